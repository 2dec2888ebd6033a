"""The NetworkPolicies of a service that asks for them (``spec.networkPolicy.enabled``).

Who may connect to what:

- the **front** (the engines of a colocated service; the router of a disaggregated one): the
  declared clients (default: the service's namespace), on the HTTP port;
- **every pod** of the service: the operator's namespace (the tuner's live-adjustment calls) and
  Prometheus's namespace (the scrapes), as the installation names them (:class:`NetworkPeers`), on
  the HTTP port (and the router's metrics port); and the service's own pods on any port (the
  router's calls to the pools; the KV transfer between prefill and decode, whose data ports the
  transport picks at run time).

So a disaggregated service's engines (its pools, and a colocated topology trial's canary engines
beside them) take requests from their own routers only: no client can hand a decode engine
KV-transfer parameters that name a host of its choosing. Egress is left to the namespace. The
policies are ``<service>`` (the front) and, for a disaggregated service, ``<service>-pools`` and
``<service>-canary`` (those canary engines: a policy of their own, so that no colocated engine is
restricted while the Service still reaches it during a switch of topology).
"""

from __future__ import annotations

from typing import Any

from chunkpilot.operator.config import NetworkPeers
from chunkpilot.operator.engines import ENGINE_PORT
from chunkpilot.operator.meta import LABEL_MANAGED_BY, MANAGED_BY, object_metadata, service_name
from chunkpilot.operator.router import COMPONENT_ROUTER, ROUTER_METRICS_PORT, colocated_canary_selector

from chunkpilot.api import LABEL_COMPONENT, LABEL_ROLE, LABEL_SERVICE, InferenceService

#: The label every namespace carries with its own name (Kubernetes 1.22 and later).
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


def network_policy_names(isvc: InferenceService) -> tuple[str, str, str]:
    """The front policy's name (the service's), the pools' (``<service>-pools``) and that of a colocated
    topology trial's canary engines beside them (``<service>-canary``)."""
    name = service_name(isvc)
    return name, f"{name}-pools", f"{name}-canary"


def wants_network_policy(isvc: InferenceService) -> bool:
    policy = isvc.spec.network_policy
    return policy is not None and policy.enabled


def _installation(peers: NetworkPeers) -> list[dict[str, Any]]:
    """The operator's and Prometheus's namespaces, where the installation names them."""
    found: list[dict[str, Any]] = []
    if peers.operator_namespace:
        operator = {NAMESPACE_NAME_LABEL: peers.operator_namespace}
        found.append({"namespaceSelector": {"matchLabels": operator}})
    if peers.prometheus_namespace_labels:
        found.append({"namespaceSelector": {"matchLabels": dict(peers.prometheus_namespace_labels)}})
    return found


def _policy(
    isvc: InferenceService, name: str, selector: dict[str, Any], ingress: list[Any]
) -> dict[str, Any]:
    labels = {LABEL_SERVICE: service_name(isvc), LABEL_MANAGED_BY: MANAGED_BY}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": object_metadata(isvc, name, labels),
        "spec": {"podSelector": selector, "policyTypes": ["Ingress"], "ingress": ingress},
    }


def build_network_policies(isvc: InferenceService, peers: NetworkPeers) -> list[dict[str, Any]]:
    """The NetworkPolicy manifests of ``isvc``: the front's, and the pools' when it is disaggregated."""
    service = service_name(isvc)
    own_pods = {"from": [{"podSelector": {"matchLabels": {LABEL_SERVICE: service}}}]}
    policy = isvc.spec.network_policy
    clients = [c.to_k8s() for c in policy.clients] if policy is not None and policy.clients else []
    callers = (clients or [{"podSelector": {}}]) + _installation(peers)
    front_name, pools_name, canary_name = network_policy_names(isvc)
    http = {"port": ENGINE_PORT, "protocol": "TCP"}
    if not isvc.spec.disaggregated:
        selector = {"matchLabels": {LABEL_SERVICE: service}}
        return [_policy(isvc, front_name, selector, [{"from": callers, "ports": [http]}, own_pods])]
    router = {"matchLabels": {LABEL_SERVICE: service, LABEL_COMPONENT: COMPONENT_ROUTER}}
    metrics = {"port": ROUTER_METRICS_PORT, "protocol": "TCP"}
    front = [{"from": callers, "ports": [http, metrics]}, own_pods]
    pools = {
        "matchLabels": {LABEL_SERVICE: service},
        "matchExpressions": [{"key": LABEL_ROLE, "operator": "Exists"}],
    }
    canary = {"matchLabels": colocated_canary_selector(isvc)}
    installation = _installation(peers)
    pool_ingress = ([{"from": installation, "ports": [http]}] if installation else []) + [own_pods]
    return [
        _policy(isvc, front_name, router, front),
        _policy(isvc, pools_name, pools, pool_ingress),
        _policy(isvc, canary_name, canary, pool_ingress),
    ]


__all__ = [
    "NAMESPACE_NAME_LABEL",
    "build_network_policies",
    "network_policy_names",
    "wants_network_policy",
]
