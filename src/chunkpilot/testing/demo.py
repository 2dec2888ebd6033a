"""The demo under test: its command line and the processes it leaves behind."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

#: The environment variable that marks every process of one demo run under test.
MARKER = "CHUNKPILOT_DEMO_TEST_RUN"


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


@dataclass
class DemoRun:
    """One ``chunkpilot demo --fast`` under test: its command line, writing under ``state`` and
    ``reports``, and an environment whose :data:`MARKER` every process it starts inherits."""

    state: Path
    reports: Path
    marker: str = field(default_factory=lambda: uuid.uuid4().hex)

    def command(self, *options: str) -> list[str]:
        """``python -m chunkpilot.cli demo --fast OPTIONS --state-dir … --report-dir …``."""
        return [
            sys.executable, "-m", "chunkpilot.cli", "demo", "--fast", *options,
            "--state-dir", str(self.state), "--report-dir", str(self.reports),
        ]  # fmt: skip

    def run(self, *options: str, timeout: float) -> subprocess.CompletedProcess[str]:
        """Run the demo with ``options`` to its end (at most ``timeout`` seconds), its output captured."""
        return subprocess.run(
            self.command(*options), env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, MARKER: self.marker}

    def leftovers(self) -> dict[str, str]:
        """The run's processes still alive: a test that must leave none asserts this is empty."""
        return processes_carrying(f"{MARKER}={self.marker}")
