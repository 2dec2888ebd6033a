"""Profile assembly from measurements, its JSON round trip, and its consumers (pure, no torch)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from chunkpilot.engine.probe import STEP_PROFILE_SCHEMA, ProfileError, StepProfile, load_profile, save_profile
from chunkpilot.engine.probe.profile import Peaks, PeakSource
from chunkpilot.engine.probe.roofline import (
    decode_attention_cost,
    linear_cost,
    prefill_attention_cost,
    shard_shapes,
)
from chunkpilot.engine.probe.runner import (
    LayerMeasurement,
    ProbeRequest,
    ProbeRequestError,
    accelerator_for_device_name,
    assemble_profile,
    resolve_model_shape,
)
from chunkpilot.engine.sim.profiles.loader import load_accelerator, load_model
from chunkpilot.engine.sim.steptime import STEP_PROFILE_SCHEMA as SIM_STEP_PROFILE_SCHEMA
from chunkpilot.engine.sim.steptime import ForwardPass, StepTimeModel
from chunkpilot.engine.sim.steptime import StepProfile as SimStepProfile

H200 = load_accelerator("h200")
DATASHEET = Peaks(
    flops_per_s=H200.peak_flops, bandwidth_bytes_per_s=H200.hbm_bytes_per_s, source=PeakSource.DATASHEET
)
TOKENS = tuple(2**i for i in range(15))
CONTEXT = 2048
LINEAR = (0.75, 0.70, 0.010)  # compute efficiency, bandwidth efficiency, overhead ms
ATTENTION = (0.55, 0.80, 0.005)


def _roofline_ms(flops: float, moved: float, params: tuple[float, float, float]) -> float:
    e_c, e_b, overhead = params
    return max(flops / (H200.peak_flops * e_c), moved / (H200.hbm_bytes_per_s * e_b)) * 1000 + overhead


def synthetic_measurements(model: str, tp: int, scale: float = 1.0) -> list[LayerMeasurement]:
    """What a probe would measure on an ideal roofline GPU (linear times optionally scaled)."""
    shapes = shard_shapes(resolve_model_shape(model), tp)
    out = []
    for tokens in TOKENS:
        linear = _roofline_ms(*linear_cost(shapes.linears, tokens, 2), LINEAR) * scale
        prefill = _roofline_ms(*prefill_attention_cost(shapes.attention, tokens, CONTEXT, 2), ATTENTION)
        decode = (
            _roofline_ms(*decode_attention_cost(shapes.attention, tokens, CONTEXT, 2), ATTENTION)
            if tokens <= 512
            else None
        )
        out.append(LayerMeasurement(tokens, linear, prefill, decode))
    return out


def make_profile(
    model: str = "llama-3.1-8b", tp: int = 1, itl: float | None = 50.0, scale: float = 1.0
) -> StepProfile:
    request = ProbeRequest(
        model=model, tensor_parallel_size=tp, device="cuda", tokens=TOKENS, itl_target_ms=itl
    )
    return assemble_profile(
        request=request,
        shape=resolve_model_shape(model),
        accelerator="h200",
        device_name="NVIDIA H200",
        peaks=DATASHEET,
        measured=synthetic_measurements(model, tp, scale),
        torch_version="2.13.0",
    )


def test_assembled_profile_recovers_the_synthetic_efficiencies() -> None:
    profile = make_profile()
    assert profile.dtype == "bfloat16"
    assert profile.linear_fit.compute_efficiency == pytest.approx(0.75, rel=1e-6)
    assert profile.linear_fit.bandwidth_efficiency == pytest.approx(0.70, rel=1e-6)
    assert profile.linear_fit.overhead_ms == pytest.approx(0.010, abs=1e-9)
    assert profile.attention_fit.compute_efficiency == pytest.approx(0.55, rel=1e-6)
    assert profile.attention_fit.bandwidth_efficiency == pytest.approx(0.80, rel=1e-6)
    assert len(profile.points) == len(TOKENS)
    assert profile.points[-1].decode_attention_ms is None
    assert profile.linear_ms[4096] == pytest.approx(32 * profile.points[12].linear_ms)


def test_knee_is_where_the_fitted_projections_turn_compute_bound() -> None:
    profile = make_profile()
    linears = shard_shapes(profile.model_shape, 1).linears

    def compute_bound(tokens: int) -> bool:
        flops, moved = linear_cost(linears, tokens, 2)
        return flops / (H200.peak_flops * 0.75) >= moved / (H200.hbm_bytes_per_s * 0.70)

    expected = next(m for m in range(1, 100_000) if compute_bound(m))
    assert profile.knee_tokens == expected
    # On an H200 the datasheet ridge is ~206 FLOP/byte; the knee sits in the low hundreds of tokens.
    assert 100 < expected < 400


def test_feasible_budget_is_the_largest_step_within_the_itl_target() -> None:
    profile = make_profile(itl=50.0)
    budget = profile.itl_feasible_budget_tokens
    assert budget is not None
    assert profile.itl_feasible_budget(50.0) == budget
    assert profile.step_ms(budget) <= 50.0 < profile.step_ms(budget + 1)
    assert profile.itl_feasible_budget(25.0) < budget < profile.itl_feasible_budget(100.0)  # type: ignore[operator]
    assert profile.itl_feasible_budget(0.001) is None
    with pytest.raises(ValueError, match="positive"):
        profile.itl_feasible_budget(0.0)


def test_70b_tp4_shard_profile() -> None:
    profile = make_profile("llama-3.1-70b", tp=4, itl=50.0)
    assert profile.tensor_parallel_size == 4
    assert profile.linear_fit.compute_efficiency == pytest.approx(0.75, rel=1e-6)
    assert profile.knee_tokens is not None
    assert profile.itl_feasible_budget_tokens is not None


def test_round_trip_through_json(tmp_path: Path) -> None:
    profile = make_profile()
    path = save_profile(profile, tmp_path / "h200" / "llama-3.1-8b-tp1.json")
    data = json.loads(path.read_text())
    assert data["schema"] == STEP_PROFILE_SCHEMA
    assert data["linear_ms"]["1"] == pytest.approx(profile.linear_ms[1])
    loaded = load_profile(path)
    assert loaded == profile
    assert loaded.knee_tokens == profile.knee_tokens


def test_invalid_profiles_name_the_field(tmp_path: Path) -> None:
    data = json.loads(make_profile().model_dump_json())
    data["linear_fit"]["compute_efficiency"] = -1
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match=r"linear_fit\.compute_efficiency"):
        load_profile(bad)
    data = json.loads(make_profile().model_dump_json())
    data["schema"] = "chunkpilot.io/step-profile/v0"
    bad.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match="schema"):
        load_profile(bad)
    bad.write_text("{not json")
    with pytest.raises(ProfileError, match="not valid JSON"):
        load_profile(bad)
    with pytest.raises(ProfileError, match="cannot read"):
        load_profile(tmp_path / "missing.json")


def test_schema_is_the_one_the_simulator_accepts() -> None:
    assert STEP_PROFILE_SCHEMA == SIM_STEP_PROFILE_SCHEMA


def test_simulator_loads_the_profile_and_its_step_time_follows_it(tmp_path: Path) -> None:
    profile = make_profile()
    fast = SimStepProfile.load(save_profile(profile, tmp_path / "fast.json"))
    slow = SimStepProfile.load(save_profile(make_profile(scale=2.0), tmp_path / "slow.json"))
    assert fast.model == "llama-3.1-8b"
    assert fast.accelerator == "h200"
    assert fast.efficiency == pytest.approx(
        {"gemm_compute": 0.75, "gemm_memory": 0.70, "attention_compute": 0.55, "attention_memory": 0.80}
    )
    model = load_model("llama-3.1-8b")
    datasheet = StepTimeModel(model, H200, 1)
    measured = StepTimeModel(model, H200, 1, step_profile=fast)
    doubled = StepTimeModel(model, H200, 1, step_profile=slow)
    assert measured.linear_time(1024) == pytest.approx(profile.linear_ms[1024] / 1000)
    step = ForwardPass(num_tokens=2048, num_sequences=8, num_sampled=8, decode_context_tokens=8 * 1024)
    t_datasheet, t_measured, t_doubled = (m.step_time(step) for m in (datasheet, measured, doubled))
    assert t_measured != pytest.approx(t_datasheet, rel=1e-3)
    assert doubled.linear_time(2048) == pytest.approx(2 * measured.linear_time(2048))
    # Twice the linear time, plus a slower LM head (its GEMM uses the halved fitted efficiencies).
    assert t_doubled - t_measured >= measured.linear_time(2048)


def test_efficiencies_fitted_against_other_peaks_are_rescaled_to_the_datasheet() -> None:
    halved = Peaks(
        flops_per_s=H200.peak_flops / 2,
        bandwidth_bytes_per_s=H200.hbm_bytes_per_s / 2,
        source=PeakSource.GIVEN,
    )
    request = ProbeRequest(model="llama-3.1-8b", device="cuda", tokens=TOKENS)
    profile = assemble_profile(
        request=request,
        shape=resolve_model_shape("llama-3.1-8b"),
        accelerator="h200",
        device_name="NVIDIA H200",
        peaks=halved,
        measured=synthetic_measurements("llama-3.1-8b", 1),
    )
    assert profile.linear_fit.compute_efficiency == pytest.approx(1.5, rel=1e-6)
    assert profile.efficiency["gemm_compute"] == pytest.approx(0.75, rel=1e-6)
    cpu = profile.model_copy(update={"accelerator": "cpu"})
    assert cpu.knee_tokens == profile.knee_tokens  # the knee does not depend on the peaks' scale


def test_request_validation_names_the_option() -> None:
    with pytest.raises(ProbeRequestError, match="--tokens"):
        ProbeRequest(model="llama-3.1-8b", tokens=(1, 2)).validate()
    with pytest.raises(ProbeRequestError, match="--peak-bandwidth-gbs"):
        ProbeRequest(model="llama-3.1-8b", peak_tflops=1.0).validate()
    with pytest.raises(ProbeRequestError, match="--dtype"):
        ProbeRequest(model="llama-3.1-8b", dtype="int4").validate()
    with pytest.raises(ProbeRequestError, match="--itl-target-ms"):
        ProbeRequest(model="llama-3.1-8b", itl_target_ms=0).validate()
    ProbeRequest(model="llama-3.1-8b").validate()


@pytest.mark.parametrize(
    ("name", "memory_gib", "expected"),
    [
        ("NVIDIA H200", 141, "h200"),
        ("NVIDIA H100 80GB HBM3", 80, "h100"),
        ("NVIDIA A100-SXM4-80GB", 80, "a100-80gb"),
        ("NVIDIA A100-SXM4-40GB", 40, "a100-40gb"),
        ("NVIDIA L40S", 48, "l40s"),
        ("NVIDIA B200", 180, "b200"),
        ("NVIDIA GeForce RTX 4090", 24, None),
    ],
)
def test_accelerator_is_detected_from_the_device_name(
    name: str, memory_gib: int, expected: str | None
) -> None:
    assert accelerator_for_device_name(name, memory_gib * 2**30) == expected
