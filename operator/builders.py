"""Pure builders: an InferenceService in, the desired child manifests out.

Nothing here talks to the cluster. The operator applies these manifests (and
adopts them); ``chunkpilot render`` prints them; the tuner builds its canary
Deployments with :func:`build_deployment`.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from chunkpilot.engine.live_adjust import LIVE_ADJUST_TOKEN_ENV
from chunkpilot.engine.podsecurity import (
    container_security_context,
    home_env,
    home_volume,
    pod_security_context,
)
from chunkpilot.operator.apicalls import LIVE_ADJUST_SECRET_NAME
from chunkpilot.operator.config import NetworkPeers
from chunkpilot.operator.engines import (
    ENGINE_PORT,
    ENGINE_PORT_NAME,
    EngineRender,
    RenderProblem,
    metrics_path,
    render_engine,
)
from chunkpilot.operator.engines.kvtransfer import with_kv_transfer
from chunkpilot.operator.meta import LABEL_MANAGED_BY as LABEL_MANAGED_BY
from chunkpilot.operator.meta import MANAGED_BY as MANAGED_BY
from chunkpilot.operator.meta import object_metadata, service_name
from chunkpilot.operator.networkpolicy import build_network_policies, wants_network_policy
from chunkpilot.operator.router import (
    ENGINE_COMPONENT_LABEL,
    build_router_objects,
    colocated_canary_selector,
    router_selector,
)

from chunkpilot.api import (
    LABEL_CONFIG_HASH,
    LABEL_ROLE,
    LABEL_SERVICE,
    LABEL_TRACK,
    EngineConfig,
    InferenceService,
    PoolRole,
    TopologyMode,
    TopologySpec,
    Track,
)

ANNOTATION_ENGINE: Final = "chunkpilot.io/engine"
ANNOTATION_CONFIG: Final = "chunkpilot.io/config"
#: Limits set at run time on the pods of a Deployment (the tuner's live adjustment of a canary):
#: JSON ``{"configHash": ..., "max_num_batched_tokens": ..., "max_num_seqs": ..., ...}``. It holds
#: only while the Deployment's config hash label equals ``configHash`` (a new rollout starts afresh).
ANNOTATION_LIVE_LIMITS: Final = "chunkpilot.io/live-limits"
#: The de-facto annotation of the metrics path for scrapers without a PodMonitor (the local runtime's
#: file_sd among them); set only on pods whose engine does not serve ``/metrics``, its default.
ANNOTATION_METRICS_PATH: Final = "prometheus.io/path"
#: On an InferenceService: set it to a new value (a date, say) to rotate its live-adjustment tokens.
#: (Outside ``chunkpilot.io/``, whose annotations Kopf keeps out of the diffs update handlers see.)
#: Its value is copied onto the engine pods' template (so they restart and read the new tokens) and
#: recorded on the namespace's Secret per service (so the tokens are replaced once per value).
ANNOTATION_ROTATE_TOKENS: Final = "live-adjust.chunkpilot.io/rotate-tokens"
#: The prefix of the Secret's annotations recording, per service, the rotation its tokens come from.
ROTATED_PREFIX: Final = "rotated.chunkpilot.io"
ENGINE_CONTAINER: Final = "engine"
HEALTH_PATH: Final = "/health"
METRICS_PATH: Final = "/metrics"
POD_MONITOR_API_VERSION: Final = "monitoring.coreos.com/v1"
#: Extra time a rollout may take beyond the engine's startup allowance before it counts as stuck.
ROLLOUT_DEADLINE_MARGIN_S: Final = 300
#: Key of the live-adjustment bearer token in the ``<service>-live-adjust`` Secret.
#: The Secret of each namespace holding the live-adjustment tokens of its services' tracks (its name
#: is what the installation's grant on Secrets is limited to).
LIVE_ADJUST_SECRET: Final = LIVE_ADJUST_SECRET_NAME
#: Volume holding the live-adjustment control file (an emptyDir per pod).
CONTROL_VOLUME: Final = "chunkpilot-run"
#: Volume holding an engine's options file, written by its command (an emptyDir per pod).
CONFIG_VOLUME: Final = "chunkpilot-config"
#: Volume holding the engine's prometheus_client multiprocess files (an emptyDir per pod).
METRICS_VOLUME: Final = "chunkpilot-metrics"
#: The engine port's name on a topology trial's canary pools. The service's Service targets the
#: port named ``http``, so a colocated service's Service, selecting on the service label, finds no
#: port on them: they are reached through their canary router only. The router discovers them by
#: labels and the port number; the PodMonitor of a service allowed to change topology scrapes it.
CANARY_POOL_PORT_NAME: Final = "pd-http"


class RenderError(ValueError):
    """The spec asks for something the engine version cannot do; ``problem`` says what."""

    def __init__(self, problem: RenderProblem) -> None:
        super().__init__(problem.message)
        self.problem = problem


def deployment_name(service: str, track: Track | str) -> str:
    """``<service>-stable`` or ``<service>-canary``."""
    return f"{service}-{Track(track).value}"


def pool_deployment_name(service: str, role: PoolRole | str, track: Track | str = Track.STABLE) -> str:
    """A disaggregated pool's Deployment: ``<service>-prefill`` (stable) or ``<service>-prefill-canary``."""
    name = f"{service}-{PoolRole(role).value}"
    return name if Track(track) == Track.STABLE else f"{name}-{Track(track).value}"


