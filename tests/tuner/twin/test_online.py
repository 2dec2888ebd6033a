"""The twin in the tuning loop: calibrate from a hidden truth's telemetry, rank, check a canary.

The truth is the simulator on perturbed hardware; its step telemetry and request-length histograms
are what the engine exports, the twin starts from the datasheet.
"""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from chunkpilot.engine import metrics_names as names
from chunkpilot.engine.sim.capacity import find_capacity, retime
from chunkpilot.engine.sim.engine import SimConfig
from chunkpilot.engine.sim.metrics import StepTelemetry, StepTotals
from chunkpilot.engine.sim.offline import SLO, Summary, simulate
from chunkpilot.engine.sim.scheduler import SchedulerConfig, SGLangSchedulerConfig, TrtllmSchedulerConfig
from chunkpilot.engine.sim.workload import Workload, load_trace
from chunkpilot.tuner.measure import MetricsUnavailableError, Selector, VectorFn
from chunkpilot.tuner.space import Knob, KnobRange, SearchSpace, TunedConfig
from chunkpilot.tuner.twin import online
from chunkpilot.tuner.twin.capture import MIN_REQUESTS
from chunkpilot.tuner.twin.fit import MIN_STEPS
from chunkpilot.tuner.twin.predict import ARRIVAL_SAMPLES, SUSTAINED_SAMPLES, arrival_seeds
from chunkpilot.tuner.twin.search import ERROR_POINTS, ROBUST_EVALUATIONS

from chunkpilot.api import Objective
from chunkpilot.bench.twin_truth import Perturbation, write_truth
from chunkpilot.bench.twin_validate import observe_window

SLO_ = SLO(itl_ms=50.0, ttft_ms=2000.0)
TRUTH = Perturbation(0.75, 0.85, 2.0)
INCUMBENT = TunedConfig(512, 128)
SPACE = SearchSpace(
    ranges={Knob.MAX_NUM_BATCHED_TOKENS: KnobRange(256, 4096, log=True)},
    fixed=TunedConfig(512, 128),
)
RATE = 3.0


@pytest.fixture(scope="module")
def lengths() -> Workload:
    return load_trace("azure_conv_2023", rate=1.0, limit=200)


@pytest.fixture(scope="module")
def truth(tmp_path_factory: pytest.TempPathFactory) -> SimConfig:
    return write_truth(tmp_path_factory.mktemp("truth"), TRUTH, model="llama-3.1-8b", accelerator="h100")


def serve(
    truth: SimConfig, config: TunedConfig, workload: Workload, rate: float
) -> tuple[Summary, StepTelemetry]:
    telemetry = StepTelemetry()
    engine = replace(truth, scheduler=SchedulerConfig(**config.as_dict(), max_model_len=8192))  # type: ignore[arg-type]
    summary = simulate(engine, retime(workload, rate, 1), SLO_, keep_records=True, telemetry=telemetry)
    return summary, telemetry


def measured(summary: Summary) -> tuple[tuple[float, float], tuple[online.Band | None, online.Band | None]]:
    """The SLO quantiles, and the TTFT quantile's sampling band from the per-request records."""
    ttfts = sorted(r.ttft_s * 1000.0 for r in summary.records)
    low, high = online.band_quantiles(SLO_.ttft_quantile, len(ttfts))
    band = (float(np.quantile(ttfts, low)), float(np.quantile(ttfts, high)))
    return (summary.itl_at_slo_quantile_ms, summary.ttft_at_slo_quantile_ms), (None, band)


