"""Fit roofline efficiency factors to measured timings (pure, no torch).

The model explains a kernel's time as the slower of its compute and its memory
traffic plus a fixed cost::

    ms = max(flops / (peak_flops · e_c), bytes / (peak_bandwidth · e_b)) · 1000 + c

With ``a = 1000 / (peak_flops · e_c)`` and ``b = 1000 / (peak_bandwidth · e_b)``
the model is linear in ``(a, b, c)`` once each point is assigned to a regime, and
the regime is decided by the point's arithmetic intensity (flops / bytes) alone:
a point is compute-bound exactly when its intensity is at least ``b / a``. So the
global least-squares optimum is found by trying every split of the points sorted by
intensity, solving a small weighted linear least-squares problem per split and
keeping the parameters whose *max-form* residual is smallest.

Residuals are relative (weighted by 1 / measured ms): timings span four orders of
magnitude between one token and sixteen thousand, and an absolute fit would ignore
the small-batch points that matter most for decode.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = [
    "CostPoint",
    "FitError",
    "RooflineFit",
    "first_tokens_where",
    "fit_roofline",
    "largest_tokens_within",
]


class FitError(ValueError):
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


@dataclass(frozen=True)
class _Params:
    a: float  # ms per FLOP
    b: float  # ms per byte
    c: float  # ms


def _solve_least_squares(rows: list[list[float]], targets: list[float]) -> list[float] | None:
    """Solve min ||R x - t|| through the normal equations with column scaling; None if singular."""
    n = len(rows[0])
    scale = [math.sqrt(sum(r[j] * r[j] for r in rows)) or 1.0 for j in range(n)]
    scaled = [[r[j] / scale[j] for j in range(n)] for r in rows]
    ata = [[sum(r[i] * r[j] for r in scaled) for j in range(n)] for i in range(n)]
    atb = [sum(r[i] * t for r, t in zip(scaled, targets, strict=True)) for i in range(n)]
    # Gaussian elimination with partial pivoting on the augmented matrix.
    m = [[*row, rhs] for row, rhs in zip(ata, atb, strict=True)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-12:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [x - f * y for x, y in zip(m[r], m[col], strict=True)]
    return [m[i][n] / m[i][i] / scale[i] for i in range(n)]


def _solve_split(points: Sequence[CostPoint], compute: Sequence[bool]) -> _Params | None:
    """Weighted least squares for a fixed regime assignment; None when infeasible."""
    has_c = any(compute)
    has_b = not all(compute)
    for with_overhead in (True, False):
        rows: list[list[float]] = []
        for p, is_c in zip(points, compute, strict=True):
            row: list[float] = []
            if has_c:
                row.append(p.flops / p.ms if is_c else 0.0)
            if has_b:
                row.append(0.0 if is_c else p.bytes / p.ms)
            if with_overhead:
                row.append(1.0 / p.ms)
            rows.append(row)
        solution = _solve_least_squares(rows, [1.0] * len(points))
        if solution is None:
            continue
        values = iter(solution)
        a = next(values) if has_c else math.nan
        b = next(values) if has_b else math.nan
        c = next(values) if with_overhead else 0.0
        if c < 0.0:
            continue  # refit without the overhead term (clamped at zero)
        if (has_c and a <= 0.0) or (has_b and b <= 0.0):
            return None
        # An unidentified slope is set to the least favourable value consistent with the assignment.
        if not has_c:
            a = min(b * p.bytes / p.flops for p in points)
        if not has_b:
            b = min(a * p.flops / p.bytes for p in points)
        return _Params(a=a, b=b, c=c)
    return None


def _relative_residuals(points: Sequence[CostPoint], params: _Params) -> list[float]:
    return [(max(params.a * p.flops, params.b * p.bytes) + params.c - p.ms) / p.ms for p in points]


def fit_roofline(points: Sequence[CostPoint], peak_flops: float, peak_bandwidth: float) -> RooflineFit:
    """Least-squares fit of compute efficiency, bandwidth efficiency and fixed overhead.

    ``peak_flops`` is in FLOP/s and ``peak_bandwidth`` in bytes/s; the efficiencies
    are relative to them (so they may exceed 1 when the peaks are underestimates).
    Needs at least three points; both efficiencies are only identified when the
    points span both regimes (``compute_bound_points`` and ``bandwidth_bound_points``
    say how many fell on each side).
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

    ordered = sorted(points, key=lambda p: p.intensity)
    best: tuple[float, _Params] | None = None
    for split in range(len(ordered) + 1):
        compute = [i >= split for i in range(len(ordered))]
        params = _solve_split(ordered, compute)
        if params is None:
            continue
        sse = sum(r * r for r in _relative_residuals(ordered, params))
        if best is None or sse < best[0]:
            best = (sse, params)
    if best is None:
        raise FitError("no regime split gives positive efficiencies; check that the timings grow with work")
    sse, params = best
    n_compute = sum(1 for p in ordered if params.a * p.flops >= params.b * p.bytes)
    return RooflineFit(
        peak_flops=peak_flops,
        peak_bandwidth=peak_bandwidth,
        compute_efficiency=1000.0 / (params.a * peak_flops),
        bandwidth_efficiency=1000.0 / (params.b * peak_bandwidth),
        overhead_ms=params.c,
        rms_relative_error=math.sqrt(sse / len(ordered)),
        compute_bound_points=n_compute,
        bandwidth_bound_points=len(ordered) - n_compute,
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