def service_labels(isvc: InferenceService) -> dict[str, str]:
    """Labels every child of ``isvc`` carries; the Service selects on these alone."""
    name = _name(isvc)
    return {
        "app.kubernetes.io/name": "chunkpilot-engine",
        "app.kubernetes.io/instance": name,
        ENGINE_COMPONENT_LABEL: "engine",
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_SERVICE: name,
    }


def selector_labels(
    isvc: InferenceService, track: Track | str, role: PoolRole | str | None = None
) -> dict[str, str]:
    """The immutable Deployment selector: service and track (and a pool's role), never the config hash."""
    labels = {LABEL_SERVICE: _name(isvc), LABEL_TRACK: Track(track).value}
    if role is not None:
        labels[LABEL_ROLE] = PoolRole(role).value
    return labels


def effective_config(
    isvc: InferenceService, config: EngineConfig | None = None, role: PoolRole | str | None = None
) -> EngineConfig:
    """The knobs a Deployment runs with: ``config`` if given, else those in the spec (of the pool)."""
    if config is not None:
        return config
    if role is not None:
        return isvc.spec.pool_config(role)
    return EngineConfig.from_engine(isvc.spec.engine)


def render_for(
    isvc: InferenceService, config: EngineConfig | None = None, role: PoolRole | str | None = None
) -> EngineRender:
    """Render the engine container for ``isvc`` with ``config`` applied; raise :class:`RenderError`.

    With ``role``, the engine of that pool of a disaggregated service: the pool's knobs (unless
    ``config`` is given) and the KV transfer.
    """
    spec = isvc.spec
    if role is not None:
        config = effective_config(isvc, config, role)
    if config is not None:
        spec = spec.model_copy(update={"engine": config.apply_to(spec.engine)})
    result = render_engine(spec)
    if not isinstance(result, EngineRender):
        raise RenderError(result)
    return with_kv_transfer(spec, result) if role is not None else result


