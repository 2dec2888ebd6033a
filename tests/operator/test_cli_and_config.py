"""``chunkpilot render``, operator configuration and the HA guard (no cluster)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from chunkpilot.operator import ha
from chunkpilot.operator.cli import operator_config, register
from chunkpilot.operator.config import OperatorConfig, PodMonitorMode, parse_labels
from chunkpilot.operator.reconcile import export_metrics
from chunkpilot.operator.status import DeploymentState, Observation, live_limits
from chunkpilot.tuner.config import TunerConfig

from chunkpilot import telemetry
from chunkpilot.api import EngineConfig, InferenceService

REPO = Path(__file__).resolve().parents[2]

CASES = Path(__file__).parent / "golden" / "cases"


def chunkpilot(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chunkpilot.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_render_prints_a_yaml_stream_of_children() -> None:
    result = chunkpilot("render", "-f", str(CASES / "sim-h100.yaml"))
    assert result.returncode == 0, result.stderr
    kinds = [doc["kind"] for doc in yaml.safe_load_all(result.stdout)]
    assert kinds == ["Deployment", "Service"]


def test_render_reports_validation_errors_with_exit_1() -> None:
    manifest = (CASES / "sim-h100.yaml").read_text().replace("maxNumSeqs: 64", "maxNumSeqs: 4096")
    result = chunkpilot("render", "-f", "-", stdin=manifest)
    assert result.returncode == 1
    assert "maxNumBatchedTokens" in result.stderr and "maxNumSeqs" in result.stderr
    assert result.stdout == ""


def test_render_reports_unsupported_knobs_with_exit_1() -> None:
    manifest = (
        (CASES / "sim-h100.yaml")
        .read_text()
        .replace("maxNumSeqs: 64", "maxNumSeqs: 64\n    maxNumPartialPrefills: 2")
        .replace("kind: sim", 'kind: sim\n    version: "0.32.0"')
    )
    result = chunkpilot("render", "-f", "-", stdin=manifest)
    assert result.returncode == 1
    assert "UnsupportedKnob" in result.stderr and "0.32.0" in result.stderr


def test_operator_refuses_several_replicas_without_peering() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "chunkpilot.cli", "operator", "--all-namespaces", "--standalone"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**__import__("os").environ, "CHUNKPILOT_OPERATOR_REPLICAS": "2"},
    )
    assert result.returncode == 2
    assert "refusing to run" in result.stderr and "--peering" in result.stderr


def test_peering_check() -> None:
    assert ha.check_peering_settings(expected_replicas=1, standalone=True, mandatory=False) is None
    assert ha.check_peering_settings(expected_replicas=2, standalone=False, mandatory=True) is None
    assert ha.check_peering_settings(expected_replicas=2, standalone=False, mandatory=False) is not None


def test_older_replicas_get_higher_priority() -> None:
    older = ha.start_time_priority(now_s=1_800_000_000.0, jitter=999)
    newer = ha.start_time_priority(now_s=1_800_000_000.001, jitter=0)
    assert older > newer
    assert older < 2**53  # exact in JSON everywhere


def test_label_parsing() -> None:
    assert parse_labels("release=kps, team = ml") == {"release": "kps", "team": "ml"}
    assert parse_labels("") == {}
    with pytest.raises(ValueError, match="key=value"):
        parse_labels("release")


def test_config_from_env() -> None:
    config = OperatorConfig.from_env(
        {
            "CHUNKPILOT_POD_MONITOR": "disabled",
            "CHUNKPILOT_POD_MONITOR_LABELS": "a=b",
            "CHUNKPILOT_OPERATOR_REPLICAS": "3",
        }
    )
    assert config.pod_monitor == PodMonitorMode.DISABLED
    assert dict(config.pod_monitor_labels) == {"a": "b"}
    assert config.expected_replicas == 3


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--metrics-port", "70000"], "--metrics-port='70000' is not a port number"),
        (["--metrics-port", "nine"], "--metrics-port='nine' is not a port number"),
        (["--metrics-port", "8081", "--liveness", "http://0.0.0.0:8081/healthz"], "also the --liveness port"),
    ],
)
def test_operator_rejects_bad_metrics_port(flags: list[str], message: str) -> None:
    result = chunkpilot("operator", "--all-namespaces", "--standalone", *flags)
    assert result.returncode == 2
    assert message in result.stderr


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"CHUNKPILOT_POD_MONITOR": "sometimes"}, "CHUNKPILOT_POD_MONITOR='sometimes': use one of auto"),
        (
            {"CHUNKPILOT_TUNER_INTERVAL": "often"},
            "CHUNKPILOT_TUNER_INTERVAL='often' is not a number of seconds",
        ),
    ],
)
def test_operator_rejects_bad_settings_at_start_up(env: dict[str, str], message: str) -> None:
    """Read once at start-up, the operator's and the autotuner's variables stop it with exit 2."""
    result = subprocess.run(
        [sys.executable, "-m", "chunkpilot.cli", "operator", "--all-namespaces", "--standalone"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "CHUNKPILOT_AUTOTUNER": "on", "CHUNKPILOT_METRICS_PORT": "0", **env},
    )
    assert result.returncode == 2, result.stderr
    assert f"chunkpilot operator: {message}" in result.stderr


def test_metrics_port_and_optuna_storage_from_env() -> None:
    config = OperatorConfig.from_env(
        {"CHUNKPILOT_METRICS_PORT": "0", "CHUNKPILOT_OPTUNA_STORAGE": "sqlite:////tmp/optuna.db"}
    )
    assert config.metrics_port == 0
    assert config.optuna_storage == "sqlite:////tmp/optuna.db"
    assert OperatorConfig.from_env({}).metrics_port == 8080
    with pytest.raises(ValueError, match="CHUNKPILOT_METRICS_PORT"):
        OperatorConfig.from_env({"CHUNKPILOT_METRICS_PORT": "-1"})
    # Handed to the autotuner (in the same process) as its setting, not through the environment.
    assert TunerConfig.from_env({}, config).optuna_storage == "sqlite:////tmp/optuna.db"
    assert TunerConfig.from_env({}, OperatorConfig()).optuna_storage is None


def test_config_is_read_from_the_mapping_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """Defaults for what the mapping lacks; the process's environment is not consulted."""
    for name in ("CHUNKPILOT_METRICS_PORT", "CHUNKPILOT_OPERATOR_REPLICAS", "CHUNKPILOT_LIVE_ADJUST"):
        monkeypatch.setenv(name, "not a value")
    assert OperatorConfig.from_env({}) == OperatorConfig()
    config = OperatorConfig.from_env(
        {
            "CHUNKPILOT_PROMETHEUS_URL": "http://prometheus:9090",
            "CHUNKPILOT_OPTUNA_STORAGE": "  ",
            "CHUNKPILOT_DISAGGREGATION": "off",
            "CHUNKPILOT_AUTOTUNER": "OFF",
            "CHUNKPILOT_PROBE_JOBS": "on",
            "CHUNKPILOT_PROBE_IMAGE": "registry.example/probe:1",
            "CHUNKPILOT_KUBE_CALLS": "enforce",
            "KUBECONFIG": "/elsewhere",  # the Kubernetes client's default; only --kubeconfig sets it
        }
    )
    assert config == OperatorConfig(
        prometheus_url="http://prometheus:9090",
        disaggregation=False,
        autotuner=False,
        probe_jobs=True,
        probe_image="registry.example/probe:1",
        enforce_kube_calls=True,
    )
    assert OperatorConfig.from_env({"CHUNKPILOT_AUTOTUNER": "on"}).autotuner


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"CHUNKPILOT_OPERATOR_REPLICAS": "two"}, "CHUNKPILOT_OPERATOR_REPLICAS='two' is not a whole number"),
        ({"CHUNKPILOT_POD_MONITOR": "sometimes"}, "CHUNKPILOT_POD_MONITOR='sometimes': use one of auto"),
        ({"CHUNKPILOT_POD_MONITOR_LABELS": "release"}, "CHUNKPILOT_POD_MONITOR_LABELS: invalid label"),
        ({"CHUNKPILOT_METRICS_PORT": "eighty"}, "CHUNKPILOT_METRICS_PORT='eighty' is not a port number"),
        ({"CHUNKPILOT_DISAGGREGATION": "maybe"}, "CHUNKPILOT_DISAGGREGATION='maybe': use on or off"),
        (
            {"CHUNKPILOT_IMAGE_REGISTRY": "https://mirror"},
            "CHUNKPILOT_IMAGE_REGISTRY='https://mirror': give a",
        ),
    ],
)
def test_config_errors_name_the_variable(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        OperatorConfig.from_env(environ)


def operator_args(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["operator", "--all-namespaces", *flags])


def test_flags_override_their_variables_which_are_then_not_read(tmp_path: Path) -> None:
    environ = {
        "CHUNKPILOT_METRICS_PORT": "not a port",  # overridden by the flag: not read
        "CHUNKPILOT_POD_MONITOR": "disabled",
        "CHUNKPILOT_OPTUNA_STORAGE": "sqlite:////tmp/env.db",
        "CHUNKPILOT_OPERATOR_REPLICAS": "2",
    }
    config = operator_config(
        operator_args(
            "--metrics-port", "0", "--optuna-storage", "sqlite:////tmp/flag.db", "--no-autotuner",
            "--kubeconfig", str(tmp_path / "kubeconfig"),
        ),
        environ,
    )  # fmt: skip
    assert config.metrics_port == 0 and config.optuna_storage == "sqlite:////tmp/flag.db"
    assert config.pod_monitor is PodMonitorMode.DISABLED and config.expected_replicas == 2  # no flag
    assert not config.autotuner and config.kubeconfig == str((tmp_path / "kubeconfig").resolve())
    defaults = operator_config(operator_args(), {})
    assert defaults == OperatorConfig() and defaults.kubeconfig is None and defaults.autotuner
    with pytest.raises(ValueError, match="CHUNKPILOT_METRICS_PORT='not a port'"):
        operator_config(operator_args(), environ)
    with pytest.raises(ValueError, match="--metrics-port='-2'"):
        operator_config(operator_args("--metrics-port", "-2"), {})


def test_operator_gauges_follow_the_tracks_and_slo() -> None:
    service = InferenceService.from_manifest(
        yaml.safe_load((CASES / "sim-promoted.yaml").read_text()) | {"status": None}
    )
    stable = DeploymentState(desired=2, config=EngineConfig(max_num_batched_tokens=3072, max_num_seqs=96))
    # A canary started with wide limits, then adjusted live to the trial's: the gauges show what runs.
    canary = DeploymentState(
        desired=1,
        config=EngineConfig(max_num_batched_tokens=8192, max_num_seqs=256),
        live_limits=(("max_num_batched_tokens", 4096), ("max_num_seqs", 96)),
    )

    def sample(name: str, **labels: str) -> float | None:
        value: float | None = telemetry.REGISTRY.get_sample_value(
            name, {"namespace": "llm", "service": "chat-promoted", **labels}
        )
        return value

    export_metrics(service, Observation(generation=1, stable=stable, canary=canary))
    assert sample("chunkpilot_token_budget_tokens", track="stable") == 3072
    assert sample("chunkpilot_token_budget_tokens", track="canary") == 4096
    assert sample("chunkpilot_max_num_seqs", track="stable") == 96
    assert sample("chunkpilot_max_num_seqs", track="canary") == 96
    assert sample("chunkpilot_slo_target_seconds", metric="itl", quantile="0.99") == 0.05
    assert sample("chunkpilot_slo_target_seconds", metric="ttft", quantile="0.95") == 2.0
    export_metrics(service, Observation(generation=2, stable=stable, canary=None))
    assert sample("chunkpilot_token_budget_tokens", track="canary") is None
    without_slo = service.model_copy(update={"spec": service.spec.model_copy(update={"slo": None})})
    export_metrics(without_slo, Observation(generation=3, stable=stable))
    assert sample("chunkpilot_slo_target_seconds", metric="itl", quantile="0.99") is None
    telemetry.forget_service("llm", "chat-promoted")
    assert sample("chunkpilot_token_budget_tokens", track="stable") is None


def test_live_limits_hold_only_for_the_pods_they_were_set_on() -> None:
    started = EngineConfig(max_num_batched_tokens=8192, max_num_seqs=256)
    lowered = {"max_num_batched_tokens": 2048, "max_num_seqs": 64}
    raw = json.dumps({"configHash": started.config_hash(), **lowered})
    assert live_limits(raw, started.config_hash()) == tuple(lowered.items())
    assert live_limits(raw, "another-rollout") == ()  # a new rollout starts with its own config
    assert live_limits("not json", started.config_hash()) == () and live_limits(None, None) == ()
    state = DeploymentState(desired=1, config=started, live_limits=live_limits(raw, started.config_hash()))
    assert state.running_config == started.model_copy(update=lowered)
    assert state.config == started  # what the pods started with stays as rendered


def test_operator_needs_a_watch_scope() -> None:
    result = chunkpilot("operator", "--standalone")
    assert result.returncode == 2
    assert "-n/--namespace" in result.stderr and "--all-namespaces" in result.stderr


def test_bench_validates_its_counts() -> None:
    result = chunkpilot("operator", "bench", "--count", "10", "--services", "5")
    assert result.returncode == 2
    assert "--services >= --count" in result.stderr


def test_default_images_come_from_the_installations_registry() -> None:
    config = OperatorConfig.from_env({"CHUNKPILOT_IMAGE_REGISTRY": "mirror.internal:5000/"})
    assert config.image_registry == "mirror.internal:5000"
    assert TunerConfig.from_env({}, config).image_registry == "mirror.internal:5000"
    manifest = yaml.safe_load((REPO / "examples" / "disaggregated-sim.yaml").read_text())
    served = config.served(InferenceService.from_manifest(manifest))
    assert served.spec.engine.image is not None
    assert served.spec.engine.image.startswith("mirror.internal:5000/chunkpilot/chunkpilot:")
    assert served.spec.topology is not None and served.spec.topology.router is not None
    assert (served.spec.topology.router.image or "").startswith("mirror.internal:5000/chunkpilot/")
    # An image the spec names is the spec's; without a registry nothing changes.
    manifest["spec"]["engine"]["image"] = "team.example/sim:1"
    assert config.served(InferenceService.from_manifest(manifest)).spec.engine.image == "team.example/sim:1"
    plain = InferenceService.from_manifest(
        yaml.safe_load((REPO / "examples" / "disaggregated-sim.yaml").read_text())
    )
    assert OperatorConfig().served(plain) == plain
