"""Plugin configuration: partial-prefill limits, live limits and the control channel.

Pure Python (no vLLM import), so the operator and tests can use it anywhere.

Configuration comes from the engine's ``--additional-config`` JSON under the
``chunkpilot`` key, and from ``CHUNKPILOT_*`` environment variables for keys
the JSON does not set::

    --additional-config '{"chunkpilot": {"max_num_partial_prefills": 2,
                                         "max_long_partial_prefills": 1,
                                         "long_prefill_threshold": 1024,
                                         "control_file": "/run/chunkpilot/limits.json"}}'
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from chunkpilot.engine.live_adjust import PluginConfigError, int_field

ADDITIONAL_CONFIG_KEY = "chunkpilot"
ENV_PREFIX = "CHUNKPILOT_"
# Default "long prompt" threshold as a fraction of max-model-len (vLLM V0's default).
DEFAULT_LONG_FRACTION = 0.04


@dataclasses.dataclass(frozen=True)
class PartialPrefillLimits:
    """At most ``max_num_partial_prefills`` requests prefill at once, at most
    ``max_long_partial_prefills`` of them with a prompt above ``long_prefill_threshold``."""

    max_num_partial_prefills: int
    max_long_partial_prefills: int
    long_prefill_threshold: int

    def is_long(self, prompt_tokens: int) -> bool:
        return prompt_tokens > self.long_prefill_threshold


@dataclasses.dataclass(frozen=True)
class PluginConfig:
    """Everything the scheduler plugin reads at start-up."""

    max_num_partial_prefills: int | None = None
    max_long_partial_prefills: int | None = None
    long_prefill_threshold: int | None = None
    # JSON-lines file receiving one record per scheduler step (off when None).
    step_log: str | None = None
    # File through which the API server hands lowered limits to the scheduler.
    control_file: str | None = None

    def partial_prefill_limits(self, max_model_len: int) -> PartialPrefillLimits | None:
        """The limits to enforce, or None when partial-prefill limiting is off."""
        if self.max_num_partial_prefills is None:
            return None
        long_limit = self.max_long_partial_prefills
        if long_limit is None:
            long_limit = self.max_num_partial_prefills
        threshold = self.long_prefill_threshold
        if threshold is None or threshold == 0:
            threshold = max(1, int(max_model_len * DEFAULT_LONG_FRACTION))
        return PartialPrefillLimits(self.max_num_partial_prefills, long_limit, threshold)


_INT_FIELDS = ("max_num_partial_prefills", "max_long_partial_prefills", "long_prefill_threshold")
_STR_FIELDS = ("step_log", "control_file")


def load_plugin_config(
    additional_config: Mapping[str, Any] | None, environ: Mapping[str, str] | None = None
) -> PluginConfig:
    """Merge ``additional_config["chunkpilot"]`` with ``CHUNKPILOT_*`` variables (JSON wins)."""
    environ = os.environ if environ is None else environ
    section: Mapping[str, Any] = {}
    if additional_config and ADDITIONAL_CONFIG_KEY in additional_config:
        raw = additional_config[ADDITIONAL_CONFIG_KEY]
        if not isinstance(raw, Mapping):
            raise PluginConfigError(
                f"--additional-config: '{ADDITIONAL_CONFIG_KEY}' must be a JSON object, got {raw!r}"
            )
        section = raw
    known = set(_INT_FIELDS) | set(_STR_FIELDS)
    unknown = sorted(set(section) - known)
    if unknown:
        raise PluginConfigError(
            f"--additional-config: unknown {ADDITIONAL_CONFIG_KEY} key(s) {unknown}; "
            f"known keys are {sorted(known)}"
        )
    values: dict[str, Any] = {}
    for name in (*_INT_FIELDS, *_STR_FIELDS):
        env_name = ENV_PREFIX + name.upper()
        if name in section and section[name] is not None:
            value, source = section[name], f"--additional-config {ADDITIONAL_CONFIG_KEY}.{name}"
        elif environ.get(env_name):
            value, source = environ[env_name], f"environment {env_name}"
        else:
            continue
        if name in _INT_FIELDS:
            minimum = 0 if name == "long_prefill_threshold" else 1
            values[name] = int_field(name, value, source, minimum)
        else:
            values[name] = str(value)
    config = PluginConfig(**values)
    if config.max_long_partial_prefills is not None:
        if config.max_num_partial_prefills is None:
            raise PluginConfigError("max_long_partial_prefills needs max_num_partial_prefills: set both")
        if config.max_long_partial_prefills > config.max_num_partial_prefills:
            raise PluginConfigError(
                f"max_long_partial_prefills ({config.max_long_partial_prefills}) must be <= "
                f"max_num_partial_prefills ({config.max_num_partial_prefills})"
            )
    return config


def write_json_atomic(path: str | Path, data: Mapping[str, Any]) -> None:
    """Write JSON so that a concurrent reader sees the old or the new file, never half of one."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle)
    os.replace(tmp, target)


def applied_file(control_file: str | Path) -> Path:
    """Where the scheduler reports the limits it applies."""
    return Path(f"{control_file}.applied")
