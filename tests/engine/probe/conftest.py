"""Shared fixtures of the probe tests: a synthetic profile (pure) and a torch environment for CPU runs."""

from __future__ import annotations

import os

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
from chunkpilot.engine.probe.torchenv import (
    TorchEnvError,
    ensure_torch,
    probe_environment,
    torch_in_environment,
)
from chunkpilot.engine.sim.profiles.loader import load_accelerator

SYNTHETIC_TOKENS = tuple(2**i for i in range(15))


def synthetic_profile(model: str = "llama-3.1-8b", tp: int = 1, itl_target_ms: float = 50.0) -> StepProfile:
    """What an ideal H200 would measure (projections at 75 %/70 % of the datasheet, attention 55 %/80 %)."""
    h200 = load_accelerator("h200")
    linear = RooflineFit(h200.peak_flops, h200.hbm_bytes_per_s, 0.75, 0.70, 0.010, 0.0, 0, 0)
    attention = RooflineFit(h200.peak_flops, h200.hbm_bytes_per_s, 0.55, 0.80, 0.005, 0.0, 0, 0)
    shapes = shard_shapes(resolve_model_shape(model), tp)
    measured = [
        LayerMeasurement(
            tokens,
            linear.predict_ms(*linear_cost(shapes.linears, tokens, 2)),
            attention.predict_ms(*prefill_attention_cost(shapes.attention, tokens, 2048, 2)),
            None,
        )
        for tokens in SYNTHETIC_TOKENS
    ]
    return assemble_profile(
        request=ProbeRequest(
            model=model,
            tensor_parallel_size=tp,
            device="cuda",
            tokens=SYNTHETIC_TOKENS,
            itl_target_ms=itl_target_ms,
        ),
        shape=resolve_model_shape(model),
        accelerator="h200",
        device_name="NVIDIA H200",
        peaks=Peaks(
            flops_per_s=h200.peak_flops,
            bandwidth_bytes_per_s=h200.hbm_bytes_per_s,
            source=PeakSource.DATASHEET,
        ),
        measured=measured,
        torch_version="2.13.0",
    )


@pytest.fixture(scope="session")
def small_profile() -> StepProfile:
    """A synthetic Llama-3.1-8B TP1 profile on an H200 with a 50 ms ITL target."""
    return synthetic_profile()


#: Set to 1 (CI) to fail instead of skip when torch cannot be installed.
ENV_REQUIRE_TORCH = "CHUNKPILOT_REQUIRE_TORCH"


@pytest.fixture(scope="session")
def torch_env() -> dict[str, str]:
    """Environment for a ``chunkpilot probe`` subprocess that can import torch.

    Uses the interpreter's own torch when installed, else installs the probe
    extra's torch once into ~/.cache/chunkpilot/torch (about two minutes, 2.7 GB
    downloaded) and puts it first on PYTHONPATH. Skips only when that install is
    impossible (no registry, no disk space), unless CHUNKPILOT_REQUIRE_TORCH=1.
    """
    if torch_in_environment():
        return probe_environment(None)
    try:
        path = ensure_torch(lambda message: print(message, flush=True))
    except TorchEnvError as exc:
        if os.environ.get(ENV_REQUIRE_TORCH) == "1":
            pytest.fail(f"torch is required ({ENV_REQUIRE_TORCH}=1) but could not be installed: {exc}")
        pytest.skip(f"torch could not be installed for the CPU probe runs: {exc}")
    return probe_environment(path)
