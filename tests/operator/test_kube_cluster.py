"""API errors as the real kube-apiserver sends them, and what the reconciler makes of them.

A namespace being deleted refuses new objects with HTTP 403, like an RBAC denial. The
operator must tell the two apart: a child event that arrives while the namespace goes
away is no reason to log an error (the namespace takes the service with it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from chunkpilot.operator.config import FINALIZER, OperatorConfig
from chunkpilot.operator.kube import KubeClient, KubeError
from chunkpilot.operator.reconcile import Reconciler

from chunkpilot import telemetry
from chunkpilot.testing.processes import captured

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "chat-llama-8b-sim.yaml"
HOLD = "tests.chunkpilot.io/hold"


def client(cluster: Any) -> KubeClient:
    return KubeClient.from_environment(field_manager="kube-test", kubeconfig=str(cluster.kubeconfig))


def kubectl(cluster: Any, *args: str, stdin: str | None = None) -> Any:
    return cluster.kubectl(*args, input=stdin) if stdin is not None else cluster.kubectl(*args)


@pytest.fixture()
def terminating_namespace(control_plane: Any) -> Any:
    """A namespace held in Terminating by a ConfigMap with a finalizer; released afterwards."""
    control_plane.apply_manifests([REPO / "crds"])
    namespace = f"terminating-{uuid.uuid4().hex[:6]}"
    held = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "held", "namespace": namespace, "finalizers": [HOLD]},
    }
    kubectl(control_plane, "create", "namespace", namespace)
    kubectl(control_plane, "apply", "-f", "-", stdin=json.dumps(held))
    kubectl(control_plane, "delete", "namespace", namespace, "--wait=false")
    deadline = time.monotonic() + 30
    while (
        json.loads(kubectl(control_plane, "get", "namespace", namespace, "-o", "json").stdout)["status"][
            "phase"
        ]
        != "Terminating"
    ):
        assert time.monotonic() < deadline, f"namespace {namespace} never became Terminating"
        time.sleep(0.2)
    yield namespace
    kubectl(control_plane, "patch", "configmap", "held", "-n", namespace, "--type=merge", "-p",
            '{"metadata": {"finalizers": null}}')  # fmt: skip


def test_a_write_into_a_terminating_namespace_is_told_apart_from_an_rbac_denial(
    control_plane: Any, terminating_namespace: str
) -> None:
    async def write() -> KubeError:
        kube = client(control_plane)
        try:
            await kube.apply(
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": {"name": "new", "namespace": terminating_namespace},
                    "spec": {"ports": [{"port": 8000}]},
                }
            )
        except KubeError as error:
            return error
        finally:
            await kube.close()
        raise AssertionError("the API server accepted new content in a terminating namespace")

    error = asyncio.run(write())
    assert error.status == 403
    assert error.namespace_terminating
    assert "being terminated" in str(error)


def test_reconciling_into_a_terminating_namespace_stops_quietly(
    control_plane: Any, terminating_namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A child event's body of a service whose namespace is going away (the service itself may
    # already be gone: the namespace controller deletes content in no particular order).
    body = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"].update(namespace=terminating_namespace, uid=str(uuid.uuid4()), generation=1)

    async def reconcile() -> None:
        kube = client(control_plane)
        try:
            await Reconciler(kube=kube, config=OperatorConfig()).reconcile(body)
        finally:
            await kube.close()

    with caplog.at_level(logging.INFO, logger="chunkpilot.operator.reconcile"):
        asyncio.run(reconcile())
    assert f"not reconciling {terminating_namespace}/{body['metadata']['name']}" in caplog.text


def _deployment_reads() -> float:
    return (
        telemetry.REGISTRY.get_sample_value(
            "chunkpilot_kube_requests_total", {"verb": "get", "resource": "apps/deployments"}
        )
        or 0.0
    )


def test_a_new_services_first_reconcile_reads_no_canary(control_plane: Any) -> None:
    """The tuner runs a canary only for a service the operator has reconciled: the first reconcile
    reads the stable Deployment alone, a later one the canary too."""
    control_plane.apply_manifests([REPO / "crds"])
    namespace = f"canary-reads-{uuid.uuid4().hex[:6]}"
    kubectl(control_plane, "create", "namespace", namespace)
    manifest = yaml.safe_load(EXAMPLE.read_text())
    manifest["metadata"]["namespace"] = namespace
    kubectl(control_plane, "apply", "-f", "-", stdin=json.dumps(manifest))
    name = manifest["metadata"]["name"]

    def service() -> dict[str, Any]:
        found: dict[str, Any] = json.loads(
            kubectl(control_plane, "get", "cpis", name, "-n", namespace, "-o", "json").stdout
        )
        return found

    async def reconcile(body: dict[str, Any]) -> float:
        kube = client(control_plane)
        before = _deployment_reads()
        try:
            await Reconciler(kube=kube, config=OperatorConfig()).reconcile(body)
        finally:
            await kube.close()
        return _deployment_reads() - before

    first = service()
    assert "observedGeneration" not in (first.get("status") or {})
    assert asyncio.run(reconcile(first)) == 1  # the stable Deployment, to apply it
    again = service()
    assert again["status"]["observedGeneration"] == 1
    assert asyncio.run(reconcile(again)) == 2  # the stable Deployment and the canary


def test_release_frees_services_from_an_uninstalled_operators_finalizer(control_plane: Any) -> None:
    """With no operator left to remove its finalizer, ``chunkpilot operator release`` does, and only it."""
    control_plane.apply_manifests([REPO / "crds"])
    namespace = f"released-{uuid.uuid4().hex[:6]}"
    kubectl(control_plane, "create", "namespace", namespace)
    manifest = yaml.safe_load(EXAMPLE.read_text())
    manifest["metadata"] = {
        "name": "left-behind",
        "namespace": namespace,
        "finalizers": [FINALIZER, HOLD],
    }
    kubectl(control_plane, "apply", "-f", "-", stdin=json.dumps(manifest))
    kubectl(control_plane, "delete", "cpis", "left-behind", "-n", namespace, "--wait=false")

    proc = captured(
        [sys.executable, "-m", "chunkpilot.cli", "operator", "release", "-n", namespace,
         "--kubeconfig", str(control_plane.kubeconfig)],
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert f"released {namespace}/left-behind" in proc.stdout
    left = json.loads(
        kubectl(control_plane, "get", "cpis", "left-behind", "-n", namespace, "-o", "json").stdout
    )
    assert left["metadata"]["finalizers"] == [HOLD]  # someone else's finalizer stays

    again = captured(
        [sys.executable, "-m", "chunkpilot.cli", "operator", "release", "-n", namespace,
         "--kubeconfig", str(control_plane.kubeconfig)],
        timeout=120,
    )  # fmt: skip
    assert again.returncode == 0 and "0 InferenceService(s) released" in again.stdout, again.stdout
    kubectl(
        control_plane, "patch", "cpis", "left-behind", "-n", namespace, "--type=merge",
        "-p", '{"metadata":{"finalizers":null}}',
    )  # fmt: skip
    gone = kubectl(control_plane, "get", "cpis", "-n", namespace, "-o", "json").stdout
    assert json.loads(gone)["items"] == []
    kubectl(control_plane, "delete", "namespace", namespace, "--wait=false")
