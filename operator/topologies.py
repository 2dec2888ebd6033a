"""The two topologies a service runs in, as strategies the one reconcile path writes.

A :class:`Side` is one topology of a service: its Deployments by part, its PodMonitors, whether
the Service reaches its pods through a router, and how messages name it. :func:`desired_side`
renders the side the spec asks for (or the problem that stops it); :func:`other_side` is the side
a change of topology may have left. The reconcile (:mod:`chunkpilot.operator.reconcile`) ensures
the desired side's children, keeps the Service on the old side's pods until the new side is
Ready, then prunes the old side: the same steps in both directions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from chunkpilot.operator import events as ev
from chunkpilot.operator.builders import (
    POD_MONITOR_API_VERSION,
    RenderError,
    build_pod_monitor,
    build_pool_deployment,
    build_stable_deployment,
    deployment_name,
    disaggregated_pod_monitors,
    pool_deployment_name,
)
from chunkpilot.operator.config import (
    DISAGGREGATION_DISABLED_MESSAGE,
    REASON_DISAGGREGATION_DISABLED,
    OperatorConfig,
)
from chunkpilot.operator.engines import RenderProblem
from chunkpilot.operator.kube import resource_path
from chunkpilot.operator.objects import named_deployment_path
from chunkpilot.operator.router import build_router_objects, router_name
from chunkpilot.operator.status import (
    DeploymentState,
    InstallationProblem,
    Reason,
    TopologyObservation,
    TopologyPart,
)

from chunkpilot.api import InferenceService, PoolRole, TopologyMode, Track

#: The part name of a colocated service's one Deployment.
STABLE_PART: Final = "stable"


@dataclass(frozen=True)
class Side:
    """One topology of a service, as far as paths and names go (nothing rendered)."""

    mode: TopologyMode
    #: How an Event names the side when the Service switches to it.
    target: str
    #: How a status message names the side while it still serves during a switch.
    serving: str
    #: The Service reaches the side's engines through its router.
    via_router: bool
    #: Every Deployment of the side by part, in the order a switch reports them.
    deployments: Mapping[str, str]
    #: The side's PodMonitors.
    monitors: tuple[str, ...]

    def observe(
        self, parts: Mapping[str, Mapping[str, Any] | None]
    ) -> tuple[DeploymentState | None, TopologyObservation | None]:
        """The status's view of the side from its live Deployments: ``(stable, topology)``."""
        if self.mode is TopologyMode.DISAGGREGATED:
            return None, topology_observation(parts)
        return _state(parts.get(STABLE_PART)), None


@dataclass(frozen=True)
class DesiredSide:
    """The side the spec asks for, rendered: applied in order, unless ``problem`` stops it."""

    side: Side
    problem: RenderProblem | InstallationProblem | None = None
    #: Applied first (the router's ServiceAccount, Role and RoleBinding).
    before: tuple[dict[str, Any], ...] = ()
    #: Rolled like the stable track (one ``Rolled`` Event per new config), by part.
    rolled: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    #: Applied last, by part (the router, once its backends are there).
    after: Mapping[str, dict[str, Any]] = field(default_factory=dict)


def colocated_side(isvc: InferenceService) -> Side:
    """The stable Deployment behind the Service, one PodMonitor."""
    service = _name(isvc)
    namespace = isvc.metadata.namespace
    stable = deployment_name(service, Track.STABLE)
    return Side(
        mode=TopologyMode.COLOCATED,
        target="the stable Deployment",
        serving=f"Deployment {stable}",
        via_router=False,
        deployments={STABLE_PART: named_deployment_path(namespace, stable)},
        monitors=(_monitor_path(namespace, service),),
    )


def disaggregated_side(isvc: InferenceService) -> Side:
    """Both pools and the router behind the Service, one PodMonitor per pool (and one over a
    colocated topology trial's canary engines)."""
    service = _name(isvc)
    namespace = isvc.metadata.namespace
    pools = {role.value: pool_deployment_name(service, role) for role in PoolRole}
    return Side(
        mode=TopologyMode.DISAGGREGATED,
        target="the prefill/decode pools",
        serving="the prefill/decode pools",
        via_router=True,
        deployments={
            **{part: named_deployment_path(namespace, name) for part, name in pools.items()},
            TopologyPart.ROUTER.value: named_deployment_path(namespace, router_name(service)),
        },
        monitors=tuple(
            _monitor_path(namespace, name)
            for name in (*pools.values(), deployment_name(service, Track.CANARY))
        ),
    )


