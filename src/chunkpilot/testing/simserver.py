"""A real ``chunkpilot sim serve`` process on a free loopback port, for tests that talk to it over HTTP."""

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

import pytest

from chunkpilot.devcluster.ports import LOOPBACK, free_port
from chunkpilot.devcluster.processes import terminate_group

__all__ = ["SimServer", "run_sim_server"]


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
