"""Run local servers as process groups with log files, readiness waits and clean teardown."""

from __future__ import annotations

import contextlib
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

_POLL_SECONDS = 0.2


class StartupError(RuntimeError):
    """A server exited or did not become ready in time; the message carries its log tail."""


def log_tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file (or a note that there is none)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:]) or "(log is empty)"


def start_or_undo(start: Callable[[], None], stop: Callable[[], None]) -> None:
    """Run ``start``; when it fails or is interrupted, ``stop`` what it started and re-raise."""
    try:
        start()
    except BaseException:
        stop()
        raise


@dataclass
class ManagedProcess:
    """One server process, started in its own session so that its whole group can be stopped."""

    name: str
    argv: Sequence[str]
    log_path: Path
    env: Mapping[str, str] | None = None
    cwd: Path | None = None
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self) -> ManagedProcess:
        """Start the process with stdout and stderr appended to :attr:`log_path`."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"$ {' '.join(self.argv)}\n".encode())
            log.flush()
            self.popen = subprocess.Popen(
                list(self.argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(self.env) if self.env is not None else None,
                cwd=self.cwd,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        """The process id (also its process-group id)."""
        if self.popen is None:
            raise RuntimeError(f"{self.name} was never started")
        return self.popen.pid

    def running(self) -> bool:
        """Whether the process is still alive."""
        return self.popen is not None and self.popen.poll() is None

    def tail(self, lines: int = 30) -> str:
        """The last lines of the log."""
        return log_tail(self.log_path, lines)

    def wait_until(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll ``ready`` until it is true; raise :class:`StartupError` with the log tail otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            if not self.running():
                code = self.popen.returncode if self.popen is not None else None
                raise StartupError(
                    f"{self.name} exited with code {code} before {what}; last log lines "
                    f"({self.log_path}):\n{self.tail()}"
                )
            if ready():
                return
            if time.monotonic() > deadline:
                raise StartupError(
                    f"{self.name} did not become ready ({what}) within {timeout:.0f}s; last log lines "
                    f"({self.log_path}):\n{self.tail()}"
                )
            time.sleep(_POLL_SECONDS)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the whole process group: SIGTERM, then SIGKILL after ``timeout`` seconds."""
        if self.popen is None:
            return
        terminate_group(self.popen.pid, timeout, self.popen)


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    # Format: "pid (comm) state ..."; comm may contain spaces, the state follows the last ')'.
    return stat.rpartition(")")[2].split()[0] in {"Z", "X"}


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - not ours
        return True
    # A detached server's exited leader may linger as a zombie until its new parent reaps it.
    return not _is_zombie(pgid)


def _reap(popen: subprocess.Popen[bytes] | None) -> None:
    if popen is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(timeout=0)


def terminate_group(pgid: int, timeout: float = 10.0, popen: subprocess.Popen[bytes] | None = None) -> None:
    """Stop process group ``pgid`` (SIGTERM, then SIGKILL) and wait until it is gone."""
    for sig, grace in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            _reap(popen)
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            _reap(popen)
            if not _group_alive(pgid):
                return
            time.sleep(0.1)
    _reap(popen)


def process_command_line(pid: int) -> list[str] | None:
    """The argv of a running process, or ``None`` if it does not exist."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def http_ok(
    url: str,
    context: ssl.SSLContext | None = None,
    timeout: float = 2.0,
    headers: Mapping[str, str] | None = None,
) -> bool:
    """Whether ``GET url`` (with ``headers``) answers 200."""
    request = urllib.request.Request(url, headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def insecure_tls_context() -> ssl.SSLContext:
    """A TLS context that skips verification: only for health checks of self-signed loopback servers."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context