def build_deployment(
    isvc: InferenceService,
    track: Track | str,
    config: EngineConfig | None = None,
    replicas: int | None = None,
    role: PoolRole | str | None = None,
    port_name: str = ENGINE_PORT_NAME,
) -> dict[str, Any]:
    """The Deployment running ``isvc``'s engine on ``track`` with ``config`` (default: the spec's knobs).

    ``replicas`` defaults to the replicas the service runs on the stable track
    (:meth:`~chunkpilot.api.InferenceService.running_replicas`: ``spec.replicas``, or the planner's
    decision in ``scaling.mode: Auto``) and to
    ``spec.autotune.canaryReplicas`` on the canary track. With ``role``, the Deployment of
    that pool of a disaggregated service (``<service>-<role>``, the pool's knobs and replicas,
    pods labelled ``chunkpilot.io/role``). Raises :class:`RenderError` when the engine
    version cannot honour a knob.
    """
    track = Track(track)
    role = PoolRole(role) if role is not None else None
    knobs = effective_config(isvc, config, role)
    render = render_for(isvc, knobs if role is not None else config, role)
    config_hash = knobs.config_hash()
    if replicas is None:
        stable = isvc.running_replicas() if role is None else isvc.running_pool_replicas(role)
        replicas = stable if track == Track.STABLE else isvc.spec.autotune.canary_replicas
    labels = {**service_labels(isvc), LABEL_TRACK: track.value, LABEL_CONFIG_HASH: config_hash}
    if role is not None:
        labels[LABEL_ROLE] = role.value
    name = (
        deployment_name(_name(isvc), track)
        if role is None
        else pool_deployment_name(_name(isvc), role, track)
    )
    annotations = {
        ANNOTATION_ENGINE: f"{render.engine} {render.version}",
        ANNOTATION_CONFIG: json.dumps(knobs.to_k8s(), sort_keys=True, separators=(",", ":")),
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(isvc, name, labels, annotations),
        "spec": {
            "replicas": replicas,
            "revisionHistoryLimit": 3,
            "progressDeadlineSeconds": render.probes.startup_budget_s + ROLLOUT_DEADLINE_MARGIN_S,
            "selector": {"matchLabels": selector_labels(isvc, track, role)},
            # Never drop below the serving capacity during a rollout: surge one pod at a time.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {
                        **annotations,
                        **_metrics_path(render),
                        **_token_generation(isvc, render),
                    },
                },
                "spec": _pod_spec(isvc, render, port_name, track),
            },
        },
    }


def token_rotation(isvc: InferenceService) -> str:
    """The service's requested token rotation (:data:`ANNOTATION_ROTATE_TOKENS`; empty: none yet)."""
    return isvc.metadata.annotations.get(ANNOTATION_ROTATE_TOKENS, "")


def _token_generation(isvc: InferenceService, render: EngineRender) -> dict[str, str]:
    """The pod annotation that restarts live-adjusted engines when their tokens are rotated."""
    rotation = token_rotation(isvc)
    return {ANNOTATION_ROTATE_TOKENS: rotation} if render.live_adjust and rotation else {}


def _metrics_path(render: EngineRender) -> dict[str, str]:
    """The pod annotation naming the engine's metrics path, when it is not ``/metrics``."""
    return {} if render.metrics_path == METRICS_PATH else {ANNOTATION_METRICS_PATH: render.metrics_path}


