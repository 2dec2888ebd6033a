"""The reconcile loop body: apply the desired children, correct drift, write status and Events.

Handlers call into :class:`Reconciler`; it does the I/O (through
:class:`~chunkpilot.operator.kube.KubeClient`) around the pure builders,
status functions and event selection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import kopf
from chunkpilot.operator import events as ev
from chunkpilot.operator.builders import (
    LIVE_ADJUST_SECRET_KEY,
    POD_MONITOR_API_VERSION,
    RenderError,
    build_live_adjust_secret,
    build_pod_monitor,
    build_pool_deployment,
    build_service,
    build_stable_deployment,
    deployment_name,
    live_adjust_secret_name,
    new_live_adjust_token,
    pool_deployment_name,
    wants_live_adjust_secret,
)
from chunkpilot.operator.config import (
    DISAGGREGATION_DISABLED_MESSAGE,
    REASON_DISAGGREGATION_DISABLED,
    OperatorConfig,
    PodMonitorMode,
)
from chunkpilot.operator.drift import (
    ALL_KINDS,
    ChildKind,
    foreign_selector_keys,
    is_operator_owned,
    is_subset,
    is_terminating,
    restored_name,
)
from chunkpilot.operator.engines import RenderProblem
from chunkpilot.operator.kube import KubeClient, KubeError, object_path, resource_path
from chunkpilot.operator.objects import adopt, isvc_path, parse_status, write_service_status
from chunkpilot.operator.router import build_router_objects, router_name
from chunkpilot.operator.served import with_best_config, with_best_topology, with_live_adjust_condition
from chunkpilot.operator.status import (
    DeploymentState,
    InstallationProblem,
    Observation,
    Reason,
    TopologyObservation,
    TopologyPart,
    TopologySwitch,
    compute_status,
    status_patch,
)

from chunkpilot import telemetry
from chunkpilot.api import (
    LABEL_SERVICE,
    InferenceService,
    InferenceServiceStatus,
    ManifestError,
    PoolRole,
    TopologyMode,
    Track,
)

logger = logging.getLogger(__name__)

#: How long the answer to "is the PodMonitor API served?" is trusted.
API_DISCOVERY_TTL_S: Final = 300.0


@dataclass
class _Ensured:
    actual: dict[str, Any] | None
    previous: dict[str, Any] | None
    created: bool = False
    written: bool = False


@dataclass
class Reconciler:
    """Reconciles InferenceServices through one API client; safe to share across handlers."""

    kube: KubeClient
    config: OperatorConfig
    post_event: Callable[[Mapping[str, Any], ev.EventSpec], None] | None = None
    _locks: dict[tuple[str, str], asyncio.Lock] = field(default_factory=dict)
    _pod_monitor_api: tuple[float, bool] | None = None

    # ------------------------------------------------------------------ entry points

    async def reconcile(
        self,
        body: Mapping[str, Any],
        *,
        kinds: frozenset[ChildKind] = ALL_KINDS,
        known: Mapping[ChildKind, dict[str, Any] | None] | None = None,
        repair: bool = False,
    ) -> None:
        """Bring the children of one InferenceService in line with its spec and refresh its status.

        ``kinds`` limits which children are checked; ``known`` passes bodies
        already at hand (None = known to be gone); ``repair`` marks a reconcile
        triggered by a change to a child, whose writes are reported as drift.
        """
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            try:
                await self._reconcile_locked(body, kinds, dict(known or {}), repair)
            except KubeError as error:
                if not error.namespace_terminating:
                    raise
                # The namespace is being deleted and takes the service with it: nothing to restore.
                logger.info("not reconciling %s/%s: its namespace is being deleted", *key)

    async def child_changed(self, event_type: str | None, child: Mapping[str, Any]) -> None:
        """A labelled child changed or vanished: restore it if needed and refresh the parent's status."""
        meta = child.get("metadata", {})
        labels = meta.get("labels") or {}
        service = labels.get(LABEL_SERVICE)
        namespace = meta.get("namespace")
        if not service or not namespace:
            return
        kind = ChildKind(child["kind"])
        if kind == ChildKind.DEPLOYMENT and not is_operator_owned(labels):
            # Canary Deployments belong to the tuner; they only count towards the replicas.
            kinds: frozenset[ChildKind] = frozenset()
            known: dict[ChildKind, dict[str, Any] | None] = {}
        else:
            kinds = frozenset({kind})
            # The event's body may be older than what an earlier reconcile already saw (events
            # queue while the lock is held): read the child afresh rather than judge from it.
            gone = event_type == "DELETED" and meta.get("name") == restored_name(kind, service)
            known = {kind: None} if gone else {}
        parent = await self.kube.get(isvc_path(namespace, service))
        if parent is None or is_terminating(parent):
            return
        owner_uids = {ref.get("uid") for ref in meta.get("ownerReferences") or []}
        if owner_uids and parent["metadata"]["uid"] not in owner_uids:
            return  # left over from an earlier object of the same name: the garbage collector removes it
        await self.reconcile(parent, kinds=kinds, known=known, repair=True)

    def forget(self, namespace: str, name: str) -> None:
        self._locks.pop((namespace, name), None)
        telemetry.forget_service(namespace, name)

    # ------------------------------------------------------------------ internals

    async def _reconcile_locked(
        self,
        body: Mapping[str, Any],
        kinds: frozenset[ChildKind],
        known: dict[ChildKind, dict[str, Any] | None],
        repair: bool,
    ) -> None:
        meta = body["metadata"]
        try:
            isvc = InferenceService.from_manifest({k: v for k, v in body.items() if k != "status"})
        except ManifestError as error:
            raise kopf.PermanentError(str(error)) from None
        isvc = with_best_config(isvc, body.get("status"))
        live_adjust_blocked = self.config.live_adjust_blocked(isvc)
        isvc = with_best_topology(self.config.served(isvc), body.get("status"))
        if isvc.spec.disaggregated:
            await self._reconcile_disaggregated(body, isvc, kinds, known, repair, live_adjust_blocked)
            return
        problem: RenderProblem | None = None
        created: list[tuple[str, str]] = []

        # Rendered on every pass, even one about another child: the status must keep
        # reporting a knob the engine version cannot honour.
        try:
            desired_stable: dict[str, Any] | None = build_stable_deployment(isvc)
        except RenderError as error:
            problem = error.problem
            desired_stable = None
        stable: dict[str, Any] | None
        if ChildKind.DEPLOYMENT in kinds and desired_stable is not None:
            stable = await self._ensure_stable(
                body, isvc, desired_stable, known.get(ChildKind.DEPLOYMENT, _UNKNOWN), repair, created
            )
        else:
            stable = await self.kube.get(_deployment_path(isvc, Track.STABLE))
        leftovers = await self._disaggregated_leftovers(isvc, body) if _may_have_pools(body) else {}
        switch = (
            TopologySwitch("the stable Deployment", "the prefill/decode pools", (("stable", _state(stable)),))
            if leftovers and problem is None
            else None
        )
        switched = False
        if switch is not None:
            switched = await self._switch_service(
                body, isvc, switch, to_router=False, kinds=kinds, known=known, repair=repair, created=created
            )

        # While pools are left, the Service is kept by _switch_service.
        wanted = kinds - {ChildKind.SERVICE} if leftovers else kinds
        await self._ensure_service_and_monitor(body, isvc, wanted, known, repair, created)
        if created and not repair:
            self._emit(body, ev.created(created))
        self._note_switch_started(body, switch, created, repair)
        if switched or (_was_disaggregated(body) and not leftovers):
            await self._remove_disaggregated_children(isvc, body, ALL_KINDS if switched else kinds)
            if switched:
                self._emit(body, switched_event("the stable Deployment", "the prefill/decode pools"))
        serving_old = switch is not None and not switched

        canary = await self.kube.get(_deployment_path(isvc, Track.CANARY))
        observation = Observation(
            generation=int(meta.get("generation") or 0),
            stable=None if serving_old else _state(stable),
            canary=_state(canary),
            problem=problem,
            topology=_topology_observation(leftovers) if serving_old else None,
            switch=switch if serving_old else None,
        )
        await self._report(body, isvc, observation, live_adjust_blocked, kinds)

    async def _ensure_service_and_monitor(
        self,
        body: Mapping[str, Any],
        isvc: InferenceService,
        kinds: frozenset[ChildKind],
        known: dict[ChildKind, dict[str, Any] | None],
        repair: bool,
        created: list[tuple[str, str]],
    ) -> None:
        """A colocated service's Service and PodMonitor, those of them in ``kinds``."""
        for kind in (ChildKind.SERVICE, ChildKind.POD_MONITOR):
            if kind not in kinds:
                continue
            if kind == ChildKind.POD_MONITOR:
                if not await self._pod_monitor_wanted():
                    continue
                desired = build_pod_monitor(isvc, self.config.pod_monitor_labels)
            else:
                desired = build_service(isvc)
            ensured = await self._ensure(desired, body, known.get(kind, _UNKNOWN))
            self._note(body, kind.value, desired["metadata"]["name"], ensured, repair, created)

    async def _report(
        self,
        body: Mapping[str, Any],
        isvc: InferenceService,
        observation: Observation,
        live_adjust_blocked: bool,
        kinds: frozenset[ChildKind],
    ) -> None:
        """Export the gauges and write the status computed from ``observation``."""
        meta = body["metadata"]
        export_metrics(isvc, observation)
        await self._write_status(meta["namespace"], meta["name"], observation, live_adjust_blocked)
        logger.info(
            "reconciled %s%s/%s (generation %s, %s)",
            "disaggregated " if isvc.spec.disaggregated else "",
            meta["namespace"],
            meta["name"],
            observation.generation,
            ", ".join(sorted(kinds)) if kinds else "status only",
        )

    async def _reconcile_disaggregated(
        self,
        body: Mapping[str, Any],
        isvc: InferenceService,
        kinds: frozenset[ChildKind],
        known: dict[ChildKind, dict[str, Any] | None],
        repair: bool,
        live_adjust_blocked: bool,
    ) -> None:
        """A disaggregated service: both pools, the router and its RBAC, the Service, a PodMonitor per pool.

        The same steps as the colocated path; the pools are rolled like the stable track (one
        Event per new config) and the router is kept like any other child.
        """
        meta = body["metadata"]
        problem: RenderProblem | InstallationProblem | None = None
        created: list[tuple[str, str]] = []
        desired_pools: dict[PoolRole, dict[str, Any]] = {}
        if not self.config.disaggregation:
            problem = InstallationProblem(REASON_DISAGGREGATION_DISABLED, DISAGGREGATION_DISABLED_MESSAGE)
        for role in PoolRole:
            try:
                desired_pools[role] = build_pool_deployment(isvc, role)
            except RenderError as error:
                problem = problem or error.problem
        if ChildKind.DEPLOYMENT in kinds and problem is None:
            states = await self._ensure_pools_and_router(body, isvc, desired_pools, repair, created)
        else:
            states = {role.value: await self.kube.get(_pool_path(isvc, role)) for role in PoolRole}
            states[TopologyPart.ROUTER] = await self.kube.get(_router_path(isvc))
        colocated = await self._owned(_deployment_path(isvc, Track.STABLE), body) if problem is None else None
        topology = _topology_observation(states)
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
            switched = await self._switch_service(
                body, isvc, switch, to_router=True, kinds=kinds, known=known, repair=repair, created=created
            )
        elif ChildKind.SERVICE in kinds and problem is None:
            ensured = await self._ensure(build_service(isvc), body, known.get(ChildKind.SERVICE, _UNKNOWN))
            self._note(body, "Service", _name(isvc), ensured, repair, created)
        if ChildKind.POD_MONITOR in kinds and problem is None and await self._pod_monitor_wanted():
            for role in PoolRole:
                monitor = build_pod_monitor(isvc, self.config.pod_monitor_labels, role)
                ensured = await self._ensure(monitor, body, _UNKNOWN)
                self._note(body, "PodMonitor", monitor["metadata"]["name"], ensured, repair, created)
            if not _was_disaggregated(body) and switch is None:
                await self._delete_owned(_pod_monitor_path(isvc, _name(isvc)), body)
        if created and not repair:
            self._emit(body, ev.created(created))
        self._note_switch_started(body, switch, created, repair)
        if switched:
            await self._remove_colocated_children(isvc, body)
            self._emit(body, switched_event("the prefill/decode pools", "the stable Deployment"))
        serving_old = switch is not None and not switched

        canary = await self.kube.get(_deployment_path(isvc, Track.CANARY))
        observation = Observation(
            generation=int(meta.get("generation") or 0),
            stable=_state(colocated) if serving_old else None,
            canary=_state(canary),
            problem=problem,
            topology=None if serving_old else topology,
            switch=switch if serving_old else None,
        )
        await self._report(body, isvc, observation, live_adjust_blocked, kinds)

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
        :meth:`_switch_service`).
        """
        *rbac, router = build_router_objects(isvc)
        for manifest in rbac:
            ensured = await self._ensure(manifest, body, _UNKNOWN)
            self._note(body, manifest["kind"], manifest["metadata"]["name"], ensured, repair, created)
        states: dict[str, dict[str, Any] | None] = {}
        for role, desired in desired_pools.items():
            states[role.value] = await self._ensure_stable(body, isvc, desired, _UNKNOWN, repair, created)
        ensured = await self._ensure(router, body, _UNKNOWN)
        self._note(body, "Deployment", router["metadata"]["name"], ensured, repair, created)
        states[TopologyPart.ROUTER] = ensured.actual
        return states

    async def _switch_service(
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
                ensured = await self._ensure(old, body, known.get(ChildKind.SERVICE, _UNKNOWN))
                self._note(body, "Service", _name(isvc), ensured, repair, created)
            return False
        ensured = await self._ensure(build_service(isvc, via_router=to_router), body, _UNKNOWN)
        return not ensured.written

    def _note_switch_started(
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
            self._emit(body, ev.EventSpec(ev.EventType.NORMAL, "TopologySwitching", switch.message()))

    async def _remove_colocated_children(self, isvc: InferenceService, body: Mapping[str, Any]) -> None:
        """A service now served by its pools: delete its stable Deployment and colocated PodMonitor."""
        await self._delete_owned(_deployment_path(isvc, Track.STABLE), body)
        if await self._pod_monitor_wanted():
            await self._delete_owned(_pod_monitor_path(isvc, _name(isvc)), body)

    async def _disaggregated_leftovers(
        self, isvc: InferenceService, body: Mapping[str, Any]
    ) -> dict[str, dict[str, Any] | None]:
        """The pools and router this service still owns, by part; empty when none is left."""
        paths = {role.value: _pool_path(isvc, role) for role in PoolRole} | {
            TopologyPart.ROUTER.value: _router_path(isvc)
        }
        found = {part: await self._owned(path, body) for part, path in paths.items()}
        return found if any(found.values()) else {}

    async def _owned(self, path: str, owner: Mapping[str, Any]) -> dict[str, Any] | None:
        """The child at ``path`` when this InferenceService owns it and it is not being deleted."""
        current = await self.kube.get(path)
        if current is None or is_terminating(current):
            return None
        uid = owner["metadata"].get("uid")
        owners = {ref.get("uid") for ref in current["metadata"].get("ownerReferences") or []}
        return current if uid in owners else None

    def _note(
        self,
        body: Mapping[str, Any],
        kind: str,
        name: str,
        ensured: _Ensured,
        repair: bool,
        created: list[tuple[str, str]],
    ) -> None:
        """Record a created child, or report a repaired one."""
        if ensured.created and not repair:
            created.append((kind, name))
        elif ensured.written and repair:
            self._emit(
                body, ev.restored(kind, name, "deleted by hand" if ensured.created else "edited by hand")
            )

    async def _remove_disaggregated_children(
        self, isvc: InferenceService, body: Mapping[str, Any], kinds: frozenset[ChildKind]
    ) -> None:
        """A service back to colocated: delete its pools, router and pool PodMonitors."""
        if ChildKind.DEPLOYMENT in kinds:
            for role in PoolRole:
                await self._delete_owned(_pool_path(isvc, role), body)
            await self._delete_owned(_router_path(isvc), body)
        if ChildKind.POD_MONITOR in kinds and self.config.disaggregation and await self._pod_monitor_wanted():
            for role in PoolRole:
                await self._delete_owned(
                    _pod_monitor_path(isvc, pool_deployment_name(_name(isvc), role)), body
                )

    async def _delete_owned(self, path: str, owner: Mapping[str, Any]) -> None:
        """Delete the child at ``path`` when this InferenceService owns it (a topology change left it)."""
        current = await self._owned(path, owner)
        if current is None:
            return
        await self.kube.delete(path)
        logger.info("deleted %s %s, left from the service's previous topology", current["kind"], path)

    async def _ensure_stable(
        self,
        body: Mapping[str, Any],
        isvc: InferenceService,
        desired: dict[str, Any],
        current: Any,
        repair: bool,
        created: list[tuple[str, str]],
    ) -> dict[str, Any] | None:
        """Apply the stable Deployment (and the live-adjust Secret); Events for a roll or a repair."""
        if wants_live_adjust_secret(isvc) and await self._ensure_live_adjust_secret(isvc, body):
            created.append(("Secret", live_adjust_secret_name(_name(isvc))))
        ensured = await self._ensure(desired, body, current)
        name = desired["metadata"]["name"]
        if ensured.created:
            created.append(("Deployment", name))
        if ensured.written and not ensured.created:
            old_state = DeploymentState.from_manifest(ensured.previous) if ensured.previous else None
            new_state = DeploymentState.from_manifest(desired)
            if old_state is not None and old_state.config_hash != new_state.config_hash and new_state.config:
                self._emit(
                    body, ev.rolled(name, old_state.config, new_state.config, new_state.config_hash or "")
                )
            elif repair:
                self._emit(body, ev.restored("Deployment", name, "edited by hand"))
        elif ensured.created and repair:
            self._emit(body, ev.restored("Deployment", name, "deleted by hand"))
        return ensured.actual

    async def _ensure(self, desired: dict[str, Any], owner: Mapping[str, Any], current: Any) -> _Ensured:
        """Apply ``desired`` unless the live object already matches it."""
        adopt(desired, owner)
        if current is _UNKNOWN:
            current = await self.kube.get(object_path(desired))
        if current is not None and is_terminating(current):
            return _Ensured(actual=current, previous=current)  # recreated once the deletion completes
        extra = foreign_selector_keys(desired, current) if current is not None else {}
        if current is not None and not extra and is_subset(desired, current):
            return _Ensured(actual=current, previous=current)
        actual = await self.kube.apply(desired)
        if extra:
            # Keys added by another field manager survive an apply: remove them explicitly.
            actual = await self.kube.merge_patch(object_path(desired), {"spec": {"selector": extra}})
        return _Ensured(actual=actual, previous=current, created=current is None, written=True)

    async def _ensure_live_adjust_secret(self, isvc: InferenceService, owner: Mapping[str, Any]) -> bool:
        """Create the live-adjustment token Secret once; True when it was created now.

        An existing token is never replaced (engines read it at start-up): only a
        Secret without one gets a token added.
        """
        secret = build_live_adjust_secret(isvc, new_live_adjust_token())
        adopt(secret, owner)
        path = object_path(secret)
        current = await self.kube.get(path)
        if current is None:
            try:
                await self.kube.create(resource_path("v1", "secrets", isvc.metadata.namespace), secret)
            except KubeError as error:
                if not error.conflict:
                    raise
                return False  # created meanwhile by another writer: keep its token
            return True
        if not (current.get("data") or {}).get(LIVE_ADJUST_SECRET_KEY):
            await self.kube.merge_patch(path, {"stringData": secret["stringData"]})
        return False

    async def _pod_monitor_wanted(self) -> bool:
        mode = self.config.pod_monitor
        if mode != PodMonitorMode.AUTO:
            return mode == PodMonitorMode.ENABLED
        now = time.monotonic()
        if self._pod_monitor_api is None or now - self._pod_monitor_api[0] > API_DISCOVERY_TTL_S:
            served = await self.kube.has_resource(POD_MONITOR_API_VERSION, "podmonitors")
            self._pod_monitor_api = (now, served)
        return self._pod_monitor_api[1]

    async def _write_status(
        self, namespace: str, name: str, observation: Observation, live_adjust_blocked: bool = False
    ) -> None:
        """Write the status computed from ``observation``; conditional on resourceVersion, retried."""
        computed: dict[str, InferenceServiceStatus | None] = {}

        def patcher(fresh: Mapping[str, Any]) -> dict[str, Any] | None:
            raw = fresh.get("status") or {}
            current = parse_status(raw)
            new = compute_status(current, observation)
            new = with_live_adjust_condition(new, live_adjust_blocked, observation.generation)
            computed.update(current=current, new=new)
            patch = status_patch(raw, new)
            return patch["status"] if patch is not None else None

        def written(fresh: Mapping[str, Any]) -> None:
            new = computed["new"]
            assert new is not None
            for spec in ev.status_transitions(computed["current"], new):
                self._emit(fresh, spec)

        if not await write_service_status(
            self.kube, namespace, name, patcher, skip_terminating=True, on_written=written
        ):
            raise kopf.TemporaryError(
                f"status of {namespace}/{name} kept changing underneath; retrying", delay=1
            )

    def _emit(self, body: Mapping[str, Any], spec: ev.EventSpec) -> None:
        if self.post_event is not None:
            self.post_event(body, spec)


def export_metrics(isvc: InferenceService, observation: Observation) -> None:
    """Set the operator's gauges: budget and max-num-seqs per live track, the SLO targets."""
    namespace, name = isvc.metadata.namespace or "", isvc.metadata.name or ""
    for track, state in ((Track.STABLE, observation.stable), (Track.CANARY, observation.canary)):
        if state is not None and state.config is not None:
            config = state.config
            telemetry.TOKEN_BUDGET.labels(namespace, name, track.value).set(config.max_num_batched_tokens)
            telemetry.MAX_NUM_SEQS.labels(namespace, name, track.value).set(config.max_num_seqs)
        else:
            for gauge in (telemetry.TOKEN_BUDGET, telemetry.MAX_NUM_SEQS):
                with contextlib.suppress(KeyError):
                    gauge.remove(namespace, name, track.value)
    slo = isvc.spec.slo
    if slo is not None:
        telemetry.record_slo_targets(
            namespace, name, (slo.itl.quantile, slo.itl.max_ms), (slo.ttft.quantile, slo.ttft.max_ms)
        )


