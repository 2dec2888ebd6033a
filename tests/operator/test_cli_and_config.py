"""``chunkpilot render``, operator configuration and the HA guard (no cluster)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from chunkpilot.operator import ha
from chunkpilot.operator.config import OperatorConfig, PodMonitorMode, parse_labels
from chunkpilot.operator.reconcile import is_subset

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
    )
    result = chunkpilot("render", "-f", "-", stdin=manifest)
    assert result.returncode == 1
    assert "UnsupportedKnob" in result.stderr and "0.33.0" in result.stderr


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


def test_subset_comparison_ignores_server_defaults_but_sees_edits() -> None:
    desired = {"spec": {"replicas": 1, "template": {"containers": [{"name": "e", "args": ["a", "b"]}]}}}
    live = {
        "spec": {
            "replicas": 1,
            "progressDeadlineSeconds": 600,
            "template": {
                "containers": [{"name": "e", "args": ["a", "b"], "imagePullPolicy": "IfNotPresent"}]
            },
        },
        "status": {},
    }
    assert is_subset(desired, live)
    live["spec"]["template"]["containers"][0]["args"] = ["a", "c"]  # type: ignore[index]
    assert not is_subset(desired, live)
