"""The tuner's settings: parsed once from the mapping they are given, with defaults and clear errors."""

from __future__ import annotations

from typing import Any

import kopf
import pytest
from chunkpilot.operator.config import HANDLED_ANNOTATION, OperatorConfig
from chunkpilot.tuner import handlers
from chunkpilot.tuner.config import (
    DEFAULT_INTERVAL_S,
    DEFAULT_ROLLOUT_TIMEOUT_S,
    ENV_TWIN,
    ENV_TWIN_CPU_SECONDS,
    ENV_TWIN_MAX_EVALUATIONS,
    TunerConfig,
)
from chunkpilot.tuner.decide.lifecycle import TunerSettings
from chunkpilot.tuner.twin.online import DEFAULT_CPU_SECONDS, TwinBudget


@pytest.mark.parametrize(
    ("value", "expected"), [(None, True), ("on", True), ("off", False), (" OFF ", False)]
)
def test_twin_switch(value: str | None, expected: bool) -> None:
    environ = {} if value is None else {ENV_TWIN: value}
    assert TunerConfig.from_env(environ).twin is expected


def test_twin_switch_rejects_other_values() -> None:
    with pytest.raises(ValueError, match="CHUNKPILOT_TWIN='maybe': use on or off"):
        TunerConfig.from_env({ENV_TWIN: "maybe"})


def test_defaults_come_from_an_empty_mapping_not_from_the_process_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in (
        "CHUNKPILOT_TUNER_INTERVAL",
        ENV_TWIN,
        ENV_TWIN_MAX_EVALUATIONS,
        "CHUNKPILOT_OPTUNA_STORAGE",
    ):
        monkeypatch.setenv(name, "not a value")
    config = TunerConfig.from_env({})
    assert config == TunerConfig()
    assert (config.interval_s, config.rollout_timeout_s) == (DEFAULT_INTERVAL_S, DEFAULT_ROLLOUT_TIMEOUT_S)
    assert (
        config.twin and config.twin_cpu_seconds == DEFAULT_CPU_SECONDS and config.twin_max_evaluations is None
    )
    assert config.prometheus_url is None and config.optuna_storage is None and config.pod_targets_file is None
    assert config.live_adjust and config.disaggregation
    assert config.settings == TunerSettings(rollout_timeout_s=900.0)
    assert config.twin_budget == TwinBudget()


def test_every_setting_is_read_from_the_mapping() -> None:
    config = TunerConfig.from_env(
        {
            "CHUNKPILOT_TUNER_INTERVAL": "2.5",
            "CHUNKPILOT_TUNER_ROLLOUT_TIMEOUT": "120",
            "CHUNKPILOT_TWIN": "off",
            "CHUNKPILOT_TWIN_CPU_SECONDS": "0.5",
            "CHUNKPILOT_TWIN_MAX_EVALUATIONS": "12",
            "CHUNKPILOT_POD_TARGETS_FILE": "/tmp/targets.json",
            # shared with the operator: from its configuration when given one
            "CHUNKPILOT_PROMETHEUS_URL": "http://prometheus:9090",
            "CHUNKPILOT_OPTUNA_STORAGE": "sqlite:////tmp/optuna.db",
            "CHUNKPILOT_LIVE_ADJUST": "off",
            "CHUNKPILOT_DISAGGREGATION": "off",
        }
    )
    assert config == TunerConfig(
        prometheus_url="http://prometheus:9090",
        optuna_storage="sqlite:////tmp/optuna.db",
        live_adjust=False,
        disaggregation=False,
        interval_s=2.5,
        rollout_timeout_s=120.0,
        twin=False,
        twin_cpu_seconds=0.5,
        twin_max_evaluations=12,
        pod_targets_file="/tmp/targets.json",
    )
    assert config.settings == TunerSettings(rollout_timeout_s=120.0, disaggregation=False)
    assert config.twin_budget == TwinBudget(cpu_s=0.5, max_evaluations=12)
    assert TunerConfig.from_env({ENV_TWIN_CPU_SECONDS: "0"}).twin_cpu_seconds == DEFAULT_CPU_SECONDS


