"""Client-side latency summaries."""

from __future__ import annotations

import math

import pytest

from chunkpilot.localrun.stats import Distribution, RequestRecord, quantile, summarise


def test_quantile_interpolates_between_ranks() -> None:
    values = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert quantile(values, 0.0) == 1.0
    assert quantile(values, 0.5) == 3.0
    assert quantile(values, 0.9) == pytest.approx(4.6)
    assert quantile(values, 1.0) == 5.0
    assert math.isnan(quantile([], 0.5))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        quantile(values, 1.5)


def test_distribution_converts_seconds_to_scaled_milliseconds() -> None:
    dist = Distribution.of_seconds([0.010, 0.020], scale=10.0)
    assert dist.count == 2
    assert dist.max == pytest.approx(200.0)
    assert dist.p50 == pytest.approx(150.0)


def test_summary_counts_outcomes_and_scales_rates_to_engine_time() -> None:
    ok = RequestRecord(0, 0.0, 100, 3, pod="p1", track="stable", ttft_s=0.1, itl_s=[0.01, 0.02], e2e_s=0.13)
    ok.output_tokens = 3
    canary = RequestRecord(1, 0.1, 100, 3, pod="p2", track="canary", ttft_s=0.2, itl_s=[0.03], e2e_s=0.3)
    canary.output_tokens = 2
    failed = RequestRecord(2, 0.2, 100, 3, error="no_ready_endpoint: none")
    summary = summarise([ok, canary, failed], duration_s=1.0, time_scale=2.0)
    assert (summary.requests, summary.completed, summary.failed) == (3, 2, 1)
    assert summary.errors == {"no_ready_endpoint": 1}
    assert summary.by_track == {"stable": 1, "canary": 1}
    assert summary.output_tokens == 5
    assert summary.throughput_tok_s == pytest.approx(2.5)  # 5 tokens over 2 engine seconds
    assert summary.itl_ms.count == 3
    assert summary.ttft_ms.max == pytest.approx(400.0)
    assert "3 completed" not in summary.format() and "2 completed" in summary.format()
    assert summary.to_dict()["ttft_ms"]["count"] == 2
