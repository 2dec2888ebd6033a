"""The plugin's step telemetry on the real vLLM CPU engine's ``/metrics`` (the session server)."""

from __future__ import annotations

import asyncio
import math
import urllib.request

import aiohttp
import pytest
from chunkpilot.engine import metrics_names as names
from chunkpilot.engine.vllm_plugin.client import prompt_ids, stream_completion
from chunkpilot.engine.vllm_plugin.launch import SERVED_MODEL_NAME
from chunkpilot.engine.vllm_plugin.testing import MAX_MODEL_LEN, EngineServer
from chunkpilot.tuner.twin.capture import parse_exposition, window_between
from prometheus_client.parser import text_string_to_metric_families

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as response:
        text: str = response.read().decode()
        return text


async def _one(url: str, prompt: int, output: int) -> None:
    async with aiohttp.ClientSession() as session:
        await stream_completion(session, url, SERVED_MODEL_NAME, prompt_ids(prompt, 97), output)


def _values(text: str, family: str) -> dict[str, float]:
    """``_count`` and ``_sum`` of a histogram family, summed over its series."""
    out: dict[str, float] = {}
    for metric in text_string_to_metric_families(text):
        if metric.name == family:
            for sample in metric.samples:
                suffix = sample.name.removeprefix(family)
                if suffix in ("_count", "_sum"):
                    out[suffix] = out.get(suffix, 0.0) + sample.value
    return out


def _counter(text: str, name: str) -> float:
    return sum(
        sample.value
        for metric in text_string_to_metric_families(text)
        for sample in metric.samples
        if sample.name == name
    )


def test_step_telemetry_and_request_lengths_reach_vllm_metrics(vllm_server: EngineServer) -> None:
    prompt, output = 600, 4
    before = _scrape(vllm_server.url)
    asyncio.run(_one(vllm_server.url, prompt, output))
    after = _scrape(vllm_server.url)

    _, steps = window_between(parse_exposition(before), parse_exposition(after), 1.0)
    # One prefill step of the whole prompt (budget 2048), then one decode step per further token.
    prefill = [t for t in steps.values() if t.prefill_tokens]
    assert sum(t.prefill_tokens for t in prefill) == prompt
    assert sum(t.steps for t in prefill) == 1
    decodes = steps["1"]
    assert (decodes.steps, decodes.decode_tokens, decodes.decode_sequences) == (
        output - 1,
        output - 1,
        output - 1,
    )
    assert decodes.decode_context_tokens == sum(prompt + i for i in range(1, output))
    assert steps["768"].prefill_attention_pairs == prompt * (prompt + 1) / 2
    assert all(t.duration_s > 0 for t in steps.values())

    # The fine latency histograms saw this request: one TTFT, output - 1 inter-token gaps.
    for family, count in ((names.FINE_TIME_TO_FIRST_TOKEN, 1), (names.FINE_INTER_TOKEN_LATENCY, output - 1)):
        grown = _values(after, family)["_count"] - _values(before, family).get("_count", 0.0)
        assert grown == count, family
    # The plugin's own cost is exported and grew with this request; its share of the step time is a
    # figure (printed; docs/vllm-plugin.md has the measured cost), not a timed assertion.
    cost = _counter(after, names.TELEMETRY_SECONDS) - _counter(before, names.TELEMETRY_SECONDS)
    stepped = sum(t.duration_s for t in steps.values())
    print(f"\ntelemetry cost {cost * 1e6:.0f} us over {stepped * 1e3:.1f} ms of steps ({cost / stepped:.2%})")
    assert cost > 0
    # The finer request-length histograms saw it too (the twin's workload capture prefers them).
    workload, _ = window_between(parse_exposition(before), parse_exposition(after), 1.0)
    assert workload.prompt_tokens.bounds == names.FINE_REQUEST_TOKENS_BUCKETS
    assert (workload.prompt_tokens.count, workload.prompt_tokens.total) == (1, prompt)
    assert (workload.generation_tokens.count, workload.generation_tokens.total) == (1, output)
    assert workload.tokens_product == prompt * output
    # vLLM's request-length histograms, with the buckets the simulator uses for the same max-model-len.
    for metric in text_string_to_metric_families(after):
        if metric.name in (names.REQUEST_PROMPT_TOKENS, names.REQUEST_GENERATION_TOKENS):
            bounds = sorted({float(s.labels["le"]) for s in metric.samples if s.name.endswith("_bucket")})
            assert bounds == [*names.request_tokens_buckets(MAX_MODEL_LEN), math.inf]
