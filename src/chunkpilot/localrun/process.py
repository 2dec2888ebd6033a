"""Engine processes: start in their own process group, probe ``/health``, stop without leftovers."""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path


def probe_health(host: str, port: int, timeout_s: float = 0.5, path: str = "/health") -> bool:
    """Whether ``GET path`` (default ``/health``) answers 200 (a readiness probe)."""
    connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        connection.request("GET", path)
        return connection.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()


def tail(path: Path, max_bytes: int = 2048) -> str:
    """The last ``max_bytes`` of a log file, decoded leniently."""
    try:
        with path.open("rb") as stream:
            stream.seek(0, os.SEEK_END)
            size = stream.tell()
            stream.seek(max(0, size - max_bytes))
            return stream.read().decode("utf-8", "replace")
    except OSError:
        return ""


class EngineProcess:
    """One engine process, the leader of its own process group, logging to a file."""

    def __init__(
        self,
        command: Sequence[str],
        *,
        host: str,
        port: int,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        health_path: str = "/health",
    ) -> None:
        self.command = list(command)
        self.host = host
        self.port = port
        self.health_path = health_path
        self.log_path = log_path
        self.started_at = datetime.now(UTC)
        self._term_sent_at: float | None = None
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log:
            log.write(f"--- {self.started_at.isoformat()} {' '.join(self.command)}\n".encode())
            log.flush()
            self._popen = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        """The process id (also the process group id)."""
        return self._popen.pid

    def exit_code(self) -> int | None:
        """The exit status once the process has ended (negative: killed by that signal)."""
        return self._popen.poll()

    def healthy(self) -> bool:
        """Whether the process is alive and its health path answers 200."""
        return self.exit_code() is None and probe_health(self.host, self.port, path=self.health_path)

    def _signal_group(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._popen.pid, signum)

    def kill(self) -> None:
        """Kill the whole process group at once (a crash, or the end of a grace period)."""
        self._signal_group(signal.SIGKILL)

    def terminate(self) -> None:
        """Ask the process group to shut down (SIGTERM), as a kubelet does on pod deletion."""
        if self._term_sent_at is None:
            self._term_sent_at = time.monotonic()
        self._signal_group(signal.SIGTERM)

    def reap(self, grace_s: float) -> bool:
        """After :meth:`terminate`: kill once ``grace_s`` has passed; True when the process is gone."""
        if self.exit_code() is not None:
            self._signal_group(signal.SIGKILL)  # stray children of the group, if any
            return True
        if self._term_sent_at is not None and time.monotonic() - self._term_sent_at >= grace_s:
            self.kill()
        return False

    def stop(self, grace_s: float = 5.0) -> int:
        """Terminate, wait up to ``grace_s``, then kill; returns the exit status."""
        self.terminate()
        try:
            return self._popen.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return self._popen.wait()
        finally:
            self._signal_group(signal.SIGKILL)

    def log_tail(self, max_bytes: int = 1024) -> str:
        """The end of the process's output (for termination messages)."""
        return tail(self.log_path, max_bytes)
