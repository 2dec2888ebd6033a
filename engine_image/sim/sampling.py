"""Validation of OpenAI request bodies into sampling parameters, as vLLM's server does it.

Each check answers 400 with a message that names the offending field (``param``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from chunkpilot.engine.sim.http_api import APIError, check_text

#: vLLM's default ``--max-logprobs``.
MAX_LOGPROBS = 20
#: Most choices per prompt (``n``) accepted.
MAX_N = 128


@dataclass(frozen=True, slots=True)
class Sampling:
    """What one completion or chat request asks of the engine (besides its prompt)."""

    max_tokens: int | None
    limit_key: str
    n: int
    stream: bool
    include_usage: bool
    continuous_usage: bool
    ignore_eos: bool
    min_tokens: int
    stop: tuple[str, ...]
    stop_token_ids: frozenset[int]
    include_stop_str: bool
    logprobs: int | None
    echo: bool
    seed: int | None


def _int(body: dict[str, Any], key: str, low: int | None = None, high: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise APIError(400, f"'{key}' must be an integer", key)
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise APIError(400, f"'{key}' must be {bounds}, got {value}", key)
    return value


def _bool(body: dict[str, Any], key: str, default: bool = False) -> bool:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise APIError(400, f"'{key}' must be a boolean", key)
    return value


def _float(body: dict[str, Any], key: str, low: float, high: float, open_low: bool = False) -> None:
    value = body.get(key)
    if value is None:
        return
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise APIError(400, f"'{key}' must be a finite number", key)
    if value < low or value > high or (open_low and value == low):
        lo = "(" if open_low else "["
        raise APIError(400, f"'{key}' must be in {lo}{low:g}, {high:g}], got {value}", key)


def _stop(body: dict[str, Any]) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise APIError(400, "'stop' must be a string or a list of strings", "stop")
    if any(not s for s in items):
        raise APIError(400, "'stop' strings must not be empty", "stop")
    return tuple(check_text(s, "stop") for s in items)


def _stop_token_ids(body: dict[str, Any]) -> frozenset[int]:
    value = body.get("stop_token_ids")
    if value is None:
        return frozenset()
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise APIError(400, "'stop_token_ids' must be a list of integers", "stop_token_ids")
    return frozenset(value)


def _stream_options(body: dict[str, Any], stream: bool) -> tuple[bool, bool]:
    options = body.get("stream_options")
    if options is None:
        return False, False
    if not stream:
        raise APIError(400, "'stream_options' can only be set when 'stream' is true", "stream_options")
    if not isinstance(options, dict):
        raise APIError(400, "'stream_options' must be an object", "stream_options")
    include = _bool(options, "include_usage")
    continuous = _bool(options, "continuous_usage_stats")
    return include, continuous


def _logprobs(body: dict[str, Any], chat: bool) -> int | None:
    if not chat:
        return _int(body, "logprobs", 0, MAX_LOGPROBS)
    wanted = _bool(body, "logprobs")
    top = _int(body, "top_logprobs", 0, MAX_LOGPROBS)
    if top is not None and top > 0 and not wanted:
        raise APIError(400, "'top_logprobs' needs 'logprobs' set to true", "top_logprobs")
    return (top or 0) if wanted else None


def parse_sampling(body: dict[str, Any], chat: bool) -> Sampling:
    """The sampling parameters of a ``/v1/completions`` or ``/v1/chat/completions`` body."""
    limit_key = (
        "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    )
    max_tokens = body.get(limit_key)
    if max_tokens is not None and (
        not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1
    ):
        raise APIError(400, f"'{limit_key}' must be a positive integer", limit_key)
    n = _int(body, "n", 1, MAX_N) or 1
    best_of = _int(body, "best_of", 1)
    if best_of is not None and best_of < n:
        raise APIError(400, f"'best_of' must be >= n ({n}), got {best_of}", "best_of")
    _float(body, "temperature", 0.0, 1e6)
    _float(body, "top_p", 0.0, 1.0, open_low=True)
    _float(body, "min_p", 0.0, 1.0)
    _float(body, "presence_penalty", -2.0, 2.0)
    _float(body, "frequency_penalty", -2.0, 2.0)
    _float(body, "repetition_penalty", 0.0, 1e6, open_low=True)
    _int(body, "top_k", -1)  # -1 and 0 turn top-k off
    seed = _int(body, "seed")
    min_tokens = _int(body, "min_tokens", 0) or 0
    if max_tokens is not None and min_tokens > max_tokens:
        raise APIError(
            400, f"'min_tokens' ({min_tokens}) must be <= '{limit_key}' ({max_tokens})", "min_tokens"
        )
    stream = _bool(body, "stream")
    include_usage, continuous = _stream_options(body, stream)
    for key in ("skip_special_tokens", "spaces_between_special_tokens", "add_special_tokens"):
        _bool(body, key)
    return Sampling(
        max_tokens=max_tokens,
        limit_key=limit_key,
        n=n,
        stream=stream,
        include_usage=include_usage,
        continuous_usage=continuous,
        ignore_eos=_bool(body, "ignore_eos"),
        min_tokens=min_tokens,
        stop=_stop(body),
        stop_token_ids=_stop_token_ids(body),
        include_stop_str=_bool(body, "include_stop_str_in_output"),
        logprobs=_logprobs(body, chat),
        echo=False if chat else _bool(body, "echo"),
        seed=seed,
    )


@dataclass(frozen=True, slots=True)
class Prompt:
    """One prompt: its text (None when given as token ids) or its token ids."""

    text: str | None
    ids: tuple[int, ...] | None


def _is_ids(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def _check_ids(ids: list[int], vocab_size: int) -> tuple[int, ...]:
    if not ids:
        raise APIError(400, "'prompt' must not be empty", "prompt")
    for token in ids:
        if not 0 <= token < vocab_size:
            raise APIError(
                400, f"'prompt': token id {token} is out of vocabulary (size {vocab_size})", "prompt"
            )
    return tuple(ids)


def parse_prompts(value: object, vocab_size: int) -> list[Prompt]:
    """The prompts of a completions body: a string, token ids, or a list of either."""
    message = "'prompt' must be a non-empty string, a list of token ids, or a list of those"
    if isinstance(value, str):
        items: list[object] = [value]
    elif _is_ids(value):
        items = [value]
    elif isinstance(value, list) and value:
        items = value
    else:
        raise APIError(400, message, "prompt")
    prompts: list[Prompt] = []
    for item in items:
        if isinstance(item, str):
            if not item:
                raise APIError(400, "'prompt' must not be empty", "prompt")
            prompts.append(Prompt(check_text(item, "prompt"), None))
        elif _is_ids(item):
            prompts.append(Prompt(None, _check_ids(item, vocab_size)))  # type: ignore[arg-type]
        else:
            raise APIError(400, message, "prompt")
    return prompts


def content_text(content: object, index: int) -> str:
    """Text of a chat message's content (a string or a list of text parts)."""
    param = f"messages[{index}].content"
    if isinstance(content, str):
        return check_text(content, param)
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append(check_text(part["text"], param))
            else:
                raise APIError(400, f"{param}: only text parts are supported", "messages")
        return "".join(parts)
    if content is None:
        return ""
    raise APIError(400, f"{param} must be a string or a list of text parts", "messages")


def parse_messages(value: object) -> list[tuple[str, str]]:
    """``(role, content)`` of each chat message."""
    if not isinstance(value, list) or not value:
        raise APIError(400, "'messages' must be a non-empty list", "messages")
    parsed: list[tuple[str, str]] = []
    for i, message in enumerate(value):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise APIError(400, f"messages[{i}] must be an object with a string 'role'", "messages")
        parsed.append(
            (check_text(message["role"], f"messages[{i}].role"), content_text(message.get("content"), i))
        )
    return parsed
