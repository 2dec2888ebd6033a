"""A topology the tuner promoted (``status.bestTopology``) and the canary topology of a topology trial."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from chunkpilot.operator.builders import (
    CANARY_POOL_PORT_NAME,
    build_canary_topology,
    build_children,
    build_pod_monitor,
    build_service,
    effective_topology,
    promoted_topology,
)
from chunkpilot.operator.config import OperatorConfig, PodMonitorMode
from chunkpilot.operator.kube import object_path
from chunkpilot.operator.objects import adopt, isvc_path
from chunkpilot.operator.reconcile import Reconciler
from chunkpilot.operator.router import router_args
from chunkpilot.operator.served import with_best_config, with_best_topology

from chunkpilot.api import (
    LABEL_ROLE,
    LABEL_TRACK,
    InferenceService,
    InferenceServiceStatus,
    PoolScalingStatus,
    PoolSpec,
    ScalingMode,
    ScalingStatus,
    TopologySpec,
)
from chunkpilot.testing.kube import merge_into
from chunkpilot.testing.services import a_topology_manifest

TOPOLOGY = TopologySpec(
    mode="disaggregated",
    prefill=PoolSpec(replicas=1, max_num_batched_tokens=4096, max_num_seqs=64),
    decode=PoolSpec(replicas=1, max_num_batched_tokens=512, max_num_seqs=128),
)


def isvc(
    *, allow: bool = True, enabled: bool = True, best: TopologySpec | None = TOPOLOGY, **spec: Any
) -> InferenceService:
    body = a_topology_manifest("chat", "llm", enabled=enabled, allow=allow, **spec)
    body["metadata"]["uid"] = "u1"
    service = InferenceService.from_manifest(body)
    return service.model_copy(update={"status": InferenceServiceStatus(best_topology=best)})


def names(manifests: Any) -> list[str]:
    return [m["metadata"]["name"] for m in manifests]


def test_a_promoted_topology_is_rendered_as_pools_and_router_instead_of_the_colocated_deployment() -> None:
    service = effective_topology(isvc())
    assert service.spec.disaggregated
    children = build_children(service, pod_monitor=True)
    assert children.deployment is None
    assert names(children.pools) == ["chat-prefill", "chat-decode"]
    assert names(children.router)[-1] == "chat-router"
    prefill, decode = (service.spec.pool_config(role) for role in ("prefill", "decode"))
    assert (prefill.max_num_batched_tokens, decode.max_num_seqs) == (4096, 128)
    # The Service now selects the router.
    assert children.service["spec"]["selector"]["chunkpilot.io/component"] == "router"


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"allow": False}, "allowTopologyChange is off"),
        ({"enabled": False}, "autotuning is off"),
        ({"best": None}, "nothing promoted"),
        ({"autotune": {"enabled": True, "allowTopologyChange": True, "liveAdjust": True}}, "cannot run"),
    ],
)
def test_a_promoted_topology_runs_only_while_the_flags_allow_it_and_the_spec_can_run_it(
    changes: dict[str, Any], why: str
) -> None:
    service = isvc(**changes)
    assert promoted_topology(service) is None, why
    assert not effective_topology(service).spec.disaggregated
    assert build_children(effective_topology(service), pod_monitor=False).deployment is not None


def test_the_spec_topology_wins_over_a_promoted_one() -> None:
    declared = {
        "mode": "disaggregated",
        "prefill": {"replicas": 2, "maxNumBatchedTokens": 8192},
        "decode": {"replicas": 3},
    }
    service = isvc(topology=declared)
    assert promoted_topology(service) is None
    assert effective_topology(service).spec.pool("prefill").replicas == 2


def test_the_spec_kv_transfer_and_router_apply_to_a_promoted_topology() -> None:
    hints = {"kvTransfer": {"bandwidthGBps": 5, "latencyMs": 2}, "router": {"policy": "round_robin"}}
    service = effective_topology(isvc(topology=hints))
    assert service.spec.kv_transfer.bandwidth_gbps == 5
    assert "round_robin" in router_args(service)


def test_the_operator_reads_the_promoted_topology_from_the_raw_status() -> None:
    raw = {"bestTopology": TOPOLOGY.to_k8s()}
    assert with_best_topology(isvc(best=None), raw).spec.disaggregated
    assert not with_best_topology(isvc(best=None), {"bestTopology": {"mode": "bogus"}}).spec.disaggregated
    assert not with_best_topology(isvc(best=None), {}).spec.disaggregated


def test_reading_the_best_config_and_the_best_topology_keeps_what_the_other_read() -> None:
    raw = {"bestTopology": TOPOLOGY.to_k8s(), "bestConfig": {"maxNumBatchedTokens": 384, "maxNumSeqs": 64}}
    for first, then in ((with_best_topology, with_best_config), (with_best_config, with_best_topology)):
        service = then(first(isvc(best=None), raw), raw)
        assert service.status is not None, first
        assert service.status.best_topology == TOPOLOGY, first.__name__
        assert (
            service.status.best_config is not None
            and service.status.best_config.max_num_batched_tokens == 384
        )


def test_a_promoted_topology_runs_only_on_the_replicas_it_was_measured_on() -> None:
    assert promoted_topology(isvc(replicas=3)) is None  # 1 + 1 is two replicas
    assert not effective_topology(isvc(replicas=3)).spec.disaggregated
    assert promoted_topology(isvc(replicas=2)) == TOPOLOGY


def sized(decided: ScalingStatus) -> InferenceService:
    """The service in ``scaling.mode: Auto`` on 3 declared replicas, 1 + 1 promoted, ``decided``."""
    service = isvc(replicas=3, scaling={"mode": "Auto", "maxReplicas": 8})
    return service.model_copy(
        update={"status": InferenceServiceStatus(best_topology=TOPOLOGY, scaling=decided)}
    )


def test_in_auto_a_promoted_topology_runs_once_the_planners_decision_is_for_its_pools() -> None:
    colocated = ScalingStatus(mode=ScalingMode.AUTO, topology="colocated", desired_replicas=5)
    assert not effective_topology(sized(colocated)).spec.disaggregated  # 1 + 1 measured, 5 run
    assert effective_topology(sized(colocated.model_copy(update={"desired_replicas": 2}))).spec.disaggregated
    decided = [
        PoolScalingStatus(role="prefill", desired_replicas=3),
        PoolScalingStatus(role="decode", desired_replicas=1),
    ]
    pools = ScalingStatus(mode=ScalingMode.AUTO, topology="disaggregated", desired_replicas=4, pools=decided)
    running = effective_topology(sized(pools))  # a promotion in Auto wrote the pools' decision
    assert running.spec.disaggregated
    manifests = build_children(running, pod_monitor=False).manifests()
    replicas = {m["metadata"]["name"]: m["spec"]["replicas"] for m in manifests if m["kind"] == "Deployment"}
    assert (replicas["chat-prefill"], replicas["chat-decode"]) == (3, 1) and "chat-stable" not in replicas


def test_a_spec_replicas_edit_returns_a_promoted_topology_to_colocated_on_the_new_replicas() -> None:
    cluster = switched_cluster()
    cluster.body["spec"]["replicas"] = 3
    cluster.body["metadata"]["generation"] = 2
    cluster.reconcile()
    stable = cluster.kube.objects[
        object_path(build_children(isvc(best=None), pod_monitor=False).manifests()[0])
    ]
    assert stable["spec"]["replicas"] == 3
    assert cluster.selector() == ROUTER_SELECTOR  # the pools serve until the stable Deployment is Ready
    mark_ready(cluster.kube, "chat-stable")
    cluster.reconcile(kinds=frozenset())
    cluster.reconcile(kinds=frozenset())
    assert deployments(cluster.kube) == {"chat-stable"}
    assert cluster.selector() == COLOCATED_SELECTOR
    # Set back to the topology's two replicas, the promoted topology runs again.
    cluster.body["spec"]["replicas"] = 2
    cluster.body["metadata"]["generation"] = 3
    cluster.reconcile()
    assert {"chat-prefill", "chat-decode", "chat-router"} <= deployments(cluster.kube)


def test_the_canary_topology_is_two_canary_pools_behind_a_canary_router() -> None:
    manifests = build_canary_topology(isvc(best=None), TOPOLOGY)
    assert names(manifests) == [
        "chat-prefill-canary",
        "chat-decode-canary",
        "chat-router-canary",
        "chat-router-canary",
        "chat-router-canary",
        "chat-router-canary",
    ]
    prefill, decode, *_, router = manifests
    for pool, role in ((prefill, "prefill"), (decode, "decode")):
        labels = pool["spec"]["template"]["metadata"]["labels"]
        assert (labels[LABEL_TRACK], labels[LABEL_ROLE]) == ("canary", role)
        assert pool["spec"]["replicas"] == 1
        assert any(
            a.startswith("--kv-transfer-config")
            for a in pool["spec"]["template"]["spec"]["containers"][0]["args"]
        )
    args = router["spec"]["template"]["spec"]["containers"][0]["args"]
    selectors = " ".join(args)
    assert "chunkpilot.io/role=prefill chunkpilot.io/track=canary" in selectors
    assert "chunkpilot.io/role=decode chunkpilot.io/track=canary" in selectors
    labels = router["spec"]["template"]["metadata"]["labels"]
    # The Service of the colocated service (service label only) sends the canary router its share.
    assert labels["chunkpilot.io/service"] == "chat" and labels[LABEL_TRACK] == "canary"
    assert router["spec"]["template"]["spec"]["serviceAccountName"] == "chat-router-canary"


def test_a_canary_topology_the_spec_cannot_run_is_refused() -> None:
    service = isvc(best=None, autotune={"enabled": True, "allowTopologyChange": True, "liveAdjust": True})
    with pytest.raises(ValueError, match="cannot run a disaggregated topology"):
        build_canary_topology(service, TOPOLOGY)


class FakeKube:
    """Objects by path: what a reconcile of one service reads and writes."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.deleted: list[str] = []

    async def get(self, path: str) -> dict[str, Any] | None:
        found = self.objects.get(path)
        return copy.deepcopy(found) if found is not None else None

    async def apply(self, manifest: dict[str, Any], *, force: bool = True) -> dict[str, Any]:
        body = copy.deepcopy(manifest)
        body["metadata"].setdefault("resourceVersion", "1")
        self.objects[object_path(manifest)] = body
        return copy.deepcopy(body)

    async def merge_patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        target = self.objects[path.removesuffix("/status")]
        merge_into(target, {key: value for key, value in patch.items() if key != "metadata"})
        return copy.deepcopy(target)

    async def delete(self, path: str) -> None:
        self.deleted.append(path)
        self.objects.pop(path, None)


