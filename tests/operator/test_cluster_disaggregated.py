"""A disaggregated InferenceService on the local control plane: the operator as a real process.

The pools, the router with its RBAC and the Service in front of the router are created; the
status shows both pools; switching back to colocated removes what the old topology left. A
promoted topology's switch-over runs through the real Reconciler against the same API server.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from chunkpilot.operator.builders import as_declared, build_canary_colocated
from chunkpilot.operator.config import OperatorConfig, PodMonitorMode
from chunkpilot.operator.kube import KubeClient, object_path, resource_path
from chunkpilot.operator.objects import adopt, isvc_path
from chunkpilot.operator.reconcile import Reconciler
from chunkpilot.operator.served import with_best_topology
from chunkpilot.operator.testing import OperatorProcess, operator_env, wait_for
from chunkpilot.tuner.observe.observer import parse_service

from chunkpilot.api import EngineConfig
from chunkpilot.testing.kube import condition_of, get_object, patch_status, service_endpoints

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
NS = "chunkpilot-disaggregated-tests"
EXAMPLE = REPO / "examples" / "disaggregated-sim.yaml"
NAME = "chat-pd"
TIMEOUT = 90.0


def kubectl(cluster: Any, *args: str, stdin: str | None = None, check: bool = True) -> Any:
    return cluster.kubectl(*args, input=stdin, check=check)


def get(cluster: Any, kind: str, name: str) -> dict[str, Any] | None:
    return get_object(cluster, kind, name, NS)


def condition(isvc: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    return condition_of(isvc, type_) or {}


def manifest() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    document["metadata"]["namespace"] = NS
    # Autotuning on: the operator's reconcile renders the pools all the same (tuning is the tuner's).
    document["spec"]["autotune"] = {"enabled": True}
    return document


@pytest.fixture(scope="module")
def cluster(control_plane: Any) -> Any:
    control_plane.apply_manifests([REPO / "crds"])
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}
    kubectl(control_plane, "apply", "-f", "-", stdin=json.dumps(namespace))
    return control_plane


@pytest.fixture(scope="module")
def operator(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    process = OperatorProcess(
        ["-n", NS, "--standalone", "--verbose"],
        env=operator_env(cluster.env),
        log_path=tmp_path_factory.mktemp("operator") / "operator.log",
    )
    process.start()
    yield process
    kubectl(
        cluster, "delete", "inferenceservices", "--all", "-n", NS, "--wait=true", "--timeout=60s", check=False
    )
    process.stop()


def test_disaggregated_service_gets_both_pools_the_router_and_its_rbac(
    cluster: Any, operator: OperatorProcess
) -> None:
    kubectl(cluster, "apply", "-f", "-", stdin=json.dumps(manifest()))

    def ready() -> dict[str, Any] | None:
        isvc = get(cluster, "inferenceservices", NAME)
        ok = condition(isvc, "Ready").get("status") == "True"
        return isvc if ok and (isvc or {}).get("status", {}).get("topology") else None

    isvc = wait_for(ready, timeout=TIMEOUT, what=f"{NAME} Ready with both pools")
    uid = isvc["metadata"]["uid"]

    pools = {role: get(cluster, "deployments", f"{NAME}-{role}") for role in ("prefill", "decode")}
    for role, deployment in pools.items():
        assert deployment is not None, role
        assert deployment["metadata"]["ownerReferences"][0]["uid"] == uid
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert labels["chunkpilot.io/role"] == role and labels["chunkpilot.io/service"] == NAME
        args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[args.index("--kv-transfer-config") + 1] == (
            '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'
        )
        assert args[args.index("--kv-bandwidth-gbps") + 1] == "25"
    prefill_args = pools["prefill"]["spec"]["template"]["spec"]["containers"][0]["args"]  # type: ignore[index]
    decode_args = pools["decode"]["spec"]["template"]["spec"]["containers"][0]["args"]  # type: ignore[index]
    assert prefill_args[prefill_args.index("--max-num-batched-tokens") + 1] == "8192"
    assert decode_args[decode_args.index("--max-num-batched-tokens") + 1] == "512"
    assert pools["decode"]["spec"]["replicas"] == 3  # type: ignore[index]
    assert get(cluster, "deployments", f"{NAME}-stable") is None

    router = get(cluster, "deployments", f"{NAME}-router")
    assert router is not None and router["metadata"]["ownerReferences"][0]["uid"] == uid
    pod = router["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == f"{NAME}-router"
    container = pod["containers"][0]
    assert container["name"] == "router" and container["command"] == ["vllm-router"]
    args = container["args"]
    assert args[args.index("--service-discovery-namespace") + 1] == NS
    start = args.index("--prefill-selector") + 1
    assert args[start : start + 2] == [f"chunkpilot.io/service={NAME}", "chunkpilot.io/role=prefill"]
    role = get(cluster, "roles", f"{NAME}-router")
    assert role is not None and role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    ]
    binding = get(cluster, "rolebindings", f"{NAME}-router")
    assert binding is not None and binding["subjects"] == [
        {"kind": "ServiceAccount", "name": f"{NAME}-router", "namespace": NS}
    ]
    assert get(cluster, "serviceaccounts", f"{NAME}-router") is not None
    # The router's own ServiceAccount may list the pods of its namespace, and no more.
    subject = f"system:serviceaccount:{NS}:{NAME}-router"
    can = kubectl(cluster, "auth", "can-i", "list", "pods", "-n", NS, "--as", subject, check=False)
    assert can.stdout.strip() == "yes"
    cannot = kubectl(cluster, "auth", "can-i", "create", "pods", "-n", NS, "--as", subject, check=False)
    assert cannot.stdout.strip() == "no"

    service = get(cluster, "services", NAME)
    assert service is not None
    assert service["spec"]["selector"] == {"chunkpilot.io/service": NAME, "chunkpilot.io/component": "router"}

    topology = isvc["status"]["topology"]
    assert topology["mode"] == "disaggregated"
    assert (topology["prefill"]["readyReplicas"], topology["decode"]["readyReplicas"]) == (1, 3)
    assert topology["prefill"]["config"]["maxNumBatchedTokens"] == 8192
    assert topology["decode"]["config"]["maxNumSeqs"] == 256
    assert topology["router"]["readyReplicas"] == 1
    assert isvc["status"]["readyReplicas"] == 4 and "appliedConfig" not in isvc["status"]


def test_a_hand_deleted_router_is_restored(cluster: Any, operator: OperatorProcess) -> None:
    before = get(cluster, "deployments", f"{NAME}-router")
    assert before is not None
    kubectl(cluster, "delete", "deployment", f"{NAME}-router", "-n", NS)

    def restored() -> dict[str, Any] | None:
        now = get(cluster, "deployments", f"{NAME}-router")
        return now if now is not None and now["metadata"]["uid"] != before["metadata"]["uid"] else None

    wait_for(restored, timeout=60, what="the router Deployment restored")


def test_in_auto_each_pool_runs_the_planners_decision_for_it(cluster: Any, operator: OperatorProcess) -> None:
    name = "sized-pd"
    document = manifest()
    document["metadata"]["name"] = name
    document["spec"]["scaling"] = {"mode": "Auto", "minReplicas": 1, "maxReplicas": 4}
    kubectl(cluster, "apply", "-f", "-", stdin=json.dumps(document))  # the API server accepts it

    def pool(role: str, replicas: int) -> dict[str, Any] | None:
        deployment = get(cluster, "deployments", f"{name}-{role}")
        return deployment if deployment is not None and deployment["spec"]["replicas"] == replicas else None

    wait_for(lambda: pool("decode", 3), timeout=TIMEOUT, what="the declared decode pool")
    # The tuner's decision, written through the status subresource as it does; 6 is beyond maxReplicas.
    decided = [{"role": "prefill", "desiredReplicas": 2}, {"role": "decode", "desiredReplicas": 6}]
    status = {
        "status": {"scaling": {"mode": "Auto", "desiredReplicas": 8, "reason": "test", "pools": decided}}
    }
    kubectl(
        cluster,
        "patch",
        "cpis",
        name,
        "-n",
        NS,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(status),
    )
    wait_for(lambda: pool("prefill", 2), timeout=TIMEOUT, what="the prefill pool's decision run")
    wait_for(lambda: pool("decode", 4), timeout=TIMEOUT, what="the decode pool at maxReplicas")
    # Off: the declared pools run again.
    kubectl(
        cluster, "patch", "cpis", name, "-n", NS, "--type=merge", "-p", '{"spec":{"scaling":{"mode":"Off"}}}'
    )
    wait_for(lambda: pool("prefill", 1) and pool("decode", 3), timeout=TIMEOUT, what="the declared pools")
    kubectl(cluster, "delete", "cpis", name, "-n", NS)


def apply_auto_service(cluster: Any, name: str) -> None:
    """The chat example as ``name``, sized by the planner in Auto and allowed to change topology."""
    document: dict[str, Any] = yaml.safe_load((REPO / "examples" / "chat-llama-8b-sim.yaml").read_text())
    document["metadata"].update(name=name, namespace=NS)
    document["spec"]["autotune"] = {"enabled": True, "allowTopologyChange": True}
    document["spec"]["scaling"] = {"mode": "Auto", "minReplicas": 1, "maxReplicas": 4}
    kubectl(cluster, "apply", "-f", "-", stdin=json.dumps(document))


def test_in_auto_a_promoted_topology_of_other_replicas_runs_and_its_pools_follow_the_planner(
    cluster: Any, operator: OperatorProcess
) -> None:
    name = "proposed-pd"
    apply_auto_service(cluster, name)

    def patch_status(status: dict[str, Any]) -> None:
        body = json.dumps({"status": status})
        kubectl(cluster, "patch", "cpis", name, "-n", NS, "--subresource=status", "--type=merge", "-p", body)

    def replicas(part: str, count: int | None) -> bool:
        deployment = get(cluster, "deployments", f"{name}-{part}")
        return (
            deployment is None
            if count is None
            else bool(deployment and deployment["spec"]["replicas"] == count)
        )

    patch_status(
        {"scaling": {"mode": "Auto", "topology": "colocated", "desiredReplicas": 3, "reason": "test"}}
    )
    wait_for(lambda: replicas("stable", 3), timeout=TIMEOUT, what="the planner's three colocated replicas")
    # A topology trial promoted 1 + 1 pools (the planner's proposal): two GPUs where three ran.
    topology = {
        "mode": "disaggregated",
        "prefill": {"replicas": 1, "maxNumBatchedTokens": 8192, "maxNumSeqs": 128},
        "decode": {"replicas": 1, "maxNumBatchedTokens": 2048, "maxNumSeqs": 128},
    }
    pools = [{"role": "prefill", "desiredReplicas": 1}, {"role": "decode", "desiredReplicas": 1}]
    promoted = {"topology": "disaggregated", "desiredReplicas": 2, "decision": "prefill 1 + decode 1"}
    patch_status(
        {
            "bestTopology": topology,
            "bestTopologyTrial": f"{name}-trial-7",
            "scaling": {**promoted, "pools": pools},
        }
    )
    wait_for(
        lambda: replicas("prefill", 1) and replicas("decode", 1) and replicas("stable", None),
        timeout=TIMEOUT,
        what="the promoted pools in place of the colocated Deployment",
    )
    # The planner sizes the pools from then on.
    decided = [{"role": "prefill", "desiredReplicas": 2}, {"role": "decode", "desiredReplicas": 1}]
    patch_status({"scaling": {"desiredReplicas": 3, "decision": "prefill 2 + decode 1", "pools": decided}})
    wait_for(lambda: replicas("prefill", 2), timeout=TIMEOUT, what="the prefill pool's decision run")
    # A new split of the same three replicas: the sum stays, the decision changes, and it runs.
    decided = [{"role": "prefill", "desiredReplicas": 1}, {"role": "decode", "desiredReplicas": 2}]
    patch_status({"scaling": {"decision": "prefill 1 + decode 2", "pools": decided}})
    wait_for(lambda: replicas("decode", 2), timeout=TIMEOUT, what="the decode pool's new decision run")
    kubectl(cluster, "delete", "cpis", name, "-n", NS)


def test_back_to_colocated_removes_the_pools_and_the_router(cluster: Any, operator: OperatorProcess) -> None:
    remove = json.dumps([{"op": "remove", "path": "/spec/topology"}])
    kubectl(cluster, "patch", "inferenceservices", NAME, "-n", NS, "--type=json", "-p", remove)

    def switched() -> bool:
        service = get(cluster, "services", NAME) or {}
        return (
            get(cluster, "deployments", f"{NAME}-stable") is not None
            and all(
                get(cluster, "deployments", f"{NAME}-{part}") is None
                for part in ("prefill", "decode", "router")
            )
            and service.get("spec", {}).get("selector") == {"chunkpilot.io/service": NAME}
        )

    wait_for(
        switched, timeout=TIMEOUT, what="colocated again: stable Deployment only, Service on the engines"
    )

    def status_cleared() -> dict[str, Any] | None:
        isvc = get(cluster, "inferenceservices", NAME)
        ok = condition(isvc, "Ready").get("status") == "True"
        return isvc if ok and "topology" not in isvc["status"] else None  # type: ignore[index]

    isvc = wait_for(status_cleared, timeout=TIMEOUT, what="status without topology")
    assert isvc["status"]["appliedConfig"]["maxNumBatchedTokens"] == 2048


def test_a_promoted_topology_switches_over_on_the_real_api_server_and_back_on_a_replicas_edit(
    cluster: Any,
) -> None:
    """The real Reconciler and API server (server-side apply of the Service's selector both ways):
    the colocated Deployment serves until the pools and router are Ready, and again after an edit of
    spec.replicas away from the topology's until it is Ready."""
    namespace = f"promoted-{uuid.uuid4().hex[:8]}"
    kubectl(cluster, "create", "namespace", namespace)
    document: dict[str, Any] = yaml.safe_load((REPO / "examples" / "chat-llama-8b-sim.yaml").read_text())
    document["metadata"]["namespace"] = namespace
    document["spec"]["autotune"]["allowTopologyChange"] = True
    kubectl(cluster, "apply", "-f", "-", stdin=json.dumps(document))
    topology = {
        "mode": "disaggregated",
        "prefill": {"replicas": 1, "maxNumBatchedTokens": 4096, "maxNumSeqs": 128},
        "decode": {"replicas": 1, "maxNumBatchedTokens": 2048, "maxNumSeqs": 128},
    }
    service_path = object_path(
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "chat", "namespace": namespace}}
    )

    def deployment_path(name: str) -> str:
        return resource_path("apps/v1", "deployments", namespace, name)

    async def scenario() -> None:
        kube = KubeClient.from_environment(field_manager="promoted-test", kubeconfig=str(cluster.kubeconfig))
        reconciler = Reconciler(kube=kube, config=OperatorConfig(pod_monitor=PodMonitorMode.DISABLED))

        async def reconcile() -> None:
            body = await kube.get(isvc_path(namespace, "chat"))
            assert body is not None
            await reconciler.reconcile(body)

        async def ready(*names: str) -> None:
            deadline = asyncio.get_running_loop().time() + TIMEOUT
            while True:
                found = [await kube.get(deployment_path(name)) for name in names]
                if all(
                    d and (d.get("status") or {}).get("readyReplicas") == d["spec"]["replicas"] for d in found
                ):
                    return
                assert asyncio.get_running_loop().time() < deadline, f"{names} not Ready"
                await asyncio.sleep(0.5)

        async def selector() -> dict[str, str]:
            service = await kube.get(service_path)
            assert service is not None
            return dict(service["spec"]["selector"])

        async def exists(name: str) -> bool:
            return await kube.get(deployment_path(name)) is not None

        try:
            await reconcile()
            await ready("chat-stable")
            await kube.merge_patch(
                isvc_path(namespace, "chat") + "/status",
                {"status": {"bestTopology": topology, "bestTopologyTrial": "chat-trial-7"}},
            )
            await reconcile()
            assert (
                await exists("chat-prefill") and await exists("chat-router") and await exists("chat-stable")
            )
            assert await selector() == {"chunkpilot.io/service": "chat"}  # the stable pods serve
            await ready("chat-prefill", "chat-decode", "chat-router")
            await reconcile()
            assert await selector() == {"chunkpilot.io/service": "chat", "chunkpilot.io/component": "router"}
            await reconcile()
            assert not await exists("chat-stable")
            # spec.replicas edited away from the topology's two: colocated on three, once Ready.
            await kube.merge_patch(isvc_path(namespace, "chat"), {"spec": {"replicas": 3}})
            await reconcile()
            stable = await kube.get(deployment_path("chat-stable"))
            assert stable is not None and stable["spec"]["replicas"] == 3
            assert (await selector()).get("chunkpilot.io/component") == "router"
            await ready("chat-stable")
            await reconcile()
            assert await selector() == {"chunkpilot.io/service": "chat"}  # the router key removed
            await reconcile()
            assert not any([await exists(f"chat-{part}") for part in ("prefill", "decode", "router")])
        finally:
            await kube.close()

    try:
        asyncio.run(scenario())
    finally:
        kubectl(cluster, "delete", "namespace", namespace, "--wait=false", check=False)


