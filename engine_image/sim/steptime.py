"""Roofline step-time model: how long one forward pass of a batch takes on an accelerator.

Per transformer layer (and tensor-parallel rank):

* four GEMMs (QKV projection, attention output projection, gated up projection, down projection),
  each ``(t_compute**p + t_memory**p)**(1/p) + floor`` where ``t_compute = FLOPs / (peak * eff_c)``
  and ``t_memory = bytes / (bandwidth * eff_m)`` (weights plus activations);
* element-wise kernels (norms, rotary embedding, activation, residual adds), memory-bound;
* prefill attention, compute-bound, proportional to the query-key pairs of each chunk: a chunk of
  ``c`` new tokens over ``p`` cached ones costs ``c * (p + c)`` pairs (the diagonal block is computed
  whole), a prompt in one pass ``c * (c + 1) / 2`` (causal kernel); chunking therefore costs about
  ``C / N`` extra attention FLOPs for chunk size ``C`` and prompt length ``N``;
* decode attention, memory-bound, proportional to the KV bytes read;
* two all-reduces per layer when the tensor-parallel degree is above one;

plus the LM head over the sampled rows, the embedding gather, and a fixed per-step overhead (scheduler,
sampler, launch) with a small per-sequence part. The efficiencies are calibrated against measured A100
operator times (see ``chunkpilot.engine.sim.calibration``); a measured step profile from a GPU probe
replaces the datasheet roofline of the linear layers when given (see :class:`StepProfile`).
"""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import dataclass, fields, replace
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from chunkpilot.engine.sim.compiled import picklable
from chunkpilot.engine.sim.profiles.loader import Accelerator, ModelProfile

STEP_PROFILE_SCHEMA = "chunkpilot.io/step-profile/v1"


