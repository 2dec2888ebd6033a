"""Shared fixtures of the probe tests: a synthetic profile (pure) and a torch environment for CPU runs."""

from __future__ import annotations

import os

import pytest
from chunkpilot.engine.probe.profile import StepProfile
from chunkpilot.engine.probe.synthetic import synthetic_profile
from chunkpilot.engine.probe.torchenv import (
    TorchEnvError,
    ensure_torch,
    probe_environment,
    torch_in_environment,
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
