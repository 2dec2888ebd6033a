"""Pure builders for the router of a disaggregated service: vllm-router and its RBAC.

The router (``vllm-router --vllm-pd-disaggregation``) finds the engine pods itself through
Kubernetes service discovery: it watches the pods of its namespace that match the prefill
and decode selectors (the service label plus ``chunkpilot.io/role``), sends each request to a
prefill engine first and then, with the KV-transfer parameters the prefill returned, to a
decode engine. Its ServiceAccount may read pods in the namespace and nothing else. The
service's Service selects the router pods, never the engines.
"""

from __future__ import annotations

from typing import Any, Final

from chunkpilot.engine.podsecurity import container_security_context, pod_security_context
from chunkpilot.operator.engines import ENGINE_PORT, ENGINE_PORT_NAME
from chunkpilot.operator.engines.sim import default_sim_image
from chunkpilot.operator.meta import LABEL_MANAGED_BY, MANAGED_BY, object_metadata, service_name

from chunkpilot.api import (
    LABEL_COMPONENT,
    LABEL_ROLE,
    LABEL_SERVICE,
    LABEL_TRACK,
    InferenceService,
    PoolRole,
    Track,
)

ROUTER_CONTAINER: Final = "router"
ROUTER_COMMAND: Final = ("vllm-router",)
#: ``chunkpilot.io/component`` of the router pods.
COMPONENT_ROUTER: Final = "router"
#: ``chunkpilot.io/component`` of a colocated topology trial's canary engines (behind its router).
COMPONENT_COLOCATED_CANARY: Final = "colocated-canary"
#: The router serves the OpenAI API on the engines' port, so the Service is the same in both topologies.
ROUTER_PORT: Final = ENGINE_PORT
ROUTER_PORT_NAME: Final = ENGINE_PORT_NAME
ROUTER_METRICS_PORT: Final = 29000
ROUTER_METRICS_PORT_NAME: Final = "metrics"
#: The recommended label that tells an engine pod (``engine``) from a router pod (``router``).
ENGINE_COMPONENT_LABEL: Final = "app.kubernetes.io/component"
READINESS_PATH: Final = "/readiness"
LIVENESS_PATH: Final = "/liveness"
#: Set from the pod's namespace; the router's discovery namespace when the service has none.
NAMESPACE_ENV: Final = "POD_NAMESPACE"
ROUTER_RESOURCES: Final = {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}}
#: What the router's Role allows: reading the pods it routes to.
ROUTER_RULES: Final = ({"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},)


def router_name(service: str, track: Track | None = None) -> str:
    """``<service>-router``: the router's Deployment, ServiceAccount, Role and RoleBinding.

    ``<service>-router-canary`` for the canary router of a topology trial.
    """
    return f"{service}-router" if track in (None, Track.STABLE) else f"{service}-router-{Track(track).value}"


def default_router_image() -> str:
    """The Chunkpilot image of this version (it ships the vllm-router binary)."""
    return default_sim_image()


def _track_label(track: Track | None) -> dict[str, str]:
    return {} if track in (None, Track.STABLE) else {LABEL_TRACK: Track(track).value}


def router_selector(isvc: InferenceService, track: Track | None = None) -> dict[str, str]:
    """The labels selecting the router pods (the Deployment's selector and the Service's).

    A canary router's carry ``chunkpilot.io/track: canary`` too (the Service, selecting on the
    service label alone, still sends it its share).
    """
    return {LABEL_SERVICE: service_name(isvc), LABEL_COMPONENT: COMPONENT_ROUTER, **_track_label(track)}


def router_deployment_selector(isvc: InferenceService, track: Track | None = None) -> dict[str, Any]:
    """The router Deployment's selector: :func:`router_selector`, the stable one matching no tracked pod.

    A topology trial's canary router's pods carry ``chunkpilot.io/track: canary``; the stable
    router must not count them as its own.
    """
    selector: dict[str, Any] = {"matchLabels": router_selector(isvc, track)}
    if track in (None, Track.STABLE):
        selector["matchExpressions"] = [{"key": LABEL_TRACK, "operator": "DoesNotExist"}]
    return selector


def router_labels(isvc: InferenceService, track: Track | None = None) -> dict[str, str]:
    """Labels of the router's objects and pods."""
    name = service_name(isvc)
    return {
        "app.kubernetes.io/name": "chunkpilot-router",
        "app.kubernetes.io/instance": name,
        ENGINE_COMPONENT_LABEL: COMPONENT_ROUTER,
        LABEL_MANAGED_BY: MANAGED_BY,
        **router_selector(isvc, track),
    }


def pool_selector(isvc: InferenceService, role: PoolRole | str, track: Track | None = None) -> dict[str, str]:
    """The labels the router discovers the engine pods of ``role`` by (and of a canary topology's track)."""
    return {LABEL_SERVICE: service_name(isvc), LABEL_ROLE: PoolRole(role).value, **_track_label(track)}


def _selector_args(selector: dict[str, str]) -> list[str]:
    return [f"{key}={value}" for key, value in selector.items()]


def colocated_canary_selector(isvc: InferenceService) -> dict[str, str]:
    """The labels of the colocated canary engine pods a colocated topology trial runs beside pools
    (its canary router sends to them, its PodMonitor and NetworkPolicy select them)."""
    return {
        LABEL_SERVICE: service_name(isvc),
        LABEL_TRACK: Track.CANARY.value,
        LABEL_COMPONENT: COMPONENT_COLOCATED_CANARY,
    }


def router_args(
    isvc: InferenceService, track: Track | None = None, workers: dict[str, str] | None = None
) -> list[str]:
    """The ``vllm-router`` argument vector: PD mode, pod discovery by role, the engines' port.

    With ``workers``: its regular mode, in front of the colocated engine pods those labels select
    (the canary router of a colocated topology trial).
    """
    namespace = isvc.metadata.namespace or f"$({NAMESPACE_ENV})"
    router = isvc.spec.router
    if workers is None:
        discovery = [
            "--prefill-selector",
            *_selector_args(pool_selector(isvc, PoolRole.PREFILL, track)),
            "--decode-selector",
            *_selector_args(pool_selector(isvc, PoolRole.DECODE, track)),
        ]
    else:
        discovery = ["--selector", *_selector_args(workers)]
    return [
        *(["--vllm-pd-disaggregation"] if workers is None else []),
        "--service-discovery",
        "--service-discovery-namespace",
        namespace,
        *discovery,
        "--service-discovery-port",
        str(ENGINE_PORT),
        "--host",
        "0.0.0.0",
        "--port",
        str(ROUTER_PORT),
        "--policy",
        router.policy.value,
        "--prometheus-host",
        "0.0.0.0",
        "--prometheus-port",
        str(ROUTER_METRICS_PORT),
    ]


def canary_router_replicas(isvc: InferenceService) -> int:
    """A canary router's replicas: one per GPU replica of its pools (prefill plus decode).

    The service's Service spreads its traffic evenly over its endpoints, the canary router's pods
    among the stable replicas; with one pod per pool replica the canary topology gets the share of
    the live traffic its replicas would carry as stable replicas, the load it would carry promoted.
    """
    return sum(isvc.spec.pool(role).replicas for role in PoolRole)


def _probe(path: str, period_s: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": ROUTER_PORT_NAME},
        "timeoutSeconds": 5,
        "periodSeconds": period_s,
        "failureThreshold": failures,
    }


def build_router_deployment(
    isvc: InferenceService,
    track: Track | None = None,
    *,
    workers: dict[str, str] | None = None,
    replicas: int | None = None,
) -> dict[str, Any]:
    """The router Deployment in front of the prefill and decode pools (of ``track``'s pools), or
    (``workers``) in front of the colocated engine pods those labels select; ``replicas`` overrides
    a canary router's (:func:`canary_router_replicas`)."""
    name = router_name(service_name(isvc), track)
    labels = router_labels(isvc, track)
    router = isvc.spec.router
    container: dict[str, Any] = {
        "name": ROUTER_CONTAINER,
        "image": router.image or default_router_image(),
        "imagePullPolicy": "IfNotPresent",
        "command": list(ROUTER_COMMAND),
        "args": router_args(isvc, track, workers),
        "env": [{"name": NAMESPACE_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}],
        "ports": [
            {"name": ROUTER_PORT_NAME, "containerPort": ROUTER_PORT, "protocol": "TCP"},
            {"name": ROUTER_METRICS_PORT_NAME, "containerPort": ROUTER_METRICS_PORT, "protocol": "TCP"},
        ],
        "resources": {kind: dict(values) for kind, values in ROUTER_RESOURCES.items()},
        "readinessProbe": _probe(READINESS_PATH, 5, 3),
        "livenessProbe": _probe(LIVENESS_PATH, 10, 6),
        "securityContext": container_security_context(),
    }
    return {
        **_router_object(isvc, track, "apps/v1", "Deployment"),
        "spec": {
            "replicas": (
                router.replicas
                if track in (None, Track.STABLE)
                else replicas
                if replicas is not None
                else canary_router_replicas(isvc)
            ),
            "revisionHistoryLimit": 3,
            "selector": router_deployment_selector(isvc, track),
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": name,  # its token lists the pools' pods
                    "enableServiceLinks": False,
                    "securityContext": pod_security_context(),
                    "terminationGracePeriodSeconds": 30,
                    "containers": [container],
                },
            },
        },
    }


