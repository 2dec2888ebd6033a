"""The demo's end-to-end tests: each gets a demo run of its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from chunkpilot.testing.demo import DemoRun


@pytest.fixture
def demo(tmp_path: Path) -> DemoRun:
    """A demo run writing under the test's ``tmp_path`` (``state``, ``reports``)."""
    return DemoRun(tmp_path / "state", tmp_path / "reports")