def _pod_spec(
    isvc: InferenceService,
    render: EngineRender,
    port_name: str = ENGINE_PORT_NAME,
    track: Track = Track.STABLE,
) -> dict[str, Any]:
    resources = isvc.spec.resources
    probe = {"httpGet": {"path": HEALTH_PATH, "port": port_name}, "timeoutSeconds": 5}
    timing = render.probes
    container: dict[str, Any] = {
        "name": ENGINE_CONTAINER,
        "image": render.image,
        "imagePullPolicy": "IfNotPresent",
        "command": list(render.command),
        "args": list(render.args),
        "ports": [
            {"name": port_name, "containerPort": ENGINE_PORT, "protocol": "TCP"},
            *(dict(port) for port in render.extra_ports),
        ],
        "resources": {kind: dict(values) for kind, values in render.resources.items()},
        "startupProbe": {
            **probe,
            "periodSeconds": timing.startup_period_s,
            "failureThreshold": timing.startup_failure_threshold,
        },
        "readinessProbe": {**probe, "periodSeconds": timing.readiness_period_s, "failureThreshold": 3},
        "livenessProbe": {
            **probe,
            "periodSeconds": timing.liveness_period_s,
            "failureThreshold": timing.liveness_failure_threshold,
        },
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
        "securityContext": container_security_context(isvc.spec.engine.run_as_user),
    }
    home, home_mount = home_volume()
    container["volumeMounts"].append(home_mount)
    env = [*home_env(), *(dict(item) for item in render.env)]
    if render.live_adjust:
        secret_ref = {"name": LIVE_ADJUST_SECRET, "key": live_adjust_token_key(_name(isvc), track)}
        env.append({"name": LIVE_ADJUST_TOKEN_ENV, "valueFrom": {"secretKeyRef": secret_ref}})
    if env:
        container["env"] = env
    volumes: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": render.shm_size}},
        home,
    ]
    if render.control_dir is not None:
        container["volumeMounts"].append({"name": CONTROL_VOLUME, "mountPath": render.control_dir})
        volumes.append({"name": CONTROL_VOLUME, "emptyDir": {"sizeLimit": "1Mi"}})
    if render.config_dir is not None:
        container["volumeMounts"].append({"name": CONFIG_VOLUME, "mountPath": render.config_dir})
        volumes.append({"name": CONFIG_VOLUME, "emptyDir": {"sizeLimit": "1Mi"}})
    if render.metrics_dir is not None:
        container["volumeMounts"].append({"name": METRICS_VOLUME, "mountPath": render.metrics_dir})
        volumes.append({"name": METRICS_VOLUME, "emptyDir": {"sizeLimit": "64Mi"}})
    if render.model_volume is not None:
        container["volumeMounts"].append(
            {"name": "model", "mountPath": render.model_volume.mount_path, "readOnly": True}
        )
        volumes.append(
            {
                "name": "model",
                "persistentVolumeClaim": {"claimName": render.model_volume.claim_name, "readOnly": True},
            }
        )
    pod: dict[str, Any] = {
        # A Service named like an engine variable (e.g. "vllm") would inject VLLM_PORT=tcp://...
        "enableServiceLinks": False,
        # The engine talks to no API server: no ServiceAccount token in its pods.
        "automountServiceAccountToken": False,
        "securityContext": pod_security_context(isvc.spec.engine.run_as_user),
        "terminationGracePeriodSeconds": render.termination_grace_period_s,
        "containers": [container],
        "volumes": volumes,
    }
    if resources.node_selector:
        pod["nodeSelector"] = dict(resources.node_selector)
    if resources.tolerations:
        pod["tolerations"] = [toleration.to_k8s() for toleration in resources.tolerations]
    return pod


def live_adjust_token_key(service: str, track: Track | str) -> str:
    """``<service>.<track>``: the key of a track's token in the namespace's :data:`LIVE_ADJUST_SECRET`.

    One token per track: the canary's token adjusts no stable pod.
    """
    return f"{service}.{Track(track).value}"


def wants_live_adjust_secret(isvc: InferenceService) -> bool:
    """Whether ``isvc``'s engine serves the live-adjustment route (so it needs the token Secret)."""
    try:
        return render_for(isvc).live_adjust
    except RenderError:
        return False


