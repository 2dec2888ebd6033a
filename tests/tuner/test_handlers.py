"""The tuner's environment switches."""

from __future__ import annotations

import pytest
from chunkpilot.tuner import handlers


@pytest.mark.parametrize(
    ("value", "expected"), [(None, True), ("on", True), ("off", False), (" OFF ", False)]
)
def test_twin_switch(monkeypatch: pytest.MonkeyPatch, value: str | None, expected: bool) -> None:
    if value is None:
        monkeypatch.delenv(handlers.ENV_TWIN, raising=False)
    else:
        monkeypatch.setenv(handlers.ENV_TWIN, value)
    assert handlers.twin_enabled() is expected


def test_twin_switch_rejects_other_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(handlers.ENV_TWIN, "maybe")
    with pytest.raises(ValueError, match="CHUNKPILOT_TWIN='maybe': use on or off"):
        handlers.twin_enabled()
