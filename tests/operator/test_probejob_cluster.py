"""The probe Job on the real control plane: a service asks for a probe, the operator creates the Job
and the publisher's RBAC, the profile reaches the ConfigMap, and the service is told.

KWOK runs no containers, so nothing measures here: the test plays the Job's publish
container itself. It runs the same command the container runs (``chunkpilot probe
publish``) with the token of the ServiceAccount the operator created for the Job, so
the ConfigMap is written exactly as in a cluster, through the operator's RBAC.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from chunkpilot.engine.probe import save_profile
from chunkpilot.engine.probe.synthetic import synthetic_profile
from chunkpilot.operator.events import EventSpec, EventType
from chunkpilot.operator.kube import KubeClient
from chunkpilot.operator.probejob import ProbeRunner, ProbeTarget, read_profile
from chunkpilot.operator.testing import OperatorProcess, operator_env, token_kubeconfig, wait_for
from chunkpilot.tuner.space import ServiceFacts, TunedConfig, build_space

from chunkpilot.testing.kube import get_object, someone_elses_role_binding

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
NS = "chunkpilot-probe-tests"
SERVICE = "chat"
TARGET = ProbeTarget("h100", "meta-llama/Llama-3.1-8B-Instruct", 1)
JOB = "chunkpilot-probe-h100-llama-3-1-8b-tp1"
CONFIGMAP = "chunkpilot-profile-h100-llama-3-1-8b-tp1"


def get(cluster: Any, kind: str, name: str) -> dict[str, Any] | None:
    return get_object(cluster, kind, name, NS)


def annotations(cluster: Any) -> dict[str, str]:
    body = get(cluster, "inferenceservices", SERVICE) or {}
    found: dict[str, str] = body.get("metadata", {}).get("annotations") or {}
    return found


def event_reasons(cluster: Any, name: str) -> list[str]:
    out = cluster.kubectl(
        "get", "events", "-n", NS, "--field-selector", f"involvedObject.name={name}", "-o", "json"
    ).stdout
    return [event["reason"] for event in json.loads(out)["items"]]


@pytest.fixture(scope="module")
def cluster(control_plane: Any) -> Any:
    control_plane.apply_manifests(
        [REPO / "crds", REPO / "charts" / "chunkpilot" / "crds" / "kopf-peering.yaml"]
    )
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}
    control_plane.kubectl("apply", "-f", "-", input=json.dumps(namespace))
    return control_plane


@pytest.fixture(scope="module")
def operator(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    process = OperatorProcess(
        ["-n", NS, "--standalone", "--verbose", "--metrics-port", "0"],
        env=operator_env(cluster.env, CHUNKPILOT_PROBE_JOBS="on", CHUNKPILOT_PROBE_IMAGE_ANNOTATION="on"),
        log_path=tmp_path_factory.mktemp("operator") / "operator.log",
    )
    process.start()
    yield process
    cluster.kubectl(
        "delete", "inferenceservices", "--all", "-n", NS, "--wait=true", "--timeout=60s", check=False
    )
    process.stop()


def test_probe_request_creates_the_job_and_the_profile_reaches_the_service(
    cluster: Any, operator: OperatorProcess, tmp_path: Path
) -> None:
    service = yaml.safe_load((REPO / "examples" / "chat-llama-8b-sim.yaml").read_text())
    service["spec"]["replicas"] = 1
    service["metadata"]["annotations"] = {
        "chunkpilot.io/probe": "request",
        "chunkpilot.io/probe-image": "registry.example/chunkpilot-probe:test",
    }
    cluster.kubectl("apply", "-n", NS, "-f", "-", input=json.dumps(service))
    isvc = get(cluster, "inferenceservices", SERVICE)
    assert isvc is not None

    # 1. The Job, owned by the service, measuring on one GPU and publishing to the ConfigMap.
    job = wait_for(lambda: get(cluster, "jobs", JOB), timeout=60, what=f"Job {JOB}")
    assert job["metadata"]["ownerReferences"][0]["uid"] == isvc["metadata"]["uid"]
    pod = job["spec"]["template"]["spec"]
    probe = pod["initContainers"][0]
    assert probe["image"] == "registry.example/chunkpilot-probe:test"
    assert probe["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    command = probe["command"]
    assert command[command.index("--model") + 1] == "meta-llama/Llama-3.1-8B-Instruct"
    assert command[command.index("--itl-target-ms") + 1] == "50"
    publish = pod["containers"][0]["command"]
    assert publish[publish.index("--configmap") + 1] == CONFIGMAP
    assert pod["serviceAccountName"] == "chunkpilot-probe"
    for kind in ("serviceaccount", "role", "rolebinding"):
        assert get(cluster, kind, "chunkpilot-probe") is not None, kind

    # 2. The service says the probe is running and where the profile will be.
    running = wait_for(
        lambda: (a := annotations(cluster)).get("chunkpilot.io/probe") == "running" and a,
        timeout=30,
        what="chunkpilot.io/probe: running",
    )
    assert running["chunkpilot.io/profile-configmap"] == CONFIGMAP
    assert JOB in running["chunkpilot.io/probe-message"]
    wait_for(lambda: "ProbeStarted" in event_reasons(cluster, SERVICE), timeout=30, what="ProbeStarted")
    assert get(cluster, "configmaps", CONFIGMAP) is None

    # 3. The Job's publish container, played here: same command, the Job's ServiceAccount token.
    profile = synthetic_profile("meta-llama/Llama-3.1-8B-Instruct", 1, "h100", itl_target_ms=50.0)
    profile_file = save_profile(profile, tmp_path / "profile.json")
    token = cluster.kubectl("create", "token", "chunkpilot-probe", "-n", NS).stdout.strip()
    kubeconfig = token_kubeconfig(cluster.kubeconfig, token, tmp_path / "probe-kubeconfig", NS)
    published = subprocess.run(
        [
            str(Path(sys.executable).with_name("chunkpilot")),
            *("probe", "publish", "--file", str(profile_file), "--configmap", CONFIGMAP),
            *("--namespace", NS, "--kubeconfig", str(kubeconfig)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert published.returncode == 0, published.stderr
    assert f"created ConfigMap {NS}/{CONFIGMAP}" in published.stderr

    # 4. The operator marks the service done, with the knee and the ITL budget.
    done = wait_for(
        lambda: (a := annotations(cluster)).get("chunkpilot.io/probe") == "done" and a,
        timeout=30,
        what="chunkpilot.io/probe: done",
    )
    assert f"knee {profile.knee_tokens} tokens" in done["chunkpilot.io/probe-message"]
    wait_for(lambda: "ProbeSucceeded" in event_reasons(cluster, SERVICE), timeout=30, what="ProbeSucceeded")

    # 5. The tuner's side: read the profile back and derive the search space from it.
    async def read() -> Any:
        kube = KubeClient.from_environment(field_manager="probe-test", kubeconfig=str(cluster.kubeconfig))
        try:
            return await read_profile(kube, NS, TARGET)
        finally:
            await kube.close()

    stored = asyncio.run(read())
    assert stored == profile
    space = build_space(
        ServiceFacts(
            accelerator="h100",
            model=TARGET.model,
            incumbent=TunedConfig(2048, 128),
            itl_target_ms=50.0,
            step_profile=stored,
        )
    )
    assert space.budget.low == profile.knee_tokens
    assert "Traceback" not in operator.log()


def test_a_probe_name_taken_by_someone_elses_role_binding_is_left_alone(cluster: Any) -> None:
    """The probe's RBAC is applied only over the probe's own objects, on the real API server."""
    namespace = "chunkpilot-probe-conflict"
    cluster.kubectl("create", "namespace", namespace)
    theirs = someone_elses_role_binding("chunkpilot-probe", namespace)
    cluster.kubectl("apply", "-f", "-", input=json.dumps(theirs))
    service = yaml.safe_load((REPO / "examples" / "chat-llama-8b-sim.yaml").read_text())
    service["metadata"] = {"name": SERVICE, "namespace": namespace, "uid": "not-applied"}
    events: list[EventSpec] = []

    async def start() -> None:
        kube = KubeClient.from_environment(field_manager="probe-test", kubeconfig=str(cluster.kubeconfig))
        try:
            await ProbeRunner(kube, lambda _body, spec: events.append(spec)).start(service)
        finally:
            await kube.close()

    try:
        asyncio.run(start())
        kept = json.loads(
            cluster.kubectl("get", "rolebinding", "chunkpilot-probe", "-n", namespace, "-o", "json").stdout
        )
        jobs = json.loads(cluster.kubectl("get", "jobs", "-n", namespace, "-o", "json").stdout)["items"]
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false")
    assert kept["roleRef"]["name"] == "view" and not kept["metadata"].get("labels")
    assert jobs == []  # no probe runs under someone else's binding
    assert [(e.type, e.reason) for e in events] == [(EventType.WARNING, "NameConflict")]
    assert f"RoleBinding {namespace}/chunkpilot-probe already exists" in events[0].message