def desired_side(isvc: InferenceService, config: OperatorConfig) -> DesiredSide:
    """Render the side ``isvc`` asks for; a knob the engine refuses, or an installation that does
    not allow disaggregation, is the ``problem`` and nothing of the side is rendered."""
    if not isvc.spec.disaggregated:
        side = colocated_side(isvc)
        try:
            return DesiredSide(side, rolled={STABLE_PART: build_stable_deployment(isvc)})
        except RenderError as error:
            return DesiredSide(side, problem=error.problem)
    side = disaggregated_side(isvc)
    problem: RenderProblem | InstallationProblem | None = None
    if not config.disaggregation:
        problem = InstallationProblem(REASON_DISAGGREGATION_DISABLED, DISAGGREGATION_DISABLED_MESSAGE)
    pools: dict[str, dict[str, Any]] = {}
    for role in PoolRole:
        try:
            pools[role.value] = build_pool_deployment(isvc, role)
        except RenderError as error:
            problem = problem or error.problem
    if problem is not None:
        return DesiredSide(side, problem=problem)
    *rbac, router = build_router_objects(isvc)
    return DesiredSide(side, before=tuple(rbac), rolled=pools, after={TopologyPart.ROUTER.value: router})


def other_side(isvc: InferenceService) -> Side:
    """The side a change of topology may have left behind: the one the spec does not ask for."""
    return colocated_side(isvc) if isvc.spec.disaggregated else disaggregated_side(isvc)


def pod_monitors(isvc: InferenceService, side: Side, labels: Mapping[str, str]) -> list[dict[str, Any]]:
    """The PodMonitors of ``side``: one over every engine pod, or one per pool and one over the
    colocated canary engines a colocated topology trial runs beside them."""
    if side.mode is TopologyMode.DISAGGREGATED:
        return list(disaggregated_pod_monitors(isvc, labels))
    return [build_pod_monitor(isvc, labels)]


def may_be_left(side: Side, body: Mapping[str, Any]) -> bool:
    """Whether ``side`` may still have children when the spec asks for the other one.

    Pools are looked for only while the status says they ran or were being switched to; a stable
    Deployment is always looked for (a quick change back may leave it without a status saying so).
    """
    return side.mode is TopologyMode.COLOCATED or may_have_pools(body)


def switched_event(target: str, old: str) -> ev.EventSpec:
    """The ``TopologySwitched`` Event: the Service selects the new side, the old one is deleted."""
    return ev.EventSpec(
        ev.EventType.NORMAL,
        "TopologySwitched",
        f"switched to {target}: the Service selects them; deleting {old}",
    )


def topology_observation(parts: Mapping[str, Mapping[str, Any] | None]) -> TopologyObservation:
    """The pools' and the router's states from their live Deployments by part."""
    return TopologyObservation(
        prefill=_state(parts.get(TopologyPart.PREFILL)),
        decode=_state(parts.get(TopologyPart.DECODE)),
        router=_state(parts.get(TopologyPart.ROUTER)),
    )


def may_have_pools(body: Mapping[str, Any]) -> bool:
    """Whether pools and a router may be left: the service ran them, or was switching to them."""
    status = body.get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    switching = any(
        isinstance(c, Mapping) and c.get("reason") == Reason.TOPOLOGY_SWITCHING for c in conditions or []
    )
    return switching or was_disaggregated(body)


def was_disaggregated(body: Mapping[str, Any]) -> bool:
    """Whether the status records a disaggregated topology that was rolled out (its pools may exist)."""
    status = body.get("status")
    topology = status.get("topology") if isinstance(status, Mapping) else None
    return (
        isinstance(topology, Mapping)
        and topology.get("mode") == TopologyMode.DISAGGREGATED.value
        and any(topology.get(part) for part in TopologyPart)
    )


def _state(manifest: Mapping[str, Any] | None) -> DeploymentState | None:
    return DeploymentState.from_manifest(manifest) if manifest is not None else None


def _name(isvc: InferenceService) -> str:
    assert isvc.metadata.name is not None
    return isvc.metadata.name


def _monitor_path(namespace: str | None, name: str) -> str:
    return resource_path(POD_MONITOR_API_VERSION, "podmonitors", namespace, name)