def request(
    truth: SimConfig, lengths: Workload, tmp_path: Path, *, rank: bool, evaluations: int = 6
) -> tuple[online.Request, Summary]:
    """A ranking request whose search ends after ``evaluations``, not on CPU time (alike on any machine)."""
    observed, telemetry = serve(truth, INCUMBENT, lengths, RATE)
    quantiles, bands = measured(observed)
    built = online.Request(
        key="abc-0",
        model="llama-3.1-8b",
        accelerator="h100",
        tensor_parallel_size=1,
        max_model_len=8192,
        gpu_memory_utilization=0.92,
        steps=telemetry.totals(),
        workload=observe_window(observed, 8192),
        slo=SLO_,
        space=SPACE,
        incumbent=INCUMBENT,
        stable_rate_req_s=RATE,
        measured_ms=quantiles,
        bands=bands,
        objective=Objective.GOODPUT,
        seed=7,
        rank=rank,
        cpu_budget_s=600.0,
        max_evaluations=evaluations,
        directory=str(tmp_path),
    )
    return built, observed


def test_calibration_fits_the_hidden_hardware_and_predicts_the_stable_track(
    truth: SimConfig, lengths: Workload, tmp_path: Path
) -> None:
    built, _ = request(truth, lengths, tmp_path, rank=False)
    calibration = online.calibrate(built)
    assert calibration.fit.scales.compute == pytest.approx(TRUTH.compute, rel=0.05)
    assert calibration.ranked == () and calibration.incumbent is None  # not asked to rank
    # The same engine, the synthetic workload: the quantiles agree within the tolerance.
    assert calibration.error <= online.TOLERANCE, (calibration.predicted_ms, built.measured_ms)


def test_the_twin_plans_on_a_larger_sample_of_the_same_window(
    truth: SimConfig, lengths: Workload, tmp_path: Path
) -> None:
    built, _ = request(truth, lengths, tmp_path, rank=False)
    twin = online.build_twin(built)
    sustained = twin.sustained_workload
    assert sustained is not None and len(twin.workload.requests) == online.WORKLOAD_REQUESTS
    assert len(sustained.requests) == online.SUSTAINED_REQUESTS > online.WORKLOAD_REQUESTS
    # The same window's distributions: the mean prompt within a few percent of the ranking's sample.
    means = [np.mean([p for p, _o in w.lengths]) for w in (twin.workload, sustained)]
    assert means[1] == pytest.approx(means[0], rel=0.1)
    planning = twin.for_planning()
    assert planning.workload is sustained and planning.arrival_seeds == arrival_seeds(SUSTAINED_SAMPLES)
    assert planning.fit is twin.fit and twin.workload is not sustained  # the ranking's twin is unchanged


def test_ranking_beats_the_incumbent_on_the_truth_too(
    truth: SimConfig, lengths: Workload, tmp_path: Path
) -> None:
    built, _ = request(truth, lengths, tmp_path, rank=True)
    calibration = online.calibrate(built)
    assert calibration.incumbent is not None and calibration.incumbent.config == INCUMBENT
    assert calibration.ranked and INCUMBENT not in [c.config for c in calibration.ranked]
    best = calibration.ranked[0]
    assert best.capacity_req_s >= calibration.incumbent.capacity_req_s
    # Six on the twin, then the leaders again one standard error slower and one faster.
    robust = sum(c.robust_req_s is not None for c in calibration.ranked)
    assert best.robust_req_s is not None and 1 <= robust <= ROBUST_EVALUATIONS
    assert calibration.evaluations == 6 + len(ERROR_POINTS) * robust and calibration.cpu_seconds > 0
    # Each ranked capacity is the mean over the twin's own arrival samples, not one draw.
    assert calibration.twin.arrival_seeds == arrival_seeds(ARRIVAL_SAMPLES) and ARRIVAL_SAMPLES > 1

    def true_capacity(config: TunedConfig) -> float:
        engine = replace(truth, scheduler=SchedulerConfig(**config.as_dict(), max_model_len=8192))  # type: ignore[arg-type]
        return find_capacity(engine, lengths, SLO_, tolerance=0.03, start_rate=2.0).capacity_req_s

    assert true_capacity(best.config) >= 0.95 * true_capacity(INCUMBENT)


