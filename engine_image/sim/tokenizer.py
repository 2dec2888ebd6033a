"""A deterministic tokenizer approximation and a plausible-text generator.

Text splits into words, numbers, punctuation and whitespace-led pieces; a piece of ``n`` characters
counts ``ceil(n / 4)`` tokens (about four characters per token, as BPE vocabularies average on
English), each token being the next four characters of its piece. A token's id is its index in a
fixed vocabulary of common chunks (letters, digits, punctuation, whitespace runs; see
:func:`vocabulary`) or, for a chunk outside it, a CRC32 hash; equal prompt prefixes thus give equal
ids and therefore equal KV block hashes (prefix caching works on real prompts).
:mod:`chunkpilot.engine.sim.hf_tokenizer` writes the same tokenizer as a Hugging Face
``tokenizer.json``, so benchmark clients count exactly what the simulator counts.
"""

from __future__ import annotations

import functools
import itertools
import random
import re
import string
import zlib
from collections.abc import Iterable, Sequence

#: The characters Python's ``\\s`` matches in a str pattern (``str.isspace``), spelled out so that
#: other regex engines (the exported Hugging Face tokenizer's) match exactly the same ones.
WHITESPACE_CODEPOINTS: tuple[int, ...] = (
    0x9, 0xA, 0xB, 0xC, 0xD, 0x1C, 0x1D, 0x1E, 0x1F, 0x20, 0x85, 0xA0, 0x1680, 0x2000, 0x2001,
    0x2002, 0x2003, 0x2004, 0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200A, 0x2028, 0x2029,
    0x202F, 0x205F, 0x3000,
)  # fmt: skip


def piece_pattern(codepoint: str) -> str:
    """The piece regex, each whitespace character written as ``codepoint.format(ord(char))``."""
    space = "".join(codepoint.format(c) for c in WHITESPACE_CODEPOINTS)
    return f" ?[A-Za-z]+| ?[0-9]+| ?[^{space}A-Za-z0-9]|[{space}]+"


_PIECE = re.compile(piece_pattern("\\U{:08x}"))
CHARS_PER_TOKEN = 4
CHAT_TOKENS_PER_MESSAGE = 4
CHAT_TOKENS_PER_REPLY = 3
#: Text of a token id that is not in the vocabulary (one token wherever it stands).
UNKNOWN_TEXT = "\ufffd"
#: Ids at the top of the vocabulary kept free for the exported tokenizer's chat-template tokens.
RESERVED_IDS = 2

_WORDS: tuple[str, ...] = (
    "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "with", "was", "on", "be",
    "by", "this", "are", "at", "from", "or", "an", "which", "have", "not", "model", "token", "cache",
    "batch", "prefill", "decode", "latency", "budget", "engine", "request", "stream", "chunk",
    "schedule", "system", "memory", "compute", "bandwidth", "kernel", "layer", "attention",
    "throughput", "service", "cluster", "replica", "value", "result", "time", "first", "next", "each",
    "step", "while", "when", "more", "than", "into", "also", "can", "will", "would",
)  # fmt: skip


def _chunks(piece: str) -> list[str]:
    return [piece[i : i + CHARS_PER_TOKEN] for i in range(0, len(piece), CHARS_PER_TOKEN)]


def pieces(text: str) -> list[str]:
    """The text of each token of ``text``, in order (their concatenation is ``text``)."""
    out: list[str] = []
    for match in _PIECE.finditer(text):
        out.extend(_chunks(match.group(0)))
    return out