def deployments(kube: FakeKube) -> set[str]:
    return {path.rsplit("/", 1)[1] for path in kube.objects if "/deployments/" in path}


def mark_ready(kube: FakeKube, *names: str) -> None:
    """What the Deployment controller writes once every replica of ``names`` runs and is ready."""
    for path, body in kube.objects.items():
        if "/deployments/" in path and body["metadata"]["name"] in names:
            replicas = body["spec"]["replicas"]
            body["metadata"]["generation"] = 1
            body["status"] = {
                "observedGeneration": 1,
                "replicas": replicas,
                "readyReplicas": replicas,
                "updatedReplicas": replicas,
                "availableReplicas": replicas,
            }


class Cluster:
    """One service in a FakeKube and the real Reconciler; each pass reads the service afresh."""

    def __init__(self, service: InferenceService, status: dict[str, Any]) -> None:
        body = service.to_manifest()
        body["metadata"].update(resourceVersion="7", generation=1)
        body["status"] = status
        self.service = service
        self.kube = FakeKube()
        self.kube.objects[isvc_path("llm", "chat")] = body
        self.events: list[Any] = []
        self.reconciler = Reconciler(
            kube=self.kube,  # type: ignore[arg-type]
            config=OperatorConfig(pod_monitor=PodMonitorMode.DISABLED),
            post_event=lambda _body, spec: self.events.append(spec),
        )

    @property
    def body(self) -> dict[str, Any]:
        return self.kube.objects[isvc_path("llm", "chat")]

    def reconcile(self, **kwargs: Any) -> None:
        asyncio.run(self.reconciler.reconcile(copy.deepcopy(self.body), **kwargs))

    def selector(self) -> dict[str, str]:
        service: dict[str, Any] = self.kube.objects[object_path(build_service(self.service))]
        return dict(service["spec"]["selector"])

    def progressing(self) -> dict[str, Any]:
        conditions = self.body["status"]["conditions"]
        return next(c for c in conditions if c["type"] == "Progressing")

    def reasons(self) -> list[str]:
        return [event.reason for event in self.events]


