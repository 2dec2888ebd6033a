"""Fit the twin's step-time model to an engine's step telemetry (pure, numpy only).

The model has two layers.

* **A roofline with seven unknowns**: the simulator's own step-time model
  (:class:`~chunkpilot.engine.sim.steptime.StepTimeModel`) for the service's model on the datasheet
  accelerator, with how far the engine's linear layers fall short of the datasheet's compute and
  memory bandwidth (``compute``, ``memory``), how far attention and the element-wise kernels fall
  short *of the linear layers* (``attention_compute``, ``attention_memory``, ``elementwise``: the
  datasheet's ratios are 1) and how large its fixed costs are (``step_overhead`` per step,
  ``sequence_overhead`` per sequence). Each scheduled-token bucket of the telemetry gives one point:
  the mean step time against the mean batch shape. The scales are the maximum a posteriori estimate
  of relative residuals weighted by each bucket's step count, under log-normal priors centred on the
  datasheet; the solver is the shared step-time fitting core (:mod:`chunkpilot.engine.stepfit`),
  whose covariance says how well the telemetry pins each scale.
* **Measured buckets over the roofline** (semi-parametric): what the fitted roofline still misses in
  an observed bucket is kept, shrunk by how many steps measured it (:data:`STRUCTURE_SIGMA` against
  the bucket mean's own error), as a correction of the linear-layer time at that token count. Between
  observed counts the correction is interpolated; beyond them it fades out within
  :data:`FADE_OCTAVES`, leaving the roofline to extrapolate. A truth whose kernels do not follow the
  roofline's shape is followed where it was measured.

The uncertainty of both layers is carried to each prediction: :meth:`TwinFit.step_sigma` is the
relative standard error of a step's time at a token count (the scales' covariance through the
roofline, plus the correction's own error, growing beyond the observed counts).

The result is a ``chunkpilot.io/step-profile/v1`` document the simulator loads with ``--step-profile``
(linear-layer times tabulated from the fitted roofline and its corrections, the fitted efficiencies as
overrides), so the twin is the simulator itself, not a second model.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt
from chunkpilot.engine import metrics_names as names
from chunkpilot.engine.sim.metrics import StepTotals
from chunkpilot.engine.sim.profiles.loader import Accelerator, ModelProfile, load_accelerator, load_model
from chunkpilot.engine.sim.steptime import (
    MAX_STEP_LOG_SIGMA,
    STEP_PROFILE_SCHEMA,
    Efficiency,
    StepProfile,
    StepTimeModel,
)
from chunkpilot.engine.stepfit import Parameter, StepFitError, relative_errors, solve, weighted_rms

__all__ = [
    "MIN_STEPS",
    "BucketCorrection",
    "Scales",
    "TwinFit",
    "TwinFitError",
    "fit_steps",
    "scaled_efficiency",
    "time_ratio",
]

FloatArray = npt.NDArray[np.float64]

#: Fewer steps than this in the window: no fit (the caller waits for more telemetry).
MIN_STEPS: Final = 50
#: Relative spread of single step times within a bucket, and the floor of a bucket mean's relative
#: error (the model evaluates the bucket's mean shape, not each step): ``sigma_b**2 = CV**2 / n_b +
#: FLOOR**2``.
STEP_TIME_CV: Final = 0.1
MODEL_ERROR_FLOOR: Final = 0.005
#: Prior standard deviations of the log scales (in the order of :class:`Scales`): the datasheet is
#: trusted to a factor e**0.5 ~ 1.6 for the linear layers' compute and memory, e**0.3 ~ 1.35 for the
#: ratios of attention and element-wise kernels to them (wider let them trade against the linear
#: scales on truths of the roofline's own shape), e**1 ~ 2.7 for the overheads (software, not silicon).
PRIOR_SIGMA: Final = (0.5, 0.5, 1.0, 1.0, 0.3, 0.3, 0.3)
#: Prior standard deviation of a bucket's log step time around the fitted roofline: how far a real
#: engine's kernels may stray from the roofline's shape at one token count (tile quantisation, the
#: attention backend, CUDA graphs). The bucket's correction is shrunk by this against its own error.
STRUCTURE_SIGMA: Final = 0.15
#: Octaves of token count beyond the observed buckets over which their corrections fade to none.
FADE_OCTAVES: Final = 1.0
#: A correction may scale a token count's linear-layer time by at most this factor either way.
MAX_LINEAR_CORRECTION: Final = 4.0

_ELEMENTWISE_FIELDS = (
    "norm_memory",
    "rope_memory",
    "activation_memory",
    "residual_add_memory",
    "embedding_memory",
)
#: Efficiencies a slowed profile divides, and fixed costs it multiplies (:meth:`TwinFit.profile_document`).
_SLOWED_EFFICIENCIES = (
    "gemm_compute",
    "gemm_memory",
    "attention_compute",
    "attention_memory",
    *_ELEMENTWISE_FIELDS,
)
_SLOWED_COSTS = ("gemm_floor_s", "elementwise_floor_s", "step_overhead_s", "per_sequence_overhead_s")
#: Token counts of the fitted profile's ``linear_ms`` table (log-log interpolated by the simulator).
PROFILE_TOKENS: Final[tuple[int, ...]] = (*names.STEP_TOKEN_BUCKETS, 49152, 65536)


class TwinFitError(StepFitError):
    """The telemetry cannot be fitted (too few steps, or none with a positive duration)."""


@dataclass(frozen=True, slots=True)
class Scales:
    """The engine relative to its datasheet: 1.0 everywhere is the datasheet roofline.

    ``compute`` and ``memory`` scale the linear layers' efficiencies; ``attention_compute``,
    ``attention_memory`` and ``elementwise`` scale attention's and the element-wise kernels'
    efficiencies *relative to the linear layers'* (an engine slower in every kernel alike has them
    at 1); the overheads scale the per-step and per-sequence fixed costs.
    """

    compute: float = 1.0
    memory: float = 1.0
    step_overhead: float = 1.0
    sequence_overhead: float = 1.0
    attention_compute: float = 1.0
    attention_memory: float = 1.0
    elementwise: float = 1.0

    def as_array(self) -> FloatArray:
        return np.array([getattr(self, f.name) for f in fields(self)], dtype=np.float64)

    @classmethod
    def from_array(cls, values: FloatArray) -> Scales:
        return cls(*(float(v) for v in values))


def scaled_efficiency(base: Efficiency, scales: Scales) -> Efficiency:
    """``base`` with compute, memory and overhead terms scaled (a slower engine has smaller scales)."""
    changes: dict[str, float] = {
        "gemm_compute": base.gemm_compute * scales.compute,
        "attention_compute": base.attention_compute * scales.compute * scales.attention_compute,
        "gemm_memory": base.gemm_memory * scales.memory,
        "attention_memory": base.attention_memory * scales.memory * scales.attention_memory,
    }
    changes.update(
        {name: getattr(base, name) * scales.memory * scales.elementwise for name in _ELEMENTWISE_FIELDS}
    )
    changes["step_overhead_s"] = base.step_overhead_s * scales.step_overhead
    changes["per_sequence_overhead_s"] = base.per_sequence_overhead_s * scales.sequence_overhead
    return replace(base, **changes)


@dataclass(frozen=True, slots=True)
class BucketCorrection:
    """What the fitted roofline misses at one observed token count, kept as measured.

    ``log_ratio`` is the shrunk log of measured over predicted step time at the bucket's mean shape,
    ``sigma`` its standard error (log scale), ``linear_factor`` the same correction expressed on the
    linear layers' time at ``tokens`` (what the step profile tabulates).
    """

    tokens: float
    steps: float
    log_ratio: float
    sigma: float
    linear_factor: float


@dataclass(frozen=True, slots=True)
class _Point:
    """One bucket: its step count, mean step time and mean batch shape."""

    steps: float
    mean_s: float
    tokens: float
    sequences: float
    sampled: float
    pairs: float
    prefill_context: float
    decode_context: float


def _points(telemetry: Mapping[str, StepTotals]) -> list[_Point]:
    points: list[_Point] = []
    for totals in telemetry.values():
        if totals.steps < 1 or totals.duration_s <= 0:
            continue
        points.append(
            _Point(
                steps=totals.steps,
                mean_s=totals.duration_s / totals.steps,
                tokens=totals.mean_tokens,
                sequences=totals.mean("sequences"),
                sampled=totals.mean("sampled_sequences"),
                pairs=totals.mean("prefill_attention_pairs"),
                prefill_context=totals.mean("prefill_context_tokens"),
                decode_context=totals.mean("decode_context_tokens"),
            )
        )
    return points


def _interpolated(function: Any, x: float) -> float:
    low = max(1, math.floor(x))
    high = max(1, math.ceil(x))
    if low == high:
        return float(function(low))
    weight = x - low
    return float((1 - weight) * function(low) + weight * function(high))


def predict_mean_step(model: StepTimeModel, point: _Point) -> float:
    """Step time of the bucket's mean batch shape under ``model``."""
    eff = model.efficiency
    return (
        _interpolated(model.linear_time, point.tokens)
        + _interpolated(model.elementwise_time, point.tokens)
        + _interpolated(model.allreduce_time, point.tokens)
        + (_interpolated(model.lm_head_time, point.sampled) if point.sampled >= 1 else 0.0)
        + eff.step_overhead_s
        + eff.per_sequence_overhead_s * point.sequences
        + model.prefill_attention_time(point.pairs, round(point.prefill_context))
        + model.decode_attention_time(round(point.decode_context))
    )


