"""Structural truths: the shipped step profiles are the generator's, measured in shape, off the prior."""

from __future__ import annotations

import itertools
import json
import math
import re
from pathlib import Path

import pytest
from chunkpilot.engine.sim.profiles.loader import load_accelerator, load_model
from chunkpilot.engine.sim.steptime import STEP_PROFILE_SCHEMA, Efficiency, StepProfile, StepTimeModel
from chunkpilot.tuner.twin.fit import PRIOR_SIGMA

from chunkpilot.bench.structural_truths import (
    SHIPPED_MODELS,
    STRUCTURAL_FAMILY,
    gemm_shapes,
    main,
    structural_family,
    structural_profile,
)

MODEL, GPU = "llama-3.1-8b", "h100"


def _linear_flops(tokens: int) -> float:
    model = load_model(MODEL)
    return 2.0 * tokens * model.num_layers * sum(a * b for a, b in gemm_shapes(model).values())


@pytest.mark.parametrize("model", SHIPPED_MODELS)
def test_shipped_family_is_the_generator_output(model: str, tmp_path: Path) -> None:
    shipped = structural_family(model)
    assert set(shipped) == set(STRUCTURAL_FAMILY) and 3 <= len(shipped) <= 4
    for name, path in shipped.items():
        document = json.loads(path.read_text(encoding="utf-8"))
        expected = structural_profile(name, STRUCTURAL_FAMILY[name], model=model)
        assert document == json.loads(json.dumps(expected))
        assert document["schema"] == STEP_PROFILE_SCHEMA
        shape = (document["model"], document["accelerator"], document["tensor_parallel_size"])
        assert shape == (model, GPU, 1)
        assert "Microsoft" in document["truth"]["source"]  # the measurements' attribution travels along
        StepProfile.load(path)  # the simulator reads it
    assert main(["--write", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        p.name for m in SHIPPED_MODELS for p in structural_family(m).values()
    )


def test_a_model_the_family_is_not_shipped_for_is_refused_naming_the_fix() -> None:
    with pytest.raises(
        ValueError,
        match=re.escape("shipped for llama-3.1-8b, qwen2.5-32b, not mistral-7b; write them for it"),
    ):
        structural_family("mistral-7b")


def test_the_32b_members_carry_the_same_departures_on_the_larger_model() -> None:
    small = StepProfile.load(structural_family()["h100-vidur-l125-o5ms"])
    large = StepProfile.load(structural_family("qwen2.5-32b")["h100-vidur-l125-o5ms"])
    assert small.efficiency == large.efficiency  # attention, element-wise, overheads: the member's own
    assert large.linear_tokens == small.linear_tokens
    # The same measured curve on a model with about four times the linear FLOPs per token.
    ratios = [b / a for a, b in zip(small.linear_s, large.linear_s, strict=True)]
    assert all(3.0 < r < 5.5 for r in ratios)


def test_the_linear_layers_follow_the_measured_curve_not_the_roofline() -> None:
    roofline = StepTimeModel(load_model(MODEL), load_accelerator(GPU))
    profile = StepProfile.load(structural_family()["h100-vidur-a035-o3ms"])
    tokens = profile.linear_tokens
    achieved = [_linear_flops(n) / profile.linear_time(n) for n in tokens]
    roof = [_linear_flops(n) / roofline.linear_time(n) for n in tokens]
    # The roofline's achieved FLOP/s only grows with the batch; the measured curve dips (tile
    # quantisation: 512 tokens run at a higher rate than 1024).
    assert all(b >= a * 0.999 for a, b in itertools.pairwise(roof))
    assert any(b < a * 0.95 for a, b in itertools.pairwise(achieved))
    # No single compute scale maps one onto the other: their ratio moves by more than 20%.
    ratio = [a / r for a, r in zip(achieved, roof, strict=True)]
    assert max(ratio) / min(ratio) > 1.2
    # Rescaled to the H100: large batches run well above the A100's peak and below the H100's.
    h100, a100 = load_accelerator(GPU), load_accelerator("a100-80gb")
    big = _linear_flops(16384) / profile.linear_time(16384)
    assert 1.5 * a100.peak_flops < big < h100.peak_flops


def test_the_slowed_member_scales_the_whole_curve() -> None:
    base = StepProfile.load(structural_family()["h100-vidur-a035-o3ms"])
    slow = StepProfile.load(structural_family()["h100-vidur-l125-o5ms"])
    assert slow.linear_tokens == base.linear_tokens
    for fast_s, slow_s in zip(base.linear_s, slow.linear_s, strict=True):
        assert slow_s == pytest.approx(1.25 * fast_s, rel=1e-5)


@pytest.mark.parametrize("name", sorted(STRUCTURAL_FAMILY))
def test_each_member_sits_outside_the_twins_prior(name: str) -> None:
    profile = StepProfile.load(structural_family()[name])
    twin = Efficiency.calibrated()
    truth = StepTimeModel(load_model(MODEL), load_accelerator(GPU), step_profile=profile).efficiency
    # An overhead several prior standard deviations from the datasheet's.
    _compute_sigma, _memory_sigma, step_sigma, sequence_sigma, *_ratios = PRIOR_SIGMA
    distance = max(
        abs(math.log(truth.step_overhead_s / twin.step_overhead_s)) / step_sigma,
        abs(math.log(truth.per_sequence_overhead_s / twin.per_sequence_overhead_s)) / sequence_sigma,
    )
    assert distance > 1.5
    # Prefill attention against the linear layers: the twin scales both by one compute factor, so it
    # keeps their ratio; the truth's is at least 25% away from it.
    linear_compute = _linear_flops(16384) / profile.linear_time(16384) / load_accelerator(GPU).peak_flops
    truth_ratio = truth.attention_compute / linear_compute
    twin_ratio = twin.attention_compute / twin.gemm_compute
    assert abs(truth_ratio / twin_ratio - 1) > 0.25
    # Element-wise kernels at one bandwidth fraction, where the twin's differ by kernel.
    assert truth.norm_memory == truth.embedding_memory != twin.norm_memory
