"""Pure side of the probe Job: target, Job for a service, image choice, annotations, outcome."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from chunkpilot.engine.probe.kube import build_profile_configmap
from chunkpilot.engine.probe.synthetic import synthetic_profile
from chunkpilot.operator.config import OperatorConfig
from chunkpilot.operator.events import EventSpec, EventType
from chunkpilot.operator.kube import KubeError
from chunkpilot.operator.probejob import (
    ANNOTATION_PROBE,
    ANNOTATION_PROBE_IMAGE,
    ANNOTATION_PROBE_MESSAGE,
    ANNOTATION_PROFILE_CONFIGMAP,
    ENV_PROBE_IMAGE,
    ProbeRunner,
    ProbeState,
    ProbeTarget,
    annotation_patch,
    build_probe_job_for,
    default_probe_image,
    job_failure,
    probe_image,
    probe_jobs_enabled,
    probe_target,
    services_waiting_for,
)

from chunkpilot import __version__
from chunkpilot.api import InferenceService
from chunkpilot.testing.argv import flag, flags

REPO = Path(__file__).resolve().parents[2]


def service_body(**spec_changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load((REPO / "examples" / "chat-llama-8b-sim.yaml").read_text())
    body["metadata"].update(namespace="serving", uid="0b8e-uid")
    body["spec"]["engine"]["tensorParallelSize"] = 2
    body["spec"]["resources"].update(
        nodeSelector={"nvidia.com/gpu.product": "H100"},
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    )
    for key, value in spec_changes.items():
        body["spec"][key] = value
    return body


def isvc(body: dict[str, Any]) -> InferenceService:
    return InferenceService.from_manifest(body)


def test_target_is_accelerator_model_and_tp() -> None:
    target = probe_target(isvc(service_body()))
    assert target == ProbeTarget("h100", "meta-llama/Llama-3.1-8B-Instruct", 2)
    assert target.configmap == "chunkpilot-profile-h100-llama-3-1-8b-tp2"
    assert target.job == "chunkpilot-probe-h100-llama-3-1-8b-tp2"


def test_job_for_a_service_carries_its_slo_placement_and_owner() -> None:
    body = service_body()
    job = build_probe_job_for(isvc(body), body, "registry.example/probe:1")
    meta = job["metadata"]
    assert (meta["name"], meta["namespace"]) == ("chunkpilot-probe-h100-llama-3-1-8b-tp2", "serving")
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "chunkpilot.io/v1alpha1",
            "kind": "InferenceService",
            "name": "chat",
            "uid": "0b8e-uid",
            "controller": False,
            "blockOwnerDeletion": False,
        }
    ]
    pod = job["spec"]["template"]["spec"]
    probe = pod["initContainers"][0]
    assert probe["image"] == "registry.example/probe:1"
    command = probe["command"]
    assert command[:2] == ["chunkpilot", "probe"]
    assert flags(command, "--tensor-parallel-size", "--accelerator", "--itl-target-ms", "--out") == {
        "--tensor-parallel-size": "2",
        "--accelerator": "h100",
        "--itl-target-ms": "50",
        "--out": "/profile/profile.json",
    }
    publish = pod["containers"][0]["command"]
    assert flag(publish, "--configmap") == "chunkpilot-profile-h100-llama-3-1-8b-tp2"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "H100"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def test_job_without_an_slo_records_no_itl_target() -> None:
    body = service_body(autotune={"enabled": False})
    del body["spec"]["slo"]
    command = build_probe_job_for(isvc(body), body, "img")["spec"]["template"]["spec"]["initContainers"][0]
    assert "--itl-target-ms" not in command["command"]


def test_image_comes_from_the_annotation_if_allowed_then_the_environment_then_the_default() -> None:
    configured = OperatorConfig.from_env({ENV_PROBE_IMAGE: "b:1"}).probe_image
    # Off by default: whoever may edit a service would choose what runs with the probe's account.
    assert OperatorConfig.from_env({}).probe_image_annotation is False
    assert probe_image({ANNOTATION_PROBE_IMAGE: "a:1"}, configured) == "b:1"
    allowed = OperatorConfig.from_env({"CHUNKPILOT_PROBE_IMAGE_ANNOTATION": "on"}).probe_image_annotation
    assert probe_image({ANNOTATION_PROBE_IMAGE: "a:1"}, configured, annotation_allowed=allowed) == "a:1"
    assert probe_image({}, configured, annotation_allowed=True) == "b:1"
    assert (
        probe_image({}, OperatorConfig.from_env({}).probe_image)
        == default_probe_image()
        == f"ghcr.io/chunkpilot/chunkpilot-probe:{__version__}"
    )


def test_annotation_patch() -> None:
    assert annotation_patch(ProbeState.RUNNING, "started", "cm") == {
        "metadata": {
            "annotations": {
                ANNOTATION_PROBE: "running",
                ANNOTATION_PROBE_MESSAGE: "started",
                ANNOTATION_PROFILE_CONFIGMAP: "cm",
            }
        }
    }
    assert (
        ANNOTATION_PROFILE_CONFIGMAP not in annotation_patch(ProbeState.DONE, "ok")["metadata"]["annotations"]
    )


def _annotated(name: str, state: str | None, configmap: str | None) -> dict[str, Any]:
    annotations = {}
    if state is not None:
        annotations[ANNOTATION_PROBE] = state
    if configmap is not None:
        annotations[ANNOTATION_PROFILE_CONFIGMAP] = configmap
    return {"metadata": {"name": name, "annotations": annotations}}


def test_services_waiting_for_a_profile() -> None:
    services = [
        _annotated("a", "running", "cm-1"),
        _annotated("b", "running", "cm-2"),
        _annotated("c", "done", "cm-1"),
        _annotated("d", None, None),
        {"metadata": {"name": "e"}},
        _annotated("f", "request", "cm-1"),
    ]
    assert [s["metadata"]["name"] for s in services_waiting_for(services, "cm-1")] == ["a", "f"]


def test_job_failure_reads_the_failed_condition() -> None:
    running: dict[str, Any] = {"status": {"active": 1}}
    complete = {"status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    failed = {
        "status": {
            "conditions": [
                {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "too many"}
            ]
        }
    }
    assert job_failure(running) is None
    assert job_failure(complete) is None
    assert job_failure(failed) == "BackoffLimitExceeded: too many"


@pytest.mark.parametrize(
    ("value", "enabled"), [(None, False), ("off", False), ("on", True), ("1", True), ("TRUE", True)]
)
def test_probe_jobs_are_opt_in(value: str | None, enabled: bool) -> None:
    env = {} if value is None else {"CHUNKPILOT_PROBE_JOBS": value}
    assert probe_jobs_enabled(env) is enabled


def test_the_publisher_writes_the_configmap_the_operator_waits_for() -> None:
    """The publish container's ConfigMap name and labels are what the operator's watch selects."""
    profile = synthetic_profile("llama-3.1-8b", 2, "h100")
    target = ProbeTarget(profile.accelerator, profile.model, profile.tensor_parallel_size)
    configmap = build_profile_configmap(profile, target.configmap, "serving")
    assert configmap["metadata"]["labels"]["app.kubernetes.io/component"] == "step-profile"
    assert configmap["metadata"]["name"] == target.configmap
    assert target.configmap == probe_target(isvc(service_body())).configmap  # aliases share it


class FakeKube:
    """An in-memory API: objects by path, 409 on creating an existing one (enough for ProbeRunner)."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []

    async def get(self, path: str) -> dict[str, Any] | None:
        return self.objects.get(path)

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        full = f"{path}/{body['metadata']['name']}"
        self.calls.append(("POST", full))
        if full in self.objects:
            raise KubeError(409, "POST", path, '{"message": "already exists"}')
        self.objects[full] = dict(body)
        return dict(body)

    async def delete(self, path: str) -> None:
        self.objects.pop(path, None)

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        self.calls.append(("PATCH", path))
        target = self.objects[path]
        target["metadata"].setdefault("annotations", {}).update(patch["metadata"]["annotations"])
        return target

    async def list(self, path: str, *, label_selector: str | None = None) -> list[dict[str, Any]]:
        return [body for key, body in self.objects.items() if key.startswith(f"{path}/")]

    async def request(self, method: str, path: str, **_: Any) -> dict[str, Any]:
        self.calls.append((method, path))
        if method == "DELETE":
            self.objects.pop(path, None)
        return {}