def _router_object(
    isvc: InferenceService, track: Track | None, api_version: str, kind: str
) -> dict[str, Any]:
    """``apiVersion``, ``kind`` and metadata of one of the router's objects (all share its name)."""
    name = router_name(service_name(isvc), track)
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": object_metadata(isvc, name, router_labels(isvc, track)),
    }


def build_router_service_account(isvc: InferenceService, track: Track | None = None) -> dict[str, Any]:
    """The router's ServiceAccount."""
    return _router_object(isvc, track, "v1", "ServiceAccount")


def build_router_role(isvc: InferenceService, track: Track | None = None) -> dict[str, Any]:
    """The router's Role: read the pods of the namespace (its service discovery)."""
    return {
        **_router_object(isvc, track, "rbac.authorization.k8s.io/v1", "Role"),
        "rules": [dict(rule) for rule in ROUTER_RULES],
    }


def build_router_role_binding(isvc: InferenceService, track: Track | None = None) -> dict[str, Any]:
    """Binds the router's Role to its ServiceAccount."""
    name = router_name(service_name(isvc), track)
    subject: dict[str, Any] = {"kind": "ServiceAccount", "name": name}
    if isvc.metadata.namespace:
        subject["namespace"] = isvc.metadata.namespace
    return {
        **_router_object(isvc, track, "rbac.authorization.k8s.io/v1", "RoleBinding"),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [subject],
    }


