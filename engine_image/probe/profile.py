"""The measured step-time profile: what ``chunkpilot probe`` writes and the simulator and tuner read.

One profile describes one (accelerator, model, tensor-parallel size, dtype): the
measured per-layer timings of one tensor-parallel shard over a range of token
counts, the roofline efficiency factors fitted to them, the compute knee and the
token budget whose predicted step time meets an ITL target.

The document is the simulator's ``chunkpilot.io/step-profile/v1`` schema
(``schema``, ``linear_ms``: whole-pass linear-layer times by token count,
``efficiency``: overrides of the simulator's efficiency constants, ``model``,
``accelerator``, ``tensor_parallel_size``) extended with the probe's own record:
the per-layer curve, the peaks, both fits, the knee and the ITL budget.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Final, Literal

from chunkpilot.engine.probe.fit import RooflineFit, first_tokens_where, largest_tokens_within
from chunkpilot.engine.probe.roofline import (
    ModelShape,
    ShardShapes,
    linear_cost,
    prefill_attention_cost,
    shard_shapes,
)
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    model_validator,
)

__all__ = [
    "STEP_PROFILE_SCHEMA",
    "CurvePoint",
    "EfficiencyFit",
    "PeakSource",
    "Peaks",
    "ProbeSettings",
    "ProfileError",
    "StepProfile",
    "load_profile",
    "parse_profile",
    "save_profile",
]

STEP_PROFILE_SCHEMA: Final = "chunkpilot.io/step-profile/v1"  # what the simulator's --step-profile accepts
_MAX_BUDGET_TOKENS = 1 << 20


class ProfileError(ValueError):
    """A profile file that is missing, not JSON, or does not match the schema."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_by_name=True, serialize_by_alias=True)


class PeakSource(StrEnum):
    """Where the peak FLOP/s and bandwidth the efficiencies are relative to came from."""

    DATASHEET = "datasheet"  # the simulator's accelerator profile
    MICROBENCHMARK = "microbenchmark"  # a large GEMM and a large copy timed on the device
    GIVEN = "given"  # --peak-tflops / --peak-bandwidth-gbs


class Peaks(_Strict):
    """The roofline ceilings of the device the profile was measured on."""

    flops_per_s: PositiveFloat
    bandwidth_bytes_per_s: PositiveFloat
    source: PeakSource

    @property
    def ridge_point(self) -> float:
        """Arithmetic intensity (FLOP/byte) at which the datasheet roofline turns compute-bound."""
        return self.flops_per_s / self.bandwidth_bytes_per_s


class EfficiencyFit(_Strict):
    """Fitted ``ms = max(flops / (peak·e_c), bytes / (bw·e_b))·1000 + overhead_ms``."""

    compute_efficiency: PositiveFloat
    bandwidth_efficiency: PositiveFloat
    overhead_ms: NonNegativeFloat
    rms_relative_error: NonNegativeFloat
    compute_bound_points: int = Field(ge=0)
    bandwidth_bound_points: int = Field(ge=0)

    @classmethod
    def from_fit(cls, fit: RooflineFit) -> EfficiencyFit:
        """The fit without its peaks (every field of this model is one of the fit's)."""
        return cls.model_validate(fit, from_attributes=True)

    def to_fit(self, peaks: Peaks) -> RooflineFit:
        """The fit again, relative to ``peaks``."""
        return RooflineFit(
            peak_flops=peaks.flops_per_s, peak_bandwidth=peaks.bandwidth_bytes_per_s, **self.model_dump()
        )


class CurvePoint(_Strict):
    """Medians measured at one token count, for one layer of one tensor-parallel shard.

    ``linear_ms`` covers the four projections (QKV, O, gate/up, down);
    ``prefill_attention_ms`` a causal chunk of ``tokens`` queries after
    ``settings.context_tokens`` cached tokens; ``decode_attention_ms`` one query for
    each of ``tokens`` sequences against ``settings.context_tokens`` of KV cache
    (absent above ``settings.max_decode_sequences``).
    """

    tokens: PositiveInt
    linear_ms: PositiveFloat
    linear_flops: PositiveFloat
    linear_bytes: PositiveFloat
    prefill_attention_ms: PositiveFloat
    prefill_attention_flops: PositiveFloat
    prefill_attention_bytes: PositiveFloat
    decode_attention_ms: PositiveFloat | None = None
    decode_attention_flops: PositiveFloat | None = None
    decode_attention_bytes: PositiveFloat | None = None


class ProbeSettings(_Strict):
    """How the curve was measured."""

    warmup: int = Field(ge=0)
    repeats: PositiveInt
    context_tokens: int = Field(ge=0)
    max_decode_sequences: int = Field(ge=0)
    min_repeat_ms: NonNegativeFloat = 0.0
    threads: PositiveInt | None = None  # CPU threads torch used, when set