def test_the_shared_values_come_from_the_operators_configuration() -> None:
    """A flag (``--prometheus-url``, ``--optuna-storage``) overrides its variable in the operator's config."""
    operator = OperatorConfig(prometheus_url="http://flag:9090", optuna_storage=None, live_adjust=False)
    environ = {"CHUNKPILOT_PROMETHEUS_URL": "http://env:9090", "CHUNKPILOT_OPTUNA_STORAGE": "sqlite:///x"}
    config = TunerConfig.from_env(environ, operator)
    assert config.prometheus_url == "http://flag:9090" and config.optuna_storage is None
    assert not config.live_adjust and config.disaggregation


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        (
            {"CHUNKPILOT_TUNER_INTERVAL": "often"},
            "CHUNKPILOT_TUNER_INTERVAL='often' is not a number of seconds",
        ),
        ({"CHUNKPILOT_TUNER_INTERVAL": "0"}, "CHUNKPILOT_TUNER_INTERVAL='0' must be greater than zero"),
        ({"CHUNKPILOT_TUNER_ROLLOUT_TIMEOUT": "-5"}, "CHUNKPILOT_TUNER_ROLLOUT_TIMEOUT='-5' must be greater"),
        ({ENV_TWIN_CPU_SECONDS: "lots"}, "CHUNKPILOT_TWIN_CPU_SECONDS='lots' is not a number of seconds"),
        ({ENV_TWIN_MAX_EVALUATIONS: "2.5"}, "CHUNKPILOT_TWIN_MAX_EVALUATIONS='2.5' is not a whole number"),
        ({ENV_TWIN_MAX_EVALUATIONS: "0"}, "CHUNKPILOT_TWIN_MAX_EVALUATIONS='0' must be at least 1"),
        ({"CHUNKPILOT_METRICS_PORT": "-1"}, "CHUNKPILOT_METRICS_PORT"),  # the operator's, without one
    ],
)
def test_a_bad_value_names_its_variable(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TunerConfig.from_env(environ)


def test_start_up_hands_the_settings_to_the_controller_through_the_memo() -> None:
    memo = kopf.Memo()
    environ = {"CHUNKPILOT_TWIN_CPU_SECONDS": "3", "CHUNKPILOT_TWIN_MAX_EVALUATIONS": "7"}
    operator = OperatorConfig(live_adjust=False, optuna_storage="sqlite:////tmp/optuna.db")
    config = handlers.load(operator, environ, memo)
    assert memo[handlers.MEMO_CONFIG] is config and config.twin_cpu_seconds == 3.0

    kube: Any = object()  # not called: the controller only holds it
    controller = handlers.controller_for(config, kube)
    try:
        assert controller.observer.live_adjust is False
        assert controller.observer.twins.budget == TwinBudget(cpu_s=3.0, max_evaluations=7)
        assert controller.settings == config.settings and controller.actor.mirror is not None
    finally:
        controller.observer.twins.close()


HANDLED = {HANDLED_ANNOTATION: "{}"}


@pytest.mark.parametrize(
    ("spec", "status", "annotations", "ticks"),
    [
        ({"autotune": {"enabled": True}}, {}, {}, False),  # the operator has not reconciled it yet
        ({"autotune": {"enabled": True}}, {"observedGeneration": 1}, {}, False),  # nor recorded so
        ({"autotune": {"enabled": True}}, {"observedGeneration": 1}, HANDLED, True),
        ({"autotune": {"enabled": False}}, {"observedGeneration": 1}, HANDLED, False),
        ({}, {"observedGeneration": 2, "currentTrial": {"number": 3}}, HANDLED, True),  # a trial to clean up
    ],
)
def test_a_service_ticks_once_handled_while_it_tunes_or_has_a_trial(
    spec: dict[str, Any], status: dict[str, Any], annotations: dict[str, str], ticks: bool
) -> None:
    body = kopf.Body({"metadata": {"annotations": annotations}, "spec": spec, "status": status})
    wanted = handlers._tuning_wanted(
        spec=body.spec, status=body.status, annotations=body.metadata.annotations
    )
    assert wanted is ticks
