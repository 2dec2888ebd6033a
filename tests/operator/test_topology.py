"""Pure builders of a disaggregated service: the pools, the KV transfer, the router and its RBAC."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from chunkpilot.operator.builders import (
    build_canary_colocated,
    build_canary_pod_monitor,
    build_children,
    build_deployment,
    build_pod_monitor,
    build_service,
    pool_deployment_name,
)
from chunkpilot.operator.engines.kvtransfer import kv_transfer_args, kv_transfer_config
from chunkpilot.operator.router import build_router_deployment, colocated_canary_selector, router_args
from chunkpilot.operator.status import DeploymentState, Observation, TopologyObservation, compute_status

from chunkpilot.api import ConditionType, EngineConfig, InferenceService, PoolRole, RouterPolicy, Track
from chunkpilot.testing.argv import flag

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def isvc(
    kind: str = "sim", namespace: str | None = "llm", image: str | None = None, **topology: Any
) -> InferenceService:
    engine: dict[str, Any] = {"kind": kind, "maxNumBatchedTokens": 2048, "maxNumSeqs": 128}
    if kind == "vllm":
        engine["version"] = "0.33.0"
    if image:
        engine["image"] = image
    meta: dict[str, Any] = {"name": "chat"}
    if namespace:
        meta["namespace"] = namespace
    spec = {
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
        "engine": engine,
        "topology": {
            "mode": "disaggregated",
            "prefill": {"replicas": 1, "maxNumBatchedTokens": 8192, "maxNumSeqs": 16},
            "decode": {"replicas": 3, "maxNumBatchedTokens": 512},
            **topology,
        },
    }
    return InferenceService.from_manifest({"metadata": meta, "spec": spec})


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return found


def test_pool_deployments_run_their_own_knobs_and_the_kv_transfer() -> None:
    service = isvc()
    prefill = build_deployment(service, Track.STABLE, role=PoolRole.PREFILL)
    decode = build_deployment(service, Track.STABLE, role="decode")
    assert (prefill["metadata"]["name"], decode["metadata"]["name"]) == ("chat-prefill", "chat-decode")
    assert (prefill["spec"]["replicas"], decode["spec"]["replicas"]) == (1, 3)
    args = container(prefill)["args"]
    assert (flag(args, "--max-num-batched-tokens"), flag(args, "--max-num-seqs")) == ("8192", "16")
    args = container(decode)["args"]
    assert (flag(args, "--max-num-batched-tokens"), flag(args, "--max-num-seqs")) == ("512", "128")
    assert json.loads(flag(args, "--kv-transfer-config")) == {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_both",
    }
    assert (flag(args, "--kv-bandwidth-gbps"), flag(args, "--kv-latency-ms")) == ("25", "1")
    labels = decode["spec"]["template"]["metadata"]["labels"]
    assert labels["chunkpilot.io/role"] == "decode" and labels["chunkpilot.io/track"] == "stable"
    assert labels["chunkpilot.io/config-hash"] == service.spec.pool_config("decode").config_hash()
    annotation = json.loads(decode["spec"]["template"]["metadata"]["annotations"]["chunkpilot.io/config"])
    assert EngineConfig.model_validate(annotation) == service.spec.pool_config("decode")
    env = {item["name"]: item for item in container(decode)["env"]}
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}


def test_vllm_pools_get_the_nixl_side_channel_but_no_simulator_flags() -> None:
    pod = container(build_deployment(isvc("vllm"), Track.STABLE, role=PoolRole.PREFILL))
    assert "--kv-bandwidth-gbps" not in pod["args"] and "--kv-latency-ms" not in pod["args"]
    assert pod["command"] == ["vllm", "serve"]
    assert {"name": "nixl", "containerPort": 5600, "protocol": "TCP"} in pod["ports"]
    env = {item["name"]: item for item in pod["env"]}
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"]["value"] == "5600"


def test_kv_hints_render_as_given() -> None:
    service = isvc(kvTransfer={"bandwidthGBps": 12.5, "latencyMs": 0.25})
    assert kv_transfer_args(service.spec)[2:] == ["--kv-bandwidth-gbps", "12.5", "--kv-latency-ms", "0.25"]
    assert kv_transfer_config(service.spec) == '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'


def test_pool_selectors_never_overlap_a_canary_or_the_other_pool() -> None:
    service = isvc()
    stable = build_deployment(service, Track.STABLE, role="prefill")["spec"]["selector"]["matchLabels"]
    canary = build_deployment(service, Track.CANARY, role="prefill")
    assert (
        canary["metadata"]["name"]
        == pool_deployment_name("chat", "prefill", "canary")
        == "chat-prefill-canary"
    )
    assert canary["spec"]["replicas"] == service.spec.autotune.canary_replicas
    canary_labels = canary["spec"]["template"]["metadata"]["labels"]
    decode_labels = build_deployment(service, Track.STABLE, role="decode")["spec"]["template"]["metadata"][
        "labels"
    ]
    for labels in (canary_labels, decode_labels):
        assert not all(labels.get(key) == value for key, value in stable.items())


def test_router_arguments_follow_vllm_router_cli() -> None:
    assert router_args(isvc(router={"policy": "round_robin"})) == [
        "--vllm-pd-disaggregation", "--service-discovery", "--service-discovery-namespace", "llm",
        "--prefill-selector", "chunkpilot.io/service=chat", "chunkpilot.io/role=prefill",
        "--decode-selector", "chunkpilot.io/service=chat", "chunkpilot.io/role=decode",
        "--service-discovery-port", "8000", "--host", "0.0.0.0", "--port", "8000", "--policy", "round_robin",
        "--prometheus-host", "0.0.0.0", "--prometheus-port", "29000",
    ]  # fmt: skip
    # Rendered from a file without a namespace: the pod's own, through the downward API.
    assert flag(router_args(isvc(namespace=None)), "--service-discovery-namespace") == "$(POD_NAMESPACE)"


def test_children_of_a_disaggregated_service() -> None:
    children = build_children(isvc(), pod_monitor=True, pod_monitor_labels={"release": "prom"})
    assert children.deployment is None and children.pod_monitor is None
    kinds = [(m["kind"], m["metadata"]["name"]) for m in children.manifests()]
    assert kinds == [
        ("Deployment", "chat-prefill"),
        ("Deployment", "chat-decode"),
        ("ServiceAccount", "chat-router"),
        ("Role", "chat-router"),
        ("RoleBinding", "chat-router"),
        ("Deployment", "chat-router"),
        ("Service", "chat"),
        ("PodMonitor", "chat-prefill"),
        ("PodMonitor", "chat-decode"),
        ("PodMonitor", "chat-canary"),
    ]
    router = children.router[-1]
    pod = router["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "chat-router"
    (router_container,) = pod["containers"]
    assert router_container["name"] == "router" and router_container["command"] == ["vllm-router"]
    assert router_container["readinessProbe"]["httpGet"] == {"path": "/readiness", "port": "http"}
    assert router_container["livenessProbe"]["httpGet"] == {"path": "/liveness", "port": "http"}
    assert router["spec"]["selector"]["matchLabels"] == {
        "chunkpilot.io/service": "chat",
        "chunkpilot.io/component": "router",
    }
    role = children.router[1]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    binding = children.router[2]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "chat-router", "namespace": "llm"}]
    assert binding["roleRef"]["name"] == "chat-router"


def test_the_service_selects_the_router_and_never_an_engine() -> None:
    service = isvc()
    selector = build_service(service)["spec"]["selector"]
    assert selector == {"chunkpilot.io/service": "chat", "chunkpilot.io/component": "router"}
    engine_labels = build_deployment(service, Track.STABLE, role="decode")["spec"]["template"]["metadata"][
        "labels"
    ]
    assert not all(engine_labels.get(key) == value for key, value in selector.items())


def test_pool_monitors_select_their_role_and_label_targets_with_it() -> None:
    monitor = build_pod_monitor(isvc(), {"release": "prom"}, role="prefill")
    assert monitor["metadata"]["name"] == "chat-prefill"
    assert monitor["spec"]["selector"]["matchLabels"] == {
        "chunkpilot.io/service": "chat",
        "chunkpilot.io/role": "prefill",
    }
    relabelings = monitor["spec"]["podMetricsEndpoints"][0]["relabelings"]
    targets = [rule.get("targetLabel") for rule in relabelings]
    assert targets == ["namespace", "service", "track", "config_hash", "pod", "role", None]
    assert relabelings[5]["sourceLabels"] == ["__meta_kubernetes_pod_label_chunkpilot_io_role"]


def test_the_canary_monitor_selects_colocated_canary_engines_and_no_pool_or_router() -> None:
    """Beside pools, a colocated topology trial's canary engines have no role for a pool's monitor."""
    monitor = build_canary_pod_monitor(isvc(), {"release": "prom"})
    assert monitor["metadata"]["name"] == "chat-canary"
    assert monitor["metadata"]["labels"]["release"] == "prom"
    selector = monitor["spec"]["selector"]
    canary = build_deployment(isvc(), Track.CANARY, replicas=1)["spec"]["template"]["metadata"]["labels"]
    pool = build_deployment(isvc(), Track.CANARY, role="decode")["spec"]["template"]["metadata"]["labels"]
    router = build_router_deployment(isvc(), Track.CANARY)["spec"]["template"]["metadata"]["labels"]

    def selects(labels: dict[str, str]) -> bool:
        return all(labels.get(key) == value for key, value in selector["matchLabels"].items())

    assert not selects(canary)  # a colocated service's canary: its own monitor's
    engines = build_canary_colocated(
        isvc(), isvc(), EngineConfig(max_num_batched_tokens=1024, max_num_seqs=64), replicas=1, routers=1
    )[0]["spec"]["template"]["metadata"]["labels"]
    assert selects(engines) and not selects(pool) and not selects(router)
    targets = [rule.get("targetLabel") for rule in monitor["spec"]["podMetricsEndpoints"][0]["relabelings"]]
    assert "track" in targets and "config_hash" in targets


def test_a_colocated_trials_router_runs_in_regular_mode_in_front_of_the_canary_engines() -> None:
    service = isvc()
    args = router_args(service, Track.CANARY, colocated_canary_selector(service))
    assert "--vllm-pd-disaggregation" not in args and "--prefill-selector" not in args
    start = args.index("--selector") + 1
    assert args[start : start + 3] == [
        "chunkpilot.io/service=chat",
        "chunkpilot.io/track=canary",
        "chunkpilot.io/component=colocated-canary",
    ]
    engines, *objects = build_canary_colocated(
        service, service.model_copy(update={"spec": service.spec.model_copy(update={"topology": None})}),
        EngineConfig(max_num_batched_tokens=1024, max_num_seqs=64), replicas=2, routers=3,
    )  # fmt: skip
    assert engines["metadata"]["name"] == "chat-canary" and engines["spec"]["replicas"] == 2
    labels = engines["spec"]["template"]["metadata"]["labels"]
    assert "chunkpilot.io/role" not in labels
    assert all(labels.get(key) == value for key, value in colocated_canary_selector(service).items())
    router = objects[-1]
    assert router["metadata"]["name"] == "chat-router-canary" and router["spec"]["replicas"] == 3
    # The Service, which selects router pods, sends the canary router its share.
    router_labels = router["spec"]["template"]["metadata"]["labels"]
    selector = build_service(service)["spec"]["selector"]
    assert all(router_labels.get(key) == value for key, value in selector.items())


def state(desired: int, ready: int, config: EngineConfig | None = None) -> DeploymentState:
    config_hash = config.config_hash() if config else None
    return DeploymentState(
        desired=desired, replicas=desired, ready=ready, updated=desired, available=ready,
        generation=1, observed_generation=1, config=config, config_hash=config_hash,
    )  # fmt: skip


def test_status_shows_both_pools_and_ready_needs_all_three() -> None:
    service = isvc()
    prefill, decode = service.spec.pool_config("prefill"), service.spec.pool_config("decode")
    topology = TopologyObservation(
        prefill=state(1, 1, prefill), decode=state(3, 2, decode), router=state(1, 1)
    )
    status = compute_status(None, Observation(generation=1, stable=None, topology=topology), T0)
    ready = next(c for c in status.conditions if c.type == ConditionType.READY)
    assert (ready.status, ready.reason) == ("False", "ReplicasNotReady")
    assert ready.message == "prefill 1/1, decode 2/3, router 1/1 ready"
    assert status.topology is not None and status.topology.decode is not None
    assert (status.topology.decode.desired_replicas, status.topology.decode.ready_replicas) == (3, 2)
    assert status.topology.decode.config == decode and status.topology.prefill is not None
    assert status.topology.prefill.config_hash == prefill.config_hash()
    assert (status.replicas, status.ready_replicas, status.applied_config) == (4, 3, None)

    topology = TopologyObservation(
        prefill=state(1, 1, prefill), decode=state(3, 3, decode), router=state(1, 1)
    )
    status = compute_status(status, Observation(generation=1, stable=None, topology=topology), T0)
    ready = next(c for c in status.conditions if c.type == ConditionType.READY)
    assert (ready.status, ready.reason) == ("True", "Available")
    progressing = next(c for c in status.conditions if c.type == ConditionType.PROGRESSING)
    assert progressing.reason == "RolloutComplete" and prefill.config_hash() in progressing.message


def test_a_missing_router_is_being_created() -> None:
    topology = TopologyObservation(prefill=state(1, 1), decode=state(1, 1), router=None)
    status = compute_status(None, Observation(generation=1, stable=None, topology=topology), T0)
    ready = next(c for c in status.conditions if c.type == ConditionType.READY)
    assert (ready.reason, ready.message) == ("Creating", "creating the router Deployments")


@pytest.mark.parametrize("role", list(PoolRole))
def test_an_unsupported_pool_knob_is_a_render_error(role: PoolRole) -> None:
    from chunkpilot.operator.builders import RenderError

    # The upstream image has no scheduler plugin to enforce the limit on a V1 release.
    pool = {"replicas": 1, "maxNumPartialPrefills": 2}
    service = isvc("vllm", image="vllm/vllm-openai:v0.33.0", **{role.value: pool})
    with pytest.raises(RenderError, match="maxNumPartialPrefills"):
        build_deployment(service, Track.STABLE, role=role)


@pytest.mark.parametrize(("value", "served"), [("", True), ("on", True), ("off", False), ("false", False)])
def test_the_installation_switch_for_disaggregation(value: str, served: bool) -> None:
    from chunkpilot.operator.config import ENV_DISAGGREGATION, OperatorConfig

    assert OperatorConfig.from_env({ENV_DISAGGREGATION: value}).disaggregation is served


def test_disabled_disaggregation_fails_the_service_until_it_is_enabled() -> None:
    from chunkpilot.operator.config import DISAGGREGATION_DISABLED_MESSAGE, REASON_DISAGGREGATION_DISABLED
    from chunkpilot.operator.status import InstallationProblem

    problem = InstallationProblem(REASON_DISAGGREGATION_DISABLED, DISAGGREGATION_DISABLED_MESSAGE)
    topology = TopologyObservation(prefill=None, decode=None, router=None)
    status = compute_status(
        None, Observation(generation=1, stable=None, problem=problem, topology=topology), T0
    )
    ready = next(c for c in status.conditions if c.type == ConditionType.READY)
    assert (ready.status, ready.reason) == ("False", "DisaggregationDisabled")
    assert "disaggregation.enabled=true" in ready.message and status.phase == "Failed"


@pytest.mark.parametrize("policy", [policy.value for policy in RouterPolicy])
def test_router_arguments_pass_vllm_routers_own_parser(policy: str) -> None:
    """The rendered vector through vllm-router's argument parser (the pinned wheel's RouterArgs)."""
    import argparse

    from vllm_router.router_args import RouterArgs

    parser = argparse.ArgumentParser()
    RouterArgs.add_cli_args(parser)
    parsed = RouterArgs.from_cli_args(parser.parse_args(router_args(isvc(router={"policy": policy}))))
    parsed._validate_router_args()
    assert parsed.vllm_pd_disaggregation and parsed.service_discovery
    assert parsed.service_discovery_namespace == "llm"
    assert parsed.prefill_selector == {"chunkpilot.io/service": "chat", "chunkpilot.io/role": "prefill"}
    assert parsed.decode_selector == {"chunkpilot.io/service": "chat", "chunkpilot.io/role": "decode"}
    assert (parsed.service_discovery_port, parsed.host, parsed.port) == (8000, "0.0.0.0", 8000)
    assert (parsed.policy, parsed.kv_connector) == (policy, "nixl")