def time_ratio(fit: TwinFit, telemetry: Mapping[str, StepTotals]) -> float:
    """The telemetry's step time over what ``fit`` predicts for the same batches (nan: no steps).

    1 where the fitted model describes the engine that stepped; a pool on slower hardware, or on a
    busier node, reads above it.
    """
    model = fit.step_model()
    points = _points(telemetry)
    predicted = sum(p.steps * predict_mean_step(model, p) for p in points)
    measured = sum(p.steps * p.mean_s for p in points)
    return measured / predicted if predicted > 0 else math.nan


@dataclass(frozen=True, slots=True)
class TwinFit:
    """A fitted step-time model: datasheet scales, measured corrections, and how well they explain
    the telemetry."""

    model: str
    accelerator: str
    tensor_parallel_size: int
    scales: Scales
    steps: float
    buckets: int
    rms_relative_error: float
    prior_rms_relative_error: float
    iterations: int
    #: What the fitted roofline misses at each observed token count (ascending tokens).
    corrections: tuple[BucketCorrection, ...] = ()
    #: Covariance of the log scales (rows and columns in the order of :class:`Scales`).
    log_covariance: tuple[tuple[float, ...], ...] = ()
    #: Spread of single step times beyond the model's own, ``(tokens, log sigma)`` ascending
    #: (:func:`step_spread`); written to the profile only when asked (:meth:`profile_document`).
    dispersion: tuple[tuple[int, float], ...] = ()

    def efficiency(self) -> Efficiency:
        """The fitted efficiency constants (relative to the datasheet of ``accelerator``)."""
        return scaled_efficiency(Efficiency.calibrated(), self.scales)

    def roofline(self) -> StepTimeModel:
        """The fitted roofline alone, without the measured corrections."""
        return StepTimeModel(
            load_model(self.model),
            load_accelerator(self.accelerator),
            self.tensor_parallel_size,
            efficiency=self.efficiency(),
        )

    def step_model(self) -> StepTimeModel:
        """The fitted model as the simulator runs it: the roofline with the corrections tabulated."""
        return StepTimeModel(
            load_model(self.model),
            load_accelerator(self.accelerator),
            self.tensor_parallel_size,
            step_profile=StepProfile.from_dict(self.profile_document(), source="twin fit"),
        )

    def observed_tokens(self) -> tuple[float, float] | None:
        """The smallest and largest mean token count of the buckets the fit has seen."""
        if not self.corrections:
            return None
        return self.corrections[0].tokens, self.corrections[-1].tokens

    def linear_factor(self, tokens: float) -> float:
        """The correction of the roofline's linear-layer time at ``tokens`` (1: none)."""
        log_factor, _sigma = self._correction_at(tokens)
        return math.exp(log_factor)

    def step_sigma(self, tokens: float) -> float:
        """Relative standard error of the predicted time of a step of ``tokens`` scheduled tokens.

        The scales' uncertainty through the roofline (at a representative shape: up to 64 sequences
        sampled, the rest prefill) plus that of the measured correction, which beyond the observed
        token counts grows back to :data:`STRUCTURE_SIGMA` (the roofline's shape is a guess there).
        """
        _log_factor, correction_sigma = self._correction_at(tokens)
        parametric = 0.0
        if self.log_covariance:
            covariance = np.array(self.log_covariance, dtype=np.float64)
            finite = np.where(np.isfinite(covariance), covariance, 0.0)
            gradient = self._log_step_gradient(tokens)
            parametric = max(0.0, float(gradient @ finite @ gradient))
        return math.sqrt(parametric + correction_sigma**2)

    def _correction_at(self, tokens: float) -> tuple[float, float]:
        """``(log linear factor, sigma)`` at ``tokens``: interpolated inside, fading outside."""
        if not self.corrections:
            return 0.0, STRUCTURE_SIGMA
        x = math.log2(max(tokens, 1.0))
        xs = [math.log2(max(c.tokens, 1.0)) for c in self.corrections]
        factors = [math.log(c.linear_factor) for c in self.corrections]
        sigmas = [c.sigma for c in self.corrections]
        if xs[0] <= x <= xs[-1]:
            return float(np.interp(x, xs, factors)), float(np.interp(x, xs, sigmas))
        edge = 0 if x < xs[0] else -1
        faded = min(1.0, abs(x - xs[edge]) / FADE_OCTAVES)
        sigma = math.sqrt(sigmas[edge] ** 2 * (1 - faded) + STRUCTURE_SIGMA**2 * faded)
        return factors[edge] * (1 - faded), sigma

    def _log_step_gradient(self, tokens: float) -> FloatArray:
        sequences = max(1.0, min(tokens, 64.0))
        point = _Point(
            steps=1.0,
            mean_s=1.0,
            tokens=max(tokens, 1.0),
            sequences=sequences,
            sampled=sequences,
            pairs=max(0.0, tokens - sequences) ** 2 / 2,
            prefill_context=0.0,
            decode_context=sequences * 1024.0,
        )
        base = self.scales.as_array()
        model, accel = load_model(self.model), load_accelerator(self.accelerator)

        def log_step(values: FloatArray) -> float:
            eff = scaled_efficiency(Efficiency.calibrated(), Scales.from_array(values))
            step_model = StepTimeModel(model, accel, self.tensor_parallel_size, efficiency=eff)
            return math.log(predict_mean_step(step_model, point))

        here = log_step(base)
        step = 1e-4
        return np.array(
            [
                (log_step(base * np.where(np.arange(base.size) == i, math.exp(step), 1.0)) - here) / step
                for i in range(base.size)
            ],
            dtype=np.float64,
        )

    def profile_tokens(self) -> tuple[int, ...]:
        """The token counts the step profile tabulates: the fixed grid plus every observed bucket's."""
        observed = {max(1, round(c.tokens)) for c in self.corrections}
        return tuple(sorted(set(PROFILE_TOKENS) | observed))

    def profile_document(self, slowdown: float = 1.0, *, spread: bool = False) -> dict[str, Any]:
        """The ``chunkpilot.io/step-profile/v1`` document of the fitted model (``--step-profile``).

        ``slowdown`` stretches every step by that factor (linear layers, attention, element-wise
        kernels and overheads alike): the engine as much slower as the fit is unsure of
        (:meth:`step_sigma`), for a capacity that holds if the prediction was optimistic.
        ``spread`` adds the :attr:`dispersion` (``step_log_sigma``): each simulated step then draws
        its time, for latency quantiles that carry the engine's tails.
        """
        if not slowdown > 0:
            raise ValueError(f"slowdown must be positive, not {slowdown}")
        model = self.roofline()
        efficiency = asdict(self.efficiency())
        for name in _SLOWED_EFFICIENCIES:
            efficiency[name] /= slowdown
        for name in _SLOWED_COSTS:
            efficiency[name] *= slowdown
        document: dict[str, Any] = {
            "schema": STEP_PROFILE_SCHEMA,
            "model": self.model,
            "accelerator": self.accelerator,
            "tensor_parallel_size": self.tensor_parallel_size,
            "linear_ms": {
                str(t): model.linear_time(t) * self.linear_factor(t) * slowdown * 1e3
                for t in self.profile_tokens()
            },
            "efficiency": efficiency,
            "twin": {
                "scales": asdict(self.scales),
                "steps": self.steps,
                "buckets": self.buckets,
                "rms_relative_error": self.rms_relative_error,
                "prior_rms_relative_error": self.prior_rms_relative_error,
                "corrections": [asdict(c) for c in self.corrections],
                "dispersion": {str(t): sigma for t, sigma in self.dispersion},
            },
        }
        if spread and self.dispersion:
            document["step_log_sigma"] = {str(t): sigma for t, sigma in self.dispersion}
        return document

    def write_profile(self, path: str | Path, slowdown: float = 1.0, *, spread: bool = False) -> Path:
        """Write :meth:`profile_document` as JSON; returns the path."""
        file = Path(path)
        file.parent.mkdir(parents=True, exist_ok=True)
        document = self.profile_document(slowdown, spread=spread)
        file.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
        return file