def pods(cluster: Any, namespace: str, selector: str) -> set[str]:
    listing = json.loads(
        kubectl(cluster, "get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout
    )
    return {p["metadata"]["name"] for p in listing["items"] if not p["metadata"].get("deletionTimestamp")}


def test_in_auto_promoted_pools_tried_colocated_again_share_the_service_and_give_way_when_promoted(
    cluster: Any, operator: OperatorProcess
) -> None:
    """A colocated topology trial's canary on the real API server: the Service (which selects router
    pods) reaches the canary router beside the stable one, never the canary engines; a promotion
    (``bestTopology`` cleared, the planner's colocated decision) brings the colocated Deployment
    back on its replicas and removes the pools and the router."""
    name = "back-colocated"
    apply_auto_service(cluster, name)

    def ready(part: str, count: int | None) -> bool:
        deployment = get(cluster, "deployments", f"{name}-{part}")
        if count is None:
            return deployment is None
        return bool(
            deployment
            and deployment["spec"]["replicas"] == count
            and (deployment.get("status") or {}).get("readyReplicas") == count
        )

    topology = {
        "mode": "disaggregated",
        "prefill": {"replicas": 2, "maxNumBatchedTokens": 8192, "maxNumSeqs": 128},
        "decode": {"replicas": 1, "maxNumBatchedTokens": 2048, "maxNumSeqs": 128},
    }
    pools = [{"role": "prefill", "desiredReplicas": 2}, {"role": "decode", "desiredReplicas": 1}]
    patch_status(
        cluster,
        "cpis",
        name,
        NS,
        {
            "bestTopology": topology,
            "bestTopologyTrial": f"{name}-trial-7",
            "scaling": {"mode": "Auto", "topology": "disaggregated", "desiredReplicas": 3, "pools": pools},
        },
    )
    wait_for(
        lambda: ready("prefill", 2) and ready("decode", 1) and ready("router", 1) and ready("stable", None),
        timeout=TIMEOUT,
        what="the promoted pools and their router, Ready",
    )
    # The tuner's colocated canary: one engine of the colocated config behind one canary router pod.
    body = get(cluster, "inferenceservices", name)
    assert body is not None
    isvc = with_best_topology(parse_service(body) or pytest.fail("invalid"), body["status"])
    assert isvc.spec.disaggregated
    config = EngineConfig(max_num_batched_tokens=2048, max_num_seqs=128)
    for manifest in build_canary_colocated(isvc, as_declared(isvc, body), config, replicas=1, routers=1):
        kubectl(cluster, "apply", "-f", "-", stdin=json.dumps(adopt(manifest, body)))
    wait_for(
        lambda: ready("canary", 1) and ready("router-canary", 1),
        timeout=TIMEOUT,
        what="the colocated canary and its router, Ready",
    )
    routers = pods(cluster, NS, f"chunkpilot.io/service={name},chunkpilot.io/component=router")
    engines = pods(cluster, NS, f"chunkpilot.io/service={name},app.kubernetes.io/component=engine")
    canary_router = pods(cluster, NS, f"chunkpilot.io/service={name},chunkpilot.io/component=router,"
                         "chunkpilot.io/track=canary")  # fmt: skip
    assert len(routers) == 2 and len(canary_router) == 1
    seen: list[set[str]] = []

    def reached() -> bool:
        seen.append(service_endpoints(cluster, NS, name))
        return seen[-1] == routers

    wait_for(reached, timeout=TIMEOUT, what="the Service on both routers' pods")
    assert not seen[-1] & engines  # no engine, canary or pool, is the Service's
    # Promoted: colocated on the trial's two replicas in place of the 2 + 1 pools.
    for part in ("router-canary", "canary"):
        kubectl(cluster, "delete", "deployment", f"{name}-{part}", "-n", NS)
    patch_status(
        cluster,
        "cpis",
        name,
        NS,
        {
            "bestTopology": None,
            "bestTopologyTrial": f"{name}-trial-8",
            "scaling": {
                "topology": "colocated",
                "desiredReplicas": 2,
                "decision": "2",
                "pools": None,
                "reason": "the colocated topology trial promoted",
            },
        },
    )

    def colocated() -> bool:
        service = get(cluster, "services", name) or {}
        return (
            ready("stable", 2)
            and all(ready(part, None) for part in ("prefill", "decode", "router"))
            and service.get("spec", {}).get("selector") == {"chunkpilot.io/service": name}
        )

    wait_for(colocated, timeout=TIMEOUT, what="colocated on two replicas, the pools and router gone")
    kubectl(cluster, "delete", "cpis", name, "-n", NS)
