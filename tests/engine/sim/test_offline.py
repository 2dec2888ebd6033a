"""Offline mode: bulk decode advancing is exact, summaries are complete and consistent."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from chunkpilot.engine.sim.engine import SimConfig
from chunkpilot.engine.sim.metrics import StepTelemetry
from chunkpilot.engine.sim.offline import SLO, Percentiles, Summary, simulate
from chunkpilot.engine.sim.scheduler import SchedulerConfig
from chunkpilot.engine.sim.steptime import STEP_PROFILE_SCHEMA, StepProfile
from chunkpilot.engine.sim.workload import load_trace, parse_workload_spec

H100_DEFAULTS = SchedulerConfig(max_num_batched_tokens=8192, max_num_seqs=1024, max_model_len=32768)


def _assert_same(fast: Summary, slow: Summary) -> None:
    assert fast.steps == slow.steps
    assert fast.completed == slow.completed == fast.requests
    assert fast.preemptions == slow.preemptions
    for name in ("ttft_ms", "itl_ms", "e2e_ms", "tpot_ms", "queue_ms"):
        a, b = getattr(fast, name), getattr(slow, name)
        for q in ("p50", "p90", "p95", "p99", "max", "mean"):
            assert getattr(a, q) == pytest.approx(getattr(b, q), rel=1e-9, abs=1e-9), f"{name}.{q}"
    assert fast.duration_s == pytest.approx(slow.duration_s, rel=1e-12)
    for x, y in zip(fast.records, slow.records, strict=True):
        assert (x.prompt_tokens, x.output_tokens, x.preemptions) == (
            y.prompt_tokens,
            y.output_tokens,
            y.preemptions,
        )
        assert x.ttft_s == pytest.approx(y.ttft_s, rel=1e-9, abs=1e-12)
        assert x.e2e_s == pytest.approx(y.e2e_s, rel=1e-9, abs=1e-12)


class _CountingTelemetry(StepTelemetry):
    """Step telemetry that counts the stretches of decode steps advanced in bulk."""

    def __init__(self) -> None:
        super().__init__()
        self.bulk_runs = 0

    def observe_decode_run(
        self, batch: int, context_tokens: int, steps: int, first_s: float, increment_s: float
    ) -> None:
        self.bulk_runs += 1
        super().observe_decode_run(batch, context_tokens, steps, first_s, increment_s)


def test_bulk_decode_advancing_equals_step_by_step_on_a_trace() -> None:
    config = SimConfig(scheduler=H100_DEFAULTS)
    workload = load_trace("azure_conv_2023", limit=1500)
    counting = _CountingTelemetry()
    fast = simulate(config, workload, keep_records=True, telemetry=counting)
    assert counting.bulk_runs, "bulk decode advancing never engaged, so the comparison below proves nothing"
    slow = simulate(config, workload, fast_forward=False, keep_records=True)
    _assert_same(fast, slow)
    # How much faster it is is a benchmark figure: `chunkpilot sim bench` prints both wall times.


def test_bulk_decode_advancing_is_exact_under_kv_pressure_and_preemption() -> None:
    config = SimConfig(
        scheduler=replace(H100_DEFAULTS, max_num_batched_tokens=2048, max_model_len=4096),
        num_kv_blocks=1200,  # 19,200 tokens for ~60 concurrent requests of ~1.5k tokens
    )
    workload = parse_workload_spec("n=300,rate=40,prompt=200-1200,output=100-600,seed=2")
    fast = simulate(config, workload, keep_records=True)
    slow = simulate(config, workload, fast_forward=False, keep_records=True)
    assert slow.preemptions > 0
    _assert_same(fast, slow)


def test_summary_fields_and_slo_accounting() -> None:
    workload = parse_workload_spec("n=200,rate=20,prompt=500-1500,output=50-150,seed=1")
    loose = simulate(SimConfig(scheduler=H100_DEFAULTS), workload, SLO(itl_ms=1000, ttft_ms=10_000))
    tight = simulate(SimConfig(scheduler=H100_DEFAULTS), workload, SLO(itl_ms=1, ttft_ms=1))
    data = loose.to_dict()
    for key in ("requests", "duration_s", "ttft_ms", "itl_ms", "e2e_ms", "throughput_tok_s", "goodput_req_s",
                "slo_attainment", "preemptions", "steps", "wall_s"):  # fmt: skip
        assert key in data
    assert set(data["itl_ms"]) >= {"p50", "p90", "p95", "p99", "max"}
    assert loose.requests == loose.completed == 200
    assert loose.slo_met and loose.slo_attainment == 1.0
    assert loose.goodput_req_s == pytest.approx(loose.request_throughput_req_s)
    assert not tight.slo_met and tight.slo_attainment == 0.0 and tight.goodput_req_s == 0.0
    p = loose.itl_ms
    assert p.p50 <= p.p90 <= p.p95 <= p.p99 <= p.max
    assert loose.ttft_ms.p50 > 0 and math.isfinite(loose.throughput_tok_s)


def test_weighted_percentiles() -> None:
    import numpy as np

    values = np.array([1.0, 2.0, 3.0])
    p = Percentiles.of(values, np.array([1.0, 1.0, 98.0]))
    assert p.p50 == 3000.0 and p.max == 3000.0
    assert Percentiles.of(np.array([0.001, 0.002])).p50 == pytest.approx(1.0)


@pytest.mark.parametrize("kwargs", [{"itl_quantile": 1.5}, {"ttft_ms": 0}])
def test_slo_validation_names_the_flag(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="--slo-"):
        SLO(**kwargs)


def test_a_prompt_larger_than_the_kv_cache_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="--max-model-len"):
        SimConfig(scheduler=H100_DEFAULTS, num_kv_blocks=100).build()


def _spread_profile(tmp_path: Path, sigma: float) -> str:
    """The datasheet H100's linear layers as a step profile, single steps spread by ``sigma``."""
    model = SimConfig(model="llama-3.1-8b", accelerator="h100").build().step_model
    document = {
        "schema": STEP_PROFILE_SCHEMA,
        "model": "llama-3.1-8b",
        "accelerator": "h100",
        "linear_ms": {str(t): model.linear_time(t) * 1e3 for t in (1, 16, 256, 1024, 4096, 16384)},
        "step_log_sigma": {"1": sigma, "16384": sigma},
    }
    path = tmp_path / f"spread-{sigma}.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    return str(path)