def test_an_incumbent_outside_the_space_is_still_given_a_capacity(
    truth: SimConfig, lengths: Workload, tmp_path: Path
) -> None:
    built, _ = request(truth, lengths, tmp_path, rank=True, evaluations=2)
    outside = replace(built, incumbent=TunedConfig(128, 32))
    calibration = online.calibrate(outside)
    assert calibration.incumbent is not None and calibration.incumbent.config == TunedConfig(128, 32)


def test_a_canary_check_agrees_on_the_truth_and_flags_a_different_engine_even_widened_by_its_window(
    truth: SimConfig, lengths: Workload, tmp_path: Path
) -> None:
    built, _ = request(truth, lengths, tmp_path, rank=False)
    calibration = online.calibrate(built)
    other = TunedConfig(1024, 128)
    canary, _ = serve(truth, other, lengths, RATE / 2)
    quantiles, bands = measured(canary)
    check = online.check_canary(calibration, other, RATE / 2, quantiles, SLO_, 8192, bands)
    assert check.error <= online.TOLERANCE, (check.predicted_ms, quantiles, bands)
    # A 60 s window's spread widens the bands (never narrows them) and so never raises the error.
    spread = online.check_canary(calibration, other, RATE / 2, quantiles, SLO_, 8192, bands, 60.0)
    assert spread.error <= check.error and spread.bands != check.bands
    for narrow, wide, m in zip(check.bands, spread.bands, quantiles, strict=True):
        low, high = narrow if narrow is not None else (m, m)
        assert wide is not None and wide[0] <= low and wide[1] >= high
    slower = (quantiles[0] * 2, quantiles[1] * 2)  # an engine twice as slow as the twin thinks
    for window_s in (0.0, 60.0):
        flagged = online.check_canary(
            calibration, other, RATE / 2, slower, SLO_, 8192, (None, None), window_s
        )
        assert flagged.error > online.TOLERANCE, window_s


def test_widened_bands_hold_every_long_run_a_window_could_have_come_from() -> None:
    spread = ((0.8, 1.25), (0.7, 1.5))
    itl, ttft = online.widened(((20.0, 24.0), None), (22.0, 200.0), spread)
    assert itl == pytest.approx((22.0 / 1.25, 22.0 / 0.8))
    assert ttft == pytest.approx((200.0 / 1.5, 200.0 / 0.7))
    # A prediction of the long run at 27 ms is within what a 22 ms window allows, 29 ms is not.
    assert online.quantile_error((27.0, 200.0), (22.0, 200.0), (itl, ttft)) == 0.0
    assert online.quantile_error((29.0, 200.0), (22.0, 200.0), (itl, ttft)) > 0.0
    assert online.quantile_error((27.0, 200.0), (22.0, 200.0), ((20.0, 24.0), None)) > 0.0
    # No spread, or nothing measured: the band stays as it was.
    assert online.widened(((20.0, 24.0), None), (22.0, None), ((1.0, 1.0), spread[1])) == ((20.0, 24.0), None)


def test_quantile_error_is_the_larger_relative_error_beyond_the_sampling_band() -> None:
    assert online.quantile_error((30.0, 440.0), (25.0, 400.0)) == pytest.approx(0.2)
    assert online.quantile_error((30.0, 440.0), (None, 400.0)) == pytest.approx(0.1)
    assert math.isnan(online.quantile_error((30.0, 440.0), (None, None)))
    # Inside the band a few samples cannot contradict the prediction; outside, the distance counts.
    assert online.quantile_error((30.0, 440.0), (25.0, 400.0), ((24.0, 31.0), (300.0, 600.0))) == 0.0
    assert online.quantile_error((30.0, 200.0), (25.0, 400.0), (None, (300.0, 600.0))) == pytest.approx(0.5)
    assert online.quantile_error((30.0, 900.0), (30.0, 400.0), (None, (300.0, 600.0))) == pytest.approx(0.5)
    low, high = online.band_quantiles(0.95, 60)
    assert 0.89 < low < 0.95 < high <= 0.9999
    assert online.band_quantiles(0.95, 1e6)[0] == pytest.approx(0.95, abs=0.001)


