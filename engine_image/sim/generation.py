"""What a simulated request generates: its tokens' text and ids, where it stops, and logprobs.

The output is synthetic (see :class:`~chunkpilot.engine.sim.tokenizer.TextGenerator`) but is
planned in full when the request arrives, so ``stop`` strings and ``stop_token_ids`` end a request
at the token that completes them, as vLLM's do, and the engine is told the exact output length.
"""

from __future__ import annotations

import bisect
import zlib
from dataclasses import dataclass, field
from typing import Any

from chunkpilot.engine.sim import tokenizer
from chunkpilot.engine.sim.sampling import Sampling

#: Alternatives offered in ``top_logprobs`` (each a one-token chunk).
_ALTERNATIVES = tuple(dict.fromkeys(c for w in tokenizer._WORDS for c in tokenizer.pieces(" " + w)))


@dataclass(slots=True)
class Plan:
    """The planned output of one choice; token texts are generated as they are asked for."""

    num_tokens: int
    finish_reason: str
    stop_reason: str | int | None
    generator: tokenizer.TextGenerator
    texts: list[str] = field(default_factory=list)

    def tokens(self, start: int, stop: int) -> list[str]:
        """Texts of output tokens ``start`` (inclusive) to ``stop`` (exclusive)."""
        stop = min(stop, self.num_tokens)
        while len(self.texts) < stop:
            self.texts.append(self.generator.next_token())
        return self.texts[start:stop]

    def text(self, start: int, stop: int) -> str:
        """Text of output tokens ``start`` (inclusive) to ``stop`` (exclusive)."""
        return "".join(self.tokens(start, stop))


def plan(
    prompt_ids: list[int], sampling: Sampling, max_tokens: int, index: int, seed: str, vocab: int
) -> Plan:
    """Plan one choice: natural end (unless ``ignore_eos``), ``max_tokens``, stop strings and ids.

    With ``stop`` or ``stop_token_ids`` the whole output is generated here, to find where it stops.
    """
    natural = tokenizer.natural_length(prompt_ids if index == 0 else [*prompt_ids, index])
    natural = max(natural, sampling.min_tokens)
    natural_stop = not sampling.ignore_eos and natural < max_tokens
    target = natural if natural_stop else max_tokens
    result = Plan(target, "stop" if natural_stop else "length", None, tokenizer.TextGenerator(seed))
    if sampling.stop_token_ids:
        _apply_stop_ids(result, sampling, tokenizer.encode(result.text(0, target), vocab))
    _apply_stop_strings(result, sampling)
    return result


def _apply_stop_ids(result: Plan, sampling: Sampling, ids: list[int]) -> None:
    for position, token in enumerate(ids[: result.num_tokens]):
        if position + 1 >= max(sampling.min_tokens, 1) and token in sampling.stop_token_ids:
            result.num_tokens, result.finish_reason, result.stop_reason = position + 1, "stop", token
            result.texts = result.texts[: position + 1]
            if not sampling.include_stop_str:
                result.texts[-1] = ""
            return


def _apply_stop_strings(result: Plan, sampling: Sampling) -> None:
    if not sampling.stop:
        return
    ends: list[int] = []
    total = 0
    for piece in result.tokens(0, result.num_tokens):
        total += len(piece)
        ends.append(total)
    text = "".join(result.texts)
    start = ends[sampling.min_tokens - 1] if 0 < sampling.min_tokens <= len(ends) else 0
    best: tuple[int, int, str] | None = None  # (end, start, stop string) of the earliest match
    for stop in sampling.stop:
        found = text.find(stop, start)
        if found >= 0 and (best is None or found + len(stop) < best[0]):
            best = (found + len(stop), found, stop)
    if best is None:
        return
    end, found, stop = best
    last = bisect.bisect_left(ends, end)  # the token that completes the stop string
    keep = end if sampling.include_stop_str else found
    texts = result.texts[: last + 1]
    clipped: list[str] = []
    offset = 0
    for piece in texts:
        clipped.append(piece[: max(0, keep - offset)])
        offset += len(piece)
    result.num_tokens, result.finish_reason, result.stop_reason = last + 1, "stop", stop
    result.texts = clipped


def _logprob(text: str, position: int) -> float:
    digest = zlib.crc32(f"{position}:{text}".encode("utf-8", "surrogatepass"))
    return -round(0.02 + (digest % 1000) / 400, 4)


def _top(text: str, position: int, k: int) -> list[tuple[str, float]]:
    """The chosen token first, then ``k - 1`` alternatives, each less likely than the one before."""
    alternatives = [a for a in _ALTERNATIVES if a != text]
    start = zlib.crc32(text.encode("utf-8", "surrogatepass")) % len(alternatives)
    top = [(text, _logprob(text, position))]
    for i in range(max(0, k - 1)):
        alternative = alternatives[(start + i) % len(alternatives)]
        top.append((alternative, round(top[-1][1] - 0.25 + _logprob(alternative, position) / 10, 4)))
    return top


def completion_logprobs(
    texts: list[str], first: int, offset: int, k: int, echo_prompt: int = 0
) -> dict[str, Any]:
    """Completions-style ``logprobs`` of tokens ``texts`` (positions from ``first``, text offsets from
    ``offset``); the first ``echo_prompt`` of them are echoed prompt tokens (the very first has none)."""
    tokens: list[str] = []
    offsets: list[int] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] = []
    for i, text in enumerate(texts):
        position = first + i
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
        if i < echo_prompt and position == 0:
            token_logprobs.append(None)
            top_logprobs.append(None)
            continue
        top = _top(text, position, max(k, 1))
        token_logprobs.append(top[0][1])
        top_logprobs.append(dict(top))
    return {
        "text_offset": offsets,
        "token_logprobs": token_logprobs,
        "tokens": tokens,
        "top_logprobs": top_logprobs,
    }


def chat_logprobs(texts: list[str], first: int, k: int) -> dict[str, Any]:
    """Chat-style ``logprobs`` (``{"content": [...]}``) of output tokens ``texts``."""
    content = []
    for i, text in enumerate(texts):
        top = _top(text, first + i, max(k, 1))
        content.append(
            {
                "token": text,
                "logprob": top[0][1],
                "bytes": list(text.encode("utf-8")),
                "top_logprobs": [
                    {"token": t, "logprob": lp, "bytes": list(t.encode("utf-8"))} for t, lp in top[:k]
                ],
            }
        )
    return {"content": content}
