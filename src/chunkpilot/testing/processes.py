"""Processes a test runs to their end: output captured as text, the exit status the test's to check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any


def captured(
    argv: Sequence[str],
    *,
    timeout: float,
    input: str | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` to its end (at most ``timeout`` seconds) with ``input`` on its stdin, its stdout and
    stderr captured as text; ``env`` adds to this process's environment."""
    return subprocess.run(
        list(argv),
        input=input,
        capture_output=True,
        text=True,
        env=None if env is None else {**os.environ, **env},
        timeout=timeout,
        check=False,
    )


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``python -m chunkpilot.cli ARGS`` in a fresh interpreter, through :func:`captured`."""
    return captured([sys.executable, "-m", "chunkpilot.cli", *args], timeout=timeout)


def json_through(argv: Sequence[str], payload: Any, *, timeout: float = 300) -> Any:
    """Run ``argv`` with ``payload`` as JSON on its stdin; it must exit 0, and its stdout (JSON, all of
    it) is returned parsed."""
    proc = captured(argv, input=json.dumps(payload), timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)