@functools.cache
def vocabulary(vocab_size: int = 128_000) -> tuple[str, ...]:
    """The vocabulary: chunk texts by id, most useful first, at most ``vocab_size - RESERVED_IDS``.

    Id 0 is :data:`UNKNOWN_TEXT`; then the generated words' chunks, punctuation, whitespace runs,
    one- to three-letter chunks (lower case and capitalised, with and without a leading space) and
    digit groups. The ids past it (up to ``vocab_size``) have no text of their own.
    """
    lower, upper, digits = string.ascii_lowercase, string.ascii_uppercase, string.digits
    punctuation = [c for c in string.printable if not c.isalnum() and not c.isspace()]

    def letters(n: int) -> Iterable[str]:
        return ("".join(p) for p in itertools.product(lower, repeat=n))

    def groups() -> Iterable[str]:
        yield UNKNOWN_TEXT
        for word in _WORDS:
            yield from _chunks(" " + word)
            yield from _chunks(word.capitalize())
        yield from punctuation
        yield from (" " + c for c in punctuation)
        for n in range(1, 5):
            yield from ("".join(p) for p in itertools.product(" \n\t", repeat=n))
        for n in (1, 2):
            yield from (w for w in letters(n))
            yield from (" " + w for w in letters(n))
            yield from (w.capitalize() for w in letters(n))
            yield from (" " + w.capitalize() for w in letters(n))
        yield from upper
        yield from (" " + c for c in upper)
        yield from ("".join(p) for n in (1, 2, 3) for p in itertools.product(digits, repeat=n))
        yield from (" " + "".join(p) for n in (1, 2, 3) for p in itertools.product(digits, repeat=n))
        yield from (" " + w for w in letters(3))
        yield from letters(3)
        yield from (" " + w.capitalize() for w in letters(3))
        yield from (w.capitalize() for w in letters(3))
        yield from ("".join(p) for p in itertools.product(digits, repeat=4))

    return tuple(itertools.islice(dict.fromkeys(groups()), max(1, vocab_size - RESERVED_IDS)))


@functools.cache
def _ids(vocab_size: int) -> dict[str, int]:
    return {text: i for i, text in enumerate(vocabulary(vocab_size))}


def _chunk_id(chunk: str, ids: dict[str, int], vocab_size: int) -> int:
    known = ids.get(chunk)
    if known is not None:
        return known
    return zlib.crc32(chunk.encode("utf-8", "surrogatepass")) % vocab_size


def encode(text: str, vocab_size: int = 128_000) -> list[int]:
    """Token ids of ``text`` (deterministic; about one token per four characters)."""
    ids = _ids(vocab_size)
    return [_chunk_id(chunk, ids, vocab_size) for chunk in pieces(text)]


def decode_token(token_id: int, vocab_size: int = 128_000) -> str:
    """Text of one token id (:data:`UNKNOWN_TEXT` for an id without a vocabulary entry)."""
    vocab = vocabulary(vocab_size)
    return vocab[token_id] if 0 <= token_id < len(vocab) else UNKNOWN_TEXT


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
    """Plausible generated text, seeded per request.

    Each output token is the next chunk of a word (at most four characters), so the generated
    text tokenizes back into exactly as many tokens as were generated.
    """

    def __init__(self, seed: str) -> None:
        self._rng = random.Random(zlib.crc32(seed.encode("utf-8", "surrogatepass")))
        self._words = 0
        self._pending: list[str] = []

    def tokens(self, n: int) -> str:
        """Text of the next ``n`` output tokens."""
        return "".join(self.next_token() for _ in range(n))

    def next_token(self) -> str:
        """Text of the next output token."""
        if not self._pending:
            self._pending = _chunks(self._next_word())[::-1]
        return self._pending.pop()

    def _next_word(self) -> str:
        self._words += 1
        word = self._rng.choice(_WORDS)
        if self._words == 1:
            return word.capitalize()
        if self._rng.random() < 0.07:
            return "."
        return " " + word


def natural_length(token_ids: Iterable[int], low: int = 16, high: int = 256) -> int:
    """Deterministic "end of sequence" position for a prompt when ``ignore_eos`` is off."""
    digest = zlib.crc32(bytes(str(list(token_ids)[-64:]), "utf-8"))
    return low + digest % (high - low + 1)