def test_a_check_confirms_within_the_tolerance_or_a_tenth_of_each_target_of_the_prediction() -> None:
    targets = (50.0, 1000.0)
    # ITL 25% off but 4 ms from the prediction under a 50 ms target; TTFT 5% off.
    assert online.CanaryCheck(2.0, (20.0, 420.0), (16.0, 400.0)).confirms(targets, 0.15)
    # ITL 6 ms off (over 5 ms) and 37% off: the twin and the canary disagree.
    assert not online.CanaryCheck(2.0, (22.0, 420.0), (16.0, 400.0)).confirms(targets, 0.15)
    # TTFT 150 ms (over 100 ms) and 37% off: one quantile out is enough.
    assert not online.CanaryCheck(2.0, (16.0, 550.0), (16.0, 400.0)).confirms(targets, 0.15)
    # Nothing measured: nothing confirmed.
    assert not online.CanaryCheck(2.0, (16.0, 400.0), (None, None)).confirms(targets, 0.15)


def test_merged_steps_sum_per_bucket() -> None:
    a = {"64": StepTotals(steps=2, duration_s=0.02), "128": StepTotals(steps=1, duration_s=0.02)}
    b = {"64": StepTotals(steps=3, duration_s=0.03)}
    merged = online.merge_steps(a, b)
    assert merged["64"] == StepTotals(steps=5, duration_s=0.05) and merged["128"] == a["128"]


def test_waiting_names_what_is_missing(truth: SimConfig, lengths: Workload) -> None:
    observed, telemetry = serve(truth, INCUMBENT, lengths, RATE)
    window = observe_window(observed, 8192)
    few = {label: replace(t, steps=1.0) for label, t in list(telemetry.totals().items())[:3]}
    assert f"{MIN_STEPS} needed" in (online.waiting_reason(online.Inputs(True, few, window)) or "")
    assert online.waiting_reason(online.Inputs(True, telemetry.totals(), None, "no finished requests")) == (
        "no finished requests"
    )
    thin = replace(window, prompt_tokens=replace(window.prompt_tokens, count=5.0))
    assert f"{MIN_REQUESTS} needed" in (
        online.waiting_reason(online.Inputs(True, telemetry.totals(), thin)) or ""
    )
    assert online.waiting_reason(online.Inputs(True, telemetry.totals(), window)) is None
    for changed in ((1, 0), (0, 1)):
        rolled = online.Inputs(True, telemetry.totals(), window, pods_changed=changed, window="40s")
        assert online.waiting_reason(rolled) is None
        reason = online.unsteady_reason(rolled) or ""
        assert f"changed in the last 40s ({changed[0]} came up, {changed[1]} went away" in reason
    assert online.unsteady_reason(online.Inputs(True, telemetry.totals(), window, window="40s")) is None


def _read_stable_inputs(vector: VectorFn, *, steadiness: bool = True) -> online.Inputs:
    """The twin inputs of service default/chat's stable track over 60 s, read through ``vector``."""
    return online.read_inputs(
        vector,
        Selector("chat", "default", "stable"),
        "60s",
        60.0,
        datetime(2026, 1, 1, tzinfo=UTC),
        (0.99, 0.95),
        steadiness=steadiness,
    )


@pytest.mark.parametrize(
    "engine_series", [False, True], ids=["nothing-scraped-yet", "engine-without-telemetry"]
)
def test_an_engine_without_step_telemetry_reads_as_not_exported(engine_series: bool) -> None:
    asked: list[str] = []
    selector = '{service="chat",namespace="default",track="stable"}'

    def vector(query: str, at: datetime) -> list[dict[str, Any]]:
        asked.append(query)
        if engine_series and query.startswith(f"count({names.REQUEST_SUCCESS}"):
            return [{"metric": {}, "value": [0, "1"]}]
        return []

    inputs = _read_stable_inputs(vector)
    assert inputs.exported is False and inputs.seen is engine_series
    assert asked == [
        f"count({names.STEP_DURATION}_count{selector})",
        f"count({names.REQUEST_SUCCESS}{selector})",
    ]