def new_live_adjust_token() -> str:
    """A fresh random bearer token (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def is_live_adjust_secret(secret: Mapping[str, Any]) -> bool:
    """Whether ``secret`` is the installation's live-adjustment Secret (not someone else's of that name)."""
    labels = (secret.get("metadata") or {}).get("labels") or {}
    return labels.get(LABEL_MANAGED_BY) == MANAGED_BY and secret.get("type", "Opaque") == "Opaque"


def live_adjust_tokens(isvc: InferenceService) -> dict[str, str]:
    """Fresh tokens for ``isvc``'s tracks, by key in the namespace's Secret."""
    return {live_adjust_token_key(_name(isvc), track): new_live_adjust_token() for track in Track}


def build_live_adjust_secret(namespace: str | None, tokens: Mapping[str, str]) -> dict[str, Any]:
    """The namespace's live-adjustment Secret (:data:`LIVE_ADJUST_SECRET`) holding ``tokens``.

    One Secret of a fixed name per namespace, so the installation's grant on Secrets can name it
    (``resourceNames``); each service's tracks have their own keys (:func:`live_adjust_token_key`),
    and each service using it is one of its owners. The operator adds a service's tokens once and
    never rewrites one (engines read theirs at start-up; the tuner reads the canary's to call it).
    """
    meta: dict[str, Any] = {"name": LIVE_ADJUST_SECRET, "labels": {LABEL_MANAGED_BY: MANAGED_BY}}
    if namespace:
        meta["namespace"] = namespace
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta,
        "type": "Opaque",
        "stringData": dict(tokens),
    }


def build_service(isvc: InferenceService, *, via_router: bool | None = None) -> dict[str, Any]:
    """The Service in front of every engine pod of ``isvc``: stable and canary both get traffic.

    A disaggregated service's Service selects its router pods instead (same name and port).
    ``via_router`` overrides which of the two it selects (the side still serving while the
    topology changes).
    """
    name = _name(isvc)
    if via_router is None:
        via_router = isvc.spec.disaggregated
    selector = router_selector(isvc) if via_router else {LABEL_SERVICE: name}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(isvc, name, service_labels(isvc)),
        "spec": {
            "type": "ClusterIP",
            "selector": selector,
            "ports": [
                {
                    "name": ENGINE_PORT_NAME,
                    "port": ENGINE_PORT,
                    "targetPort": ENGINE_PORT_NAME,
                    "protocol": "TCP",
                }
            ],
        },
    }


def build_pod_monitor(
    isvc: InferenceService, labels: Mapping[str, str] | None = None, role: PoolRole | str | None = None
) -> dict[str, Any]:
    """A Prometheus Operator PodMonitor scraping every engine pod of ``isvc``.

    ``labels`` are added so a Prometheus ``podMonitorSelector`` (e.g.
    ``release: kube-prometheus-stack``) selects it. Relabelings give every
    target exactly the labels the tuner's PromQL selects on (see
    :data:`TARGET_LABELS`), the same set the local file_sd writer produces, so
    stable and canary can be compared. With ``role``, the PodMonitor
    ``<service>-<role>`` of that pool of a disaggregated service: its pods only,
    and a ``role`` target label as well.
    """
    name = _name(isvc)
    selector = {LABEL_SERVICE: name}
    relabelings = pod_monitor_relabelings()
    # A service allowed to change topology may run a topology trial's canary pools: their targets
    # need the role, and they serve on CANARY_POOL_PORT_NAME.
    trials = role is None and isvc.spec.autotune.allow_topology_change and not isvc.spec.disaggregated
    if role is not None:
        role = PoolRole(role)
        selector[LABEL_ROLE] = role.value
    if role is not None or trials:
        relabelings.insert(len(TARGET_LABELS), _relabel("role", ROLE_SOURCE_LABEL))
    endpoint = {
        "port": ENGINE_PORT_NAME,
        "path": metrics_path(isvc.spec.engine.kind),
        "interval": "15s",
        "relabelings": relabelings,
    }
    endpoints = [endpoint, {**endpoint, "port": CANARY_POOL_PORT_NAME}] if trials else [endpoint]
    monitor = name if role is None else pool_deployment_name(name, role)
    return {
        "apiVersion": POD_MONITOR_API_VERSION,
        "kind": "PodMonitor",
        "metadata": _metadata(isvc, monitor, {**service_labels(isvc), **dict(labels or {})}),
        "spec": {
            "selector": {"matchLabels": selector},
            "podMetricsEndpoints": endpoints,
        },
    }


def build_canary_pod_monitor(
    isvc: InferenceService, labels: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The PodMonitor ``<service>-canary`` of a service that runs prefill/decode pools: the colocated
    canary engines a colocated topology trial runs beside them (the pools' PodMonitors select by
    role, which those pods have none of)."""
    monitor = build_pod_monitor(isvc, labels)
    monitor["metadata"]["name"] = deployment_name(_name(isvc), Track.CANARY)
    monitor["spec"]["selector"] = {"matchLabels": colocated_canary_selector(isvc)}
    return monitor


