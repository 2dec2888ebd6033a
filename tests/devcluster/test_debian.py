"""On-demand Debian package installs refuse clearly where apt-get cannot run."""

from __future__ import annotations

import pytest

from chunkpilot.devcluster import debian


def test_without_apt_get_the_error_says_to_install_it_by_hand(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(debian.shutil, "which", lambda _name: None)
    with pytest.raises(debian.AptUnavailableError, match="cannot install prometheus: apt-get needs root"):
        debian.install_package("prometheus", lambda _message: None)


def test_not_root_is_refused_before_running_anything(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(debian.shutil, "which", lambda _name: "/usr/bin/apt-get")
    monkeypatch.setattr(debian.os, "geteuid", lambda: 1000)
    ran: list[object] = []
    monkeypatch.setattr(debian.subprocess, "run", lambda *args, **kwargs: ran.append(args))
    with pytest.raises(debian.AptUnavailableError):
        debian.install_package("postgresql", lambda _message: None)
    assert ran == []
