"""The local stack's operator gets the environment the chart's Deployment would for its values."""

from __future__ import annotations

from chunkpilot.operator.config import ENV_LIVE_ADJUST as OPERATOR_ENV_LIVE_ADJUST
from chunkpilot.operator.config import live_adjust_allowed

from chunkpilot.localrun.stack import (
    DEFAULT_CHART_VALUES,
    ENV_LIVE_ADJUST,
    LIVE_ADJUST_CHART_VALUE,
    chart_env,
)


def test_without_the_live_adjust_value_the_charted_operator_has_live_adjustment_off() -> None:
    env = chart_env(True, ["watch.mode=cluster"])
    assert env == {OPERATOR_ENV_LIVE_ADJUST: "off"} and ENV_LIVE_ADJUST == OPERATOR_ENV_LIVE_ADJUST
    assert not live_adjust_allowed(env)


def test_with_the_value_or_under_the_admin_kubeconfig_it_stays_on() -> None:
    assert LIVE_ADJUST_CHART_VALUE in DEFAULT_CHART_VALUES
    assert chart_env(True, DEFAULT_CHART_VALUES) == {}
    assert chart_env(False, []) == {}  # the admin kubeconfig may read Secrets
    assert live_adjust_allowed(chart_env(True, [*DEFAULT_CHART_VALUES, "watch.mode=cluster"]))
