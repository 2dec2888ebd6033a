"""Where the development tooling keeps its state: one cache folder outside the repository."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "CHUNKPILOT_CACHE"


def cache_root() -> Path:
    """The cache root: ``$CHUNKPILOT_CACHE``, ``$XDG_CACHE_HOME/chunkpilot`` or ``~/.cache/chunkpilot``."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "chunkpilot"


def bin_dir() -> Path:
    """Built binaries, one folder per component and version (``bin/kubernetes-v1.36.3/``)."""
    return cache_root() / "bin"


def go_path() -> Path:
    """GOPATH (module cache included) used for builds, so downloads survive between runs."""
    return cache_root() / "go"


def go_cache() -> Path:
    """GOCACHE used for builds, so a rebuild after a cache wipe of ``bin/`` is fast."""
    return cache_root() / "go-build"


def build_work_dir() -> Path:
    """Scratch Go modules the binaries are built from."""
    return cache_root() / "work"


def logs_dir() -> Path:
    """Build logs."""
    return cache_root() / "logs"


def clusters_dir() -> Path:
    """State of detached clusters started by ``chunkpilot cluster up`` (one folder per name)."""
    return cache_root() / "clusters"