@dataclass(frozen=True, slots=True)
class Efficiency:
    """Fractions of the datasheet peaks that kernels achieve, and fixed costs (seconds).

    Element-wise kernels (RMSNorm, rotary embedding, SiLU-and-mul, residual add, embedding gather) each
    have their own fraction of the memory bandwidth: their memory access patterns differ too much for
    one factor (the reference shows the gather at a third of the add's effective bandwidth).
    """

    gemm_compute: float = 0.72
    gemm_memory: float = 0.75
    gemm_smoothing: float = 2.0
    gemm_floor_s: float = 5e-6
    norm_memory: float = 0.5
    rope_memory: float = 0.5
    activation_memory: float = 0.5
    residual_add_memory: float = 0.5
    embedding_memory: float = 0.5
    elementwise_floor_s: float = 3e-6
    attention_compute: float = 0.6
    attention_memory: float = 0.75
    step_overhead_s: float = 6e-4
    per_sequence_overhead_s: float = 5e-6

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Efficiency:
        """Build from a mapping of field names to numbers; unknown keys are an error."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown efficiency field(s) {unknown}; known: {sorted(known)}")
        return cls(**{key: float(value) for key, value in data.items()})

    @classmethod
    def calibrated(cls) -> Efficiency:
        """The constants fitted against the A100 reference data (``calibration/efficiency.json``)."""
        return cls.from_dict(_calibrated_constants())


@cache
def _calibrated_constants() -> dict[str, Any]:
    """The fitted constants, read once per process (every simulated engine builds a step model)."""
    path = resources.files("chunkpilot.engine.sim.calibration").joinpath("efficiency.json")
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))["efficiency"]
    return data


@dataclass(slots=True, init=False)
class ForwardPass:
    """Shape of one batched forward pass, as the step-time model needs it.

    Built once per simulated step and never changed. Not frozen, and with its own ``__init__``:
    the compiled core compiles an ``__init__`` written in the class but runs the one a dataclass
    generates as Python (a frozen one's through the slow generic attribute setter).
    """

    num_tokens: int
    num_sequences: int
    num_sampled: int
    prefill_attention_pairs: float = 0.0
    prefill_context_tokens: int = 0
    decode_context_tokens: int = 0

    def __init__(
        self,
        num_tokens: int,
        num_sequences: int,
        num_sampled: int,
        prefill_attention_pairs: float = 0.0,
        prefill_context_tokens: int = 0,
        decode_context_tokens: int = 0,
    ) -> None:
        self.num_tokens = num_tokens
        self.num_sequences = num_sequences
        self.num_sampled = num_sampled
        self.prefill_attention_pairs = prefill_attention_pairs
        self.prefill_context_tokens = prefill_context_tokens
        self.decode_context_tokens = decode_context_tokens

    @staticmethod
    def prefill_pairs(new_tokens: int, cached_tokens: int) -> float:
        """Query-key pairs one prefill chunk computes (see the module docstring)."""
        if cached_tokens == 0:
            return new_tokens * (new_tokens + 1) / 2
        return float(new_tokens * (cached_tokens + new_tokens))


@dataclass(frozen=True, slots=True)
class StepBreakdown:
    """Seconds spent per component of one forward pass."""

    linear_s: float
    elementwise_s: float
    prefill_attention_s: float
    decode_attention_s: float
    allreduce_s: float
    lm_head_s: float
    overhead_s: float

    @property
    def total_s(self) -> float:
        """Duration of the whole step."""
        return (
            self.linear_s
            + self.elementwise_s
            + self.prefill_attention_s
            + self.decode_attention_s
            + self.allreduce_s
            + self.lm_head_s
            + self.overhead_s
        )


#: Largest spread of single step times a profile may give (a factor e**3 ~ 20 at one sigma).
MAX_STEP_LOG_SIGMA = 3.0


@dataclass(frozen=True, slots=True)
class StepProfile:
    """Measured linear-layer times from a GPU probe (JSON schema ``chunkpilot.io/step-profile/v1``).

    ``linear_ms`` maps a token count to the measured time of all linear layers of one forward pass
    (every layer, one tensor-parallel rank); times between measured counts are interpolated on a
    log-log scale and extrapolated linearly beyond the largest. ``efficiency`` optionally overrides
    fitted :class:`Efficiency` fields (for attention, element-wise kernels and overheads).
    ``step_log_sigma`` optionally maps a token count to the spread of single step times around the
    model's (the standard deviation of their log; interpolated on log tokens, held beyond the ends):
    a simulated step then lasts its modelled time times a mean-one log-normal draw.
    """

    linear_tokens: tuple[int, ...]
    linear_s: tuple[float, ...]
    efficiency: dict[str, float]
    model: str = ""
    accelerator: str = ""
    tensor_parallel_size: int = 1
    dispersion: tuple[tuple[int, float], ...] = ()

    @classmethod
    def load(cls, path: str | Path) -> StepProfile:
        """Read and validate a step-profile JSON file."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"--step-profile {path}: cannot read JSON ({exc})") from exc
        return cls.from_dict(data, source=str(path))

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "step profile") -> StepProfile:
        """Validate the parsed JSON document."""
        if data.get("schema") != STEP_PROFILE_SCHEMA:
            raise ValueError(f"{source}: field 'schema' must be {STEP_PROFILE_SCHEMA!r}")
        linear = data.get("linear_ms")
        if not isinstance(linear, dict) or not linear:
            raise ValueError(f"{source}: field 'linear_ms' must map token counts to milliseconds")
        points = sorted((int(tokens), float(ms) / 1e3) for tokens, ms in linear.items())
        if points[0][0] < 1 or any(t <= 0 for _, t in points):
            raise ValueError(f"{source}: 'linear_ms' needs token counts >= 1 and positive times")
        efficiency = {str(k): float(v) for k, v in dict(data.get("efficiency", {})).items()}
        Efficiency.from_dict(efficiency)  # validate names early
        spread = data.get("step_log_sigma", {})
        if not isinstance(spread, dict):
            raise ValueError(f"{source}: field 'step_log_sigma' must map token counts to log-spreads")
        dispersion = tuple(sorted((int(tokens), float(sigma)) for tokens, sigma in spread.items()))
        if any(t < 1 or not 0 <= sigma <= MAX_STEP_LOG_SIGMA for t, sigma in dispersion):
            raise ValueError(
                f"{source}: 'step_log_sigma' needs token counts >= 1 and spreads in [0, {MAX_STEP_LOG_SIGMA}]"
            )
        return cls(
            linear_tokens=tuple(t for t, _ in points),
            linear_s=tuple(s for _, s in points),
            efficiency=efficiency,
            model=str(data.get("model", "")),
            accelerator=str(data.get("accelerator", "")),
            tensor_parallel_size=int(data.get("tensor_parallel_size", 1)),
            dispersion=dispersion,
        )

    def step_log_sigma(self, num_tokens: int) -> float:
        """The spread of single step times at ``num_tokens`` (0: none)."""
        if not self.dispersion:
            return 0.0
        tokens = [math.log(t) for t, _ in self.dispersion]
        sigmas = [sigma for _, sigma in self.dispersion]
        return float(np.interp(math.log(max(num_tokens, 1)), tokens, sigmas))

    def linear_time(self, num_tokens: int) -> float:
        """Interpolated linear-layer time for ``num_tokens`` tokens."""
        tokens, times = self.linear_tokens, self.linear_s
        if num_tokens <= tokens[0] or len(tokens) == 1:
            return times[0] if num_tokens <= tokens[0] else times[0] * num_tokens / tokens[0]
        if num_tokens >= tokens[-1]:
            return times[-1] * num_tokens / tokens[-1]
        i = bisect.bisect_left(tokens, num_tokens)
        if tokens[i] == num_tokens:
            return times[i]
        x0, x1 = math.log(tokens[i - 1]), math.log(tokens[i])
        y0, y1 = math.log(times[i - 1]), math.log(times[i])
        return math.exp(y0 + (y1 - y0) * (math.log(num_tokens) - x0) / (x1 - x0))


