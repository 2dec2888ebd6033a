"""Fit the twin's step-time model to an engine's step telemetry (pure, numpy only).

The model is the simulator's own roofline (:class:`~chunkpilot.engine.sim.steptime.StepTimeModel`)
for the service's model on the datasheet accelerator, with four unknowns: how far the engine's
compute and memory bandwidth fall short of the datasheet (``compute`` scales every compute
efficiency, ``memory`` every memory efficiency) and how large its fixed costs are (``step_overhead``
scales the per-step overhead, ``sequence_overhead`` the per-sequence one). Each scheduled-token
bucket of the telemetry gives one point: the mean step time against the mean batch shape. The scales
are the maximum a posteriori estimate of relative residuals weighted by each bucket's step count,
under a log-normal prior centred on the datasheet (scale 1): with few steps the datasheet wins, with
many the data; the solver is the shared step-time fitting core (:mod:`chunkpilot.engine.stepfit`).
The result is a ``chunkpilot.io/step-profile/v1`` document the simulator loads with ``--step-profile``
(linear-layer times tabulated from the fitted roofline, the fitted efficiencies as overrides), so the
twin is the simulator itself, not a second model.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt
from chunkpilot.engine import metrics_names as names
from chunkpilot.engine.sim.metrics import StepTotals
from chunkpilot.engine.sim.profiles.loader import Accelerator, ModelProfile, load_accelerator, load_model
from chunkpilot.engine.sim.steptime import STEP_PROFILE_SCHEMA, Efficiency, StepTimeModel
from chunkpilot.engine.stepfit import Parameter, StepFitError, relative_errors, solve, weighted_rms

__all__ = ["MIN_STEPS", "Scales", "TwinFit", "TwinFitError", "fit_steps", "scaled_efficiency"]

FloatArray = npt.NDArray[np.float64]

#: Fewer steps than this in the window: no fit (the caller waits for more telemetry).
MIN_STEPS: Final = 50
#: Relative spread of single step times within a bucket, and the floor of a bucket mean's relative
#: error (the model evaluates the bucket's mean shape, not each step): ``sigma_b**2 = CV**2 / n_b +
#: FLOOR**2``.
STEP_TIME_CV: Final = 0.1
MODEL_ERROR_FLOOR: Final = 0.005
#: Prior standard deviations of the log scales: the datasheet is trusted to a factor e**0.5 ~ 1.6 for
#: compute and memory, e**1 ~ 2.7 for the overheads (software, not silicon).
PRIOR_SIGMA: Final = (0.5, 0.5, 1.0, 1.0)

_COMPUTE_FIELDS = ("gemm_compute", "attention_compute")
_MEMORY_FIELDS = (
    "gemm_memory",
    "norm_memory",
    "rope_memory",
    "activation_memory",
    "residual_add_memory",
    "embedding_memory",
    "attention_memory",
)
#: Token counts of the fitted profile's ``linear_ms`` table (log-log interpolated by the simulator).
PROFILE_TOKENS: Final[tuple[int, ...]] = (*names.STEP_TOKEN_BUCKETS, 49152, 65536)


class TwinFitError(StepFitError):
    """The telemetry cannot be fitted (too few steps, or none with a positive duration)."""


@dataclass(frozen=True, slots=True)
class Scales:
    """The engine relative to its datasheet: 1.0 everywhere is the datasheet roofline."""

    compute: float = 1.0
    memory: float = 1.0
    step_overhead: float = 1.0
    sequence_overhead: float = 1.0

    def as_array(self) -> FloatArray:
        return np.array([getattr(self, f.name) for f in fields(self)], dtype=np.float64)

    @classmethod
    def from_array(cls, values: FloatArray) -> Scales:
        return cls(*(float(v) for v in values))


def scaled_efficiency(base: Efficiency, scales: Scales) -> Efficiency:
    """``base`` with compute, memory and overhead terms scaled (a slower engine has smaller scales)."""
    changes: dict[str, float] = {name: getattr(base, name) * scales.compute for name in _COMPUTE_FIELDS}
    changes.update({name: getattr(base, name) * scales.memory for name in _MEMORY_FIELDS})
    changes["step_overhead_s"] = base.step_overhead_s * scales.step_overhead
    changes["per_sequence_overhead_s"] = base.per_sequence_overhead_s * scales.sequence_overhead
    return replace(base, **changes)


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


@dataclass(frozen=True, slots=True)
class TwinFit:
    """A fitted step-time model: datasheet scales and how well they explain the telemetry."""

    model: str
    accelerator: str
    tensor_parallel_size: int
    scales: Scales
    steps: float
    buckets: int
    rms_relative_error: float
    prior_rms_relative_error: float
    iterations: int

    def efficiency(self) -> Efficiency:
        """The fitted efficiency constants (relative to the datasheet of ``accelerator``)."""
        return scaled_efficiency(Efficiency.calibrated(), self.scales)

    def step_model(self) -> StepTimeModel:
        """The fitted roofline as a step-time model."""
        return StepTimeModel(
            load_model(self.model),
            load_accelerator(self.accelerator),
            self.tensor_parallel_size,
            efficiency=self.efficiency(),
        )

    def profile_document(self) -> dict[str, Any]:
        """The ``chunkpilot.io/step-profile/v1`` document of the fitted model (``--step-profile``)."""
        model = self.step_model()
        return {
            "schema": STEP_PROFILE_SCHEMA,
            "model": self.model,
            "accelerator": self.accelerator,
            "tensor_parallel_size": self.tensor_parallel_size,
            "linear_ms": {str(t): model.linear_time(t) * 1e3 for t in PROFILE_TOKENS},
            "efficiency": asdict(self.efficiency()),
            "twin": {
                "scales": asdict(self.scales),
                "steps": self.steps,
                "buckets": self.buckets,
                "rms_relative_error": self.rms_relative_error,
                "prior_rms_relative_error": self.prior_rms_relative_error,
            },
        }

    def write_profile(self, path: str | Path) -> Path:
        """Write :meth:`profile_document` as JSON; returns the path."""
        file = Path(path)
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(json.dumps(self.profile_document(), indent=1) + "\n", encoding="utf-8")
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
    return TwinFit(
        model=model,
        accelerator=accelerator,
        tensor_parallel_size=tensor_parallel_size,
        scales=Scales.from_array(solution.values),
        steps=steps,
        buckets=len(points),
        rms_relative_error=objective.rms(solution.values),
        prior_rms_relative_error=objective.rms(Scales().as_array()),
        iterations=solution.iterations,
    )
