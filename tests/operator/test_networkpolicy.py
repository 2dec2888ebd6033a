"""The NetworkPolicy a service asks for: who reaches its pods, on which ports."""

from __future__ import annotations

from pathlib import Path

import yaml
from chunkpilot.operator.config import NetworkPeers, OperatorConfig
from chunkpilot.operator.networkpolicy import build_network_policies, wants_network_policy

from chunkpilot.api import InferenceService

REPO = Path(__file__).resolve().parents[2]


def service(example: str, **policy: object) -> InferenceService:
    manifest = yaml.safe_load((REPO / "examples" / example).read_text())
    if policy:
        manifest["spec"]["networkPolicy"] = policy
    return InferenceService.from_manifest(manifest)


def test_only_a_service_that_asks_gets_one() -> None:
    assert not wants_network_policy(service("chat-llama-8b-sim.yaml"))
    assert not wants_network_policy(service("chat-llama-8b-sim.yaml", enabled=False))
    assert wants_network_policy(service("chat-llama-8b-sim.yaml", enabled=True))


PEERS = NetworkPeers(operator_namespace="chunkpilot-system", prometheus_namespace_labels={"team": "obs"})
OPERATOR = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "chunkpilot-system"}}}
PROMETHEUS = {"namespaceSelector": {"matchLabels": {"team": "obs"}}}


def test_without_clients_the_namespace_calls_and_the_installation_is_admitted() -> None:
    isvc = service("chat-llama-8b-sim.yaml", enabled=True)
    (policy,) = build_network_policies(isvc, PEERS)
    name = isvc.metadata.name
    assert policy["metadata"]["name"] == name
    assert policy["spec"]["podSelector"] == {"matchLabels": {"chunkpilot.io/service": name}}
    callers, own = policy["spec"]["ingress"]
    assert callers["from"] == [{"podSelector": {}}, OPERATOR, PROMETHEUS]
    assert callers["ports"] == [{"port": 8000, "protocol": "TCP"}]
    # The service's own pods reach each other on any port (no "ports": all of them).
    assert own == {"from": [{"podSelector": {"matchLabels": {"chunkpilot.io/service": name}}}]}


def test_a_disaggregated_services_clients_reach_its_router_and_its_pools_only_its_own_pods() -> None:
    clients = [{"podSelector": {"matchLabels": {"app": "web"}}}]
    isvc = service("disaggregated-sim.yaml", enabled=True, clients=clients)
    name = isvc.metadata.name
    own = {"from": [{"podSelector": {"matchLabels": {"chunkpilot.io/service": name}}}]}
    front, pools, canary = build_network_policies(isvc, PEERS)
    assert front["metadata"]["name"] == name and pools["metadata"]["name"] == f"{name}-pools"
    assert front["spec"]["podSelector"]["matchLabels"] == {
        "chunkpilot.io/service": name,
        "chunkpilot.io/component": "router",
    }
    callers, front_own = front["spec"]["ingress"]
    assert callers["from"] == [*clients, OPERATOR, PROMETHEUS]
    assert [p["port"] for p in callers["ports"]] == [8000, 29000]
    assert front_own == own
    assert pools["spec"]["podSelector"]["matchExpressions"] == [
        {"key": "chunkpilot.io/role", "operator": "Exists"}
    ]
    # A colocated topology trial's canary engines beside the pools: their own router's only. Not
    # every engine: a colocated service switching to pools keeps its clients until the pools serve.
    assert canary["metadata"]["name"] == f"{name}-canary"
    assert canary["spec"]["podSelector"] == {
        "matchLabels": {
            "chunkpilot.io/service": name,
            "chunkpilot.io/track": "canary",
            "chunkpilot.io/component": "colocated-canary",
        }
    }
    assert canary["spec"]["ingress"] == pools["spec"]["ingress"]
    installation, pools_own = pools["spec"]["ingress"]
    assert installation == {"from": [OPERATOR, PROMETHEUS], "ports": [{"port": 8000, "protocol": "TCP"}]}
    assert pools_own == own  # no client: KV-transfer parameters come from the service's own router
    assert build_network_policies(isvc, NetworkPeers())[1]["spec"]["ingress"] == [own]


def test_the_installation_names_its_peers_in_the_environment() -> None:
    config = OperatorConfig.from_env(
        {
            "CHUNKPILOT_OPERATOR_NAMESPACE": "ops",
            "CHUNKPILOT_PROMETHEUS_NAMESPACE_LABELS": "kubernetes.io/metadata.name=monitoring",
        }
    )
    assert config.network_peers == NetworkPeers("ops", {"kubernetes.io/metadata.name": "monitoring"})
    assert OperatorConfig.from_env({}).network_peers == NetworkPeers()
