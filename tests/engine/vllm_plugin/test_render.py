"""Engine arguments and environment that switch the plugin on (pure, used by the operator)."""

from __future__ import annotations

import json

import pytest
from chunkpilot.engine.live_adjust import LIVE_ADJUST_TOKEN_ENV
from chunkpilot.engine.vllm_plugin.config import load_plugin_config
from chunkpilot.engine.vllm_plugin.render import (
    DEFAULT_CONTROL_FILE,
    SCHEDULER_CLS,
    PluginSettings,
    engine_image,
    plugin_args,
    plugin_env,
)


def _additional(args: list[str]) -> dict[str, object]:
    assert args[:2] == ["--scheduler-cls", SCHEDULER_CLS]
    assert args[2] == "--additional-config"
    parsed: dict[str, object] = json.loads(args[3])
    return parsed


def test_nothing_rendered_when_nothing_is_asked() -> None:
    assert plugin_args(PluginSettings()) == []
    assert plugin_env(PluginSettings()) == []


def test_partial_prefill_limits_round_trip_through_the_plugin_config() -> None:
    settings = PluginSettings(
        max_num_partial_prefills=4, max_long_partial_prefills=1, long_prefill_threshold=2048
    )
    additional = _additional(plugin_args(settings))
    assert additional == {
        "chunkpilot": {
            "max_num_partial_prefills": 4,
            "max_long_partial_prefills": 1,
            "long_prefill_threshold": 2048,
        }
    }
    config = load_plugin_config(additional, {})
    assert (
        config.max_num_partial_prefills,
        config.max_long_partial_prefills,
        config.long_prefill_threshold,
    ) == (
        4,
        1,
        2048,
    )
    assert config.control_file is None


def test_existing_additional_config_is_merged() -> None:
    settings = PluginSettings(live_adjust=True)
    args = plugin_args(settings, ["--seed", "0", "--additional-config", '{"other": {"a": 1}}'])
    assert _additional(args) == {"other": {"a": 1}, "chunkpilot": {"control_file": DEFAULT_CONTROL_FILE}}
    args = plugin_args(settings, ['--additional-config={"other": 2}'])
    assert _additional(args)["other"] == 2


def test_live_adjust_environment() -> None:
    env = plugin_env(PluginSettings(live_adjust=True), token_secret=("chat-live-adjust", "token"))
    assert env[0] == {"name": "VLLM_PLUGINS", "value": "chunkpilot,chunkpilot_live_adjust"}
    assert env[1] == {
        "name": LIVE_ADJUST_TOKEN_ENV,
        "valueFrom": {"secretKeyRef": {"name": "chat-live-adjust", "key": "token"}},
    }


def test_engine_image_per_supported_version() -> None:
    assert engine_image("0.33.0") == "ghcr.io/chunkpilot/engine-vllm:vllm-v0.33.0"
    assert engine_image("v0.33.0") == engine_image("0.33.0")
    with pytest.raises(ValueError, match=r"no Chunkpilot engine image for vLLM 0\.8\.5; supported: 0\.33\.0"):
        engine_image("0.8.5")