def _runner_with_service() -> tuple[ProbeRunner, FakeKube, list[EventSpec], dict[str, Any]]:
    kube = FakeKube()
    events: list[EventSpec] = []
    runner = ProbeRunner(kube, lambda _body, spec: events.append(spec))
    body = service_body()
    kube.objects["/apis/chunkpilot.io/v1alpha1/namespaces/serving/inferenceservices/chat"] = body
    return runner, kube, events, body


JOB_PATH = "/apis/batch/v1/namespaces/serving/jobs/chunkpilot-probe-h100-llama-3-1-8b-tp2"


def test_runner_starts_then_reports_success() -> None:
    runner, kube, events, body = _runner_with_service()
    assert asyncio.run(runner.start(body)) == "chunkpilot-probe-h100-llama-3-1-8b-tp2"
    assert JOB_PATH in kube.objects
    applied = [p for m, p in kube.calls if m == "PATCH" and ("/rbac." in p or "/serviceaccounts/" in p)]
    assert len(applied) == 3  # ServiceAccount, Role, RoleBinding
    annotations = body["metadata"]["annotations"]
    assert annotations[ANNOTATION_PROBE] == "running"
    assert annotations[ANNOTATION_PROFILE_CONFIGMAP] == "chunkpilot-profile-h100-llama-3-1-8b-tp2"
    assert [e.reason for e in events] == ["ProbeStarted"]

    profile = synthetic_profile("llama-3.1-8b", 2, "h100")
    configmap = build_profile_configmap(profile, "chunkpilot-profile-h100-llama-3-1-8b-tp2", "serving")
    assert asyncio.run(runner.profile_published(configmap)) == 1
    assert annotations[ANNOTATION_PROBE] == "done"
    assert f"knee {profile.knee_tokens} tokens" in annotations[ANNOTATION_PROBE_MESSAGE]
    assert [e.reason for e in events] == ["ProbeStarted", "ProbeSucceeded"]
    assert asyncio.run(runner.profile_published(configmap)) == 0  # nobody waits any more


