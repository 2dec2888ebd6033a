"""Helpers of the demo's end-to-end tests."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest


def processes_carrying(marker: str) -> dict[str, str]:
    """Processes whose environment holds ``marker`` (``NAME=value``; every descendant of the demo
    inherits it), by pid, with the start of their command line."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker.encode() in environ:
            found[entry.name] = cmdline[:200]
    return found


@pytest.fixture
def leftover_processes() -> Callable[[str], dict[str, str]]:
    """:func:`processes_carrying`, for a test that must leave no process behind."""
    return processes_carrying