class _Unknown:
    """Marker: the child's live state has not been fetched yet."""


_UNKNOWN: Final = _Unknown()


def _name(isvc: InferenceService) -> str:
    assert isvc.metadata.name is not None
    return isvc.metadata.name


def _deployment_path(isvc: InferenceService, track: Track) -> str:
    assert isvc.metadata.name is not None
    return resource_path(
        "apps/v1", "deployments", isvc.metadata.namespace, deployment_name(isvc.metadata.name, track)
    )


def _pool_path(isvc: InferenceService, role: PoolRole) -> str:
    return resource_path(
        "apps/v1", "deployments", isvc.metadata.namespace, pool_deployment_name(_name(isvc), role)
    )


def _router_path(isvc: InferenceService) -> str:
    return resource_path("apps/v1", "deployments", isvc.metadata.namespace, router_name(_name(isvc)))


def _pod_monitor_path(isvc: InferenceService, name: str) -> str:
    return resource_path(POD_MONITOR_API_VERSION, "podmonitors", isvc.metadata.namespace, name)


def switched_event(target: str, old: str) -> ev.EventSpec:
    """The ``TopologySwitched`` Event: the Service selects the new side, the old one is deleted."""
    return ev.EventSpec(
        ev.EventType.NORMAL,
        "TopologySwitched",
        f"switched to {target}: the Service selects them; deleting {old}",
    )


