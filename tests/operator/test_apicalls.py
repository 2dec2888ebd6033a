"""The API call inventory: how REST requests map onto RBAC checks, and the client refusing undeclared ones."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from chunkpilot.operator import apicalls
from chunkpilot.operator.apicalls import (
    API_CALLS,
    ApiCall,
    Feature,
    Request,
    UndeclaredApiCallError,
    WatchMode,
    check_declared,
    requests_of,
)
from chunkpilot.operator.builders import build_canary_topology
from chunkpilot.operator.kube import APPLY_PATCH, MERGE_PATCH, KubeClient, load_credentials, object_path
from chunkpilot.operator.objects import canary_topology_paths

from chunkpilot.api import InferenceService, PoolSpec, TopologySpec
from chunkpilot.testing.services import a_topology_manifest

CLUSTER_PEERING = Request("get", "kopf.dev", "clusterkopfpeerings", False)
WATCH_ALL = Request("watch", "chunkpilot.io", "inferenceservices", False)
DELETE_DEPLOYMENT = Request("delete", "apps", "deployments", True)


@pytest.mark.parametrize(
    ("method", "path", "content_type", "expected"),
    [
        ("GET", "/api/v1/namespaces/ns/pods?labelSelector=a%3Db", None, [Request("list", "", "pods", True)]),
        (
            "GET",
            "/api/v1/namespaces/ns/secrets/chunkpilot-live-adjust",
            None,
            [Request("get", "", "secrets", True, "chunkpilot-live-adjust")],
        ),
        ("POST", "/api/v1/namespaces/ns/secrets", None, [Request("create", "", "secrets", True)]),
        (
            "PATCH",
            "/apis/apps/v1/namespaces/ns/deployments/chat",
            APPLY_PATCH,
            [Request("patch", "apps", "deployments", True), Request("create", "apps", "deployments", True)],
        ),
        (
            "PATCH",
            "/apis/chunkpilot.io/v1alpha1/namespaces/ns/inferenceservices/chat/status",
            MERGE_PATCH,
            [Request("patch", "chunkpilot.io", "inferenceservices/status", True)],
        ),
        ("POST", "/apis/batch/v1/namespaces/ns/jobs", None, [Request("create", "batch", "jobs", True)]),
        ("DELETE", "/apis/apps/v1/namespaces/ns/deployments/c", None, [DELETE_DEPLOYMENT]),
        ("DELETE", "/api/v1/namespaces/ns/pods", None, [Request("deletecollection", "", "pods", True)]),
        ("PUT", "/api/v1/namespaces/ns/configmaps/p", None, [Request("update", "", "configmaps", True)]),
        ("GET", "/apis/kopf.dev/v1/clusterkopfpeerings/p", None, [CLUSTER_PEERING]),
        ("GET", "/apis/chunkpilot.io/v1alpha1/inferenceservices?watch=1", None, [WATCH_ALL]),
        ("GET", "/api/v1/namespaces/ns", None, [Request("get", "", "namespaces", False)]),
        ("GET", "/apis/monitoring.coreos.com/v1", None, []),  # discovery
    ],
)  # fmt: skip
def test_requests_map_onto_rbac_checks(
    method: str, path: str, content_type: str | None, expected: list[Request]
) -> None:
    assert requests_of(method, path, content_type) == expected


@pytest.mark.parametrize("path", ["/healthz", "/api", "/apis/apps", "deployments"])
def test_non_api_paths_are_refused(path: str) -> None:
    with pytest.raises(ValueError, match="not a Kubernetes API path"):
        requests_of("GET", path)


def test_declared_calls_pass_and_others_name_the_fix() -> None:
    check_declared("GET", "/api/v1/namespaces/ns/pods")  # the tuner's canary pod list
    check_declared("PATCH", "/apis/apps/v1/namespaces/ns/deployments/d", APPLY_PATCH)
    with pytest.raises(UndeclaredApiCallError, match=r"get core/pods \(in a namespace\).*API_CALLS"):
        check_declared("GET", "/api/v1/namespaces/ns/pods/p")
    with pytest.raises(UndeclaredApiCallError, match="delete core/services"):
        check_declared("DELETE", "/api/v1/namespaces/ns/services/s")
    # A namespaced entry does not cover the same resource across all namespaces.
    with pytest.raises(UndeclaredApiCallError, match="cluster-wide"):
        check_declared("GET", "/api/v1/pods")
    # Server-side apply creates: both verbs must be declared.
    only_patch = (ApiCall("", "configmaps", frozenset({"patch"}), "test", "test"),)
    check_declared("PATCH", "/api/v1/namespaces/ns/configmaps/c", MERGE_PATCH, calls=only_patch)
    with pytest.raises(UndeclaredApiCallError, match="create core/configmaps"):
        check_declared("PATCH", "/api/v1/namespaces/ns/configmaps/c", APPLY_PATCH, calls=only_patch)
    # A call declared on named objects covers those names only: the one live-adjustment Secret.
    check_declared("GET", "/api/v1/namespaces/ns/secrets/chunkpilot-live-adjust")
    check_declared("POST", "/api/v1/namespaces/ns/secrets")
    with pytest.raises(UndeclaredApiCallError, match="get core/secrets"):
        check_declared("GET", "/api/v1/namespaces/ns/secrets/chat-live-adjust")
    with pytest.raises(UndeclaredApiCallError, match="patch core/secrets"):
        check_declared("PATCH", "/api/v1/namespaces/kube-system/secrets/bootstrap-token", MERGE_PATCH)


def test_inventory_is_well_formed() -> None:
    rbac_verbs = {"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection", "bind"}
    for call in API_CALLS:
        assert call.verbs and call.verbs <= rbac_verbs, call
        assert call.why and call.by in {"operator", "tuner", "kopf", "apiserver"}, call
        assert call.modes and call.modes <= set(WatchMode), call
        if call.cluster_scoped:  # a namespaced operator cannot make cluster-scoped calls
            assert WatchMode.NAMESPACED not in call.modes, call
    # Secrets only ever for live adjustment.
    assert {c.feature for c in API_CALLS if c.resource == "secrets"} == {Feature.LIVE_ADJUST}


def test_enforcement_follows_the_environment() -> None:
    assert apicalls.enforcing({"CHUNKPILOT_KUBE_CALLS": "enforce"})
    assert not apicalls.enforcing({"CHUNKPILOT_KUBE_CALLS": ""}) and not apicalls.enforcing({})


def test_client_refuses_an_undeclared_call_before_sending_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server is unreachable (port 9 discards): a declared call would fail to connect instead.
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    monkeypatch.setenv("CHUNKPILOT_KUBE_CALLS", "enforce")
    client = KubeClient(load_credentials(str(kubeconfig)), field_manager="test", timeout_s=5)
    assert client.enforce_declared_calls

    async def calls() -> None:
        try:
            with pytest.raises(UndeclaredApiCallError, match="delete core/services"):
                await client.delete("/api/v1/namespaces/ns/services/s")
            with pytest.raises(OSError):  # declared: it is sent (and cannot connect)
                await client.list("/api/v1/namespaces/ns/pods")
        finally:
            await client.close()

    asyncio.run(calls())


def test_the_tuners_entries_declare_every_call_of_a_topology_trials_canary_objects() -> None:
    """The tuner applies the canary pools and the canary router with its RBAC, and deletes them."""
    service = InferenceService.from_manifest(a_topology_manifest("chat", "ns"))
    topology = TopologySpec(
        mode="disaggregated",
        prefill=PoolSpec(replicas=1, max_num_batched_tokens=4096),
        decode=PoolSpec(replicas=1),
    )
    tuner = tuple(call for call in API_CALLS if call.by == apicalls.TUNER)
    manifests = build_canary_topology(service, topology)
    assert {m["kind"] for m in manifests} == {"Deployment", "ServiceAccount", "Role", "RoleBinding"}
    for manifest in manifests:
        check_declared("PATCH", object_path(manifest), APPLY_PATCH, calls=tuner)
    for path in canary_topology_paths("ns", "chat", pools=True):
        check_declared("DELETE", path, calls=tuner)