def gemm_time(
    tokens: int, d_in: int, d_out: int, dtype_bytes: int, gpu: Accelerator, eff: Efficiency
) -> float:
    """Seconds for one ``tokens x d_in @ d_in x d_out`` GEMM on one rank."""
    flops = 2.0 * tokens * d_in * d_out
    moved = dtype_bytes * (d_in * d_out + tokens * (d_in + d_out))
    t_compute = flops / (gpu.peak_flops * eff.gemm_compute)
    t_memory = moved / (gpu.hbm_bytes_per_s * eff.gemm_memory)
    p = eff.gemm_smoothing
    return float((t_compute**p + t_memory**p) ** (1.0 / p)) + eff.gemm_floor_s


def elementwise_time(moved_bytes: float, gpu: Accelerator, memory_efficiency: float, floor_s: float) -> float:
    """Seconds for one memory-bound element-wise kernel moving ``moved_bytes``."""
    return moved_bytes / (gpu.hbm_bytes_per_s * memory_efficiency) + floor_s


class StepTimeModel:
    """Step time of a forward pass for one model on ``tensor_parallel_size`` accelerators."""

    def __init__(
        self,
        model: ModelProfile,
        accelerator: Accelerator,
        tensor_parallel_size: int = 1,
        efficiency: Efficiency | None = None,
        step_profile: StepProfile | None = None,
    ) -> None:
        if tensor_parallel_size < 1:
            raise ValueError("tensor_parallel_size must be >= 1")
        if model.num_heads % tensor_parallel_size:
            raise ValueError(
                f"--tensor-parallel-size {tensor_parallel_size} must divide the {model.num_heads} "
                f"attention heads of {model.name}"
            )
        eff = efficiency or Efficiency.calibrated()
        if step_profile is not None and step_profile.efficiency:
            eff = replace(eff, **step_profile.efficiency)
        self.model = model
        self.accelerator = accelerator
        self.tp = tensor_parallel_size
        self.efficiency = eff
        self.step_profile = step_profile
        self._linear_cache: dict[int, float] = {}
        self._elementwise_cache: dict[int, float] = {}
        self._lm_head_cache: dict[int, float] = {}
        self._log_sigma_cache: dict[int, float] = {}
        m, tp = model, tensor_parallel_size
        self._layers = m.num_layers
        self._heads = m.num_heads / tp
        kv_heads_per_rank = max(1.0, m.num_kv_heads / tp)
        # KV bytes one token occupies in one layer of one rank.
        self._kv_bytes_layer = 2.0 * kv_heads_per_rank * m.head_dim * m.dtype_bytes
        self._decode_attention_per_token = (
            self._layers * self._kv_bytes_layer / (accelerator.hbm_bytes_per_s * eff.attention_memory)
        )

    # ---- per-component times -------------------------------------------------------------
    def linear_time(self, num_tokens: int) -> float:
        """All linear layers (every transformer layer) for ``num_tokens`` tokens."""
        cached = self._linear_cache.get(num_tokens)
        if cached is not None:
            return cached
        if self.step_profile is not None:
            value = self.step_profile.linear_time(num_tokens)
        else:
            m, tp, gpu, eff = self.model, self.tp, self.accelerator, self.efficiency
            q_out = (m.num_heads + 2 * m.num_kv_heads) * m.head_dim // tp
            per_layer = (
                gemm_time(num_tokens, m.hidden_size, q_out, m.dtype_bytes, gpu, eff)
                + gemm_time(
                    num_tokens, m.num_heads * m.head_dim // tp, m.hidden_size, m.dtype_bytes, gpu, eff
                )
                + gemm_time(num_tokens, m.hidden_size, 2 * m.intermediate_size // tp, m.dtype_bytes, gpu, eff)
                + gemm_time(num_tokens, m.intermediate_size // tp, m.hidden_size, m.dtype_bytes, gpu, eff)
            )
            value = per_layer * m.num_layers
        self._linear_cache[num_tokens] = value
        return value

    def elementwise_time(self, num_tokens: int) -> float:
        """Norms, rotary embedding, activation and residual adds of every layer, plus the embedding."""
        cached = self._elementwise_cache.get(num_tokens)
        if cached is not None:
            return cached
        m, tp, gpu, eff = self.model, self.tp, self.accelerator, self.efficiency
        b = m.dtype_bytes * num_tokens
        floor = eff.elementwise_floor_s
        norm = elementwise_time(2 * m.hidden_size * b, gpu, eff.norm_memory, floor)
        rope_bytes = 2 * (m.num_heads + m.num_kv_heads) * m.head_dim / tp * b
        rope = elementwise_time(rope_bytes, gpu, eff.rope_memory, floor)
        act = elementwise_time(3 * m.intermediate_size / tp * b, gpu, eff.activation_memory, floor)
        add = elementwise_time(3 * m.hidden_size * b, gpu, eff.residual_add_memory, floor)
        per_layer = 2 * norm + rope + act + 2 * add
        embedding = elementwise_time(2 * m.hidden_size * b, gpu, eff.embedding_memory, floor)
        value = per_layer * m.num_layers + norm + embedding
        self._elementwise_cache[num_tokens] = value
        return value

    def lm_head_time(self, num_sampled: int) -> float:
        """Logits of the sampled rows (vocabulary split across ranks)."""
        if num_sampled <= 0:
            return 0.0
        cached = self._lm_head_cache.get(num_sampled)
        if cached is None:
            m = self.model
            cached = gemm_time(
                num_sampled,
                m.hidden_size,
                m.vocab_size // self.tp,
                m.dtype_bytes,
                self.accelerator,
                self.efficiency,
            )
            self._lm_head_cache[num_sampled] = cached
        return cached

    def allreduce_time(self, num_tokens: int) -> float:
        """Two ring all-reduces of the hidden states per layer (zero without tensor parallelism)."""
        if self.tp == 1:
            return 0.0
        gpu = self.accelerator
        moved = 2.0 * (self.tp - 1) / self.tp * num_tokens * self.model.hidden_size * self.model.dtype_bytes
        return 2 * self._layers * (gpu.allreduce_latency_s + moved / gpu.interconnect_bytes_per_s)

    def prefill_attention_time(self, pairs: float, context_tokens: int) -> float:
        """Prefill attention of all chunks in the batch, every layer."""
        if pairs <= 0:
            return 0.0
        gpu, eff, hd = self.accelerator, self.efficiency, self.model.head_dim
        flops = 4.0 * self._heads * hd * pairs
        moved = context_tokens * self._kv_bytes_layer
        per_layer = max(
            flops / (gpu.peak_flops * eff.attention_compute),
            moved / (gpu.hbm_bytes_per_s * eff.attention_memory),
        )
        return per_layer * self._layers

    def decode_attention_time(self, context_tokens: int) -> float:
        """Decode attention: KV bytes read by every decoding sequence, every layer."""
        return context_tokens * self._decode_attention_per_token

    @property
    def decode_time_per_context_token(self) -> float:
        """Slope of the step time in the total decode context (used to advance decode steps in bulk)."""
        return self._decode_attention_per_token

    # ---- whole step ----------------------------------------------------------------------
    def breakdown(self, fp: ForwardPass) -> StepBreakdown:
        """Seconds per component for ``fp``."""
        eff = self.efficiency
        return StepBreakdown(
            linear_s=self.linear_time(fp.num_tokens),
            elementwise_s=self.elementwise_time(fp.num_tokens),
            prefill_attention_s=self.prefill_attention_time(
                fp.prefill_attention_pairs, fp.prefill_context_tokens
            ),
            decode_attention_s=self.decode_attention_time(fp.decode_context_tokens),
            allreduce_s=self.allreduce_time(fp.num_tokens),
            lm_head_s=self.lm_head_time(fp.num_sampled),
            overhead_s=eff.step_overhead_s + eff.per_sequence_overhead_s * fp.num_sequences,
        )

    @property
    def has_dispersion(self) -> bool:
        """Whether single steps spread around the modelled time (the profile's ``step_log_sigma``)."""
        return self.step_profile is not None and bool(self.step_profile.dispersion)

    def step_log_sigma(self, num_tokens: int) -> float:
        """The spread of single step times at ``num_tokens`` (the standard deviation of their log)."""
        if self.step_profile is None:
            return 0.0
        cached = self._log_sigma_cache.get(num_tokens)
        if cached is None:
            cached = self._log_sigma_cache[num_tokens] = self.step_profile.step_log_sigma(num_tokens)
        return cached

    def step_time(self, fp: ForwardPass) -> float:
        """Seconds for the forward pass ``fp`` (0 for an empty batch)."""
        if fp.num_tokens <= 0:
            return 0.0
        return self.fixed_time(fp.num_tokens, fp.num_sequences, fp.num_sampled) + (
            self.prefill_attention_time(fp.prefill_attention_pairs, fp.prefill_context_tokens)
            + self.decode_attention_time(fp.decode_context_tokens)
        )

    def fixed_time(self, num_tokens: int, num_sequences: int, num_sampled: int) -> float:
        """The part of the step time that does not depend on the attention context."""
        eff = self.efficiency
        return (
            self.linear_time(num_tokens)
            + self.elementwise_time(num_tokens)
            + self.allreduce_time(num_tokens)
            + self.lm_head_time(num_sampled)
            + eff.step_overhead_s
            + eff.per_sequence_overhead_s * num_sequences
        )


picklable(Efficiency, StepBreakdown, StepProfile)