def _state(manifest: Mapping[str, Any] | None) -> DeploymentState | None:
    return DeploymentState.from_manifest(manifest) if manifest is not None else None


def _topology_observation(parts: Mapping[str, Mapping[str, Any] | None]) -> TopologyObservation:
    """The pools' and the router's states from their live Deployments by part."""
    return TopologyObservation(
        prefill=_state(parts.get(TopologyPart.PREFILL)),
        decode=_state(parts.get(TopologyPart.DECODE)),
        router=_state(parts.get(TopologyPart.ROUTER)),
    )


def _may_have_pools(body: Mapping[str, Any]) -> bool:
    """Whether pools and a router may be left: the service ran them, or was switching to them."""
    status = body.get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    switching = any(
        isinstance(c, Mapping) and c.get("reason") == Reason.TOPOLOGY_SWITCHING for c in conditions or []
    )
    return switching or _was_disaggregated(body)


def _was_disaggregated(body: Mapping[str, Any]) -> bool:
    """Whether the status records a disaggregated topology that was rolled out (its pools may exist)."""
    status = body.get("status")
    topology = status.get("topology") if isinstance(status, Mapping) else None
    return (
        isinstance(topology, Mapping)
        and topology.get("mode") == TopologyMode.DISAGGREGATED.value
        and any(topology.get(part) for part in TopologyPart)
    )