COLOCATED_SELECTOR = {"chunkpilot.io/service": "chat"}
ROUTER_SELECTOR = {"chunkpilot.io/service": "chat", "chunkpilot.io/component": "router"}


def promoted_cluster() -> Cluster:
    """A colocated service serving on a Ready stable Deployment when a topology is promoted."""
    service = isvc(best=None)
    cluster = Cluster(service, {})
    cluster.reconcile()
    mark_ready(cluster.kube, "chat-stable")
    cluster.body["status"].update(bestTopology=TOPOLOGY.to_k8s(), bestTopologyTrial="chat-trial-7")
    return cluster


def switched_cluster() -> Cluster:
    """:func:`promoted_cluster` once its pools and router are Ready and the colocated side is gone."""
    cluster = promoted_cluster()
    cluster.reconcile()
    mark_ready(cluster.kube, "chat-prefill", "chat-decode", "chat-router")
    cluster.reconcile()
    cluster.reconcile()
    assert deployments(cluster.kube) == {"chat-prefill", "chat-decode", "chat-router"}
    return cluster


def test_a_promoted_topology_takes_over_only_once_its_pools_and_router_are_ready() -> None:
    cluster = promoted_cluster()
    cluster.reconcile()
    # The new side is created; the colocated Deployment and the Service's selector stay as they are.
    assert deployments(cluster.kube) == {"chat-stable", "chat-prefill", "chat-decode", "chat-router"}
    assert cluster.selector() == COLOCATED_SELECTOR
    assert cluster.progressing()["reason"] == "TopologySwitching"
    assert "waiting for them to be Ready (0/3" in cluster.progressing()["message"]
    assert "TopologySwitching" in cluster.reasons()
    assert cluster.body["status"]["readyReplicas"] == 2  # the stable replicas still serve
    mark_ready(cluster.kube, "chat-prefill", "chat-decode")
    cluster.reconcile()  # the router is not Ready yet
    assert "chat-stable" in deployments(cluster.kube)
    assert cluster.selector() == COLOCATED_SELECTOR
    assert "(2/3" in cluster.progressing()["message"]

    mark_ready(cluster.kube, "chat-router")
    cluster.reconcile(kinds=frozenset())  # a pool's or the router's event: a status-only pass
    assert cluster.selector() == ROUTER_SELECTOR
    assert "chat-stable" in deployments(cluster.kube)  # deleted once the Service has moved
    cluster.reconcile(kinds=frozenset())  # the Service's own event
    assert deployments(cluster.kube) == {"chat-prefill", "chat-decode", "chat-router"}
    assert cluster.selector() == ROUTER_SELECTOR
    assert cluster.progressing()["reason"] == "RolloutComplete"
    assert cluster.body["status"]["topology"]["mode"] == "disaggregated"
    assert "TopologySwitched" in cluster.reasons()