@pytest.mark.parametrize("answer", ["matrix", "refused"])
def test_the_workloads_minutes_are_read_only_for_the_planner_and_never_cost_the_window(answer: str) -> None:
    asked: list[str] = []

    def vector(query: str, at: datetime) -> list[dict[str, Any]]:
        asked.append(query)
        minute = query.endswith("[5m:1m]")
        if minute and answer == "refused":
            raise MetricsUnavailableError("subqueries are not supported")
        value = "0" if "le=" in query else "4"
        if "_bucket" in query:
            points = [{"metric": {"le": "+Inf"}, "value": [0, "4"], "values": [[60, "2"], [120, "2"]]}]
        else:
            points = [{"metric": {}, "value": [0, value], "values": [[60, "2"], [120, "2"]]}]
        return points if minute or "_count" in query or "_sum" in query or "_bucket" in query else []

    selector = Selector("chat", "default", "stable")
    at = datetime(2026, 1, 1, tzinfo=UTC)
    plain = online.read_workload(vector, selector, "5m", 300.0, at)
    assert plain.segments == () and not any(q.endswith("[5m:1m]") for q in asked)
    asked.clear()
    read = online.read_workload(vector, selector, "5m", 300.0, at, segments=True)
    assert read.prompt_tokens == plain.prompt_tokens
    assert len([q for q in asked if q.endswith("[5m:1m]")]) == (6 if answer == "matrix" else 1)
    assert len(read.segments) == (2 if answer == "matrix" else 0)
    # A window shorter than two minutes has no minutes to read.
    asked.clear()
    assert online.read_workload(vector, selector, "90s", 90.0, at, segments=True).segments == ()
    assert not any(":1m]" in q for q in asked)


@pytest.mark.parametrize("steadiness", [True, False], ids=["between-trials", "at-a-verdict"])
def test_the_pods_changed_queries_are_asked_only_when_steadiness_is(steadiness: bool) -> None:
    asked: list[str] = []

    def vector(query: str, at: datetime) -> list[dict[str, Any]]:
        asked.append(query)
        return [{"metric": {}, "value": [0, "1"]}] if query.startswith("count(") else []

    inputs = _read_stable_inputs(vector, steadiness=steadiness)
    pods_queries = [q for q in asked if " unless " in q]
    assert inputs.exported is True
    assert len(pods_queries) == (2 if steadiness else 0), asked
    assert inputs.pods_changed == ((1, 1) if steadiness else (0, 0))


def test_latency_the_engine_adds_outside_its_steps_is_calibrated_on_stable_and_carried_to_the_canary(
    truth: SimConfig, lengths: Workload, tmp_path: Path
) -> None:
    built, _ = request(truth, lengths, tmp_path, rank=False)
    (itl, ttft), _ = built.measured_ms, built.bands
    assert itl is not None and ttft is not None
    slower = replace(built, measured_ms=(itl + 6.0, ttft), bands=(None, None))  # +6 ms per token
    calibration = online.calibrate(slower)
    assert calibration.offset_ms[0] == pytest.approx(6.0, abs=1.0) and calibration.error > 0.15
    other = TunedConfig(1024, 128)
    canary, _ = serve(truth, other, lengths, RATE / 2)
    quantiles, bands = measured(canary)
    delivered = (quantiles[0] + 6.0, quantiles[1])
    check = online.check_canary(calibration, other, RATE / 2, delivered, SLO_, 8192, bands)
    assert check.error <= online.TOLERANCE, (check.predicted_ms, delivered)


