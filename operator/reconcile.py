"""The reconcile loop body: apply the desired children, correct drift, write status and Events.

Handlers call into :class:`Reconciler`; it does the I/O (through
:class:`~chunkpilot.operator.kube.KubeClient`) around the pure builders,
status functions and event selection. It owns a
:class:`~chunkpilot.operator.children.ChildWriter` (every child is written through it) and a
:class:`~chunkpilot.operator.disaggregated.DisaggregatedReconciler` (a disaggregated service, and
the switch between topologies) sharing that writer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf
from chunkpilot.operator import events as ev
from chunkpilot.operator.builders import (
    RenderError,
    build_pod_monitor,
    build_service,
    build_stable_deployment,
)
from chunkpilot.operator.children import UNKNOWN, ChildWriter, deployment_path, deployment_state
from chunkpilot.operator.config import OperatorConfig
from chunkpilot.operator.disaggregated import (
    DisaggregatedReconciler,
    may_have_pools,
    switched_event,
    topology_observation,
    was_disaggregated,
)
from chunkpilot.operator.drift import ALL_KINDS, ChildKind, is_operator_owned, is_terminating, restored_name
from chunkpilot.operator.engines import RenderProblem
from chunkpilot.operator.kube import KubeClient, KubeError
from chunkpilot.operator.objects import isvc_path, parse_status, write_service_status
from chunkpilot.operator.served import with_best_config, with_best_topology, with_live_adjust_condition
from chunkpilot.operator.status import Observation, TopologySwitch, compute_status, status_patch

from chunkpilot import telemetry
from chunkpilot.api import LABEL_SERVICE, InferenceService, InferenceServiceStatus, ManifestError, Track

logger = logging.getLogger(__name__)


@dataclass
class Reconciler:
    """Reconciles InferenceServices through one API client; safe to share across handlers."""

    kube: KubeClient
    config: OperatorConfig
    post_event: Callable[[Mapping[str, Any], ev.EventSpec], None] | None = None
    children: ChildWriter = field(init=False)
    pools: DisaggregatedReconciler = field(init=False)
    _locks: dict[tuple[str, str], asyncio.Lock] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.children = ChildWriter(self.kube, self.config, self.post_event)
        self.pools = DisaggregatedReconciler(self.children)

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
        try:
            isvc = InferenceService.from_manifest({k: v for k, v in body.items() if k != "status"})
        except ManifestError as error:
            raise kopf.PermanentError(str(error)) from None
        isvc = with_best_config(isvc, body.get("status"))
        live_adjust_blocked = self.config.live_adjust_blocked(isvc)
        isvc = with_best_topology(self.config.served(isvc), body.get("status"))
        if isvc.spec.disaggregated:
            observation = await self.pools.reconcile(body, isvc, kinds, known, repair)
        else:
            observation = await self._reconcile_colocated(body, isvc, kinds, known, repair)
        await self._report(body, isvc, observation, live_adjust_blocked, kinds)

    async def _reconcile_colocated(
        self,
        body: Mapping[str, Any],
        isvc: InferenceService,
        kinds: frozenset[ChildKind],
        known: dict[ChildKind, dict[str, Any] | None],
        repair: bool,
    ) -> Observation:
        """A colocated service: the stable Deployment (and live-adjust Secret), the Service, a PodMonitor.

        Pools and a router left from a disaggregated topology keep serving until the stable
        Deployment is Ready (see :meth:`DisaggregatedReconciler.switch_service`). Returns what the
        status is computed from.
        """
        meta = body["metadata"]
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
            stable = await self.children.ensure_stable(
                body, isvc, desired_stable, known.get(ChildKind.DEPLOYMENT, UNKNOWN), repair, created
            )
        else:
            stable = await self.kube.get(deployment_path(isvc, Track.STABLE))
        leftovers = await self.pools.leftovers(isvc, body) if may_have_pools(body) else {}
        switch = (
            TopologySwitch(
                "the stable Deployment", "the prefill/decode pools", (("stable", deployment_state(stable)),)
            )
            if leftovers and problem is None
            else None
        )
        switched = False
        if switch is not None:
            switched = await self.pools.switch_service(
                body, isvc, switch, to_router=False, kinds=kinds, known=known, repair=repair, created=created
            )

        # While pools are left, the Service is kept by DisaggregatedReconciler.switch_service.
        wanted = kinds - {ChildKind.SERVICE} if leftovers else kinds
        await self._ensure_service_and_monitor(body, isvc, wanted, known, repair, created)
        if created and not repair:
            self.children.emit(body, ev.created(created))
        self.pools.note_switch_started(body, switch, created, repair)
        if switched or (was_disaggregated(body) and not leftovers):
            await self.pools.remove_disaggregated_children(isvc, body, ALL_KINDS if switched else kinds)
            if switched:
                self.children.emit(body, switched_event("the stable Deployment", "the prefill/decode pools"))
        serving_old = switch is not None and not switched

        canary = await self.kube.get(deployment_path(isvc, Track.CANARY))
        return Observation(
            generation=int(meta.get("generation") or 0),
            stable=None if serving_old else deployment_state(stable),
            canary=deployment_state(canary),
            problem=problem,
            topology=topology_observation(leftovers) if serving_old else None,
            switch=switch if serving_old else None,
        )

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
                if not await self.children.pod_monitor_wanted():
                    continue
                desired = build_pod_monitor(isvc, self.config.pod_monitor_labels)
            else:
                desired = build_service(isvc)
            ensured = await self.children.ensure(desired, body, known.get(kind, UNKNOWN))
            self.children.note(body, kind.value, desired["metadata"]["name"], ensured, repair, created)

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
                self.children.emit(fresh, spec)

        if not await write_service_status(
            self.kube, namespace, name, patcher, skip_terminating=True, on_written=written
        ):
            raise kopf.TemporaryError(
                f"status of {namespace}/{name} kept changing underneath; retrying", delay=1
            )


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
