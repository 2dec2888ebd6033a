"""``CHUNKPILOT_LIVE_ADJUST=off`` (chart ``liveAdjust.enabled=false``): no route, no Secret, a condition."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from chunkpilot.engine.live_adjust import LIVE_ADJUST_TOKEN_ENV
from chunkpilot.operator.builders import build_deployment, wants_live_adjust_secret
from chunkpilot.operator.config import (
    ENV_LIVE_ADJUST,
    REASON_LIVE_ADJUST_DISABLED,
    OperatorConfig,
    live_adjust_allowed,
)
from chunkpilot.operator.events import EventType, status_transitions
from chunkpilot.operator.served import with_live_adjust_condition
from chunkpilot.operator.status import get_condition

from chunkpilot.api import ConditionStatus, ConditionType, InferenceService, InferenceServiceStatus, Track

T0 = datetime(2026, 1, 1, tzinfo=UTC)
OFF = OperatorConfig(live_adjust=False)


def isvc(live_adjust: bool = True) -> InferenceService:
    return InferenceService.from_manifest(
        {
            "apiVersion": "chunkpilot.io/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": "chat", "namespace": "llm"},
            "spec": {
                "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
                "engine": {"version": "0.33.0"},
                "autotune": {"liveAdjust": live_adjust},
            },
        }
    )


def env_names(service: InferenceService) -> set[str]:
    pod = build_deployment(service, Track.STABLE)["spec"]["template"]["spec"]
    return {item["name"] for item in pod["containers"][0].get("env", [])}


@pytest.mark.parametrize(
    ("value", "allowed"),
    [("", True), ("on", True), ("true", True), ("off", False), ("OFF", False), ("false", False)],
)
def test_the_switch_reads_on_and_off(value: str, allowed: bool) -> None:
    assert live_adjust_allowed({ENV_LIVE_ADJUST: value}) is allowed
    assert OperatorConfig.from_env({ENV_LIVE_ADJUST: value}).live_adjust is allowed
    assert OperatorConfig.from_env({}).live_adjust is True


def test_a_bad_switch_value_names_the_variable() -> None:
    with pytest.raises(ValueError, match=f"{ENV_LIVE_ADJUST}='maybe': use on or off"):
        OperatorConfig.from_env({ENV_LIVE_ADJUST: "maybe"})


def test_disabled_installation_renders_no_route_and_wants_no_secret() -> None:
    asking = isvc()
    assert LIVE_ADJUST_TOKEN_ENV in env_names(asking) and wants_live_adjust_secret(asking)
    served = OFF.served(asking)
    assert OFF.live_adjust_blocked(asking)
    assert served.spec.autotune.live_adjust is False
    assert LIVE_ADJUST_TOKEN_ENV not in env_names(served)
    assert not wants_live_adjust_secret(served)
    assert asking.spec.autotune.live_adjust is True  # the service itself is not changed
    assert OperatorConfig().served(asking) is asking  # allowed: served as written
    assert not OFF.live_adjust_blocked(isvc(live_adjust=False))


def test_blocked_service_gets_the_condition_and_one_warning_event() -> None:
    first = with_live_adjust_condition(InferenceServiceStatus(), True, 3, T0)
    condition = get_condition(first.conditions, ConditionType.LIVE_ADJUST)
    assert condition is not None
    assert (condition.status, condition.reason) == (ConditionStatus.FALSE, REASON_LIVE_ADJUST_DISABLED)
    assert "liveAdjust.enabled=true" in condition.message and condition.observed_generation == 3
    (event,) = status_transitions(InferenceServiceStatus(), first)
    assert (event.type, event.reason, event.message) == (
        EventType.WARNING,
        "LiveAdjustDisabled",
        condition.message,
    )

    again = with_live_adjust_condition(first.model_copy(deep=True), True, 3, T0 + timedelta(minutes=5))
    repeated = get_condition(again.conditions, ConditionType.LIVE_ADJUST)
    assert repeated is not None and repeated.last_transition_time == T0
    assert status_transitions(first, again) == []  # no repeat on later reconciles


def test_condition_goes_once_live_adjustment_is_allowed_or_not_asked_for() -> None:
    blocked = with_live_adjust_condition(InferenceServiceStatus(), True, 1, T0)
    cleared = with_live_adjust_condition(blocked.model_copy(deep=True), False, 2, T0)
    assert get_condition(cleared.conditions, ConditionType.LIVE_ADJUST) is None
    assert status_transitions(blocked, cleared) == []
