"""The served engine keeps the offline simulator's clock: requests sent one at a time over HTTP to a real
``sim serve`` see exactly the latencies the offline simulation gives the same requests (the event loop's
lag between two steps, multiplied by the time scale, is in none of them). The disaggregated roles are
checked the same way in ``test_server_disagg.py``."""

from __future__ import annotations

import argparse
import json
import urllib.request
from typing import Any

import pytest
from chunkpilot.engine.sim.flags import add_flags_for, config_for
from chunkpilot.engine.sim.offline import simulate
from chunkpilot.engine.sim.workload import RequestSpec, Workload

#: ``fast_sim_server``'s engine (the conftest's): 1000x real time, so each wall millisecond of lag
#: between two steps would read as a simulated second.
ENGINE = ("llama-3.1-8b", "--served-model-name", "llama-8b", "--max-model-len", "512")


def _since(after: dict[str, float], before: dict[str, float], name: str) -> float:
    return after[name] - before.get(name, 0.0)


def _stream(server: Any, prompt: str, max_tokens: int) -> int:
    """Send one streaming completion; the prompt tokens the engine counted."""
    body = {"model": "llama-8b", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    request = urllib.request.Request(
        f"{server.url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        events = [
            line[5:].strip() for line in response.read().decode().splitlines() if line.startswith("data:")
        ]
    usage = json.loads(next(e for e in reversed(events) if e != "[DONE]"))["usage"]
    assert usage["completion_tokens"] == max_tokens, usage
    return int(usage["prompt_tokens"])


def test_a_served_engine_keeps_the_offline_simulations_clock(fast_sim_server: Any) -> None:
    before = fast_sim_server.totals()
    lengths = [(6, 40), (80, 12), (18, 25)]  # about 30, 400 and 90 prompt tokens
    prompts = [
        _stream(fast_sim_server, " ".join(f"tick{i}x{w}" for w in range(words)), max_tokens)
        for i, (words, max_tokens) in enumerate(lengths)
    ]
    after = fast_sim_server.totals()

    parser = argparse.ArgumentParser()
    add_flags_for(parser, "vllm")
    config = config_for(ENGINE[0], parser.parse_args(list(ENGINE[1:])))
    arrivals = [
        RequestSpec(1000.0 * i, n, m) for i, (n, (_, m)) in enumerate(zip(prompts, lengths, strict=True))
    ]
    offline = simulate(config, Workload("one at a time", tuple(arrivals)), keep_records=True)
    assert len(offline.records) == len(lengths)
    tokens = sum(m - 1 for _, m in lengths)
    itl = "vllm:inter_token_latency_seconds"
    assert _since(after, before, f"{itl}_count") == tokens
    assert _since(after, before, f"{itl}_sum") == pytest.approx(offline.itl_ms.mean * tokens / 1e3, rel=1e-9)
    # An idle engine starts the step of a request when it arrived, not when its task woke up.
    ttft = _since(after, before, "vllm:time_to_first_token_seconds_sum")
    assert ttft == pytest.approx(sum(r.ttft_s for r in offline.records), rel=1e-9)
    e2e = _since(after, before, "vllm:e2e_request_latency_seconds_sum")
    assert e2e == pytest.approx(sum(r.e2e_s for r in offline.records), rel=1e-9)
