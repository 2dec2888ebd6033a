"""Per-layer shapes of a decoder-only transformer shard and their roofline costs.

Everything here is pure arithmetic: it turns a model architecture and a
tensor-parallel size into the matrix shapes one GPU holds for one layer, and
counts the FLOPs and bytes a forward pass over ``tokens`` tokens moves through
them. The probe times exactly these shapes; the fit explains the timings with
exactly these counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, PositiveInt

if TYPE_CHECKING:
    from chunkpilot.engine.sim.profiles.loader import ModelProfile

__all__ = [
    "AttentionShape",
    "LinearShape",
    "ModelShape",
    "ModelShapeError",
    "ShardShapes",
    "decode_attention_cost",
    "linear_cost",
    "prefill_attention_cost",
    "shard_shapes",
]


class ModelShapeError(ValueError):
    """A model architecture that cannot be split across the requested tensor-parallel size."""


class ModelShape(BaseModel):
    """The architecture fields the probe needs (the full model, before tensor-parallel splitting)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    hidden_size: PositiveInt
    num_layers: PositiveInt
    num_attention_heads: PositiveInt
    num_kv_heads: PositiveInt
    head_dim: PositiveInt
    intermediate_size: PositiveInt  # gated MLP: gate, up and down projections

    @classmethod
    def from_model_profile(cls, profile: ModelProfile) -> ModelShape:
        """Take the architecture from the simulator's model profile (built-in or a ``config.json``)."""
        return cls(
            name=profile.name,
            hidden_size=profile.hidden_size,
            num_layers=profile.num_layers,
            num_attention_heads=profile.num_heads,
            num_kv_heads=profile.num_kv_heads,
            head_dim=profile.head_dim,
            intermediate_size=profile.intermediate_size,
        )


@dataclass(frozen=True)
class LinearShape:
    """One weight matrix of a layer shard: ``out_features x in_features``."""

    name: str
    in_features: int
    out_features: int

    @property
    def weight_elements(self) -> int:
        return self.in_features * self.out_features


@dataclass(frozen=True)
class AttentionShape:
    """Attention heads held by one tensor-parallel shard."""

    num_heads: int
    num_kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class ShardShapes:
    """What one GPU of a tensor-parallel group computes for one layer."""

    model: ModelShape
    tensor_parallel_size: int
    linears: tuple[LinearShape, ...]
    attention: AttentionShape


def shard_shapes(model: ModelShape, tensor_parallel_size: int) -> ShardShapes:
    """Split one layer across ``tensor_parallel_size`` GPUs the way vLLM does (Megatron-style).

    QKV and gate/up are column-parallel (output split), O and down are row-parallel
    (input split). KV heads are split while there are enough of them and replicated
    otherwise, so a shard always holds at least one.
    """
    tp = tensor_parallel_size
    if tp < 1:
        raise ModelShapeError(f"--tensor-parallel-size must be at least 1, got {tp}")
    if model.num_attention_heads % tp:
        raise ModelShapeError(
            f"model {model.name!r}: num_attention_heads={model.num_attention_heads} is not divisible by "
            f"--tensor-parallel-size={tp}; choose a tensor-parallel size that divides it"
        )
    if model.intermediate_size % tp:
        raise ModelShapeError(
            f"model {model.name!r}: intermediate_size={model.intermediate_size} is not divisible by "
            f"--tensor-parallel-size={tp}; choose a tensor-parallel size that divides it"
        )
    if model.num_kv_heads >= tp and model.num_kv_heads % tp:
        raise ModelShapeError(
            f"model {model.name!r}: num_key_value_heads={model.num_kv_heads} is not divisible by "
            f"--tensor-parallel-size={tp}; choose a tensor-parallel size that divides it"
        )
    heads = model.num_attention_heads // tp
    kv_heads = max(1, model.num_kv_heads // tp)
    d = model.head_dim
    inter = model.intermediate_size // tp
    h = model.hidden_size
    linears = (
        LinearShape("qkv_proj", in_features=h, out_features=(heads + 2 * kv_heads) * d),
        LinearShape("o_proj", in_features=heads * d, out_features=h),
        LinearShape("gate_up_proj", in_features=h, out_features=2 * inter),
        LinearShape("down_proj", in_features=inter, out_features=h),
    )
    return ShardShapes(
        model=model,
        tensor_parallel_size=tp,
        linears=linears,
        attention=AttentionShape(num_heads=heads, num_kv_heads=kv_heads, head_dim=d),
    )


def linear_cost(linears: tuple[LinearShape, ...], tokens: int, dtype_bytes: int) -> tuple[float, float]:
    """FLOPs and bytes of one pass of ``tokens`` tokens through ``linears``.

    FLOPs are 2·M·N·K per GEMM; bytes are the weights read once plus the input
    activations read and the outputs written.
    """
    flops = 0.0
    moved = 0.0
    for lin in linears:
        flops += 2.0 * tokens * lin.weight_elements
        moved += dtype_bytes * (lin.weight_elements + tokens * (lin.in_features + lin.out_features))
    return flops, moved


def prefill_attention_cost(
    attention: AttentionShape, tokens: int, context_tokens: int, dtype_bytes: int
) -> tuple[float, float]:
    """FLOPs and bytes of causal attention for a chunk of ``tokens`` after ``context_tokens`` cached ones.

    Query ``i`` of the chunk attends to ``context_tokens + i + 1`` keys; each
    (query, key) pair costs 4·head_dim FLOPs per head (QKᵀ and PV). Bytes: Q and
    the output once, K and V of the whole context once (a fused kernel).
    """
    pairs = tokens * context_tokens + tokens * (tokens + 1) / 2.0
    flops = 4.0 * attention.num_heads * attention.head_dim * pairs
    q_and_out = 2.0 * tokens * attention.num_heads * attention.head_dim
    kv = 2.0 * (context_tokens + tokens) * attention.num_kv_heads * attention.head_dim
    return flops, dtype_bytes * (q_and_out + kv)


def decode_attention_cost(
    attention: AttentionShape, sequences: int, context_tokens: int, dtype_bytes: int
) -> tuple[float, float]:
    """FLOPs and bytes of one decode token for each of ``sequences`` sequences over ``context_tokens``."""
    pairs = float(sequences) * context_tokens
    flops = 4.0 * attention.num_heads * attention.head_dim * pairs
    q_and_out = 2.0 * sequences * attention.num_heads * attention.head_dim
    kv = 2.0 * sequences * context_tokens * attention.num_kv_heads * attention.head_dim
    return flops, dtype_bytes * (q_and_out + kv)