def disaggregated_pod_monitors(
    isvc: InferenceService, labels: Mapping[str, str] | None = None
) -> tuple[dict[str, Any], ...]:
    """A disaggregated service's PodMonitors: one per pool, and one over the colocated canary
    engines a colocated topology trial runs beside them (:func:`build_canary_pod_monitor`)."""
    pools = (build_pod_monitor(isvc, labels, role) for role in PoolRole)
    return (*pools, build_canary_pod_monitor(isvc, labels))


def _sd_name(label: str) -> str:
    """A label name as service discovery spells it: ``chunkpilot.io/track`` -> ``chunkpilot_io_track``."""
    return "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in label)


#: Prometheus target label -> Kubernetes service-discovery meta label it is copied from.
TARGET_LABELS: Final = {
    "namespace": "__meta_kubernetes_namespace",
    "service": f"__meta_kubernetes_pod_label_{_sd_name(LABEL_SERVICE)}",
    "track": f"__meta_kubernetes_pod_label_{_sd_name(LABEL_TRACK)}",
    "config_hash": f"__meta_kubernetes_pod_label_{_sd_name(LABEL_CONFIG_HASH)}",
    "pod": "__meta_kubernetes_pod_name",
}
#: The extra target label of a disaggregated pool's targets: ``role`` (prefill or decode).
ROLE_SOURCE_LABEL: Final = f"__meta_kubernetes_pod_label_{_sd_name(LABEL_ROLE)}"
#: Target labels the Prometheus Operator adds to PodMonitor targets that the contract leaves out.
DROPPED_TARGET_LABELS: Final = ("container", "endpoint")


def _relabel(target: str, source: str) -> dict[str, Any]:
    return {"action": "replace", "sourceLabels": [source], "targetLabel": target}


def pod_monitor_relabelings() -> list[dict[str, Any]]:
    """Relabelings that leave a target with ``namespace, service, track, config_hash, pod`` only."""
    rules: list[dict[str, Any]] = [_relabel(target, source) for target, source in TARGET_LABELS.items()]
    rules.append({"action": "labeldrop", "regex": "|".join(DROPPED_TARGET_LABELS)})
    return rules


@dataclass(frozen=True)
class Children:
    """The desired children of one InferenceService (before adoption).

    Colocated: the stable ``deployment``, the ``service`` and its ``pod_monitor``. Disaggregated:
    no ``deployment``; the ``pools`` (prefill, decode), the ``router`` objects (ServiceAccount,
    Role, RoleBinding, Deployment), the ``service`` selecting the router and ``pool_monitors``
    (:func:`disaggregated_pod_monitors`).
    """

    deployment: dict[str, Any] | None
    service: dict[str, Any]
    pod_monitor: dict[str, Any] | None
    pools: tuple[dict[str, Any], ...] = ()
    router: tuple[dict[str, Any], ...] = ()
    pool_monitors: tuple[dict[str, Any], ...] = ()
    network_policies: tuple[dict[str, Any], ...] = ()

    def manifests(self) -> list[dict[str, Any]]:
        ordered = (
            self.deployment,
            *self.pools,
            *self.router,
            self.service,
            *self.network_policies,
            self.pod_monitor,
            *self.pool_monitors,
        )
        return [m for m in ordered if m is not None]


def promoted_config(isvc: InferenceService) -> EngineConfig | None:
    """The promoted knobs the stable track runs, or None to run the spec's knobs.

    While ``spec.autotune.enabled``, a ``status.bestConfig`` written by the tuner
    wins over the knobs in the spec, so correcting drift never undoes a
    promotion. A bestConfig the current spec cannot run (e.g. the engine
    version changed since) is ignored: the spec's knobs apply until the tuner
    promotes again.
    """
    status = isvc.status
    if not isvc.spec.autotune.enabled or status is None or status.best_config is None:
        return None
    try:
        render_for(isvc, status.best_config)
    except ValueError:
        return None
    return status.best_config


def incumbent(isvc: InferenceService) -> EngineConfig:
    """What the stable track runs: the promoted config (see :func:`promoted_config`), else the spec's knobs.

    The one definition the operator renders the stable Deployment from and the tuner compares
    every trial against.
    """
    return promoted_config(isvc) or EngineConfig.from_engine(isvc.spec.engine)


