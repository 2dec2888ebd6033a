"""The disaggregated path of the reconcile loop, and the switch between topologies in either direction.

A disaggregated service's children: both pools (rolled like the stable track), the router and
its RBAC, the Service, a PodMonitor per pool. While a service changes topology the old side
keeps serving until the new one is Ready (:meth:`DisaggregatedReconciler.switch_service`);
then the Service selects the new side and the old one is deleted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from chunkpilot.operator import events as ev
from chunkpilot.operator.builders import (
    RenderError,
    build_pod_monitor,
    build_pool_deployment,
    build_service,
    pool_deployment_name,
)
from chunkpilot.operator.children import (
    UNKNOWN,
    ChildWriter,
    deployment_path,
    deployment_state,
    pod_monitor_path,
    pool_path,
    router_path,
    service_name,
)
from chunkpilot.operator.config import DISAGGREGATION_DISABLED_MESSAGE, REASON_DISAGGREGATION_DISABLED
from chunkpilot.operator.drift import ChildKind
from chunkpilot.operator.engines import RenderProblem
from chunkpilot.operator.router import build_router_objects
from chunkpilot.operator.status import (
    InstallationProblem,
    Observation,
    Reason,
    TopologyObservation,
    TopologyPart,
    TopologySwitch,
)

from chunkpilot.api import InferenceService, PoolRole, TopologyMode, Track


@dataclass
class DisaggregatedReconciler:
    """Reconciles disaggregated services, and the pools a service switching topologies has or leaves.

    It writes through the reconciler's :class:`~chunkpilot.operator.children.ChildWriter`; the
    colocated path calls its switch and clean-up steps for a service leaving its pools.
    """

    children: ChildWriter

    async def reconcile(
        self,
        body: Mapping[str, Any],
        isvc: InferenceService,
        kinds: frozenset[ChildKind],
        known: dict[ChildKind, dict[str, Any] | None],
        repair: bool,
    ) -> Observation:
        """A disaggregated service: both pools, the router and its RBAC, the Service, a PodMonitor per pool.

        The same steps as the colocated path; the pools are rolled like the stable track (one
        Event per new config) and the router is kept like any other child. Returns what the
        status is computed from.
        """
        meta = body["metadata"]
        problem: RenderProblem | InstallationProblem | None = None
        created: list[tuple[str, str]] = []
        desired_pools: dict[PoolRole, dict[str, Any]] = {}
        if not self.children.config.disaggregation:
            problem = InstallationProblem(REASON_DISAGGREGATION_DISABLED, DISAGGREGATION_DISABLED_MESSAGE)
        for role in PoolRole:
            try:
                desired_pools[role] = build_pool_deployment(isvc, role)
            except RenderError as error:
                problem = problem or error.problem
        if ChildKind.DEPLOYMENT in kinds and problem is None:
            states = await self._ensure_pools_and_router(body, isvc, desired_pools, repair, created)
        else:
            states = {role.value: await self.children.kube.get(pool_path(isvc, role)) for role in PoolRole}
            states[TopologyPart.ROUTER] = await self.children.kube.get(router_path(isvc))
        colocated = (
            await self.children.owned(deployment_path(isvc, Track.STABLE), body) if problem is None else None
        )
        topology = topology_observation(states)
        switch = (
            TopologySwitch(
                "the prefill/decode pools",
                f"Deployment {colocated['metadata']['name']}",
                tuple(topology.parts()),
            )
            if colocated is not None
            else None
        )
        switched = False

        # Nothing is rolled out until the problem is fixed: a service switching topologies keeps its
        # Service on the pods that serve it now.
        if switch is not None:
            switched = await self.switch_service(
                body, isvc, switch, to_router=True, kinds=kinds, known=known, repair=repair, created=created
            )
        elif ChildKind.SERVICE in kinds and problem is None:
            ensured = await self.children.ensure(
                build_service(isvc), body, known.get(ChildKind.SERVICE, UNKNOWN)
            )
            self.children.note(body, "Service", service_name(isvc), ensured, repair, created)
        if ChildKind.POD_MONITOR in kinds and problem is None and await self.children.pod_monitor_wanted():
            for role in PoolRole:
                monitor = build_pod_monitor(isvc, self.children.config.pod_monitor_labels, role)
                ensured = await self.children.ensure(monitor, body, UNKNOWN)
                self.children.note(body, "PodMonitor", monitor["metadata"]["name"], ensured, repair, created)
            if not was_disaggregated(body) and switch is None:
                await self.children.delete_owned(pod_monitor_path(isvc, service_name(isvc)), body)
        if created and not repair:
            self.children.emit(body, ev.created(created))
        self.note_switch_started(body, switch, created, repair)
        if switched:
            await self._remove_colocated_children(isvc, body)
            self.children.emit(body, switched_event("the prefill/decode pools", "the stable Deployment"))
        serving_old = switch is not None and not switched

        canary = await self.children.kube.get(deployment_path(isvc, Track.CANARY))
        return Observation(
            generation=int(meta.get("generation") or 0),
            stable=deployment_state(colocated) if serving_old else None,
            canary=deployment_state(canary),
            problem=problem,
            topology=None if serving_old else topology,
            switch=switch if serving_old else None,
        )

    async def _ensure_pools_and_router(
        self,
        body: Mapping[str, Any],
        isvc: InferenceService,
        desired_pools: Mapping[PoolRole, dict[str, Any]],
        repair: bool,
        created: list[tuple[str, str]],
    ) -> dict[str, dict[str, Any] | None]:
        """Apply the router's RBAC, both pools (rolled like the stable track) and the router.

        Returns the live Deployments by part (``prefill``, ``decode``, ``router``). A service that
        was colocated until now keeps its stable Deployment until they are Ready (see
        :meth:`switch_service`).
        """
        *rbac, router = build_router_objects(isvc)
        for manifest in rbac:
            ensured = await self.children.ensure(manifest, body, UNKNOWN)
            self.children.note(body, manifest["kind"], manifest["metadata"]["name"], ensured, repair, created)
        states: dict[str, dict[str, Any] | None] = {}
        for role, desired in desired_pools.items():
            states[role.value] = await self.children.ensure_stable(
                body, isvc, desired, UNKNOWN, repair, created
            )
        ensured = await self.children.ensure(router, body, UNKNOWN)
        self.children.note(body, "Deployment", router["metadata"]["name"], ensured, repair, created)
        states[TopologyPart.ROUTER] = ensured.actual
        return states

    async def switch_service(
        self,
        body: Mapping[str, Any],
        isvc: InferenceService,
        switch: TopologySwitch,
        *,
        to_router: bool,
        kinds: frozenset[ChildKind],
        known: dict[ChildKind, dict[str, Any] | None],
        repair: bool,
        created: list[tuple[str, str]],
    ) -> bool:
        """The Service while the topology changes: on the old side until the new one is Ready, then on it.

        True when the Service already selected the new side before this pass (its endpoints had a
        reconcile's time to follow): the old side may be deleted now.
        """
        if not switch.ready:
            if ChildKind.SERVICE in kinds:
                old = build_service(isvc, via_router=not to_router)
                ensured = await self.children.ensure(old, body, known.get(ChildKind.SERVICE, UNKNOWN))
                self.children.note(body, "Service", service_name(isvc), ensured, repair, created)
            return False
        ensured = await self.children.ensure(build_service(isvc, via_router=to_router), body, UNKNOWN)
        return not ensured.written

    def note_switch_started(
        self,
        body: Mapping[str, Any],
        switch: TopologySwitch | None,
        created: list[tuple[str, str]],
        repair: bool,
    ) -> None:
        """The ``TopologySwitching`` Event, on the pass that created the new side's Deployments."""
        if switch is None or switch.ready or repair:
            return
        if any(kind == "Deployment" for kind, _ in created):
            self.children.emit(body, ev.EventSpec(ev.EventType.NORMAL, "TopologySwitching", switch.message()))

    async def _remove_colocated_children(self, isvc: InferenceService, body: Mapping[str, Any]) -> None:
        """A service now served by its pools: delete its stable Deployment and colocated PodMonitor."""
        await self.children.delete_owned(deployment_path(isvc, Track.STABLE), body)
        if await self.children.pod_monitor_wanted():
            await self.children.delete_owned(pod_monitor_path(isvc, service_name(isvc)), body)

    async def remove_disaggregated_children(
        self, isvc: InferenceService, body: Mapping[str, Any], kinds: frozenset[ChildKind]
    ) -> None:
        """A service back to colocated: delete its pools, router and pool PodMonitors."""
        if ChildKind.DEPLOYMENT in kinds:
            for role in PoolRole:
                await self.children.delete_owned(pool_path(isvc, role), body)
            await self.children.delete_owned(router_path(isvc), body)
        if (
            ChildKind.POD_MONITOR in kinds
            and self.children.config.disaggregation
            and await self.children.pod_monitor_wanted()
        ):
            for role in PoolRole:
                await self.children.delete_owned(
                    pod_monitor_path(isvc, pool_deployment_name(service_name(isvc), role)), body
                )

    async def leftovers(
        self, isvc: InferenceService, body: Mapping[str, Any]
    ) -> dict[str, dict[str, Any] | None]:
        """The pools and router this service still owns, by part; empty when none is left."""
        paths = {role.value: pool_path(isvc, role) for role in PoolRole} | {
            TopologyPart.ROUTER.value: router_path(isvc)
        }
        found = {part: await self.children.owned(path, body) for part, path in paths.items()}
        return found if any(found.values()) else {}


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
        prefill=deployment_state(parts.get(TopologyPart.PREFILL)),
        decode=deployment_state(parts.get(TopologyPart.DECODE)),
        router=deployment_state(parts.get(TopologyPart.ROUTER)),
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