class _Objective:
    """The twin's model of the bucket means: relative errors as a function of the datasheet scales."""

    def __init__(self, model: ModelProfile, accelerator: Accelerator, tp: int, points: list[_Point]) -> None:
        self.model, self.accelerator, self.tp, self.points = model, accelerator, tp, points
        self.base = Efficiency.calibrated()
        self.steps: FloatArray = np.array([p.steps for p in points], dtype=np.float64)
        self.weights: FloatArray = 1.0 / np.sqrt(STEP_TIME_CV**2 / self.steps + MODEL_ERROR_FLOOR**2)
        self.measured: FloatArray = np.array([p.mean_s for p in points], dtype=np.float64)

    def relative_errors(self, scales: FloatArray) -> FloatArray:
        eff = scaled_efficiency(self.base, Scales.from_array(scales))
        step_model = StepTimeModel(self.model, self.accelerator, self.tp, efficiency=eff)
        predicted = np.array([predict_mean_step(step_model, p) for p in self.points], dtype=np.float64)
        return relative_errors(predicted, self.measured)

    def residuals(self, scales: FloatArray) -> FloatArray:
        """Relative errors over each bucket mean's expected error (the weights of the MAP estimate)."""
        weighted: FloatArray = self.relative_errors(scales) * self.weights
        return weighted

    def rms(self, scales: FloatArray) -> float:
        return weighted_rms(self.relative_errors(scales), self.steps)


