"""The CRDs on a real kube-apiserver: install, defaults, printer columns, CEL rejections.

Every invalid manifest in tests/api/invalid/ must be refused by the apiserver with the same
message fragments the Python model produces (see test_validation.py).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from chunkpilot.api import (
    Condition,
    ConditionStatus,
    ConditionType,
    EngineConfig,
    InferenceService,
    InferenceServiceStatus,
    Measurement,
    ServicePhase,
    ServiceSummary,
    SLOState,
    TrialPhase,
    TrialSummary,
    TuningTrial,
    TuningTrialStatus,
)
from chunkpilot.api.crdgen import DEFINITIONS
from chunkpilot.testing.kube import ensure_namespace, patch_status

pytestmark = pytest.mark.cluster

NAMESPACE = "chunkpilot-api-tests"
REPO = Path(__file__).resolve().parents[2]
ISVC_COLUMNS = [
    "NAME", "READY", "BUDGET", "ITL", "TTFT", "SLO", "PHASE", "TRIAL",
    "REPLICAS", "DESIRED", "CAPACITY", "LOAD", "AGE",
]  # fmt: skip
TRIAL_COLUMNS = ["NAME", "SERVICE", "PARAMS", "ITL", "TTFT", "VERDICT", "PHASE", "CAPACITY", "TWINERR", "AGE"]


@pytest.fixture(scope="module")
def cluster(control_plane: Any) -> Any:
    """The session control plane with the CRDs installed and a namespace for these tests."""
    control_plane.apply_manifests([REPO / "crds"])
    ensure_namespace(control_plane, NAMESPACE)
    return control_plane


def _kubectl(cluster: Any, *args: str, check: bool = True, stdin: str | None = None) -> Any:
    return cluster.kubectl(*args, input=stdin, check=check)


def _get_json(cluster: Any, resource: str, name: str) -> dict[str, Any]:
    out = _kubectl(cluster, "get", resource, name, "-n", NAMESPACE, "-o", "json").stdout
    document: dict[str, Any] = json.loads(out)
    return document


def _table(cluster: Any, *args: str) -> list[list[str]]:
    out = _kubectl(cluster, "get", *args, "-n", NAMESPACE).stdout
    return [line.split() for line in out.strip().splitlines()]


def test_crds_are_established(cluster: Any) -> None:
    for definition in DEFINITIONS:
        crd = json.loads(_kubectl(cluster, "get", "crd", definition.name, "-o", "json").stdout)
        conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        assert conditions.get("Established") == "True", conditions
        assert conditions.get("NamesAccepted") == "True", conditions
        assert "NonStructuralSchema" not in conditions, conditions
        assert crd["status"]["acceptedNames"]["shortNames"] == list(definition.short_names)


def test_example_applies_defaults_like_the_model_and_shows_columns(cluster: Any, example_path: Path) -> None:
    manifest = yaml.safe_load(example_path.read_text())
    name = manifest["metadata"]["name"]
    _kubectl(cluster, "apply", "-n", NAMESPACE, "-f", str(example_path))

    stored = _get_json(cluster, "inferenceservices", name)
    # The apiserver's defaulting and the model's defaults agree field by field.
    assert stored["spec"] == InferenceService.from_manifest(manifest).spec.to_k8s()

    service = InferenceService.from_manifest(stored)
    config = EngineConfig.from_engine(service.spec.engine)
    status = InferenceServiceStatus(
        phase=ServicePhase.READY,
        observed_generation=stored["metadata"]["generation"],
        conditions=[
            Condition(
                type=ConditionType.READY,
                status=ConditionStatus.TRUE,
                reason="AllReplicasReady",
                message="2/2 replicas ready",
                last_transition_time=datetime.now(UTC).replace(microsecond=0),
                observed_generation=stored["metadata"]["generation"],
            )
        ],
        applied_config=config,
        applied_config_hash=config.config_hash(),
        current_trial=f"{name}-trial-3",
        trials_completed=2,
        replicas=2,
        ready_replicas=2,
        last_measurement=Measurement(itl_ms=43.2, itl_quantile=0.99, ttft_ms=812.0, ttft_quantile=0.95),
        summary=ServiceSummary(itl="43/50ms", ttft="812/2000ms", slo=SLOState.MET),
    )
    patch_status(cluster, "inferenceservices", name, NAMESPACE, status.to_k8s())
    assert InferenceService.from_manifest(_get_json(cluster, "inferenceservices", name)).status == status

    header, *rows = _table(cluster, "inferenceservices", name)
    assert header == ISVC_COLUMNS
    assert rows[0][:8] == [
        name,
        "True",
        str(config.max_num_batched_tokens),
        "43/50ms",
        "812/2000ms",
        "Met",
        "Ready",
        f"{name}-trial-3",
    ]
    assert [row[0] for row in _table(cluster, "cpis")[1:]].count(name) == 1
    assert any(
        row[0] == f"inferenceservice.chunkpilot.io/{name}" for row in _table(cluster, "chunkpilot")[1:]
    )


def test_tuning_trial_applies_and_shows_columns(cluster: Any) -> None:
    path = Path(__file__).parent / "valid" / "tuningtrial.yaml"
    manifest = yaml.safe_load(path.read_text())
    name = manifest["metadata"]["name"]
    _kubectl(cluster, "apply", "-n", NAMESPACE, "-f", str(path))
    trial = TuningTrial.from_manifest(_get_json(cluster, "tuningtrials", name))
    assert trial.spec == TuningTrial.from_manifest(manifest).spec

    status = TuningTrialStatus(
        phase=TrialPhase.MEASURING,
        params_summary=trial.spec.params.summary(),
        canary=Measurement(
            itl_ms=41.0, ttft_ms=900.0, throughput_tok_s=5400.0, request_rate=12.5, samples=640
        ),
        summary=TrialSummary(itl="41/50ms", ttft="900/2000ms"),
        started_at=datetime.now(UTC).replace(microsecond=0),
    )
    patch_status(cluster, "tuningtrials", name, NAMESPACE, status.to_k8s())
    header, *rows = _table(cluster, "cptrial", name)
    assert header == TRIAL_COLUMNS
    # PARAMS holds a space ("budget=3072 seqs=256"), so it spans two whitespace-split cells.
    assert rows[0][:4] == [name, "chat", "budget=3072", "seqs=256"]
    assert rows[0][4:6] == ["41/50ms", "900/2000ms"]
    assert "Measuring" in rows[0]


def test_invalid_manifest_is_rejected_by_the_apiserver(cluster: Any, invalid_case: Any) -> None:
    result = _kubectl(
        cluster, "apply", "--dry-run=server", "-n", NAMESPACE, "-f", str(invalid_case.path), check=False
    )
    assert result.returncode != 0, f"accepted:\n{result.stdout}"
    for fragment in invalid_case.expects:
        assert fragment.lower() in result.stderr.lower(), f"{fragment!r} not in:\n{result.stderr}"
