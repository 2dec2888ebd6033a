"""A real ``chunkpilot sim serve`` process for the server tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from chunkpilot.testing.simserver import SimServer, run_sim_server


@pytest.fixture(scope="module")
def sim_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimServer]:
    """Llama-3.1-8B on an H100 in real time, served as ``llama-8b``."""
    args = ("llama-3.1-8b", "--gpu", "h100", "--served-model-name", "llama-8b", "--max-model-len", "4096")
    with run_sim_server(tmp_path_factory.mktemp("sim-server"), *args) as server:
        yield server


@pytest.fixture(scope="module")
def fast_sim_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimServer]:
    """Llama-3.1-8B with a 512-token context at 1000x real time (outputs finish in milliseconds)."""
    args = ("llama-3.1-8b", "--served-model-name", "llama-8b", "--max-model-len", "512")
    with run_sim_server(tmp_path_factory.mktemp("sim-fast"), *args, time_scale=1000.0) as server:
        yield server


@pytest.fixture
def sim_server_runner() -> Any:
    """``run_sim_server`` for tests that need their own server flags (``with runner(dir, *args) as s``)."""
    return run_sim_server


#: Bearer token of ``live_sim_server``'s live-adjustment route.
LIVE_TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def live_sim_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimServer]:
    """Like ``sim_server`` (budget 2048) with the live-adjustment route on (token ``LIVE_TOKEN``)."""
    args = ("llama-3.1-8b", "--gpu", "h100", "--max-model-len", "4096", "--max-num-batched-tokens", "2048")
    env = {"CHUNKPILOT_LIVE_ADJUST_TOKEN": LIVE_TOKEN}
    with run_sim_server(tmp_path_factory.mktemp("sim-live"), *args, env=env) as server:
        yield server
