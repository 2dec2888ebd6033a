"""The pure parts of the real-engine check: histogram quantiles, ingest time, request plans.

The check itself runs against real vLLM in tests/engine/vllm_plugin/test_twin_real.py.
"""

from __future__ import annotations

import math

import pytest
from chunkpilot.engine import metrics_names as names
from chunkpilot.engine.sim.metrics import EngineMetrics
from chunkpilot.engine.sim.profiles.loader import load_accelerator
from chunkpilot.engine.sim.workload import Workload
from chunkpilot.tuner.twin.capture import HistogramWindow, WorkloadWindow, histogram_of

from chunkpilot.bench.twin_real import (
    RealWindow,
    histogram_quantile,
    latency_histograms,
    lengths,
    measured_quantiles,
    poisson_requests,
)


def test_histogram_quantile_interpolates_within_the_bucket() -> None:
    histogram = histogram_of([0.5] * 10 + [1.5] * 10, (1.0, 2.0, 4.0))
    assert histogram_quantile(histogram, 0.25) == pytest.approx(0.5)
    assert histogram_quantile(histogram, 0.75) == pytest.approx(1.5)
    assert histogram_quantile(histogram, 1.0) == pytest.approx(2.0)
    # Observations above the last bound: the last finite bound (PromQL's answer).
    above = histogram_of([10.0] * 4, (1.0, 2.0))
    assert histogram_quantile(above, 0.5) == 2.0
    assert math.isnan(histogram_quantile(HistogramWindow((1.0,), (0.0, 0.0), 0.0, 0.0), 0.5))


def _window(histograms: dict[str, HistogramWindow]) -> RealWindow:
    empty = histogram_of([], (1.0,))
    return RealWindow(512, 1.0, Workload("w", ()), 1.0, {}, WorkloadWindow(1.0, empty, empty), histograms)


def test_quantiles_and_ingest_come_from_the_engines_histograms() -> None:
    itl = histogram_of([0.002] * 98 + [0.05] * 2, names.FINE_ITL_BUCKETS)
    ttft = histogram_of([0.030] * 10, names.FINE_TTFT_BUCKETS)
    queue = histogram_of([0.005] * 10, (0.01, 0.1))
    prefill = histogram_of([0.015] * 10, (0.01, 0.1))
    window = _window(
        {
            names.FINE_INTER_TOKEN_LATENCY: itl,
            names.FINE_TIME_TO_FIRST_TOKEN: ttft,
            names.REQUEST_QUEUE_TIME: queue,
            names.REQUEST_PREFILL_TIME: prefill,
        }
    )
    measured = window.measured
    assert 1.0 < measured.itl_p50_ms <= 2.0 + 1e-9
    assert 48.0 < measured.itl_p99_ms <= 52.0
    assert 20.0 < measured.ttft_p50_ms <= 30.0 + 1e-9
    # Arrival to the engine core's queue: the mean TTFT less vLLM's queue and prefill times.
    assert window.ingest_s == pytest.approx(0.010)
    # Without vLLM's parts there is nothing to subtract from: no ingest time.
    assert _window({names.FINE_TIME_TO_FIRST_TOKEN: ttft}).ingest_s == 0.0
    assert math.isnan(measured_quantiles({}).itl_p50_ms)


def test_latency_histograms_read_an_exposition() -> None:
    text = EngineMetrics("tiny").render()
    histograms = latency_histograms(text)
    assert names.FINE_INTER_TOKEN_LATENCY in histograms
    assert histograms[names.FINE_INTER_TOKEN_LATENCY].bounds == names.FINE_ITL_BUCKETS
    assert names.REQUEST_QUEUE_TIME in histograms


def test_request_plans_are_reproducible_and_in_range() -> None:
    pairs = lengths(200, 3, (32, 1536), (8, 64))
    assert pairs == lengths(200, 3, (32, 1536), (8, 64))
    assert all(32 <= p <= 1536 and 8 <= o <= 64 for p, o in pairs)
    workload = poisson_requests(pairs, 4.0, 1)
    arrivals = [r.arrival_s for r in workload.requests]
    assert arrivals[0] == 0.0 and arrivals == sorted(arrivals)
    assert (len(arrivals) - 1) / arrivals[-1] == pytest.approx(4.0, rel=0.2)
    assert [(r.prompt_tokens, r.output_tokens) for r in workload.requests] == pairs


def test_the_cpu_profile_is_a_prior_for_the_cpu_engine() -> None:
    cpu = load_accelerator("generic-cpu")
    assert cpu.peak_flops < load_accelerator("l40s").peak_flops / 100
    assert cpu.memory_bytes >= 8 * 2**30
