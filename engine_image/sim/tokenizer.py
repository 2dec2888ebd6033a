"""A deterministic tokenizer approximation and a plausible-text generator.

Text splits into words, numbers, punctuation and whitespace-led pieces; a piece of ``n`` characters
counts ``ceil(n / 4)`` tokens (about four characters per token, as BPE vocabularies average on
English). Token ids are CRC32 hashes of the pieces, so equal prompt prefixes give equal ids and
therefore equal KV block hashes (prefix caching works on real prompts).
"""

from __future__ import annotations

import random
import re
import zlib
from collections.abc import Iterable, Sequence

_PIECE = re.compile(r" ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]|\s+")
CHARS_PER_TOKEN = 4
CHAT_TOKENS_PER_MESSAGE = 4
CHAT_TOKENS_PER_REPLY = 3

_WORDS: tuple[str, ...] = (
    "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "with", "was", "on", "be",
    "by", "this", "are", "at", "from", "or", "an", "which", "have", "not", "model", "token", "cache",
    "batch", "prefill", "decode", "latency", "budget", "engine", "request", "stream", "chunk",
    "schedule", "system", "memory", "compute", "bandwidth", "kernel", "layer", "attention",
    "throughput", "service", "cluster", "replica", "value", "result", "time", "first", "next", "each",
    "step", "while", "when", "more", "than", "into", "also", "can", "will", "would",
)  # fmt: skip


def encode(text: str, vocab_size: int = 128_000) -> list[int]:
    """Token ids of ``text`` (deterministic; about one token per four characters)."""
    ids: list[int] = []
    for match in _PIECE.finditer(text):
        piece = match.group(0)
        for start in range(0, len(piece), CHARS_PER_TOKEN):
            chunk = piece[start : start + CHARS_PER_TOKEN]
            ids.append(zlib.crc32(chunk.encode("utf-8")) % vocab_size)
    return ids


def count_tokens(text: str) -> int:
    """Number of tokens :func:`encode` would return."""
    return sum(-(-len(m.group(0)) // CHARS_PER_TOKEN) for m in _PIECE.finditer(text))


def encode_chat(messages: Sequence[tuple[str, str]], vocab_size: int = 128_000) -> list[int]:
    """Token ids of a chat prompt: role and content per message plus template overhead."""
    ids: list[int] = []
    for role, content in messages:
        ids.extend(encode(f"<|{role}|>", vocab_size)[:1] * CHAT_TOKENS_PER_MESSAGE)
        ids.extend(encode(content, vocab_size))
    ids.extend(encode("<|assistant|>", vocab_size)[:1] * CHAT_TOKENS_PER_REPLY)
    return ids


def block_hashes(token_ids: Sequence[int], block_size: int) -> tuple[int, ...]:
    """Chained hashes of the full blocks of a prompt (a block's hash covers its whole prefix)."""
    hashes: list[int] = []
    parent = 0
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, tuple(token_ids[start : start + block_size])))
        hashes.append(parent)
    return tuple(hashes)


class TextGenerator:
    """Plausible generated text, one word-piece per output token, seeded per request."""

    def __init__(self, seed: str) -> None:
        self._rng = random.Random(zlib.crc32(seed.encode("utf-8")))
        self._count = 0

    def tokens(self, n: int) -> str:
        """Text of the next ``n`` output tokens."""
        return "".join(self._next() for _ in range(n))

    def _next(self) -> str:
        self._count += 1
        word = self._rng.choice(_WORDS)
        if self._count == 1:
            return word.capitalize()
        if self._rng.random() < 0.07:
            return "."
        return " " + word


def natural_length(token_ids: Iterable[int], low: int = 16, high: int = 256) -> int:
    """Deterministic "end of sequence" position for a prompt when ``ignore_eos`` is off."""
    digest = zlib.crc32(bytes(str(list(token_ids)[-64:]), "utf-8"))
    return low + digest % (high - low + 1)