def test_offsets_are_never_negative_and_capped_and_tighten_the_targets() -> None:
    slo = SLO(itl_ms=50.0, ttft_ms=2000.0)
    assert online.latency_offsets((20.0, 400.0), (18.0, 450.0), slo) == (0.0, 0.0)
    assert online.latency_offsets((20.0, 400.0), (24.0, 300.0), slo) == (4.0, 4.0)  # one delivery each
    assert online.latency_offsets((20.0, 400.0), (45.0, None), slo) == (12.5, 12.5)  # capped
    assert online.latency_offsets((20.0, 400.0), (90.0, 2500.0), slo) == (0.0, 0.0)  # past the SLO
    tightened = online.offset_slo(slo, (5.0, 50.0))
    assert (tightened.itl_ms, tightened.ttft_ms) == (45.0, 1950.0)


def _engine_spec(**engine: Any) -> Any:
    from chunkpilot.api import InferenceService

    manifest = {
        "apiVersion": "chunkpilot.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "chat", "namespace": "default"},
        "spec": {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, "engine": engine},
    }
    return InferenceService.from_manifest(manifest).spec.engine


def test_engine_semantics_is_the_services_engine_with_what_its_spec_pins() -> None:
    from chunkpilot.engine.sim.scheduler import (
        CapacitySchedulerPolicy,
        Engine,
        SchedulingPolicy,
    )

    assert online.engine_semantics(_engine_spec(kind="vllm"), "llama-3.1-8b", "h100", 8192) is None
    assert online.engine_semantics(_engine_spec(kind="sim"), "llama-3.1-8b", "h100", 8192) is None
    sglang = online.engine_semantics(
        _engine_spec(
            kind="sglang",
            enableMixedChunk=True,
            schedulePolicy="lpm",
            maxPrefillTokens=4096,
            maxNumBatchedTokens=2048,
        ),
        "llama-3.1-8b",
        "h100",
        8192,
    )
    assert isinstance(sglang, SGLangSchedulerConfig) and sglang.engine is Engine.SGLANG
    assert sglang.enable_mixed_chunk and sglang.policy is SchedulingPolicy.LPM
    assert sglang.max_prefill_tokens == 4096 and sglang.max_model_len == 8192
    # A policy the simulator does not reproduce keeps the engine's default.
    unsimulated = online.engine_semantics(
        _engine_spec(kind="sglang", schedulePolicy="dfs-weight"), "llama-3.1-8b", "h100", 8192
    )
    assert unsimulated is not None and unsimulated.policy is SchedulingPolicy.FCFS
    trtllm = online.engine_semantics(
        _engine_spec(kind="trtllm", capacitySchedulerPolicy="MAX_UTILIZATION"), "llama-3.1-8b", "h100", 8192
    )
    assert isinstance(trtllm, TrtllmSchedulerConfig) and trtllm.engine is Engine.TRTLLM
    assert trtllm.capacity_scheduler_policy is CapacitySchedulerPolicy.MAX_UTILIZATION


def test_the_calibrated_twin_simulates_the_requests_engine(
    truth: SimConfig, lengths: Workload, tmp_path: Path
) -> None:
    from chunkpilot.engine.sim.scheduler import Engine

    built, _ = request(truth, lengths, tmp_path, rank=False)
    engine = online.engine_semantics(_engine_spec(kind="sglang"), "llama-3.1-8b", "h100", 8192)
    sglang = online.calibrate(replace(built, engine=engine))
    assert sglang.twin.config(scheduler_of_incumbent()).scheduler.engine is Engine.SGLANG
    vllm = online.calibrate(built)
    assert vllm.twin.config(scheduler_of_incumbent()).scheduler.engine is Engine.VLLM


def scheduler_of_incumbent() -> SchedulerConfig:
    from chunkpilot.tuner.twin.search import scheduler_of

    return scheduler_of(INCUMBENT, 8192)
