"""Process groups, readiness waits and teardown (with small real processes)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from chunkpilot.devcluster.processes import ManagedProcess, StartupError, process_command_line


def _python(tmp_path: Path, code: str, name: str = "server") -> ManagedProcess:
    return ManagedProcess(name=name, argv=[sys.executable, "-c", code], log_path=tmp_path / f"{name}.log")


def test_exit_before_ready_reports_the_log_tail(tmp_path: Path) -> None:
    process = _python(tmp_path, "import sys; print('bad flag --frobnicate'); sys.exit(3)").start()
    with pytest.raises(StartupError, match=r"(?s)exited with code 3.*bad flag --frobnicate"):
        process.wait_until(lambda: False, timeout=30, what="ready")


def test_timeout_reports_what_was_awaited(tmp_path: Path) -> None:
    process = _python(tmp_path, "import time; print('warming up', flush=True); time.sleep(60)").start()
    try:
        # The child has logged before the short wait starts: on a busy machine its interpreter can
        # take longer than the wait to start, and the tail would still be empty.
        process.wait_until(lambda: "warming up" in process.tail(), timeout=30, what="the first log line")
        with pytest.raises(StartupError, match=r"(?s)did not become ready \(GET /readyz\).*warming up"):
            process.wait_until(lambda: False, timeout=0.5, what="GET /readyz")
    finally:
        process.stop()


def test_stop_ends_the_whole_process_group(tmp_path: Path) -> None:
    child_pid_file = tmp_path / "child.pid"
    code = (
        "import subprocess, sys, time;"
        f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']);"
        f"open({str(child_pid_file)!r}, 'w').write(str(child.pid));"
        "time.sleep(120)"
    )
    process = _python(tmp_path, code).start()
    deadline = time.monotonic() + 30
    while not child_pid_file.exists() or not child_pid_file.read_text():
        assert time.monotonic() < deadline, "the child never started"
        time.sleep(0.05)
    child_pid = int(child_pid_file.read_text())
    process.stop(timeout=5)
    assert not process.running()
    deadline = time.monotonic() + 10
    while process_command_line(child_pid) not in (None, []):
        assert time.monotonic() < deadline, "the grandchild survived stop()"
        time.sleep(0.05)


def test_stop_escalates_to_sigkill(tmp_path: Path) -> None:
    # The marker is assembled at run time so the logged command line does not contain it.
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        "print('ign' + 'oring', flush=True); time.sleep(120)"
    )
    process = _python(tmp_path, code).start()
    process.wait_until(lambda: "ignoring" in process.tail(), timeout=30, what="SIGTERM ignored")
    process.stop(timeout=0.5)
    assert not process.running()
    assert process.popen is not None and process.popen.returncode == -9
