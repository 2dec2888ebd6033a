"""A small streaming client for an OpenAI-compatible server: TTFT and inter-token gaps.

Prompts are token-id lists so their length is exact whatever the tokenizer.
Each streamed chunk carries the tokens of one engine step, so the gaps between
chunks are the request's inter-token latencies.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import aiohttp


@dataclass
class StreamResult:
    """Timings of one streamed completion (seconds, monotonic clock)."""

    sent: float
    chunks: list[float] = field(default_factory=list)
    finish_reason: str | None = None

    @property
    def ttft(self) -> float:
        return self.chunks[0] - self.sent

    @property
    def itls(self) -> list[float]:
        return [b - a for a, b in zip(self.chunks, self.chunks[1:], strict=False)]


def prompt_ids(length: int, offset: int = 0, vocab: int = 256) -> list[int]:
    """A deterministic prompt of ``length`` token ids below ``vocab`` (3.. skips the special tokens)."""
    return [3 + (offset + i * 7) % (vocab - 3) for i in range(length)]


async def stream_completion(
    session: aiohttp.ClientSession,
    base_url: str,
    model: str,
    prompt: Sequence[int],
    max_tokens: int,
    delay_s: float = 0.0,
) -> StreamResult:
    """Send one streaming completion after ``delay_s`` and time its chunks."""
    if delay_s:
        await asyncio.sleep(delay_s)
    body = {
        "model": model,
        "prompt": list(prompt),
        "max_tokens": max_tokens,
        "min_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "temperature": 0.0,
    }
    result = StreamResult(sent=time.monotonic())
    async with session.post(f"{base_url}/v1/completions", json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"completion failed: {response.status} {await response.text()}")
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data:"))
            if "error" in chunk:
                raise RuntimeError(f"completion failed: {chunk['error']}")
            for choice in chunk.get("choices", []):
                result.chunks.append(time.monotonic())
                result.finish_reason = choice.get("finish_reason") or result.finish_reason
    return result