#: The fitted unknowns: log-scale datasheet scales, each under its log-normal prior at 1.
_PARAMETERS: Final = tuple(
    Parameter(f.name, 1.0, lower=0.0, log=True, prior_sigma=sigma)
    for f, sigma in zip(fields(Scales), PRIOR_SIGMA, strict=True)
)


def fit_steps(
    telemetry: Mapping[str, StepTotals],
    model: str,
    accelerator: str,
    tensor_parallel_size: int = 1,
    *,
    min_steps: int = MIN_STEPS,
) -> TwinFit:
    """Fit the datasheet scales of ``accelerator`` to the step telemetry (bucket label -> totals).

    Raises :class:`TwinFitError` with fewer than ``min_steps`` steps in the window.
    """
    points = _points(telemetry)
    steps = sum(p.steps for p in points)
    if steps < min_steps:
        raise TwinFitError(
            f"{steps:g} engine steps in the window, {min_steps} needed to fit the step-time model"
        )
    model_profile = load_model(model)
    accel = load_accelerator(accelerator)
    objective = _Objective(model_profile, accel, tensor_parallel_size, points)
    solution = solve(objective.residuals, _PARAMETERS, absolute_weights=True)
    scales = Scales.from_array(solution.values)
    roofline = StepTimeModel(
        model_profile, accel, tensor_parallel_size, efficiency=scaled_efficiency(objective.base, scales)
    )
    return TwinFit(
        model=model,
        accelerator=accelerator,
        tensor_parallel_size=tensor_parallel_size,
        scales=scales,
        steps=steps,
        buckets=len(points),
        rms_relative_error=objective.rms(solution.values),
        prior_rms_relative_error=objective.rms(Scales().as_array()),
        iterations=solution.iterations,
        corrections=_corrections(roofline, points),
        log_covariance=tuple(tuple(float(v) for v in row) for row in solution.covariance),
    )


