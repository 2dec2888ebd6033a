"""Fit roofline efficiency factors to measured timings (pure, no torch).

The model explains a kernel's time as the slower of its compute and its memory
traffic plus a fixed cost::

    ms = max(flops / (peak_flops · e_c), bytes / (peak_bandwidth · e_b)) · 1000 + c

The three unknowns (``e_c`` and ``e_b`` on a log scale, ``c >= 0``) are fitted by the shared
step-time fitting core (:mod:`chunkpilot.engine.stepfit`). The max makes the problem piecewise
linear, so the fit starts from every regime split: a point is compute-bound exactly when its
arithmetic intensity (flops / bytes) is at least ``e_b``'s rate over ``e_c``'s, so sorting the points
by intensity and splitting them gives every assignment there is, and with the assignment fixed the
model is linear (one small least-squares solve per split). The core's solver refines the max-form
from each start; the best fit wins.

Residuals are relative (weighted by 1 / measured ms): timings span four orders of
magnitude between one token and sixteen thousand, and an absolute fit would ignore
the small-batch points that matter most for decode.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from chunkpilot.engine.stepfit import (
    FloatArray,
    LeastSquaresFit,
    Parameter,
    StepFitError,
    relative_errors,
    solve,
)

__all__ = [
    "CostPoint",
    "FitError",
    "RooflineFit",
    "first_tokens_where",
    "fit_roofline",
    "largest_tokens_within",
]

#: Efficiencies are fitted within these factors of the given peaks; both ending on the upper bound
#: means both times vanished from the fit (the timings do not grow with the work).
EFFICIENCY_BOUNDS = (1e-6, 1e6)


class FitError(StepFitError):
    """The points cannot be fitted (too few, or non-positive values)."""


@dataclass(frozen=True)
class CostPoint:
    """One measurement: the work of a kernel and how long it took."""

    flops: float
    bytes: float
    ms: float

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes


@dataclass(frozen=True)
class RooflineFit:
    """Fitted efficiency factors relative to the given peaks."""

    peak_flops: float
    peak_bandwidth: float
    compute_efficiency: float
    bandwidth_efficiency: float
    overhead_ms: float
    rms_relative_error: float
    compute_bound_points: int
    bandwidth_bound_points: int

    def compute_ms(self, flops: float) -> float:
        return 1000.0 * flops / (self.peak_flops * self.compute_efficiency)

    def memory_ms(self, moved_bytes: float) -> float:
        return 1000.0 * moved_bytes / (self.peak_bandwidth * self.bandwidth_efficiency)

    def predict_ms(self, flops: float, moved_bytes: float) -> float:
        """Predicted time of a kernel doing ``flops`` over ``moved_bytes``."""
        return max(self.compute_ms(flops), self.memory_ms(moved_bytes)) + self.overhead_ms

    def is_compute_bound(self, flops: float, moved_bytes: float) -> bool:
        return self.compute_ms(flops) >= self.memory_ms(moved_bytes)


class _Roofline:
    """The model of the points: predicted ms from (compute efficiency, bandwidth efficiency, overhead)."""

    def __init__(self, points: Sequence[CostPoint], peak_flops: float, peak_bandwidth: float) -> None:
        self.flops = np.array([p.flops for p in points], dtype=np.float64)
        self.bytes = np.array([p.bytes for p in points], dtype=np.float64)
        self.ms = np.array([p.ms for p in points], dtype=np.float64)
        self.peak_flops, self.peak_bandwidth = peak_flops, peak_bandwidth

    def compute_ms(self, compute_efficiency: float) -> FloatArray:
        times: FloatArray = 1000.0 * self.flops / (self.peak_flops * compute_efficiency)
        return times

    def memory_ms(self, bandwidth_efficiency: float) -> FloatArray:
        times: FloatArray = 1000.0 * self.bytes / (self.peak_bandwidth * bandwidth_efficiency)
        return times

    def predict_ms(self, params: FloatArray) -> FloatArray:
        compute_efficiency, bandwidth_efficiency, overhead_ms = params
        predicted: FloatArray = (
            np.maximum(self.compute_ms(compute_efficiency), self.memory_ms(bandwidth_efficiency))
            + overhead_ms
        )
        return predicted

    def residuals(self, params: FloatArray) -> FloatArray:
        return relative_errors(self.predict_ms(params), self.ms)

    def starts(self) -> list[tuple[Parameter, ...]]:
        """One start per regime split of the points sorted by arithmetic intensity.

        A point is compute-bound exactly when its intensity is at least the ratio of the two rates,
        so the splits are the only assignments there are. With the assignment fixed the model is
        linear in the two rates and the overhead: each start is that weighted linear fit (refitted
        without the overhead if it comes out negative); a split whose fit needs a non-positive rate
        gives no start. An empty side starts a thousand times faster than every point needs (never
        binding); the solver then fits the max-form from each start.
        """
        order = np.argsort(self.flops / self.bytes, kind="stable")
        starts = []
        for split in range(order.size + 1):
            compute = np.zeros(order.size, dtype=bool)
            compute[order[split:]] = True
            rates = self._split_fit(compute)
            if rates is not None:
                a, b, overhead = rates
                starts.append(
                    self.parameters(
                        1000.0 / (a * self.peak_flops), 1000.0 / (b * self.peak_bandwidth), overhead
                    )
                )
        return starts

    def _split_fit(self, compute: npt.NDArray[np.bool_]) -> tuple[float, float, float] | None:
        """``(ms per FLOP, ms per byte, overhead ms)`` of the linear fit with this assignment."""
        columns = []
        if compute.any():
            columns.append(np.where(compute, self.flops, 0.0))
        if not compute.all():
            columns.append(np.where(compute, 0.0, self.bytes))
        for with_overhead in (True, False):
            design = np.column_stack([*columns, np.ones_like(self.ms)] if with_overhead else columns)
            design = design / self.ms[:, None]  # relative residuals
            scale = np.linalg.norm(design, axis=0)
            solution = np.linalg.lstsq(design / scale, np.ones_like(self.ms), rcond=None)[0] / scale
            overhead = float(solution[-1]) if with_overhead else 0.0
            if overhead >= 0.0:
                break
        rates = iter(solution)
        a = float(next(rates)) if compute.any() else 1e-3 * float(np.min(self.ms / self.flops))
        b = float(next(rates)) if not compute.all() else 1e-3 * float(np.min(self.ms / self.bytes))
        return (a, b, overhead) if a > 0 and b > 0 else None

    @staticmethod
    def parameters(compute: float, bandwidth: float, overhead_ms: float) -> tuple[Parameter, ...]:
        """The unknowns, starting at these values."""
        low, high = EFFICIENCY_BOUNDS
        return (
            Parameter("compute_efficiency", min(max(compute, low), high), low, high, log=True),
            Parameter("bandwidth_efficiency", min(max(bandwidth, low), high), low, high, log=True),
            Parameter("overhead_ms", overhead_ms, lower=0.0),
        )


def fit_roofline(points: Sequence[CostPoint], peak_flops: float, peak_bandwidth: float) -> RooflineFit:
    """Least-squares fit of compute efficiency, bandwidth efficiency and fixed overhead.

    ``peak_flops`` is in FLOP/s and ``peak_bandwidth`` in bytes/s; the efficiencies
    are relative to them (so they may exceed 1 when the peaks are underestimates).
    Needs at least three points; both efficiencies are only identified when the
    points span both regimes (``compute_bound_points`` and ``bandwidth_bound_points``
    say how many fell on each side; an unidentified one is set to the least favourable
    value consistent with the others: the slowest rate that still leaves no point bound by it).
    """
    if len(points) < 3:
        raise FitError(f"need at least 3 measured points to fit 3 parameters, got {len(points)}")
    for p in points:
        if not (p.flops > 0 and p.bytes > 0 and p.ms > 0) or not all(
            math.isfinite(v) for v in (p.flops, p.bytes, p.ms)
        ):
            raise FitError(f"every point needs positive finite flops, bytes and ms, got {p}")
    if not (peak_flops > 0 and peak_bandwidth > 0):
        raise FitError(
            f"peaks must be positive, got peak_flops={peak_flops}, peak_bandwidth={peak_bandwidth}"
        )
    model = _Roofline(points, peak_flops, peak_bandwidth)
    starts = model.starts()
    if not starts:
        raise FitError("no regime split gives positive efficiencies; check that the timings grow with work")
    try:
        solution = min((_solve(model, start) for start in starts), key=lambda fit: fit.cost)
    except StepFitError as error:
        raise FitError(str(error)) from error
    if solution.at_bound[0] and solution.at_bound[1]:
        raise FitError(
            "the fitted compute and memory times both vanish; check that the timings grow with work"
        )
    compute_efficiency, bandwidth_efficiency, overhead_ms = (float(v) for v in solution.values)
    compute_bound = model.compute_ms(compute_efficiency) >= model.memory_ms(bandwidth_efficiency)
    # An unidentified rate is set to the least favourable value consistent with the assignment.
    if not compute_bound.any():
        compute_efficiency = float(np.max(model.compute_ms(1.0) / model.memory_ms(bandwidth_efficiency)))
    elif compute_bound.all():
        bandwidth_efficiency = float(np.max(model.memory_ms(1.0) / model.compute_ms(compute_efficiency)))
    compute_bound = model.compute_ms(compute_efficiency) >= model.memory_ms(bandwidth_efficiency)
    n_compute = int(np.count_nonzero(compute_bound))
    return RooflineFit(
        peak_flops=peak_flops,
        peak_bandwidth=peak_bandwidth,
        compute_efficiency=compute_efficiency,
        bandwidth_efficiency=bandwidth_efficiency,
        overhead_ms=overhead_ms,
        rms_relative_error=solution.rms,
        compute_bound_points=n_compute,
        bandwidth_bound_points=len(points) - n_compute,
    )


def _solve(model: _Roofline, start: tuple[Parameter, ...]) -> LeastSquaresFit:
    return solve(
        model.residuals,
        start,
        max_iterations=500,
        cost_tolerance=0.0,
        step_tolerance=1e-12,
    )


def first_tokens_where(predicate: Callable[[int], bool], max_tokens: int = 1 << 24) -> int | None:
    """Smallest token count in [1, max_tokens] where a monotone (False…True) predicate holds."""
    if predicate(1):
        return 1
    if not predicate(max_tokens):
        return None
    low, high = 1, max_tokens  # predicate(low) is False, predicate(high) is True
    while high - low > 1:
        mid = (low + high) // 2
        if predicate(mid):
            high = mid
        else:
            low = mid
    return high


def largest_tokens_within(
    predict_ms: Callable[[int], float], limit_ms: float, max_tokens: int = 1 << 24
) -> int | None:
    """Largest token count whose (monotone increasing) predicted time stays within ``limit_ms``.

    None when even a single token exceeds the limit; ``max_tokens`` when nothing does.
    """
    first_over = first_tokens_where(lambda m: predict_ms(m) > limit_ms, max_tokens)
    if first_over is None:
        return max_tokens
    return first_over - 1 if first_over > 1 else None
