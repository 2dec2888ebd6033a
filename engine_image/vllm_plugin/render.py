"""Engine arguments and environment that turn the plugin on (pure; used by the operator).

vLLM 0.9 and later have no ``--max-num-partial-prefills`` / ``--max-long-partial-prefills``
(the V1 scheduler never enforced them). For those versions the limits are
provided by the Chunkpilot scheduler instead::

    plugin_args(PluginSettings(max_num_partial_prefills=4, max_long_partial_prefills=1,
                               long_prefill_threshold=2048))
    # ['--scheduler-cls', 'chunkpilot.engine.vllm_plugin.scheduler.ChunkpilotScheduler',
    #  '--additional-config', '{"chunkpilot":{...}}']
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any, Final

from chunkpilot.engine.live_adjust import LIVE_ADJUST_TOKEN_ENV
from chunkpilot.engine.vllm_plugin.config import ADDITIONAL_CONFIG_KEY

SCHEDULER_CLS: Final = "chunkpilot.engine.vllm_plugin.scheduler.ChunkpilotScheduler"
GENERAL_PLUGIN: Final = "chunkpilot"
ENDPOINT_PLUGIN: Final = "chunkpilot_live_adjust"
#: Where the live-adjustment control file lives in the engine container (an emptyDir).
DEFAULT_CONTROL_FILE: Final = "/run/chunkpilot/limits.json"
#: The engine image built from engine_image/Dockerfile, per supported vLLM release.
ENGINE_IMAGE_REPOSITORY: Final = "ghcr.io/chunkpilot/engine-vllm"
SUPPORTED_VLLM_VERSIONS: Final = ("0.33.0",)
#: Oldest vLLM release whose V1 scheduler this plugin was checked against (on the CPU build).
OLDEST_CHECKED_VLLM: Final = "0.32.0"


@dataclasses.dataclass(frozen=True)
class PluginSettings:
    """What the operator wants from the plugin for one engine."""

    max_num_partial_prefills: int | None = None
    max_long_partial_prefills: int | None = None
    long_prefill_threshold: int | None = None
    live_adjust: bool = False
    control_file: str = DEFAULT_CONTROL_FILE

    @property
    def needed(self) -> bool:
        return self.max_num_partial_prefills is not None or self.live_adjust


def additional_config(settings: PluginSettings) -> dict[str, Any]:
    """The ``--additional-config`` section for ``settings`` (empty when nothing is on)."""
    section: dict[str, Any] = {}
    if settings.max_num_partial_prefills is not None:
        section["max_num_partial_prefills"] = settings.max_num_partial_prefills
        if settings.max_long_partial_prefills is not None:
            section["max_long_partial_prefills"] = settings.max_long_partial_prefills
        if settings.long_prefill_threshold:
            section["long_prefill_threshold"] = settings.long_prefill_threshold
    if settings.live_adjust:
        section["control_file"] = settings.control_file
    return {ADDITIONAL_CONFIG_KEY: section} if section else {}


def plugin_args(settings: PluginSettings, extra_args: Sequence[str] = ()) -> list[str]:
    """``--scheduler-cls`` and ``--additional-config`` for ``settings`` ([] when not needed).

    An ``--additional-config`` already present in ``extra_args`` is merged into,
    so the caller should drop it from ``extra_args`` when using the result.
    """
    if not settings.needed:
        return []
    merged: dict[str, Any] = {}
    for index, arg in enumerate(extra_args):
        if arg == "--additional-config" and index + 1 < len(extra_args):
            merged.update(json.loads(extra_args[index + 1]))
        elif arg.startswith("--additional-config="):
            merged.update(json.loads(arg.partition("=")[2]))
    merged.update(additional_config(settings))
    return [
        "--scheduler-cls",
        SCHEDULER_CLS,
        "--additional-config",
        json.dumps(merged, sort_keys=True, separators=(",", ":")),
    ]


def plugin_env(settings: PluginSettings, token_secret: tuple[str, str] | None = None) -> list[dict[str, Any]]:
    """Container environment: with live adjustment, allowlist the route and pass its token.

    ``token_secret`` is ``(secret name, key)`` of the bearer token.
    """
    if not settings.live_adjust:
        return []
    env: list[dict[str, Any]] = [
        # VLLM_PLUGINS is an allowlist for every plugin group once set.
        {"name": "VLLM_PLUGINS", "value": f"{GENERAL_PLUGIN},{ENDPOINT_PLUGIN}"},
    ]
    if token_secret is not None:
        name, key = token_secret
        env.append({"name": LIVE_ADJUST_TOKEN_ENV, "valueFrom": {"secretKeyRef": {"name": name, "key": key}}})
    return env


def engine_image(version: str) -> str:
    """The Chunkpilot engine image for a vLLM release (``0.33.0`` -> ``...:vllm-v0.33.0``)."""
    bare = version.removeprefix("v")
    if bare not in SUPPORTED_VLLM_VERSIONS:
        raise ValueError(
            f"no Chunkpilot engine image for vLLM {version}; supported: {', '.join(SUPPORTED_VLLM_VERSIONS)}"
        )
    return f"{ENGINE_IMAGE_REPOSITORY}:vllm-v{bare}"