class StepProfile(_Strict):
    """A measured step-time profile (JSON, schema ``chunkpilot.io/step-profile/v1``)."""

    schema_id: Literal["chunkpilot.io/step-profile/v1"] = Field(STEP_PROFILE_SCHEMA, alias="schema")
    accelerator: str = Field(min_length=1, description="accelerator profile name, e.g. h200, or cpu")
    device: Literal["cpu", "cuda"]
    device_name: str = ""
    model: str = Field(min_length=1, description="model profile name or config path it was built from")
    model_shape: ModelShape
    tensor_parallel_size: PositiveInt
    dtype: str
    dtype_bytes: PositiveInt
    peaks: Peaks
    settings: ProbeSettings
    points: list[CurvePoint] = Field(min_length=3)
    linear_fit: EfficiencyFit
    attention_fit: EfficiencyFit
    knee_tokens: PositiveInt | None = Field(
        description="smallest token count at which the fitted linear layers are compute-bound"
    )
    linear_ms: dict[PositiveInt, PositiveFloat] = Field(
        description="measured linear-layer ms of a whole forward pass (every layer, one shard) by token count"
    )
    efficiency: dict[str, PositiveFloat] = Field(
        default_factory=dict,
        description="fitted overrides of the simulator's efficiency constants, relative to the datasheet "
        "of `accelerator` (empty when the peaks were not that datasheet's)",
    )
    itl_target_ms: PositiveFloat | None = None
    itl_feasible_budget_tokens: PositiveInt | None = Field(
        default=None, description="largest token budget whose predicted step time meets itl_target_ms"
    )
    torch_version: str | None = None
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))

    @model_validator(mode="after")
    def _linear_ms_matches_points(self) -> StepProfile:
        if sorted(self.linear_ms) != sorted(p.tokens for p in self.points):
            raise ValueError("linear_ms must have one entry per measured point (the same token counts)")
        return self

    # -- derived shapes and fitted predictions --------------------------------------------------
    @property
    def shard(self) -> ShardShapes:
        """The per-layer shapes of one tensor-parallel shard this profile was measured on."""
        return shard_shapes(self.model_shape, self.tensor_parallel_size)

    def linear_layer_ms(self, tokens: int) -> float:
        """Fitted time of one layer's projections for ``tokens`` tokens on one shard."""
        flops, moved = linear_cost(self.shard.linears, tokens, self.dtype_bytes)
        return self.linear_fit.to_fit(self.peaks).predict_ms(flops, moved)

    def prefill_attention_layer_ms(self, tokens: int, context_tokens: int | None = None) -> float:
        """Fitted time of one layer's attention for a prefill chunk of ``tokens`` after ``context_tokens``."""
        context = self.settings.context_tokens if context_tokens is None else context_tokens
        flops, moved = prefill_attention_cost(self.shard.attention, tokens, context, self.dtype_bytes)
        return self.attention_fit.to_fit(self.peaks).predict_ms(flops, moved)

    def step_ms(self, tokens: int, context_tokens: int | None = None) -> float:
        """Predicted forward-pass time over all layers for a step of ``tokens`` tokens.

        Counts the measured parts only (projections and attention of every layer,
        attention as one prefill chunk after ``context_tokens``); tensor-parallel
        all-reduce, the LM head and sampling are not measured by the probe.
        """
        per_layer = self.linear_layer_ms(tokens) + self.prefill_attention_layer_ms(tokens, context_tokens)
        return self.model_shape.num_layers * per_layer

    def compute_knee_tokens(self) -> int | None:
        """Smallest token count where the fitted linear layers turn compute-bound (None: never)."""
        fit = self.linear_fit.to_fit(self.peaks)
        linears = self.shard.linears

        def compute_bound(tokens: int) -> bool:
            return fit.is_compute_bound(*linear_cost(linears, tokens, self.dtype_bytes))

        return first_tokens_where(compute_bound, _MAX_BUDGET_TOKENS)

    def itl_feasible_budget(self, itl_target_ms: float, context_tokens: int | None = None) -> int | None:
        """Largest token budget whose predicted step time stays within ``itl_target_ms``.

        None when even a one-token step exceeds the target.
        """
        if itl_target_ms <= 0:
            raise ValueError(f"itl_target_ms must be positive, got {itl_target_ms}")
        return largest_tokens_within(
            lambda tokens: self.step_ms(tokens, context_tokens), itl_target_ms, _MAX_BUDGET_TOKENS
        )


def parse_profile(data: object, source: str = "profile") -> StepProfile:
    """Validate a decoded profile (a dict from JSON); errors name the offending field."""
    try:
        return StepProfile.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in err['loc']) or '<root>'}: {err['msg']}" for err in exc.errors()
        )
        raise ProfileError(
            f"{source} is not a valid step profile ({problems}); regenerate it with `chunkpilot probe`"
        ) from exc


def load_profile(path: str | Path) -> StepProfile:
    """Read and validate a profile JSON file written by ``chunkpilot probe``."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ProfileError(f"cannot read step profile {file}: {exc.strerror or exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(f"step profile {file} is not valid JSON: {exc}") from exc
    return parse_profile(data, source=str(file))


def save_profile(profile: StepProfile, path: str | Path) -> Path:
    """Write ``profile`` as indented JSON (atomically: a temporary file renamed into place)."""
    file = Path(path)
    file.parent.mkdir(parents=True, exist_ok=True)
    tmp = file.with_name(f".{file.name}.tmp")
    tmp.write_text(profile.model_dump_json(indent=2) + "\n", encoding="utf-8")
    tmp.replace(file)
    return file
