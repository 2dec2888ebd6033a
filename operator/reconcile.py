"""The reconcile loop body: apply the desired children, correct drift, write status and Events.

Handlers call into :class:`Reconciler`; it does the I/O (through
:class:`~chunkpilot.operator.kube.KubeClient`) around the pure builders,
status functions and event selection. It owns a
:class:`~chunkpilot.operator.children.ChildWriter` (every child is written through it). Both
topologies, and the switch between them in either direction, go through one path
(:meth:`Reconciler._reconcile_children`) over the strategies of
:mod:`chunkpilot.operator.topologies`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import aiohttp
import kopf
from chunkpilot.operator import events as ev
from chunkpilot.operator.builders import build_service, selector_labels
from chunkpilot.operator.children import UNKNOWN, ChildWriter, deployment_state
from chunkpilot.operator.config import OperatorConfig
from chunkpilot.operator.drift import ALL_KINDS, ChildKind, is_operator_owned, is_terminating, restored_name
from chunkpilot.operator.kube import KubeClient, KubeError, is_transient, object_path, resource_path
from chunkpilot.operator.networkpolicy import (
    build_network_policies,
    network_policy_names,
    wants_network_policy,
)
from chunkpilot.operator.objects import (
    NameConflictError,
    deployment_path,
    isvc_path,
    owned_by,
    parse_status,
    write_service_status,
)
from chunkpilot.operator.served import (
    with_best_config,
    with_best_topology,
    with_live_adjust_condition,
    with_scaling,
)
from chunkpilot.operator.status import (
    InstallationProblem,
    Observation,
    Reason,
    TopologySwitch,
    compute_status,
    get_condition,
    invalid_spec_reason,
    status_patch,
)
from chunkpilot.operator.topologies import (
    DesiredSide,
    Side,
    desired_side,
    may_be_left,
    other_side,
    pod_monitors,
    switched_event,
)

from chunkpilot import telemetry
from chunkpilot.api import (
    LABEL_SERVICE,
    ConditionType,
    InferenceService,
    InferenceServiceStatus,
    ManifestError,
    TopologyMode,
    Track,
)

logger = logging.getLogger(__name__)

#: Seconds between reconciles of a service whose child's name is taken by an object it does not own.
NAME_CONFLICT_RETRY_S: Final = 30
#: A reconcile the API server's load or the network failed (:func:`is_transient`) is retried after
#: this many seconds, each retry at a random point of the range so that a burst's failures do not
#: all come back together (any other error waits for Kopf's minute).
TRANSIENT_RETRY_S: Final = (2.0, 8.0)
#: Tries of a child's event before it is given up (Kopf retries no event handler: a drift repair
#: the API server's load failed is retried here).
CHILD_EVENT_TRIES: Final = 5


class ApiUnavailable(kopf.TemporaryError):
    """A reconcile the API server's load or the network failed; retried after ``delay`` seconds."""


