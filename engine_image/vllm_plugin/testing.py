"""Helpers for tests against the real vLLM CPU engine: the test server's settings and step log.

Used by ``tests/engine/vllm_plugin`` (whose session fixture starts ONE server
with these settings) and importable from any test.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chunkpilot.engine.vllm_plugin.launch import VllmServer

# The session server's start-up limits and plugin configuration.
STARTUP_BUDGET = 2048
MAX_NUM_SEQS = 16
MAX_MODEL_LEN = 16384
LANES = 2
LONG_LANES = 1
LONG_THRESHOLD = 1024
TOKEN = "test-live-adjust-token"


@dataclass
class EngineServer:
    """The running session server and the files the plugin writes."""

    server: VllmServer
    step_log: Path
    control_file: Path
    token: str

    @property
    def url(self) -> str:
        return self.server.url

    def steps(self) -> list[dict[str, Any]]:
        """Every step recorded so far."""
        return [json.loads(line) for line in self.step_log.read_text().splitlines() if line.strip()]

    def mark(self) -> int:
        """The number of steps recorded so far (use with :meth:`steps_since`)."""
        return len(self.steps())

    def steps_since(self, mark: int) -> list[dict[str, Any]]:
        return self.steps()[mark:]