def test_the_echo_of_the_services_switch_is_the_pass_that_removes_the_old_side() -> None:
    # No other event may follow the Service's own write once every Deployment is Ready: its echo,
    # otherwise ignored as what the operator already knows, must finish the switch.
    cluster = promoted_cluster()
    cluster.reconcile()
    mark_ready(cluster.kube, "chat-prefill", "chat-decode", "chat-router")
    cluster.reconcile(kinds=frozenset())
    assert cluster.selector() == ROUTER_SELECTOR and "chat-stable" in deployments(cluster.kube)
    service = copy.deepcopy(cluster.kube.objects[object_path(build_service(cluster.service))])
    assert cluster.reconciler.children.is_echo(service)
    asyncio.run(cluster.reconciler.child_changed("MODIFIED", service))
    assert deployments(cluster.kube) == {"chat-prefill", "chat-decode", "chat-router"}
    # Once: a later echo of an unchanged Service is ignored again (nothing is even read).
    reads: list[str] = []
    get = cluster.kube.get

    async def counted(path: str) -> dict[str, Any] | None:
        reads.append(path)
        return await get(path)

    cluster.kube.get = counted  # type: ignore[method-assign]
    asyncio.run(cluster.reconciler.child_changed("MODIFIED", service))
    assert reads == []