def build_router_objects(
    isvc: InferenceService,
    track: Track | None = None,
    *,
    workers: dict[str, str] | None = None,
    replicas: int | None = None,
) -> tuple[dict[str, Any], ...]:
    """ServiceAccount, Role, RoleBinding and Deployment of the router, in the order they are applied.

    With ``track`` canary: the canary router of a topology trial, in front of the canary pools only
    (``workers``: of the canary engines of a colocated topology trial; see
    :func:`build_router_deployment`).
    """
    return (
        build_router_service_account(isvc, track),
        build_router_role(isvc, track),
        build_router_role_binding(isvc, track),
        build_router_deployment(isvc, track, workers=workers, replicas=replicas),
    )


__all__ = [
    "COMPONENT_COLOCATED_CANARY",
    "COMPONENT_ROUTER",
    "ENGINE_COMPONENT_LABEL",
    "LIVENESS_PATH",
    "READINESS_PATH",
    "ROUTER_COMMAND",
    "ROUTER_CONTAINER",
    "ROUTER_METRICS_PORT",
    "ROUTER_PORT",
    "build_router_deployment",
    "build_router_objects",
    "build_router_role",
    "build_router_role_binding",
    "build_router_service_account",
    "canary_router_replicas",
    "colocated_canary_selector",
    "default_router_image",
    "pool_selector",
    "router_args",
    "router_deployment_selector",
    "router_labels",
    "router_name",
    "router_selector",
]
