"""Helpers to run the operator as a real process against a cluster (tests and benchmarks)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, TypeVar

import yaml

T = TypeVar("T")

#: Logged by Kopf once the startup handlers have run and the operator serves.
STARTED_MARKER = "Activity 'configure' succeeded."


def wait_for(
    probe: Callable[[], T | None], *, timeout: float, interval: float = 0.2, what: str = "condition"
) -> T:
    """Poll ``probe`` until it returns something truthy; raise TimeoutError naming ``what``."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what} (last value: {last!r})")


class OperatorProcess:
    """``chunkpilot operator ARGS`` as a subprocess writing its log to a file."""

    def __init__(self, args: Sequence[str], *, env: dict[str, str], log_path: Path) -> None:
        self.args = list(args)
        self.env = env
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._offset = 0

    def start(self, *, wait: bool = True, timeout: float = 60.0) -> OperatorProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self._log = self.log_path.open("ab")
        argv = [sys.executable, "-m", "chunkpilot.cli", "operator", *self.args]
        self.process = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, env=self.env)
        if wait:
            self.wait_for_log(STARTED_MARKER, timeout=timeout)
        return self

    def log(self) -> str:
        """The log written since the last start."""
        if not self.log_path.exists():
            return ""
        with self.log_path.open("rb") as handle:
            handle.seek(self._offset)
            return handle.read().decode(errors="replace")

    def wait_for_log(self, pattern: str, *, timeout: float = 60.0) -> str:
        regex = re.compile(re.escape(pattern))

        def found() -> str | None:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"operator exited with {self.process.returncode}:\n{self.log()[-4000:]}")
            match = regex.search(self.log())
            return match.group(0) if match else None

        return wait_for(found, timeout=timeout, what=f"operator log line {pattern!r}")

    def rss_bytes(self) -> int:
        """Resident memory of the process (Linux)."""
        assert self.process is not None
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM (Kopf exits cleanly, leaving the peering object), SIGKILL if it hangs."""
        process, self.process = self.process, None
        code = None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                code = process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                code = process.wait(10)
        elif process is not None:
            code = process.returncode
        if self._log is not None:
            self._log.close()
            self._log = None
        return code


def token_kubeconfig(admin_kubeconfig: Path, token: str, path: Path, namespace: str = "default") -> Path:
    """A kubeconfig for the same cluster as ``admin_kubeconfig`` that authenticates with ``token``."""
    admin: dict[str, Any] = yaml.safe_load(admin_kubeconfig.read_text())
    cluster = admin["clusters"][0]["cluster"]
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "cluster", "cluster": cluster}],
        "users": [{"name": "token", "user": {"token": token}}],
        "contexts": [
            {"name": "token", "context": {"cluster": "cluster", "user": "token", "namespace": namespace}}
        ],
        "current-context": "token",
    }
    path.write_text(yaml.safe_dump(document))
    path.chmod(0o600)
    return path


def operator_env(base: dict[str, str] | None = None, **extra: str) -> dict[str, str]:
    """Environment for an operator process: unbuffered output, autotuner off unless asked for."""
    env = dict(os.environ if base is None else base)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("CHUNKPILOT_AUTOTUNER", "off")
    env.update(extra)
    return env
