"""Step telemetry and the twin's extra histograms: offline recording and a real ``sim serve`` /metrics."""

from __future__ import annotations

import math
import urllib.request
from pathlib import Path
from typing import Any

import openai
from chunkpilot.engine import metrics_names as names
from chunkpilot.engine.sim.engine import SimConfig
from chunkpilot.engine.sim.metrics import StepTelemetry
from chunkpilot.engine.sim.offline import simulate
from chunkpilot.engine.sim.profiles.loader import load_accelerator, load_model
from chunkpilot.engine.sim.scheduler import SchedulerConfig
from chunkpilot.engine.sim.steptime import ForwardPass, StepTimeModel
from chunkpilot.engine.sim.workload import parse_workload_spec
from chunkpilot.tuner.twin.capture import parse_exposition, window_between
from prometheus_client.parser import text_string_to_metric_families


def test_vllm_request_token_buckets_are_the_1_2_5_series_capped_at_max_model_len() -> None:
    # vllm.v1.metrics.buckets.build_1_2_5_buckets(max_model_len), written out.
    assert names.request_tokens_buckets(4096) == (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)
    assert names.request_tokens_buckets(5000)[-1] == 5000
    assert names.request_tokens_buckets(1) == (1,)


def test_step_token_buckets_use_le_semantics() -> None:
    assert names.step_token_bucket(1) == "1"
    assert names.step_token_bucket(49) == "64"
    assert names.step_token_bucket(64) == "64"
    assert names.step_token_bucket(65) == "96"
    assert names.step_token_bucket(10**6) == "+Inf"


def test_offline_telemetry_is_the_same_with_and_without_bulk_decode() -> None:
    workload = parse_workload_spec("n=60,rate=8,prompt=100-1500,output=10-200,seed=3")
    config = SimConfig(scheduler=SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=64))
    fast, slow = StepTelemetry(), StepTelemetry()
    summary = simulate(config, workload, telemetry=fast)
    simulate(config, workload, fast_forward=False, telemetry=slow)
    fast_totals, slow_totals = fast.totals(), slow.totals()
    assert fast_totals.keys() == slow_totals.keys()
    for label, totals in fast_totals.items():
        other = slow_totals[label]
        assert totals.steps == other.steps
        assert math.isclose(totals.duration_s, other.duration_s, rel_tol=1e-9)
        assert totals.decode_context_tokens == other.decode_context_tokens
        assert totals.decode_tokens == other.decode_tokens
    assert sum(t.steps for t in fast_totals.values()) == summary.steps
    prefill = sum(t.prefill_tokens for t in fast_totals.values())
    assert prefill == sum(r.prompt_tokens for r in workload.requests)  # no preemption, no prefix hits


def _families(text: str) -> dict[str, Any]:
    return {family.name: family for family in text_string_to_metric_families(text)}


def test_sim_serve_exports_step_telemetry_request_lengths_and_fine_latencies(
    sim_server_runner: Any, tmp_path: Path
) -> None:
    budget, prompt, output = 256, 1000, 3
    args = ("llama-3.1-8b", "--gpu", "h100", "--served-model-name", "llama-8b")
    flags = ("--max-model-len", "4096", "--max-num-batched-tokens", str(budget))
    with sim_server_runner(tmp_path, *args, *flags) as server:
        with urllib.request.urlopen(f"{server.url}/metrics", timeout=10) as response:
            before_text = response.read().decode()
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=30)
        client.completions.create(
            model="llama-8b", prompt=[7] * prompt, max_tokens=output, extra_body={"ignore_eos": True}
        )
        with urllib.request.urlopen(f"{server.url}/metrics", timeout=10) as response:
            text = response.read().decode()
    families = _families(text)
    assert families[names.STEP_DURATION].type == "histogram"
    for counter in names.STEP_COUNTERS:
        assert families[counter.removesuffix("_total")].type == "counter"

    _, steps = window_between(parse_exposition(before_text), parse_exposition(text), 1.0)
    # Four chunks of <= 256 prompt tokens (the last one emits the first token), then two decodes.
    assert set(steps) == {"1", "256"}
    chunks, decodes = steps["256"], steps["1"]
    assert (chunks.steps, chunks.prefill_tokens, chunks.decode_tokens) == (4, prompt, 0)
    assert chunks.prefill_attention_pairs == 256 * 257 / 2 + 256 * 512 + 256 * 768 + 232 * 1000
    assert (decodes.steps, decodes.decode_tokens, decodes.decode_sequences) == (2, 2, 2)
    assert decodes.decode_context_tokens == (prompt + 1) + (prompt + 2)
    # Durations are simulated seconds: exactly the step-time model's for each step.
    model = StepTimeModel(load_model("llama-3.1-8b"), load_accelerator("h100"))
    expected = sum(model.step_time(ForwardPass(1, 1, 1, 0.0, 0, ctx)) for ctx in (prompt + 1, prompt + 2))
    assert math.isclose(decodes.duration_s, expected, rel_tol=1e-9)
    assert chunks.duration_s / chunks.steps > decodes.duration_s / decodes.steps

    # vLLM's request-length histograms, with vLLM's buckets for --max-model-len 4096, and the finer ones.
    vllm_bounds = names.request_tokens_buckets(4096)
    for name, total, buckets in (
        (names.REQUEST_PROMPT_TOKENS, prompt, vllm_bounds),
        (names.REQUEST_GENERATION_TOKENS, output, vllm_bounds),
        (names.FINE_REQUEST_PROMPT_TOKENS, prompt, names.FINE_REQUEST_TOKENS_BUCKETS),
        (names.FINE_REQUEST_GENERATION_TOKENS, output, names.FINE_REQUEST_TOKENS_BUCKETS),
    ):
        samples = families[name].samples
        bounds = [float(s.labels["le"]) for s in samples if s.name == f"{name}_bucket"]
        assert bounds == [*buckets, math.inf]
        assert {s.name: s.value for s in samples if not s.name.endswith("_bucket")} == {
            f"{name}_sum": total,
            f"{name}_count": 1,
        }
    workload, _ = window_between(parse_exposition(before_text), parse_exposition(text), 1.0)
    assert workload.prompt_tokens.bounds == names.FINE_REQUEST_TOKENS_BUCKETS  # the finer ones win
    assert (workload.prompt_tokens.count, workload.prompt_tokens.total) == (1, prompt)
    assert workload.tokens_product == prompt * output
    # The fine ITL/TTFT histograms hold the same observations as vLLM's coarse ones.
    for coarse, fine in (
        (names.INTER_TOKEN_LATENCY, names.FINE_INTER_TOKEN_LATENCY),
        (names.TIME_TO_FIRST_TOKEN, names.FINE_TIME_TO_FIRST_TOKEN),
    ):
        values = {
            which: {
                s.name.rsplit("_", 1)[-1]: s.value for s in families[which].samples if "le" not in s.labels
            }
            for which in (coarse, fine)
        }
        assert values[coarse] == values[fine]
    itl_count = next(
        s.value for s in families[names.FINE_INTER_TOKEN_LATENCY].samples if s.name.endswith("_count")
    )
    assert itl_count == output - 1


def test_step_telemetry_render_is_valid_exposition_before_any_step() -> None:
    families = _families("\n".join(StepTelemetry().render('engine="0",model_name="m"')) + "\n")
    expected = {names.STEP_DURATION, *(c.removesuffix("_total") for c in names.STEP_COUNTERS)}
    assert set(families) == expected
    assert all(family.samples == [] for family in families.values())
