"""The roofline fit recovers known efficiency factors from synthetic curves (pure, no torch)."""

from __future__ import annotations

import random

import pytest
from chunkpilot.engine.probe.fit import (
    CostPoint,
    FitError,
    first_tokens_where,
    fit_roofline,
    largest_tokens_within,
)
from chunkpilot.engine.probe.roofline import ModelShape, linear_cost, shard_shapes

H200_FLOPS = 989e12
H200_BANDWIDTH = 4.8e12
TOKENS = [2**i for i in range(15)]

LLAMA_8B = ModelShape(
    name="llama-3.1-8b",
    hidden_size=4096,
    num_layers=32,
    num_attention_heads=32,
    num_kv_heads=8,
    head_dim=128,
    intermediate_size=14336,
)


def synthetic_curve(
    e_c: float, e_b: float, overhead_ms: float, noise: float = 0.0, seed: int = 7
) -> list[CostPoint]:
    """Llama-3.1-8B layer projections on an H200 following the roofline exactly (times optional noise)."""
    rng = random.Random(seed)
    linears = shard_shapes(LLAMA_8B, 1).linears
    points = []
    for tokens in TOKENS:
        flops, moved = linear_cost(linears, tokens, 2)
        ms = max(flops / (H200_FLOPS * e_c), moved / (H200_BANDWIDTH * e_b)) * 1000 + overhead_ms
        points.append(CostPoint(flops, moved, ms * (1 + rng.gauss(0, noise))))
    return points


@pytest.mark.parametrize(
    ("e_c", "e_b", "overhead_ms"), [(0.75, 0.70, 0.012), (0.5, 0.9, 0.0), (0.9, 0.4, 0.05)]
)
def test_noise_free_curve_is_recovered_exactly(e_c: float, e_b: float, overhead_ms: float) -> None:
    fit = fit_roofline(synthetic_curve(e_c, e_b, overhead_ms), H200_FLOPS, H200_BANDWIDTH)
    assert fit.compute_efficiency == pytest.approx(e_c, rel=1e-6)
    assert fit.bandwidth_efficiency == pytest.approx(e_b, rel=1e-6)
    assert fit.overhead_ms == pytest.approx(overhead_ms, abs=1e-9)
    assert fit.rms_relative_error < 1e-9
    assert fit.compute_bound_points > 0
    assert fit.bandwidth_bound_points > 0
    assert fit.compute_bound_points + fit.bandwidth_bound_points == len(TOKENS)


def test_noisy_curve_is_recovered_within_a_few_percent() -> None:
    fit = fit_roofline(synthetic_curve(0.75, 0.70, 0.012, noise=0.02), H200_FLOPS, H200_BANDWIDTH)
    assert fit.compute_efficiency == pytest.approx(0.75, rel=0.05)
    assert fit.bandwidth_efficiency == pytest.approx(0.70, rel=0.05)
    assert 0.0 <= fit.overhead_ms < 0.03
    assert 0.005 < fit.rms_relative_error < 0.05


def test_efficiencies_are_relative_to_the_given_peaks() -> None:
    points = synthetic_curve(0.75, 0.70, 0.012)
    fit = fit_roofline(points, H200_FLOPS / 2, H200_BANDWIDTH / 2)
    assert fit.compute_efficiency == pytest.approx(1.5, rel=1e-6)
    assert fit.bandwidth_efficiency == pytest.approx(1.4, rel=1e-6)


def test_predictions_match_the_fitted_form() -> None:
    points = synthetic_curve(0.75, 0.70, 0.012)
    fit = fit_roofline(points, H200_FLOPS, H200_BANDWIDTH)
    for p in points:
        assert fit.predict_ms(p.flops, p.bytes) == pytest.approx(p.ms, rel=1e-9)
    small, large = points[0], points[-1]
    assert not fit.is_compute_bound(small.flops, small.bytes)
    assert fit.is_compute_bound(large.flops, large.bytes)


def test_points_from_one_regime_still_fit_exactly() -> None:
    # 1..16 tokens are all bandwidth-bound on an H200: time is affine in the token count, which either
    # regime plus the overhead explains, so the split is not identified; the fit must still match.
    points = synthetic_curve(0.75, 0.70, 0.012)[:5]
    fit = fit_roofline(points, H200_FLOPS, H200_BANDWIDTH)
    assert fit.rms_relative_error < 1e-6
    for p in points:
        assert fit.predict_ms(p.flops, p.bytes) == pytest.approx(p.ms, rel=1e-6)


def test_too_few_or_bad_points_are_rejected_with_a_reason() -> None:
    points = synthetic_curve(0.75, 0.70, 0.012)
    with pytest.raises(FitError, match="at least 3"):
        fit_roofline(points[:2], H200_FLOPS, H200_BANDWIDTH)
    with pytest.raises(FitError, match="positive finite"):
        fit_roofline([*points[:3], CostPoint(1.0, 1.0, 0.0)], H200_FLOPS, H200_BANDWIDTH)
    with pytest.raises(FitError, match="peaks must be positive"):
        fit_roofline(points, 0.0, H200_BANDWIDTH)


def test_timings_that_shrink_with_work_cannot_be_fitted() -> None:
    points = [CostPoint(10.0**k, 10.0**k, 10.0 / k) for k in range(1, 6)]
    with pytest.raises(FitError, match="grow with work"):
        fit_roofline(points, 1e12, 1e12)


def test_token_searches() -> None:
    assert first_tokens_where(lambda m: m >= 300) == 300
    assert first_tokens_where(lambda m: True) == 1
    assert first_tokens_where(lambda m: False, max_tokens=1024) is None
    assert largest_tokens_within(lambda m: 0.01 * m, 5.0) == 500
    assert largest_tokens_within(lambda m: 10.0 + m, 5.0) is None
    assert largest_tokens_within(lambda m: 1.0, 5.0, max_tokens=4096) == 4096
