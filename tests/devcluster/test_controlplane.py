"""The real local control plane: API server, controllers, scheduler and KWOK GPU nodes."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from chunkpilot.devcluster.controlplane import ControlPlane
from chunkpilot.testing.kube import apply_manifest, get_json, scratch_namespace

pytestmark = pytest.mark.cluster


@pytest.fixture
def namespace(control_plane: ControlPlane) -> Iterator[str]:
    with scratch_namespace(control_plane, "t", digits=8) as name:
        yield name


def gpu_pod_spec(container: str, *, gpus: int) -> dict[str, Any]:
    """A pod spec of one container named ``container`` (image ``example.invalid/<container>:1``)
    limited to ``gpus`` GPUs."""
    limits = {"nvidia.com/gpu": str(gpus)}
    return {
        "containers": [
            {"name": container, "image": f"example.invalid/{container}:1", "resources": {"limits": limits}}
        ]
    }


def _wait_for(predicate: object, timeout: float, what: str) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.5)


def test_apiserver_is_ready(control_plane: ControlPlane) -> None:
    assert control_plane.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"
    version = json.loads(control_plane.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == version["clientVersion"]["gitVersion"]
    assert version["serverVersion"]["gitVersion"].startswith("v1.")


def test_kwok_gpu_nodes_are_ready(control_plane: ControlPlane) -> None:
    nodes = json.loads(control_plane.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    assert len(nodes) >= 2
    for node in nodes:
        ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"]
        assert ready == "True", node["metadata"]["name"]
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        assert node["metadata"]["labels"]["nvidia.com/gpu.product"].startswith("NVIDIA-")


def test_python_client_reaches_the_cluster(control_plane: ControlPlane) -> None:
    from kubernetes import client

    with control_plane.api_client() as api:
        names = {node.metadata.name for node in client.CoreV1Api(api).list_node().items}
    assert {"gpu-node-0", "gpu-node-1"} <= names


def test_gpu_deployment_becomes_available_on_a_kwok_node(control_plane: ControlPlane, namespace: str) -> None:
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "gpu-app", "namespace": namespace},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "gpu-app"}},
            "template": {
                "metadata": {"labels": {"app": "gpu-app"}},
                "spec": gpu_pod_spec("engine", gpus=1),
            },
        },
    }
    apply_manifest(control_plane, namespace, deployment)
    control_plane.kubectl(
        "wait",
        "-n",
        namespace,
        "--for=condition=Available",
        "--timeout=90s",
        "deployment/gpu-app",
        timeout=100,
    )
    pods = get_json(control_plane, namespace, "pods")["items"]
    assert len(pods) == 2
    for pod in pods:
        assert pod["spec"]["nodeName"].startswith("gpu-node-")
        assert pod["status"]["phase"] == "Running"


def test_a_pod_that_asks_for_too_many_gpus_stays_pending(control_plane: ControlPlane, namespace: str) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "greedy", "namespace": namespace},
        "spec": gpu_pod_spec("c", gpus=9),
    }
    apply_manifest(control_plane, namespace, pod)

    def unschedulable() -> bool:
        status = get_json(control_plane, namespace, "pod", "greedy")
        conditions = status["status"].get("conditions", [])
        return any(c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conditions)

    _wait_for(unschedulable, 60, "the scheduler to report the pod Unschedulable")


def test_garbage_collector_deletes_dependents(control_plane: ControlPlane, namespace: str) -> None:
    control_plane.kubectl("create", "configmap", "owner", "-n", namespace)
    uid = control_plane.kubectl(
        "get", "configmap", "owner", "-n", namespace, "-o", "jsonpath={.metadata.uid}"
    ).stdout
    dependent = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "dependent",
            "namespace": namespace,
            "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid}],
        },
    }
    apply_manifest(control_plane, namespace, dependent)
    control_plane.kubectl("delete", "configmap", "owner", "-n", namespace)

    def dependent_gone() -> bool:
        result = control_plane.kubectl("get", "configmap", "dependent", "-n", namespace, check=False)
        return result.returncode != 0 and "NotFound" in result.stderr

    _wait_for(dependent_gone, 60, "the garbage collector to delete the dependent ConfigMap")


def test_apply_manifests_waits_for_crds(control_plane: ControlPlane, tmp_path: Path) -> None:
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.devcluster.example.io"},
        "spec": {
            "group": "devcluster.example.io",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "scope": "Namespaced",
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                    },
                }
            ],
        },
    }
    (tmp_path / "crd.yaml").write_text(yaml.safe_dump(crd))
    assert control_plane.apply_manifests([tmp_path]) == ["widgets.devcluster.example.io"]
    assert "widgets" in control_plane.kubectl("api-resources", "--api-group=devcluster.example.io").stdout
