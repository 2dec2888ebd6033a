"""A measured step profile (``chunkpilot probe``) sets the budget's floor, ceiling and warm start."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from chunkpilot.engine.probe.fit import RooflineFit
from chunkpilot.engine.probe.profile import Peaks, PeakSource, StepProfile
from chunkpilot.engine.probe.roofline import linear_cost, prefill_attention_cost, shard_shapes
from chunkpilot.engine.probe.runner import (
    LayerMeasurement,
    ProbeRequest,
    assemble_profile,
    resolve_model_shape,
)
from chunkpilot.engine.sim.profiles.loader import load_accelerator as sim_accelerator
from chunkpilot.tuner.space import (
    ITL_CEILING_HEADROOM,
    Knob,
    ServiceFacts,
    TunedConfig,
    build_space,
    compute_knee_tokens,
    load_accelerator,
    load_model_shape,
    memory_ceiling_tokens,
)
from chunkpilot.tuner.warmstart import warm_start


@dataclass
class FakeProfile:
    """Knee and budgets by ITL target; records the targets asked for."""

    knee_tokens: int | None
    budgets: dict[float, int | None]
    asked: list[float] = field(default_factory=list)

    def itl_feasible_budget(self, itl_target_ms: float) -> int | None:
        self.asked.append(itl_target_ms)
        return self.budgets[itl_target_ms]


def facts(profile: object, itl_target_ms: float = 50.0) -> ServiceFacts:
    return ServiceFacts(
        accelerator="h100",
        model="llama-3.1-8b",
        incumbent=TunedConfig(8192, 256),
        itl_target_ms=itl_target_ms,
        step_profile=profile,  # type: ignore[arg-type]
    )


def test_profile_knee_and_budget_are_the_bounds_and_the_warm_start() -> None:
    profile = FakeProfile(knee_tokens=700, budgets={50.0: 3000, 100.0: 6000})
    space = build_space(facts(profile))
    assert compute_knee_tokens(load_accelerator("h100")) < 700  # the datasheet would give ~295
    assert (space.budget.low, space.budget.high) == (700, 6000)
    assert 50.0 * ITL_CEILING_HEADROOM in profile.asked
    assert any("measured step profile: knee 700" in note for note in space.notes)
    (start,) = warm_start(space, facts(profile))
    assert start[Knob.MAX_NUM_BATCHED_TOKENS.value] == 3000


def test_infeasible_target_keeps_the_floor_and_says_so() -> None:
    profile = FakeProfile(knee_tokens=512, budgets={10.0: None, 20.0: 100})
    space = build_space(facts(profile, itl_target_ms=10.0))
    assert (space.budget.low, space.budget.high) == (512, 512)
    assert any("may be infeasible" in note for note in space.notes)
    assert warm_start(space, facts(profile, itl_target_ms=10.0))[0]["max_num_batched_tokens"] == 512


def test_a_profile_without_a_knee_falls_back_to_the_datasheet_floor() -> None:
    profile = FakeProfile(knee_tokens=None, budgets={100.0: 5000})
    space = build_space(facts(profile))
    assert space.budget.low == compute_knee_tokens(load_accelerator("h100"))
    assert space.budget.high == 5000


def _measured_h100(compute_efficiency: float, bandwidth_efficiency: float) -> StepProfile:
    """A Llama-3.1-8B TP1 profile as an H100 reaching the given share of its datasheet would measure it."""
    h100 = sim_accelerator("h100")
    linear = RooflineFit(
        h100.peak_flops, h100.hbm_bytes_per_s, compute_efficiency, bandwidth_efficiency, 0.01, 0.0, 0, 0
    )
    attention = RooflineFit(h100.peak_flops, h100.hbm_bytes_per_s, 0.5, 0.8, 0.005, 0.0, 0, 0)
    shapes = shard_shapes(resolve_model_shape("llama-3.1-8b"), 1)
    tokens = tuple(2**i for i in range(15))
    measured = [
        LayerMeasurement(
            t,
            linear.predict_ms(*linear_cost(shapes.linears, t, 2)),
            attention.predict_ms(*prefill_attention_cost(shapes.attention, t, 2048, 2)),
            None,
        )
        for t in tokens
    ]
    return assemble_profile(
        request=ProbeRequest(model="llama-3.1-8b", device="cuda", tokens=tokens, itl_target_ms=50.0),
        shape=resolve_model_shape("llama-3.1-8b"),
        accelerator="h100",
        device_name="NVIDIA H100 80GB HBM3",
        peaks=Peaks(
            flops_per_s=h100.peak_flops,
            bandwidth_bytes_per_s=h100.hbm_bytes_per_s,
            source=PeakSource.DATASHEET,
        ),
        measured=measured,
    )


def test_real_probe_profiles_drive_the_space() -> None:
    datasheet_knee = compute_knee_tokens(load_accelerator("h100"))  # ~295 tokens
    # Weak GEMMs (30 % of peak) turn compute-bound early; strong GEMMs on weak bandwidth late.
    weak = _measured_h100(compute_efficiency=0.30, bandwidth_efficiency=0.90)
    strong = _measured_h100(compute_efficiency=0.90, bandwidth_efficiency=0.45)
    assert weak.knee_tokens is not None and strong.knee_tokens is not None
    assert 64 < weak.knee_tokens < datasheet_knee < strong.knee_tokens
    shape = load_model_shape("llama-3.1-8b")
    starts = []
    for profile in (weak, strong):
        service = facts(profile)
        space = build_space(service)
        assert space.budget.low == profile.knee_tokens
        ceiling = min(
            memory_ceiling_tokens(service, load_accelerator("h100"), shape),
            profile.itl_feasible_budget(50.0 * ITL_CEILING_HEADROOM) or 0,
        )
        assert space.budget.high == max(ceiling, space.budget.low)
        (start,) = warm_start(space, service)
        assert start["max_num_batched_tokens"] == space.budget.clip(profile.itl_feasible_budget(50.0) or 0)
        starts.append(start["max_num_batched_tokens"])
    # Faster GEMMs fit more tokens into the same ITL target.
    assert starts[1] > starts[0]


@pytest.mark.parametrize("target", [25.0, 50.0])
def test_without_a_profile_nothing_changes(target: float) -> None:
    plain = build_space(facts(None, target))
    assert plain.budget.low == compute_knee_tokens(load_accelerator("h100"))
    assert not any("measured step profile" in note for note in plain.notes)