def test_back_to_colocated_the_pools_serve_until_the_stable_deployment_is_ready() -> None:
    cluster = switched_cluster()
    # allowTopologyChange turned off: the service returns to colocated.
    cluster.body["spec"]["autotune"]["allowTopologyChange"] = False
    cluster.body["metadata"]["generation"] = 2
    cluster.reconcile()
    assert deployments(cluster.kube) == {"chat-stable", "chat-prefill", "chat-decode", "chat-router"}
    assert cluster.selector() == ROUTER_SELECTOR
    assert cluster.progressing()["reason"] == "TopologySwitching"
    assert "switching to the stable Deployment" in cluster.progressing()["message"]
    cluster.reconcile()
    assert cluster.selector() == ROUTER_SELECTOR  # not Ready yet: still through the router

    mark_ready(cluster.kube, "chat-stable")
    cluster.reconcile(kinds=frozenset())
    assert cluster.selector() == COLOCATED_SELECTOR
    assert "chat-prefill" in deployments(cluster.kube)
    cluster.reconcile(kinds=frozenset())
    assert deployments(cluster.kube) == {"chat-stable"}
    assert cluster.body["status"].get("topology") is None
    assert cluster.progressing()["reason"] == "RolloutComplete"


def test_the_colocated_service_reaches_the_canary_router_but_not_the_canary_pools_and_scrapes_both() -> None:
    service = isvc(best=None)
    target = build_service(service)["spec"]["ports"][0]["targetPort"]
    prefill, decode, *_, router = build_canary_topology(service, TOPOLOGY)
    for pool in (prefill, decode):
        engine = pool["spec"]["template"]["spec"]["containers"][0]
        assert [p["name"] for p in engine["ports"]] == [CANARY_POOL_PORT_NAME] != [target]
        assert engine["readinessProbe"]["httpGet"]["port"] == CANARY_POOL_PORT_NAME
    router_ports = router["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert target in [p["name"] for p in router_ports]  # the Service's named port resolves on the router
    # Allowed to change topology: the PodMonitor scrapes both port names and keeps the role label.
    monitor = build_pod_monitor(service)["spec"]["podMetricsEndpoints"]
    assert [e["port"] for e in monitor] == [target, CANARY_POOL_PORT_NAME]
    assert all(any(r.get("targetLabel") == "role" for r in e["relabelings"]) for e in monitor)
    plain = build_pod_monitor(isvc(allow=False, best=None))["spec"]["podMetricsEndpoints"]
    assert [e["port"] for e in plain] == [target]
    assert not any(r.get("targetLabel") == "role" for r in plain[0]["relabelings"])


def test_the_canary_router_runs_a_replica_per_gpu_of_its_pools() -> None:
    layout = TOPOLOGY.model_copy(
        update={
            "prefill": TOPOLOGY.prefill.model_copy(update={"replicas": 1}) if TOPOLOGY.prefill else None,
            "decode": TOPOLOGY.decode.model_copy(update={"replicas": 3}) if TOPOLOGY.decode else None,
        }
    )
    *_, router = build_canary_topology(isvc(best=None, replicas=4), layout)
    # Four canary GPUs get four endpoints of the Service, the share four stable replicas would get.
    assert router["spec"]["replicas"] == 4
    stable_router = build_children(effective_topology(isvc()), pod_monitor=False).router[-1]
    assert stable_router["spec"]["replicas"] == 1  # spec.router.replicas, unchanged


def test_a_deleted_canary_router_is_not_taken_for_the_stable_deployment() -> None:
    service = isvc(best=None)
    body = service.to_manifest()
    body["metadata"].update(resourceVersion="7", generation=1)
    kube = FakeKube()
    kube.objects[isvc_path("llm", "chat")] = body
    stable = adopt(build_children(service, pod_monitor=False).manifests()[0], body)
    stable["metadata"]["resourceVersion"] = "3"
    kube.objects[object_path(stable)] = stable
    events: list[Any] = []
    reconciler = Reconciler(
        kube=kube,  # type: ignore[arg-type]
        config=OperatorConfig(pod_monitor=PodMonitorMode.DISABLED),
        post_event=lambda _body, spec: events.append(spec),
    )
    *_, router = build_canary_topology(service, TOPOLOGY)
    asyncio.run(reconciler.child_changed("DELETED", adopt(router, body)))
    assert kube.objects[object_path(stable)]["metadata"]["resourceVersion"] == "3"  # not re-applied
    assert not [e for e in events if e.reason == "DriftCorrected"], events


def test_a_switch_called_off_before_the_pools_are_ready_removes_them_and_keeps_serving() -> None:
    cluster = promoted_cluster()
    cluster.reconcile()
    assert cluster.progressing()["reason"] == "TopologySwitching"
    cluster.body["spec"]["autotune"]["allowTopologyChange"] = False
    cluster.reconcile()  # the stable Deployment is Ready and the Service never left it
    cluster.reconcile(kinds=frozenset())
    assert deployments(cluster.kube) == {"chat-stable"}
    assert cluster.selector() == COLOCATED_SELECTOR
    assert cluster.progressing()["reason"] == "RolloutComplete"


def test_a_deleted_pool_is_not_taken_for_the_stable_deployment() -> None:
    cluster = promoted_cluster()
    cluster.reconcile()
    pool = cluster.kube.objects[
        object_path(build_children(effective_topology(isvc()), pod_monitor=False).pools[0])
    ]
    stable = cluster.kube.objects[
        object_path(build_children(isvc(best=None), pod_monitor=False).manifests()[0])
    ]
    stable["metadata"]["resourceVersion"] = "3"
    cluster.body["spec"]["autotune"]["allowTopologyChange"] = False
    cluster.reconcile()
    cluster.reconcile(kinds=frozenset())
    asyncio.run(cluster.reconciler.child_changed("DELETED", pool))
    assert "DriftCorrected" not in cluster.reasons(), cluster.events
    assert stable["metadata"]["resourceVersion"] == "3"  # the stable Deployment was not re-applied


def matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a label selector (matchLabels, Exists and DoesNotExist expressions) selects ``labels``."""
    if any(labels.get(key) != value for key, value in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        present = expression["key"] in labels
        if present != (expression["operator"] == "Exists"):
            return False
    return True


def test_the_stable_routers_selector_matches_its_own_pods_and_never_a_canary_routers() -> None:
    stable = build_children(effective_topology(isvc()), pod_monitor=False).router[-1]
    *_, canary = build_canary_topology(isvc(best=None), TOPOLOGY)
    pods = {
        name: d["spec"]["template"]["metadata"]["labels"]
        for name, d in (("stable", stable), ("canary", canary))
    }
    assert matches(stable["spec"]["selector"], pods["stable"])
    assert not matches(stable["spec"]["selector"], pods["canary"])
    assert matches(canary["spec"]["selector"], pods["canary"])
    assert not matches(canary["spec"]["selector"], pods["stable"])