def _corrections(roofline: StepTimeModel, points: list[_Point]) -> tuple[BucketCorrection, ...]:
    """Each bucket's residual over the fitted roofline, shrunk toward none by its own error.

    Normal-normal shrinkage on the log scale: the bucket mean's error ``sigma_b`` (as the fit weighs
    it) against :data:`STRUCTURE_SIGMA`; a bucket of a few steps keeps little of its residual, one of
    thousands nearly all of it.
    """
    corrections = []
    for point in sorted(points, key=lambda p: p.tokens):
        predicted = predict_mean_step(roofline, point)
        if not predicted > 0:
            continue
        noise = STEP_TIME_CV**2 / point.steps + MODEL_ERROR_FLOOR**2
        keep = STRUCTURE_SIGMA**2 / (STRUCTURE_SIGMA**2 + noise)
        log_ratio = keep * math.log(point.mean_s / predicted)
        linear = _interpolated(roofline.linear_time, point.tokens)
        corrected = linear + predicted * math.expm1(log_ratio)
        factor = min(MAX_LINEAR_CORRECTION, max(1 / MAX_LINEAR_CORRECTION, corrected / linear))
        corrections.append(
            BucketCorrection(
                tokens=point.tokens,
                steps=point.steps,
                log_ratio=log_ratio,
                sigma=math.sqrt(keep * noise),
                linear_factor=factor,
            )
        )
    return tuple(corrections)


