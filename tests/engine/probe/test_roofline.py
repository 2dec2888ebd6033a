"""Per-shard layer shapes and their FLOP/byte counts."""

from __future__ import annotations

import pytest
from chunkpilot.engine.probe.roofline import (
    ModelShapeError,
    decode_attention_cost,
    linear_cost,
    prefill_attention_cost,
    shard_shapes,
)
from chunkpilot.engine.probe.runner import resolve_model_shape


def _dims(model: str, tp: int) -> dict[str, tuple[int, int]]:
    shapes = shard_shapes(resolve_model_shape(model), tp)
    return {lin.name: (lin.in_features, lin.out_features) for lin in shapes.linears}


def test_llama_8b_tp1_layer_shapes() -> None:
    assert _dims("llama-3.1-8b", 1) == {
        "qkv_proj": (4096, (32 + 2 * 8) * 128),
        "o_proj": (4096, 4096),
        "gate_up_proj": (4096, 2 * 14336),
        "down_proj": (14336, 4096),
    }


def test_llama_70b_tp4_shard_shapes() -> None:
    shapes = shard_shapes(resolve_model_shape("meta-llama/Llama-3.1-70B-Instruct"), 4)
    assert {lin.name: (lin.in_features, lin.out_features) for lin in shapes.linears} == {
        "qkv_proj": (8192, (16 + 2 * 2) * 128),
        "o_proj": (16 * 128, 8192),
        "gate_up_proj": (8192, 2 * 28672 // 4),
        "down_proj": (28672 // 4, 8192),
    }
    assert (shapes.attention.num_heads, shapes.attention.num_kv_heads) == (16, 2)


def test_kv_heads_are_replicated_when_fewer_than_ranks() -> None:
    shapes = shard_shapes(resolve_model_shape("llama-3.1-70b"), 16)
    assert shapes.attention.num_kv_heads == 1
    assert shapes.attention.num_heads == 4


def test_indivisible_tensor_parallel_size_names_the_field() -> None:
    with pytest.raises(ModelShapeError, match="num_attention_heads=32 is not divisible"):
        shard_shapes(resolve_model_shape("llama-3.1-8b"), 3)
    with pytest.raises(ModelShapeError, match="at least 1"):
        shard_shapes(resolve_model_shape("llama-3.1-8b"), 0)


def test_linear_cost_counts_weights_once_and_activations_per_token() -> None:
    linears = shard_shapes(resolve_model_shape("llama-3.1-8b"), 1).linears
    weights = sum(lin.weight_elements for lin in linears)
    activations = sum(lin.in_features + lin.out_features for lin in linears)
    flops, moved = linear_cost(linears, 64, 2)
    assert flops == 2 * 64 * weights
    assert moved == 2 * (weights + 64 * activations)
    # Intensity grows with the token count: ~1 FLOP/byte per token while weights dominate.
    f1, b1 = linear_cost(linears, 1, 2)
    assert 0.9 < f1 / b1 < 1.0


def test_attention_costs() -> None:
    att = shard_shapes(resolve_model_shape("llama-3.1-8b"), 1).attention
    flops, moved = prefill_attention_cost(att, 4, 10, 2)
    assert flops == 4 * 32 * 128 * (4 * 10 + 4 * 5 / 2)
    assert moved == 2 * (2 * 4 * 32 * 128 + 2 * 14 * 8 * 128)
    flops, moved = decode_attention_cost(att, 3, 100, 2)
    assert flops == 4 * 32 * 128 * 300
    assert moved == 2 * (2 * 3 * 32 * 128 + 2 * 3 * 100 * 8 * 128)
