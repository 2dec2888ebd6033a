"""``kubectl chunkpilot`` and ``chunkpilot report`` against a real kube-apiserver.

The InferenceService and its TuningTrials are written the way the operator writes them (spec, then
the status subresource); the plugin runs through kubectl's plugin lookup on PATH.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from chunkpilot.testing.kube import ensure_namespace, patch_status

pytestmark = pytest.mark.cluster

NAMESPACE = "chunkpilot-report-tests"
REPO = Path(__file__).resolve().parents[2]
SERVICE = {
    "apiVersion": "chunkpilot.io/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "chat", "namespace": NAMESPACE},
    "spec": {
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
        "engine": {"kind": "sim", "maxNumBatchedTokens": 8192, "maxNumSeqs": 128},
        "slo": {"itl": {"quantile": 0.99, "maxMs": 50}, "ttft": {"quantile": 0.95, "maxMs": 1000}},
        "autotune": {"enabled": True, "maxTrials": 4},
    },
}


def _trial(number: int, budget: int, verdict: str, itl: float) -> tuple[dict[str, Any], dict[str, Any]]:
    manifest = {
        "apiVersion": "chunkpilot.io/v1alpha1",
        "kind": "TuningTrial",
        "metadata": {
            "name": f"chat-trial-{number}",
            "namespace": NAMESPACE,
            "labels": {"chunkpilot.io/service": "chat", "chunkpilot.io/trial-number": str(number)},
        },
        "spec": {
            "serviceName": "chat",
            "number": number,
            "params": {"maxNumBatchedTokens": budget, "maxNumSeqs": 128},
        },
    }
    status = {
        "phase": "Promoted" if verdict == "Promoted" else "RolledBack",
        "verdict": verdict,
        "reason": "met both SLOs and beat the incumbent" if verdict == "Promoted" else "ITL above target",
        "canary": {
            "itlMs": itl,
            "ttftMs": 420.0,
            "throughputTokS": 950.0,
            "requestRate": 3.0,
            "samples": 500,
        },
        "stable": {"itlMs": 71.0, "ttftMs": 300.0, "throughputTokS": 960.0},
    }
    return manifest, status


def _apply(cluster: Any, manifest: dict[str, Any], status: dict[str, Any] | None = None) -> None:
    cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    if status is not None:
        patch_status(cluster, manifest["kind"].lower(), manifest["metadata"]["name"], NAMESPACE, status)


@pytest.fixture(scope="module")
def cluster(control_plane: Any) -> Any:
    control_plane.apply_manifests([REPO / "crds"])
    ensure_namespace(control_plane, NAMESPACE)
    _apply(
        control_plane,
        SERVICE,
        {
            "phase": "Tuning",
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "Available",
                    "message": "1/1 ready",
                    "lastTransitionTime": "2026-12-01T00:00:00Z",
                }
            ],
            "appliedConfig": {"maxNumBatchedTokens": 1024, "maxNumSeqs": 128},
            "bestConfig": {"maxNumBatchedTokens": 1024, "maxNumSeqs": 128},
            "bestTrial": "chat-trial-1",
            "lastMeasurement": {
                "itlMs": 38.5,
                "ttftMs": 410.0,
                "throughputTokS": 955.0,
                "requestRate": 3.0,
                "window": "1m",
            },
        },
    )
    for number, budget, verdict, itl in ((0, 4096, "Discarded", 66.0), (1, 1024, "Promoted", 38.0)):
        _apply(control_plane, *_trial(number, budget, verdict, itl))
    return control_plane


def _plugin(cluster: Any, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(cluster.env)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]])
    env["COLUMNS"] = "200"
    return subprocess.run(
        [str(cluster.kubectl.binary), "chunkpilot", *args, "-n", NAMESPACE],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_kubectl_finds_the_plugin_and_lists_trials(cluster: Any) -> None:
    result = _plugin(cluster, "trials", "chat")
    assert result.returncode == 0, result.stderr
    assert "budget=4096" in result.stdout and "budget=1024" in result.stdout
    assert "66/50ms" in result.stdout and "Promoted" in result.stdout


def test_status_shows_conditions_configs_and_measurement(cluster: Any) -> None:
    result = _plugin(cluster, "status", "chat")
    assert result.returncode == 0, result.stderr
    assert "Available" in result.stdout
    assert "best:    budget=1024" in result.stdout and "chat-trial-1" in result.stdout
    assert "ITL 38.5 ms" in result.stdout


def test_pause_and_resume_flip_the_spec(cluster: Any) -> None:
    def paused() -> bool:
        out = cluster.kubectl(
            "get", "cpis", "chat", "-n", NAMESPACE, "-o", "jsonpath={.spec.autotune.paused}"
        )
        return bool(out.stdout.strip() == "true")

    assert _plugin(cluster, "pause", "chat").returncode == 0
    assert paused()
    assert _plugin(cluster, "resume", "chat").returncode == 0
    assert not paused()


def test_missing_service_is_a_clear_error(cluster: Any) -> None:
    result = _plugin(cluster, "status", "nope")
    assert result.returncode != 0
    assert "not found" in result.stdout + result.stderr


def test_report_writes_markdown_csv_and_plots(cluster: Any, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "chunkpilot.cli", "report", "chat", "-n", NAMESPACE, "--out", str(tmp_path)],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report = (tmp_path / "report.md").read_text()
    assert "chat-trial-1" in report or "| 1 |" in report
    assert len((tmp_path / "trials.csv").read_text().strip().splitlines()) == 3
    assert list(tmp_path.glob("*.png")), "the report extra is installed in tests: plots expected"
