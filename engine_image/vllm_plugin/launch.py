"""Start and stop a real vLLM CPU server on the tiny model (tests and benchmarks).

The CPU build registers no ``vllm`` distribution name, so the server runs as
``python -m vllm.entrypoints.openai.api_server --model DIR`` from the cached
environment (:mod:`.env`), with dummy weights and ``--gpu-memory-utilization``
reserving that fraction of RAM. The process runs in its own session so that
stopping it also ends the engine-core and worker children.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from chunkpilot.engine.vllm_plugin.env import EngineEnv

SERVED_MODEL_NAME = "tiny"
#: Fraction of RAM the CPU build reserves (weights, activations and KV cache).
CPU_MEMORY_FRACTION = "0.3"


class ServerStartError(RuntimeError):
    """The server exited or did not become healthy in time; the message holds its log tail."""


def free_port() -> int:
    """An unused local TCP port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def tiny_model(env: EngineEnv, folder: Path) -> Path:
    """Create the tiny model folder with the environment's ``tokenizers`` (idempotent)."""
    if not (folder / "config.json").is_file():
        subprocess.run(
            [str(env.python), "-m", "chunkpilot.engine.vllm_plugin.tiny_model", str(folder)],
            check=True,
            capture_output=True,
        )
    return folder


def server_argv(env: EngineEnv, model: Path, port: int, engine_args: Sequence[str]) -> list[str]:
    """The command line of a server on ``model`` with ``engine_args`` (``vllm serve`` flags)."""
    return [
        str(env.python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        SERVED_MODEL_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--load-format",
        "dummy",
        "--gpu-memory-utilization",
        CPU_MEMORY_FRACTION,
        *engine_args,
    ]


@dataclass
class VllmServer:
    """One running server process (and its children)."""

    argv: list[str]
    port: int
    log_path: Path
    environ: Mapping[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    startup_s: float | None = None
    _log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        environ = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **self.environ}
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            self.argv, stdout=self._log, stderr=subprocess.STDOUT, env=environ, start_new_session=True
        )

    def log_tail(self, lines: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def wait_ready(self, timeout_s: float = 600.0, started: float | None = None) -> float:
        """Block until ``/health`` answers 200; return the seconds since ``started`` (default now)."""
        assert self.process is not None, "start() first"
        started = time.monotonic() if started is None else started
        deadline = started + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerStartError(
                    f"vLLM exited with {self.process.returncode} during start-up; log {self.log_path}:\n"
                    + self.log_tail()
                )
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as response:
                    if response.status == 200:
                        self.startup_s = time.monotonic() - started
                        return self.startup_s
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1.0)
        raise ServerStartError(
            f"vLLM not healthy after {timeout_s:.0f}s; log {self.log_path}:\n" + self.log_tail()
        )

    def stop(self, grace_s: float = 20.0) -> None:
        """Stop the server's process group: SIGTERM, then SIGKILL after ``grace_s``."""
        process = self.process
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
        if process is not None:
            # Children left in the group (engine core, workers) go too.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        if self._log is not None:
            self._log.close()
            self._log = None


def start_server(
    env: EngineEnv,
    model: Path,
    engine_args: Sequence[str],
    log_path: Path,
    environ: Mapping[str, str] | None = None,
    timeout_s: float = 600.0,
) -> VllmServer:
    """Start a server and wait until it is healthy (stopping it when it is not)."""
    port = free_port()
    server = VllmServer(server_argv(env, model, port, engine_args), port, log_path, dict(environ or {}))
    started = time.monotonic()
    server.start()
    try:
        server.wait_ready(timeout_s, started)
    except BaseException:
        server.stop()
        raise
    return server