@dataclass
class Reconciler:
    """Reconciles InferenceServices through one API client; safe to share across handlers."""

    kube: KubeClient
    config: OperatorConfig
    post_event: Callable[[Mapping[str, Any], ev.EventSpec], None] | None = None
    children: ChildWriter = field(init=False)
    _locks: dict[tuple[str, str], asyncio.Lock] = field(default_factory=dict)
    #: Services whose Service this operator just turned to a topology's new side: the echo of that
    #: write is the pass that prunes the old side (no other event may follow).
    _switched: set[tuple[str, str]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.children = ChildWriter(self.kube, self.config, self.post_event)

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
                if error.transient:
                    raise _retry_soon(error) from error
                if not error.namespace_terminating:
                    raise
                # The namespace is being deleted and takes the service with it: nothing to restore.
                logger.info("not reconciling %s/%s: its namespace is being deleted", *key)
            except (TimeoutError, aiohttp.ClientError) as error:
                if not is_transient(error):
                    raise
                raise _retry_soon(error) from error

    async def child_changed(self, event_type: str | None, child: Mapping[str, Any]) -> None:
        """A labelled child changed or vanished: restore it if needed and refresh the parent's status.

        Kopf retries no event handler, so a repair the API server's load or the network failed is
        tried again here (:data:`CHILD_EVENT_TRIES` in all, :data:`TRANSIENT_RETRY_S` apart)."""
        for tried in range(1, CHILD_EVENT_TRIES + 1):
            try:
                await self._child_changed(event_type, child)
                return
            except ApiUnavailable as unavailable:
                if tried == CHILD_EVENT_TRIES:
                    raise
                delay = unavailable.delay or TRANSIENT_RETRY_S[0]
            except (KubeError, TimeoutError, aiohttp.ClientError) as error:
                if not is_transient(error) or tried == CHILD_EVENT_TRIES:
                    raise
                delay = random.uniform(*TRANSIENT_RETRY_S)
            name = child.get("metadata", {}).get("name")
            logger.info(
                "the API server did not answer: %s event of %s retried in %.0f s", event_type, name, delay
            )
            await asyncio.sleep(delay)

    async def _child_changed(self, event_type: str | None, child: Mapping[str, Any]) -> None:
        meta = child.get("metadata", {})
        labels = meta.get("labels") or {}
        service = labels.get(LABEL_SERVICE)
        namespace = meta.get("namespace")
        if not service or not namespace:
            return
        kind = ChildKind(child["kind"])
        switching = kind == ChildKind.SERVICE and (namespace, service) in self._switched
        if switching:
            self._switched.discard((namespace, service))
        if event_type != "DELETED" and not switching and self.children.is_echo(child):
            return  # the answer to this operator's own write: the reconcile that wrote it saw it
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
        self._switched.discard((namespace, name))
        self.children.forget(namespace, name)
        telemetry.forget_service(namespace, name)

    # ------------------------------------------------------------------ internals

    async def _reconcile_locked(
        self,
        body: Mapping[str, Any],
        kinds: frozenset[ChildKind],
        known: dict[ChildKind, dict[str, Any] | None],
        repair: bool,
    ) -> None:
        try:
            isvc = InferenceService.from_manifest({k: v for k, v in body.items() if k != "status"})
        except ManifestError as error:
            # What the CRD's schema lets through and the model refuses: said on the status, and not
            # retried (the next spec change is reconciled anew).
            meta = body["metadata"]
            reason = invalid_spec_reason(error.problems)
            problem = InstallationProblem(reason, f"invalid spec: {error}"[:1024])
            observation = Observation(int(meta.get("generation") or 0), None, problem=problem)
            await self._write_status(meta["namespace"], meta["name"], observation)
            raise kopf.PermanentError(str(error)) from None
        isvc = with_scaling(with_best_config(isvc, body.get("status")), body.get("status"))
        live_adjust_blocked = self.config.live_adjust_blocked(isvc)
        isvc = with_best_topology(self.config.served(isvc), body.get("status"))
        try:
            read = await self._check_service_name(body, isvc)
            if read is not UNKNOWN and ChildKind.SERVICE not in known:
                known = {**known, ChildKind.SERVICE: read}  # the Service's apply needs no second read
            observation = await self._reconcile_children(body, isvc, kinds, known, repair)
        except NameConflictError as conflict:
            generation = int(body["metadata"].get("generation") or 0)
            problem = InstallationProblem(Reason.NAME_CONFLICT, str(conflict))
            await self._report(body, isvc, Observation(generation, None, problem=problem), False, kinds)
            # Retried until the other object is gone or the service renamed (its deletion sends
            # the operator no event: it is not labelled as a child).
            raise kopf.TemporaryError(str(conflict), delay=NAME_CONFLICT_RETRY_S) from None
        await self._report(body, isvc, observation, live_adjust_blocked, kinds)

    async def _check_service_name(self, body: Mapping[str, Any], isvc: InferenceService) -> Any:
        """Before a new service (or one in conflict) writes anything: its Service's name, the one a
        foreign object most likely holds (it is the service's own), must be free or the service's.

        Returns the Service as read (None: there is none), or ``UNKNOWN`` when it was not read.
        Raises :class:`NameConflictError`, so no engine pod starts for a service that cannot serve.
        Later a conflict is found by the write itself (:meth:`ChildWriter.ensure`).
        """
        status = parse_status(body.get("status"))
        if status is not None and status.observed_generation is not None:
            ready = get_condition(status.conditions, ConditionType.READY)
            if ready is None or ready.reason != Reason.NAME_CONFLICT:
                return UNKNOWN
        current = await self.kube.get(object_path(build_service(isvc)))
        if current is not None and not owned_by(current, body):
            raise NameConflictError(current)
        return current

    async def _reconcile_children(
        self,
        body: Mapping[str, Any],
        isvc: InferenceService,
        kinds: frozenset[ChildKind],
        known: dict[ChildKind, dict[str, Any] | None],
        repair: bool,
    ) -> Observation:
        """The children of the topology the spec asks for, and the switch from the other one.

        The desired side's Deployments first (nothing of it while a ``problem`` stops it); while
        the other side still has Deployments, the Service stays on them until the new side is
        Ready, then selects the new side, and the old side is pruned on the next pass (its
        endpoints had a reconcile's time to follow). Returns what the status is computed from:
        the side that serves.
        """
        meta = body["metadata"]
        created: list[tuple[str, str]] = []
        desired = desired_side(isvc, self.config)
        new, old = desired.side, other_side(isvc)

        if ChildKind.DEPLOYMENT in kinds and desired.problem is None:
            states = await self._ensure_side(body, isvc, desired, known, repair, created)
        else:
            states = {part: await self.kube.get(path) for part, path in new.deployments.items()}
        leftovers = await self._left(old, body) if may_be_left(old, body) else {}
        switch = (
            TopologySwitch(
                new.target,
                old.serving,
                tuple((part, deployment_state(states.get(part))) for part in new.deployments),
            )
            if leftovers and desired.problem is None
            else None
        )

        switched = False
        if switch is not None:
            switched = await self._switch_service(body, isvc, new, old, switch, kinds, known, repair, created)
        elif ChildKind.SERVICE in kinds and not leftovers:
            # While the old side is left (and the new one cannot take over), its Service stays as it is.
            service = build_service(isvc)
            ensured = await self.children.ensure(
                service, body, self._current(known, ChildKind.SERVICE, service)
            )
            self.children.note(body, "Service", service["metadata"]["name"], ensured, repair, created)
        await self._ensure_network_policy(body, isvc, repair, created)
        if ChildKind.POD_MONITOR in kinds and await self.children.pod_monitor_wanted():
            for monitor in pod_monitors(isvc, new, self.config.pod_monitor_labels):
                current = self._current(known, ChildKind.POD_MONITOR, monitor)
                ensured = await self.children.ensure(monitor, body, current)
                self.children.note(body, "PodMonitor", monitor["metadata"]["name"], ensured, repair, created)
        if created and not repair:
            self.children.emit(body, ev.created(created))
        self._note_switch_started(body, switch, created, repair)
        if switched:
            await self._prune(old, body, ALL_KINDS)
            self.children.emit(body, switched_event(new.target, old.target))
        elif not leftovers and may_be_left(old, body):
            await self._prune(old, body, kinds)  # what the old side left besides its Deployments

        serving_old = switch is not None and not switched
        stable, topology = old.observe(leftovers) if serving_old else new.observe(states)
        canary = (
            await self.kube.get(deployment_path(isvc.metadata.namespace or "", meta["name"], Track.CANARY))
            if _reconciled_before(body)
            else None  # the tuner runs a canary only for a service the operator has reconciled
        )
        return Observation(
            generation=int(meta.get("generation") or 0),
            stable=stable,
            canary=deployment_state(canary),
            problem=desired.problem,
            topology=topology,
            switch=switch if serving_old else None,
            selector=",".join(f"{k}={v}" for k, v in selector_labels(isvc, Track.STABLE).items()),
        )

    async def _ensure_network_policy(
        self, body: Mapping[str, Any], isvc: InferenceService, repair: bool, created: list[tuple[str, str]]
    ) -> None:
        """The service's NetworkPolicies when it asks for them; on a spec change, none it no longer needs."""
        wanted = build_network_policies(isvc, self.config.network_peers) if wants_network_policy(isvc) else []
        for policy in wanted:
            ensured = await self.children.ensure(policy, body, UNKNOWN)
            self.children.note(body, "NetworkPolicy", policy["metadata"]["name"], ensured, repair, created)
        if repair or (not wanted and int(body["metadata"].get("generation") or 0) <= 1):
            return  # a spec never changed that wants none never had any to remove
        kept = {policy["metadata"]["name"] for policy in wanted}
        for name in network_policy_names(isvc):
            if name not in kept:
                path = resource_path("networking.k8s.io/v1", "networkpolicies", isvc.metadata.namespace, name)
                await self.children.delete_owned(path, body)

    @staticmethod
    def _current(
        known: Mapping[ChildKind, dict[str, Any] | None], kind: ChildKind, desired: Mapping[str, Any]
    ) -> Any:
        """The live child the triggering event already told about (the colocated one of ``kind``)."""
        name = desired["metadata"]["name"]
        service = desired["metadata"]["labels"][LABEL_SERVICE]
        return known.get(kind, UNKNOWN) if name == restored_name(kind, service) else UNKNOWN

    async def _ensure_side(
        self,
        body: Mapping[str, Any],
        isvc: InferenceService,
        desired: DesiredSide,
        known: Mapping[ChildKind, dict[str, Any] | None],
        repair: bool,
        created: list[tuple[str, str]],
    ) -> dict[str, dict[str, Any] | None]:
        """Apply the side's Deployments (and what they need first); the live ones by part.

        The rolled Deployments are rolled like the stable track (and get the live-adjust Secret),
        the rest are kept like any other child.
        """
        for manifest in desired.before:
            ensured = await self.children.ensure(manifest, body, UNKNOWN)
            self.children.note(body, manifest["kind"], manifest["metadata"]["name"], ensured, repair, created)
        states: dict[str, dict[str, Any] | None] = {}
        for part, manifest in desired.rolled.items():
            current = self._current(known, ChildKind.DEPLOYMENT, manifest)
            states[part] = await self.children.ensure_stable(body, isvc, manifest, current, repair, created)
        for part, manifest in desired.after.items():
            ensured = await self.children.ensure(manifest, body, UNKNOWN)
            self.children.note(body, "Deployment", manifest["metadata"]["name"], ensured, repair, created)
            states[part] = ensured.actual
        return states

    async def _left(self, side: Side, body: Mapping[str, Any]) -> dict[str, dict[str, Any] | None]:
        """The Deployments of ``side`` this service still owns, by part; empty when none is left."""
        found = {part: await self.children.owned(path, body) for part, path in side.deployments.items()}
        return found if any(found.values()) else {}

    async def _switch_service(
        self,
        body: Mapping[str, Any],
        isvc: InferenceService,
        new: Side,
        old: Side,
        switch: TopologySwitch,
        kinds: frozenset[ChildKind],
        known: Mapping[ChildKind, dict[str, Any] | None],
        repair: bool,
        created: list[tuple[str, str]],
    ) -> bool:
        """The Service while the topology changes: on the old side until the new one is Ready, then on it.

        True when the Service already selected the new side before this pass (its endpoints had a
        reconcile's time to follow): the old side may be deleted now.
        """
        if not switch.ready:
            if ChildKind.SERVICE in kinds:
                service = build_service(isvc, via_router=old.via_router)
                current = self._current(known, ChildKind.SERVICE, service)
                ensured = await self.children.ensure(service, body, current)
                self.children.note(body, "Service", service["metadata"]["name"], ensured, repair, created)
            return False
        ensured = await self.children.ensure(build_service(isvc, via_router=new.via_router), body, UNKNOWN)
        if ensured.written:  # the old side goes on the next pass: the echo of this write starts it
            self._switched.add((body["metadata"]["namespace"], body["metadata"]["name"]))
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
            self.children.emit(body, ev.EventSpec(ev.EventType.NORMAL, "TopologySwitching", switch.message()))

    async def _prune(self, side: Side, body: Mapping[str, Any], kinds: frozenset[ChildKind]) -> None:
        """Delete what this service owns of ``side`` (its Deployments, its PodMonitors), of ``kinds``."""
        if ChildKind.DEPLOYMENT in kinds:
            for path in side.deployments.values():
                await self.children.delete_owned(path, body)
        pools_unmonitored = side.mode is TopologyMode.DISAGGREGATED and not self.config.disaggregation
        if (
            ChildKind.POD_MONITOR in kinds
            and not pools_unmonitored
            and await self.children.pod_monitor_wanted()
        ):
            for path in side.monitors:
                await self.children.delete_owned(path, body)

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
        await self._write_status(meta["namespace"], meta["name"], observation, live_adjust_blocked, read=body)
        logger.info(
            "reconciled %s%s/%s (generation %s, %s)",
            "disaggregated " if isvc.spec.disaggregated else "",
            meta["namespace"],
            meta["name"],
            observation.generation,
            ", ".join(sorted(kinds)) if kinds else "status only",
        )

    async def _write_status(
        self,
        namespace: str,
        name: str,
        observation: Observation,
        live_adjust_blocked: bool = False,
        *,
        read: Mapping[str, Any] | None = None,
    ) -> None:
        """Write the status computed from ``observation``; conditional on resourceVersion, retried.

        ``read``: the service as this reconcile read it, tried first (no second read when it is
        still current: a conflict reads it afresh)."""
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
                self.children.emit(fresh, spec)

        if not await write_service_status(
            self.kube, namespace, name, patcher, skip_terminating=True, on_written=written, read=read
        ):
            raise kopf.TemporaryError(
                f"status of {namespace}/{name} kept changing underneath; retrying", delay=1
            )


def _reconciled_before(body: Mapping[str, Any]) -> bool:
    """Whether the operator has written this service's status before (its ``observedGeneration``)."""
    status = body.get("status")
    return isinstance(status, Mapping) and status.get("observedGeneration") is not None


def _retry_soon(error: BaseException) -> ApiUnavailable:
    delay = random.uniform(*TRANSIENT_RETRY_S)
    what = str(error) or type(error).__name__
    return ApiUnavailable(f"the API server did not answer ({what}); retrying in {delay:.0f} s", delay=delay)


def export_metrics(isvc: InferenceService, observation: Observation) -> None:
    """Set the engine-config gauges and the SLO targets: the operator is their one writer.

    Budget and max-num-seqs are what each track's pods run (a live-adjusted canary's limits
    included), removed while the track runs nothing; the SLO targets are removed without an SLO.
    """
    namespace, name = isvc.metadata.namespace or "", isvc.metadata.name or ""
    for track, state in ((Track.STABLE, observation.stable), (Track.CANARY, observation.canary)):
        config = state.running_config if state is not None else None
        if config is not None:
            telemetry.TOKEN_BUDGET.labels(namespace, name, track.value).set(config.max_num_batched_tokens)
            telemetry.MAX_NUM_SEQS.labels(namespace, name, track.value).set(config.max_num_seqs)
        else:
            for gauge in (telemetry.TOKEN_BUDGET, telemetry.MAX_NUM_SEQS):
                with contextlib.suppress(KeyError):
                    gauge.remove(namespace, name, track.value)
    slo = isvc.spec.slo
    telemetry.record_slo_targets(
        namespace,
        name,
        None if slo is None else ((slo.itl.quantile, slo.itl.max_ms), (slo.ttft.quantile, slo.ttft.max_ms)),
    )
