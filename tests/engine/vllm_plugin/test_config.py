"""Plugin configuration, live-limit validation and access control (pure logic, no vLLM)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from chunkpilot.engine.live_adjust import (
    LIVE_ADJUST_TOKEN_ENV,
    LimitRaiseError,
    LiveLimits,
    access_problem,
    lowered_limits,
)
from chunkpilot.engine.vllm_plugin.config import (
    PartialPrefillLimits,
    PluginConfig,
    PluginConfigError,
    load_plugin_config,
    write_json_atomic,
)

STARTUP = LiveLimits(max_num_batched_tokens=8192, max_num_seqs=256, max_num_active_seqs=256)


def test_additional_config_section_is_read() -> None:
    config = load_plugin_config(
        {
            "chunkpilot": {
                "max_num_partial_prefills": 4,
                "max_long_partial_prefills": 1,
                "long_prefill_threshold": 2048,
            }
        },
        {},
    )
    assert config == PluginConfig(
        max_num_partial_prefills=4, max_long_partial_prefills=1, long_prefill_threshold=2048
    )


def test_environment_fills_keys_the_json_does_not_set() -> None:
    environ = {
        "CHUNKPILOT_MAX_NUM_PARTIAL_PREFILLS": "8",
        "CHUNKPILOT_MAX_LONG_PARTIAL_PREFILLS": "2",
        "CHUNKPILOT_CONTROL_FILE": "/run/limits.json",
    }
    config = load_plugin_config({"chunkpilot": {"max_num_partial_prefills": 3}}, environ)
    assert config.max_num_partial_prefills == 3  # JSON wins
    assert config.max_long_partial_prefills == 2
    assert config.control_file == "/run/limits.json"


def test_other_additional_config_keys_are_ignored() -> None:
    assert load_plugin_config({"some_platform": {"x": 1}}, {}) == PluginConfig()
    assert load_plugin_config(None, {}) == PluginConfig()


@pytest.mark.parametrize(
    ("additional", "environ", "message"),
    [
        ({"chunkpilot": [1]}, {}, "'chunkpilot' must be a JSON object"),
        ({"chunkpilot": {"max_partial": 2}}, {}, "unknown chunkpilot key(s) ['max_partial']"),
        (
            {"chunkpilot": {"max_num_partial_prefills": "two"}},
            {},
            "max_num_partial_prefills must be an integer",
        ),
        ({"chunkpilot": {"max_num_partial_prefills": 0}}, {}, "max_num_partial_prefills must be >= 1, got 0"),
        ({"chunkpilot": {"max_num_partial_prefills": True}}, {}, "must be an integer"),
        (None, {"CHUNKPILOT_LONG_PREFILL_THRESHOLD": "-1"}, "environment CHUNKPILOT_LONG_PREFILL_THRESHOLD"),
        ({"chunkpilot": {"max_long_partial_prefills": 1}}, {}, "needs max_num_partial_prefills"),
        (
            {"chunkpilot": {"max_num_partial_prefills": 2, "max_long_partial_prefills": 3}},
            {},
            "max_long_partial_prefills (3) must be <= max_num_partial_prefills (2)",
        ),
    ],
)
def test_bad_configuration_names_the_field(
    additional: dict[str, object] | None, environ: dict[str, str], message: str
) -> None:
    with pytest.raises(PluginConfigError) as info:
        load_plugin_config(additional, environ)
    assert message in str(info.value)


def test_partial_prefill_limits_defaults() -> None:
    assert PluginConfig().partial_prefill_limits(8192) is None
    # Long lanes default to all lanes; the threshold to 4% of max-model-len.
    assert PluginConfig(max_num_partial_prefills=2).partial_prefill_limits(10_000) == PartialPrefillLimits(
        2, 2, 400
    )
    assert PluginConfig(max_num_partial_prefills=2, long_prefill_threshold=0).partial_prefill_limits(
        10
    ) == PartialPrefillLimits(2, 2, 1)


def test_lowering_is_applied_over_the_current_limits() -> None:
    current = lowered_limits(STARTUP, STARTUP, {"max_num_batched_tokens": 2048})
    assert current == LiveLimits(2048, 256, 256)
    current = lowered_limits(STARTUP, current, {"max_num_active_seqs": "64"})
    assert current == LiveLimits(2048, 256, 64)
    # Back up to the start-up value is allowed (it is not above it).
    assert lowered_limits(STARTUP, current, {"max_num_batched_tokens": 8192}).max_num_batched_tokens == 8192


@pytest.mark.parametrize("name", ["max_num_batched_tokens", "max_num_seqs", "max_num_active_seqs"])
def test_raise_above_startup_is_refused(name: str) -> None:
    with pytest.raises(LimitRaiseError) as info:
        lowered_limits(STARTUP, STARTUP, {name: getattr(STARTUP, name) + 1})
    assert f"{name}={getattr(STARTUP, name) + 1} is above the start-up value" in str(info.value)


@pytest.mark.parametrize(
    ("request_body", "message"),
    [
        ({}, "no limit given"),
        ({"budget": 10}, "unknown limit(s) ['budget']"),
        ({"max_num_batched_tokens": 0}, "must be >= 1"),
        ({"max_num_batched_tokens": 128}, "must be >= max_num_seqs (256)"),
    ],
)
def test_invalid_adjustments(request_body: dict[str, object], message: str) -> None:
    with pytest.raises(PluginConfigError) as info:
        lowered_limits(STARTUP, STARTUP, request_body)
    assert message in str(info.value)


def test_access_is_off_without_a_token() -> None:
    problem = access_problem(None, "Bearer x", configured=True)
    assert problem is not None and problem.status == 503 and LIVE_ADJUST_TOKEN_ENV in problem.message
    assert access_problem("", "Bearer ", configured=True) is not None


@pytest.mark.parametrize("header", [None, "", "Bearer", "Bearer wrong", "Basic s3cret", "s3cret"])
def test_access_needs_the_bearer_token(header: str | None) -> None:
    problem = access_problem("s3cret", header, configured=True)
    assert problem is not None and problem.status == 401


def test_access_with_the_token() -> None:
    assert access_problem("s3cret", "Bearer s3cret", configured=True) is None
    assert access_problem("s3cret", "bearer  s3cret", configured=True) is None
    unconfigured = access_problem("s3cret", "Bearer s3cret", configured=False)
    assert unconfigured is not None and unconfigured.status == 503 and "control_file" in unconfigured.message


def test_write_json_atomic(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "limits.json"
    write_json_atomic(target, {"generation": 1})
    write_json_atomic(target, {"generation": 2})
    assert json.loads(target.read_text()) == {"generation": 2}
    assert [p.name for p in target.parent.iterdir()] == ["limits.json"]