def with_topology(isvc: InferenceService, topology: TopologySpec) -> InferenceService | None:
    """``isvc`` running ``topology``'s pools (the spec's KV transfer and router kept); None: it cannot.

    None when the spec cannot run a disaggregated topology (its CEL rules: the engine kind or
    version, ``autotune.liveAdjust``, a ``--kv-transfer-config`` in ``extraArgs``).
    """
    current = isvc.spec.topology
    merged = TopologySpec(
        mode=TopologyMode.DISAGGREGATED,
        prefill=topology.prefill,
        decode=topology.decode,
        kv_transfer=current.kv_transfer if current is not None else topology.kv_transfer,
        router=current.router if current is not None else topology.router,
    )
    try:
        spec = type(isvc.spec).model_validate({**isvc.spec.to_k8s(), "topology": merged.to_k8s()})
    except ValueError:
        return None
    return isvc.model_copy(update={"spec": spec})


def topology_replicas(topology: TopologySpec) -> int:
    """The replicas of ``topology``'s pools together (each takes ``tensorParallelSize`` GPUs)."""
    return sum(pool.replicas for pool in (topology.prefill, topology.decode) if pool is not None)


def runs_at_its_replicas(isvc: InferenceService, topology: TopologySpec) -> bool:
    """Whether a promoted ``topology`` runs at the service's replicas: those it was measured on
    (``spec.replicas``; in ``scaling.mode: Auto`` the planner's colocated decision), or in ``Auto``
    once the planner's decision is for its pools (a promotion in ``Auto`` writes one, and the planner
    sizes the pools from then on)."""
    if not isvc.spec.scaling.acts:
        return topology_replicas(topology) == isvc.spec.replicas
    decided = isvc.status.scaling if isvc.status is not None else None
    if decided is not None and decided.topology == TopologyMode.DISAGGREGATED.value:
        return True
    return topology_replicas(topology) == isvc.running_replicas()


def promoted_topology(isvc: InferenceService) -> TopologySpec | None:
    """The topology a topology trial promoted (``status.bestTopology``), when the service runs it.

    It runs while ``spec.autotune.enabled`` and ``allowTopologyChange`` are true, the spec
    declares no disaggregated topology of its own (a declared one wins) and it runs at the
    service's replicas (:func:`runs_at_its_replicas`: outside ``Auto``, an edit of ``spec.replicas``
    takes effect, colocated, and the topology runs again once it is set back); one the spec cannot
    run (see :func:`with_topology`) is ignored, as an unrunnable ``bestConfig`` is.
    """
    status, spec = isvc.status, isvc.spec
    if status is None or status.best_topology is None or spec.disaggregated:
        return None
    if not (spec.autotune.enabled and spec.autotune.allow_topology_change):
        return None
    if not runs_at_its_replicas(isvc, status.best_topology):
        return None
    return status.best_topology if with_topology(isvc, status.best_topology) is not None else None


def effective_topology(isvc: InferenceService) -> InferenceService:
    """``isvc`` as the operator renders it and the tuner tunes it: with its promoted topology, if any.

    The spec is never written: a promoted topology lives in the tuner-written status.
    """
    promoted = promoted_topology(isvc)
    if promoted is None:
        return isvc
    effective = with_topology(isvc, promoted)
    assert effective is not None
    return effective


def build_canary_topology(isvc: InferenceService, topology: TopologySpec) -> tuple[dict[str, Any], ...]:
    """The canary topology of a topology trial: canary prefill and decode pools and a canary router.

    The pools (``<service>-prefill-canary``, ``<service>-decode-canary``: track ``canary``, their
    role, ``topology``'s replicas and knobs, the KV transfer, their port named
    :data:`CANARY_POOL_PORT_NAME` so the service's Service does not reach them) and the router in
    front of them only (``<service>-router-canary`` with its ServiceAccount, Role and RoleBinding;
    its selectors name the canary track). The router's pods carry the service label, so the
    service's Service sends them a share of the live traffic, as it does a colocated canary's
    pods. Raises ``ValueError``
    (:class:`RenderError` among them) when the spec cannot run ``topology``.
    """
    running = with_topology(isvc, topology)
    if running is None:
        raise ValueError("the spec cannot run a disaggregated topology (see spec.topology's rules)")
    pools = tuple(
        build_deployment(
            running,
            Track.CANARY,
            replicas=running.spec.pool(role).replicas,
            role=role,
            port_name=CANARY_POOL_PORT_NAME,
        )
        for role in PoolRole
    )
    return (*pools, *build_router_objects(running, Track.CANARY))