def test_runner_starts_the_job_with_the_operators_configured_image() -> None:
    kube = FakeKube()
    runner = ProbeRunner(kube, lambda _body, _spec: None, image="registry.example/probe:2")
    body = service_body()
    kube.objects["/apis/chunkpilot.io/v1alpha1/namespaces/serving/inferenceservices/chat"] = body
    asyncio.run(runner.start(body))
    pod = kube.objects[JOB_PATH]["spec"]["template"]["spec"]
    assert {c["image"] for c in [*pod["initContainers"], *pod["containers"]]} == {"registry.example/probe:2"}


def test_runner_joins_a_running_job_and_replaces_a_finished_one() -> None:
    runner, kube, _events, body = _runner_with_service()
    asyncio.run(runner.start(body))
    asyncio.run(runner.start(body))
    assert "joined" in body["metadata"]["annotations"][ANNOTATION_PROBE_MESSAGE]
    kube.objects[JOB_PATH]["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    asyncio.run(runner.start(body))
    assert "restarted" in body["metadata"]["annotations"][ANNOTATION_PROBE_MESSAGE]
    assert ("DELETE", JOB_PATH) in kube.calls
    assert "status" not in kube.objects[JOB_PATH]  # the new Job


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/namespaces/serving/serviceaccounts/chunkpilot-probe",
        "/apis/rbac.authorization.k8s.io/v1/namespaces/serving/rolebindings/chunkpilot-probe",
        JOB_PATH,
    ],
)
def test_a_name_the_probe_needs_taken_by_someone_elses_object_is_left_alone(path: str) -> None:
    runner, kube, events, body = _runner_with_service()
    theirs = {"kind": "Thing", "metadata": {"name": path.rsplit("/", 1)[-1], "labels": {"app": "theirs"}}}
    kube.objects[path] = {**theirs, "status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    asyncio.run(runner.start(body))
    assert kube.objects[path]["metadata"]["labels"] == {"app": "theirs"}  # not applied over, not deleted
    assert not [c for c in kube.calls if c[1] == path and c[0] in ("PATCH", "DELETE")]
    annotations = body["metadata"]["annotations"]
    assert annotations[ANNOTATION_PROBE] == "failed"
    assert "already exists and does not belong to the probe" in annotations[ANNOTATION_PROBE_MESSAGE]
    assert (events[-1].type, events[-1].reason) == (EventType.WARNING, "NameConflict")


def test_runner_reports_a_failed_job() -> None:
    runner, kube, events, body = _runner_with_service()
    asyncio.run(runner.start(body))
    job = kube.objects[JOB_PATH]
    assert asyncio.run(runner.job_changed(job)) == 0  # still running
    job["status"] = {
        "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "x"}]
    }
    assert asyncio.run(runner.job_changed(job)) == 1
    annotations = body["metadata"]["annotations"]
    assert annotations[ANNOTATION_PROBE] == "failed"
    assert "BackoffLimitExceeded" in annotations[ANNOTATION_PROBE_MESSAGE]
    assert "request to retry" in annotations[ANNOTATION_PROBE_MESSAGE]
    assert (events[-1].type, events[-1].reason) == (EventType.WARNING, "ProbeFailed")