#: Quantile whose distance from the median measures a bucket's spread (the tail the SLOs read).
SPREAD_QUANTILE: Final = 0.95
_SPREAD_Z: Final = 1.6448536269514722  # the standard normal's SPREAD_QUANTILE
#: Fewest steps in a token bucket for its spread to count.
MIN_SPREAD_STEPS: Final = 40


def duration_quantile(counts: Sequence[float], q: float) -> float:
    """The ``q`` quantile of step durations from per-slot counts on ``names.STEP_DURATION_BUCKETS``
    (:data:`~chunkpilot.tuner.twin.capture.StepDurations`), log-linear inside a slot."""
    bounds = names.STEP_DURATION_BUCKETS
    edges = (bounds[0] / 2, *bounds, bounds[-1] * 2)
    total = sum(counts)
    if total <= 0:
        return math.nan
    target, seen = q * total, 0.0
    for slot, count in enumerate(counts):
        if count > 0 and seen + count >= target:
            share = (target - seen) / count
            low, high = math.log(edges[slot]), math.log(edges[slot + 1])
            return math.exp(low + share * (high - low))
        seen += count
    return edges[-1]


def _log_spread(counts: Sequence[float]) -> float:
    median = duration_quantile(counts, 0.5)
    upper = duration_quantile(counts, SPREAD_QUANTILE)
    return max(0.0, math.log(upper / median)) / _SPREAD_Z if median > 0 else 0.0


def step_spread(
    measured: Mapping[str, Sequence[float]], modelled: Mapping[str, Sequence[float]]
) -> tuple[tuple[int, float], ...]:
    """The spread of single step times the model does not explain, per token bucket.

    Per bucket of at least :data:`MIN_SPREAD_STEPS` measured steps: the log-normal spread that puts
    the :data:`SPREAD_QUANTILE` quantile of the measured durations where it is relative to their
    median, less (in quadrature) the spread the model's own steps show in the same bucket
    (``modelled``: the twin replaying the same traffic; their shapes differ inside a bucket too,
    and the coarse duration slots widen both alike). ``(bucket bound, sigma)`` ascending.
    """
    out: list[tuple[int, float]] = []
    for label, counts in measured.items():
        if sum(counts) < MIN_SPREAD_STEPS or not label.isdigit():
            continue
        own = _log_spread(modelled[label]) if label in modelled and sum(modelled[label]) > 0 else 0.0
        sigma = math.sqrt(max(0.0, _log_spread(counts) ** 2 - own**2))
        out.append((int(label), min(sigma, MAX_STEP_LOG_SIGMA)))
    return tuple(sorted(out))