def as_declared(isvc: InferenceService, body: Mapping[str, Any]) -> InferenceService:
    """``isvc`` with the topology its manifest declares (``body``'s ``spec.topology``) in place of
    the one a topology trial promoted: the colocated service a colocated topology trial tries."""
    declared = (body.get("spec") or {}).get("topology")
    topology = TopologySpec.model_validate(declared) if declared is not None else None
    return isvc.model_copy(update={"spec": isvc.spec.model_copy(update={"topology": topology})})


def build_canary_colocated(
    isvc: InferenceService, colocated: InferenceService, config: EngineConfig, replicas: int, routers: int
) -> tuple[dict[str, Any], ...]:
    """The canary of a colocated topology trial of a service that runs prefill/decode pools:
    ``replicas`` colocated canary engines of ``config`` (``<service>-canary``, rendered from
    ``colocated``: the service as its manifest declares it; their pods labelled
    :func:`~chunkpilot.operator.router.colocated_canary_selector`) and a canary router of ``routers`` pods
    in front of them only (``<service>-router-canary`` in its regular mode, with its RBAC). The
    service's Service selects router pods, so the canary router's get their share of the live
    traffic beside the stable router's. Raises :class:`RenderError` for a knob the engine refuses."""
    engines = build_deployment(colocated, Track.CANARY, config=config, replicas=replicas)
    engines["spec"]["template"]["metadata"]["labels"].update(colocated_canary_selector(isvc))
    router = build_router_objects(
        isvc, Track.CANARY, workers=colocated_canary_selector(isvc), replicas=routers
    )
    return (engines, *router)


def build_stable_deployment(isvc: InferenceService) -> dict[str, Any]:
    """The stable Deployment as the operator keeps it: the promoted config if any, else the spec's."""
    return build_deployment(isvc, Track.STABLE, config=promoted_config(isvc))


def build_pool_deployment(isvc: InferenceService, role: PoolRole | str) -> dict[str, Any]:
    """The stable Deployment of one pool of a disaggregated service, as the operator keeps it."""
    return build_deployment(isvc, Track.STABLE, role=role)


def build_children(
    isvc: InferenceService, *, pod_monitor: bool, pod_monitor_labels: Mapping[str, str] | None = None
) -> Children:
    """Everything the operator keeps in place for ``isvc``: stable Deployment, Service, PodMonitor.

    For a disaggregated service: both pools' Deployments, the router and its RBAC, the Service
    in front of the router and its PodMonitors (:func:`disaggregated_pod_monitors`). The
    NetworkPolicies of a service that asks for them (admitting no installation peers: those are the
    installation's settings).
    """
    policies = tuple(build_network_policies(isvc, NetworkPeers())) if wants_network_policy(isvc) else ()
    if isvc.spec.disaggregated:
        return Children(
            deployment=None,
            service=build_service(isvc),
            pod_monitor=None,
            pools=tuple(build_pool_deployment(isvc, role) for role in PoolRole),
            router=build_router_objects(isvc),
            pool_monitors=disaggregated_pod_monitors(isvc, pod_monitor_labels) if pod_monitor else (),
            network_policies=policies,
        )
    return Children(
        deployment=build_stable_deployment(isvc),
        service=build_service(isvc),
        pod_monitor=build_pod_monitor(isvc, pod_monitor_labels) if pod_monitor else None,
        network_policies=policies,
    )


_name = service_name
_metadata = object_metadata