def test_spread_steps_raise_the_upper_quantiles_not_the_mean_and_are_seeded(tmp_path: Path) -> None:
    workload = load_trace("azure_conv_2023", rate=3.0, limit=120)
    sched = SchedulerConfig(max_num_batched_tokens=1024, max_num_seqs=64, max_model_len=8192)
    config = SimConfig(model="llama-3.1-8b", accelerator="h100", scheduler=sched)
    steady = simulate(replace(config, step_profile=_spread_profile(tmp_path, 0.0)), workload)
    spread_config = replace(config, step_profile=_spread_profile(tmp_path, 0.4))
    spread = simulate(spread_config, workload)
    assert spread.itl_ms.p90 > steady.itl_ms.p90 * 1.3
    # Mean-one draws: the typical token takes about as long as without the spread.
    assert spread.itl_ms.mean == pytest.approx(steady.itl_ms.mean, rel=0.1)
    again = simulate(spread_config, workload)
    assert (again.itl_ms.p99, again.ttft_ms.p95) == (spread.itl_ms.p99, spread.ttft_ms.p95)
    other_seed = simulate(replace(spread_config, seed=1), workload)
    assert other_seed.itl_ms.p99 != spread.itl_ms.p99


def test_a_spread_out_of_range_is_refused_naming_the_field(tmp_path: Path) -> None:
    path = Path(_spread_profile(tmp_path, 0.0))
    document = json.loads(path.read_text(encoding="utf-8"))
    document["step_log_sigma"] = {"64": 5.0}
    with pytest.raises(
        ValueError, match=r"'step_log_sigma' needs token counts >= 1 and spreads in \[0, 3.0\]"
    ):
        StepProfile.from_dict(document)
    document["step_log_sigma"] = [0.1]
    with pytest.raises(ValueError, match="'step_log_sigma' must map token counts to log-spreads"):
        StepProfile.from_dict(document)
