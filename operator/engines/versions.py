"""Engine versions: parse ``0.33.0`` / ``v0.8.5.post1`` and compare them."""

from __future__ import annotations

import re
from dataclasses import dataclass

_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:[.+-]?[0-9A-Za-z.+-]*)?$")


@dataclass(frozen=True, order=True)
class EngineVersion:
    """A release version as ``major.minor.patch``; suffixes such as ``.post1`` are ignored."""

    major: int
    minor: int
    patch: int = 0

    @classmethod
    def parse(cls, text: str) -> EngineVersion:
        """Parse ``0.33.0``, ``0.8``, ``v0.10.1`` or ``0.8.5.post1``; raise ValueError otherwise."""
        match = _VERSION_RE.match(text.strip())
        if match is None:
            raise ValueError(f"invalid engine version {text!r}: use a release number such as 0.33.0")
        major, minor, patch = match.groups()
        return cls(int(major), int(minor), int(patch or 0))

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"
