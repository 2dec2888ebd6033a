"""A real ``chunkpilot sim serve`` process for the server tests."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from chunkpilot.devcluster.ports import LOOPBACK, free_port
from chunkpilot.devcluster.processes import terminate_group


@dataclass(frozen=True)
class SimServer:
    """A running simulator server."""

    host: str
    port: int
    time_scale: float
    log: Path

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"{self.url}{path}", timeout=10) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    def totals(self) -> dict[str, float]:
        """``/metrics`` as one value per series name, summed over labels (``name:source`` apart)."""
        status, body = self.get("/metrics")
        assert status == 200
        values: dict[str, float] = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                series = name.split("{")[0]
                if 'source="' in name:
                    series += ":" + name.split('source="')[1].split('"')[0]
                values[series] = values.get(series, 0.0) + float(value)
        return values


@contextlib.contextmanager
def run_sim_server(
    log_dir: Path, *args: str, time_scale: float = 1.0, env: dict[str, str] | None = None
) -> Iterator[SimServer]:
    """Start ``chunkpilot sim serve ARGS`` on a free loopback port; stop it (SIGTERM, then SIGKILL) after.

    ``env`` is added to this process's environment.
    """
    port = free_port()
    log = log_dir / f"sim-serve-{port}.log"
    argv = [sys.executable, "-m", "chunkpilot.cli", "sim", "serve", *args]
    argv += ["--host", LOOPBACK, "--port", str(port), "--time-scale", f"{time_scale:g}"]
    with log.open("wb") as sink:
        process = subprocess.Popen(
            argv,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
    server = SimServer(LOOPBACK, port, time_scale, log)
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                pytest.fail(f"sim serve exited with {process.returncode}:\n{log.read_text()[-2000:]}")
            with contextlib.suppress(OSError):
                if server.get("/health")[0] == 200:
                    break
            if time.monotonic() > deadline:
                pytest.fail(f"sim serve not healthy within 60 s:\n{log.read_text()[-2000:]}")
            time.sleep(0.1)
        yield server
    finally:
        terminate_group(process.pid, popen=process)


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
