"""Engine versions: parse ``0.33.0`` / ``v0.8.5.post1`` and compare them.

The type lives with the knob table (:mod:`chunkpilot.api.knobs`), whose version columns use it.
"""

from __future__ import annotations

from chunkpilot.api.knobs import EngineVersion

__all__ = ["EngineVersion"]
