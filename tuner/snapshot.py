"""Observe: one frozen snapshot of everything a tuning step decides from.

:func:`observe` reads the InferenceService, its TuningTrials, the stable and canary
Deployments, the canary's pods, the live-adjustment token (only when a rollout may
need it) and the measurements from Prometheus: the stable track over the SLO window
and, for a trial past its warm-up, canary and stable over the trial's window. An
unanswered Prometheus is an explicit :attr:`Reading.error`, never a value of the
measurement. Nothing here writes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Final, Generic, ParamSpec, Protocol, TypeVar

from chunkpilot.operator.builders import (
    deployment_name,
    incumbent,
    live_adjust_secret_name,
    pool_deployment_name,
)
from chunkpilot.operator.config import OperatorConfig, live_adjust_allowed
from chunkpilot.operator.kube import KubeError, resource_path
from chunkpilot.operator.objects import isvc_path, parse_status
from chunkpilot.operator.router import router_name
from chunkpilot.operator.served import with_best_topology
from chunkpilot.operator.status import POOL_PARTS, DeploymentState, TopologyPart
from chunkpilot.tuner import liveadjust as live
from chunkpilot.tuner import records as rec
from chunkpilot.tuner.calibration import CanaryWindow, TwinObserver, TwinReading
from chunkpilot.tuner.measure import (
    MetricsUnavailableError,
    QueryFn,
    Selector,
    TopologyWindow,
    TrackMeasurement,
    VectorFn,
    WindowMeasurement,
    measure_topology,
    measure_track,
    measure_window,
)
from chunkpilot.tuner.policy import AbortRules, Decision, SLOTargets, judge_early, trial_deadline

from chunkpilot.api import (
    API_VERSION,
    LABEL_SERVICE,
    LABEL_TRACK,
    TRIAL_PLURAL,
    EngineConfig,
    InferenceService,
    InferenceServiceStatus,
    ManifestError,
    Track,
    TrialPhase,
    TuningTrial,
    parse_duration,
)

logger = logging.getLogger(__name__)
P = ParamSpec("P")
T = TypeVar("T")
M = TypeVar("M")

#: The shortest window the early-abort check looks at (Prometheus needs a few scrapes for a rate).
MIN_EARLY_WINDOW_S = 5


class ReadKube(Protocol):
    """The read verbs observing needs."""

    async def get(self, path: str) -> dict[str, Any] | None: ...
    async def list(self, path: str, *, label_selector: str | None = None) -> list[dict[str, Any]]: ...


@dataclass(frozen=True)
class Reading(Generic[M]):
    """A measurement, or why Prometheus gave none (``error``); both None: not asked."""

    value: M | None = None
    error: str | None = None

    @property
    def down(self) -> bool:
        return self.error is not None


@dataclass(frozen=True)
class WindowPlan:
    """The trial window due now: from ``measure_from`` to ``at`` (``final`` once the window is over)."""

    measure_from: datetime
    end: datetime
    deadline: datetime
    final: bool
    at: datetime
    span_s: float
    #: Past the end: the window widened up to now (capped at the deadline), for too few samples.
    widened_at: datetime | None


def twin_checks(
    plan: WindowPlan, window: WindowMeasurement | None, slo: SLOTargets, abort: AbortRules
) -> bool:
    """Whether the twin checks the canary on this window: at its end, or when the canary is pruned on it."""
    if window is None:
        return False
    return plan.final or judge_early(window.canary, slo, abort).decision is Decision.PRUNE


def window_plan(measure_from: datetime | None, window_s: float, now: datetime) -> WindowPlan | None:
    """What to measure for a trial whose window starts at ``measure_from``; None: nothing yet."""
    start = measure_from or now
    if now < start:
        return None  # warming up
    end = start + timedelta(seconds=window_s)
    final = now >= end
    at = end if final else now
    span = (at - start).total_seconds()
    if not final and span < MIN_EARLY_WINDOW_S:
        return None
    deadline = start + trial_deadline(timedelta(seconds=window_s))
    return WindowPlan(start, end, deadline, final, at, span, min(now, deadline) if now > end else None)


def window_text(total_s: float) -> str:
    return f"{max(1, int(total_s))}s"


@dataclass(frozen=True)
class Snapshot:
    """What one step knows about a service; frozen, gathered before anything is decided."""

    body: Mapping[str, Any]
    isvc: InferenceService
    status: InferenceServiceStatus
    trials: tuple[TuningTrial, ...]
    now: datetime
    #: What the stable track runs (:func:`chunkpilot.operator.builders.incumbent`).
    incumbent: EngineConfig
    stable: DeploymentState | None = None
    canary: Mapping[str, Any] | None = None
    canary_pods: tuple[Mapping[str, Any], ...] = ()
    #: A Prometheus is configured.
    prometheus: bool = False
    #: Stable over the SLO window (not asked without Prometheus, SLO or autotuning).
    stable_reading: Reading[TrackMeasurement] = Reading()
    #: The active trial's window, and the widened one past its end (asked only when due).
    window: Reading[WindowMeasurement] = Reading()
    widened: Reading[WindowMeasurement] = Reading()
    #: The live-adjustment bearer token, or why there is none (read only for a rollout to finish).
    live_token: str | None = None
    live_token_error: str | None = None
    #: The service's digital twin (fit, ranking, the active canary's check); empty: not looked at.
    twin: TwinReading = field(default_factory=TwinReading)
    #: A topology trial's canary Deployments by part (``prefill``, ``decode``, ``router``; None:
    #: absent) and their pods; empty: not looked at (see :func:`watches_topology`).
    topology_canary: Mapping[str, Mapping[str, Any] | None] = field(default_factory=dict)
    topology_pods: tuple[Mapping[str, Any], ...] = ()
    #: The active topology trial's window (its end, or widened past it; asked only when due).
    topology_window: Reading[TopologyWindow] = Reading()

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.body["metadata"]["namespace"])

    @property
    def slo(self) -> SLOTargets:
        return rec.slo_targets(self.isvc) if self.isvc.spec.slo is not None else SLOTargets(1.0, 1.0)

    def active(self) -> list[TuningTrial]:
        """The active trials, oldest first (at most one, but a crash may have left more)."""
        return sorted((t for t in self.trials if rec.is_active(t)), key=lambda t: t.spec.number)


#: The parts of a canary topology, as :attr:`Snapshot.topology_canary` keys them.
TOPOLOGY_PARTS: Final = tuple(TopologyPart)


def canary_topology_deployment_path(namespace: str, service: str, part: str) -> str:
    """The canary Deployment of a topology trial's ``part`` (a pool's role, or ``router``)."""
    name = (
        router_name(service, Track.CANARY)
        if part == TopologyPart.ROUTER
        else pool_deployment_name(service, part, Track.CANARY)
    )
    return resource_path("apps/v1", "deployments", namespace, name)


def canary_topology_paths(namespace: str, service: str, *, pools: bool = True) -> list[str]:
    """The objects of a canary topology in the order they are deleted: the router and its RBAC, then
    (``pools``) both pools: the router never outlives the backends it routes to."""
    router = router_name(service, Track.CANARY)
    return [
        canary_topology_deployment_path(namespace, service, TopologyPart.ROUTER),
        resource_path("rbac.authorization.k8s.io/v1", "rolebindings", namespace, router),
        resource_path("rbac.authorization.k8s.io/v1", "roles", namespace, router),
        resource_path("v1", "serviceaccounts", namespace, router),
        *(canary_topology_deployment_path(namespace, service, part) for part in POOL_PARTS if pools),
    ]


def watches_topology(isvc: InferenceService, trials: tuple[TuningTrial, ...]) -> bool:
    """Whether a step looks at canary topologies: the service allows them, or has had a topology trial."""
    return isvc.spec.autotune.allow_topology_change or any(t.spec.is_topology for t in trials)


def trial_path(namespace: str, name: str | None = None, sub: str | None = None) -> str:
    return resource_path(API_VERSION, TRIAL_PLURAL, namespace, name, sub)


def deployment_path(namespace: str, service: str, track: Track) -> str:
    return resource_path("apps/v1", "deployments", namespace, deployment_name(service, track))


def parse_service(body: Mapping[str, Any]) -> InferenceService | None:
    """The typed service with its status (an invalid status reads as empty); None: invalid spec."""
    meta = body.get("metadata", {})
    try:
        isvc = InferenceService.from_manifest({k: v for k, v in body.items() if k != "status"})
    except ManifestError as error:
        logger.warning(
            "%s/%s: not tuning an invalid InferenceService: %s",
            meta.get("namespace"),
            meta.get("name"),
            error,
        )
        return None
    status = parse_status(body.get("status")) or InferenceServiceStatus()
    # The service as the operator runs it, through the operator's own functions: the installation's
    # liveAdjust switch first, then a topology a topology trial promoted (status.bestTopology).
    served = OperatorConfig(live_adjust=live_adjust_allowed()).served(
        isvc.model_copy(update={"status": status})
    )
    return with_best_topology(served, body.get("status"))


class Observer:
    """Gathers a :class:`Snapshot` through the read verbs of the API and a Prometheus query function."""

    def __init__(
        self, kube: ReadKube, query: QueryFn | None, *, inline: bool = False, vector: VectorFn | None = None
    ) -> None:
        self.kube = kube
        self.query = query
        self._inline = inline  # run blocking calls on the loop itself (tests)
        self.twins = TwinObserver(vector if query is not None else None, inline=inline)

    async def observe(self, namespace: str, name: str, now: datetime) -> Snapshot | None:
        """The snapshot of one service; None when it is gone, being deleted or invalid."""
        body = await self.kube.get(isvc_path(namespace, name))
        if body is None or body.get("metadata", {}).get("deletionTimestamp"):
            return None
        isvc = parse_service(body)
        if isvc is None:
            return None
        assert isvc.status is not None
        snap = Snapshot(
            body=body,
            isvc=isvc,
            status=isvc.status,
            trials=tuple(await self._trials(namespace, name)),
            now=now,
            incumbent=incumbent(isvc),
            prometheus=self.query is not None,
        )
        stable = await self.kube.get(deployment_path(namespace, name, Track.STABLE))
        canary = await self.kube.get(deployment_path(namespace, name, Track.CANARY))
        pods: list[dict[str, Any]] = []
        if canary is not None:
            pods = await self.kube.list(
                resource_path("v1", "pods", namespace),
                label_selector=f"{LABEL_SERVICE}={name},{LABEL_TRACK}={Track.CANARY.value}",
            )
        snap = _replace(
            snap,
            stable=DeploymentState.from_manifest(stable) if stable is not None else None,
            canary=canary,
            canary_pods=tuple(pods),
        )
        snap = await self._topology(snap)
        snap = await self._token(snap)
        snap, final = await self._measure(snap)
        return _replace(snap, twin=await self.twins.observe(snap, final))

    async def _trials(self, namespace: str, service: str) -> list[TuningTrial]:
        items = await self.kube.list(trial_path(namespace), label_selector=f"{LABEL_SERVICE}={service}")
        result = []
        for item in items:
            try:
                result.append(TuningTrial.from_manifest(item))
            except ManifestError as error:
                logger.warning("%s/%s: skipping invalid TuningTrial: %s", namespace, service, error)
        return sorted(result, key=lambda t: t.spec.number)

    async def _topology(self, snap: Snapshot) -> Snapshot:
        """A topology trial's canary Deployments and pods (only for a service that may have them)."""
        if not watches_topology(snap.isvc, snap.trials):
            return snap
        parts = {
            part: await self.kube.get(canary_topology_deployment_path(snap.namespace, snap.name, part))
            for part in TOPOLOGY_PARTS
        }
        pods: list[dict[str, Any]] = []
        if any(parts.values()):
            pods = await self.kube.list(
                resource_path("v1", "pods", snap.namespace),
                label_selector=f"{LABEL_SERVICE}={snap.name},{LABEL_TRACK}={Track.CANARY.value}",
            )
        return _replace(snap, topology_canary=parts, topology_pods=tuple(pods))

    async def _token(self, snap: Snapshot) -> Snapshot:
        """Read the live-adjustment token when a trial's rollout may end in an adjustment."""
        active = snap.active()
        if not live.enabled(snap.isvc) or not active:
            return snap
        if rec.trial_phase(active[0]) not in (TrialPhase.PENDING, TrialPhase.ROLLING_OUT):
            return snap
        secret_name = live_adjust_secret_name(snap.name)
        try:
            secret = await self.kube.get(resource_path("v1", "secrets", snap.namespace, secret_name))
        except (KubeError, OSError) as error:
            return _replace(snap, live_token_error=str(error))
        token = live.secret_token(secret)
        if token is None:
            return _replace(snap, live_token_error=f"no live-adjustment token in Secret {secret_name}")
        return _replace(snap, live_token=token)

    async def _measure(self, snap: Snapshot) -> tuple[Snapshot, CanaryWindow | None]:
        """The stable reading and the active trial's window; the window when it is final."""
        autotune, slo_spec = snap.isvc.spec.autotune, snap.isvc.spec.slo
        if self.query is None or slo_spec is None or not autotune.enabled:
            return snap, None
        slo = snap.slo
        selector = Selector(snap.name, snap.namespace, Track.STABLE, config_hash=snap.incumbent.config_hash())
        try:
            stable = await self._blocking(
                measure_track,
                self.query,
                selector,
                slo_spec.window,
                snap.now,
                slo.itl_quantile,
                slo.ttft_quantile,
                str(snap.isvc.spec.engine.kind),
            )
        except MetricsUnavailableError as error:
            return _replace(snap, stable_reading=Reading(error=str(error))), None
        snap = _replace(snap, stable_reading=Reading(stable))
        active = snap.active()
        trial = active[0] if active else None
        if trial is not None and trial.spec.is_topology:
            return await self._topology_window(snap, trial), None
        if (
            autotune.paused
            or trial is None
            or rec.trial_phase(trial) is not TrialPhase.MEASURING
            or live.canary_owner(snap.canary) != trial.metadata.name
        ):
            return snap, None
        plan = window_plan(
            rec.trial_progress(trial).measure_from, parse_duration(autotune.trial_window), snap.now
        )
        if plan is None:
            return snap, None
        snap = _replace(snap, window=await self._window(snap, trial, plan.span_s, plan.at))
        if plan.widened_at is not None and not snap.window.down:
            span = (plan.widened_at - plan.measure_from).total_seconds()
            snap = _replace(snap, widened=await self._window(snap, trial, span, plan.widened_at))
        checked = twin_checks(plan, snap.window.value, snap.slo, rec.abort_rules(snap.isvc))
        final = CanaryWindow(trial, plan.span_s, plan.at) if checked else None
        return snap, final

    async def _topology_window(self, snap: Snapshot, trial: TuningTrial) -> Snapshot:
        """A measuring topology trial's pools and stable over its window (widened past its end)."""
        autotune = snap.isvc.spec.autotune
        if autotune.paused or rec.trial_phase(trial) is not TrialPhase.MEASURING:
            return snap
        due = window_plan(
            rec.trial_progress(trial).measure_from, parse_duration(autotune.trial_window), snap.now
        )
        if due is None:
            return snap
        at = due.widened_at or due.at
        assert self.query is not None
        slo = snap.slo
        try:
            window = await self._blocking(
                measure_topology,
                self.query,
                snap.name,
                snap.namespace,
                window_text((at - due.measure_from).total_seconds()),
                at,
                slo.itl_quantile,
                slo.ttft_quantile,
                snap.incumbent.config_hash(),
                str(snap.isvc.spec.engine.kind),
                min_samples=rec.abort_rules(snap.isvc).min_samples,
            )
        except MetricsUnavailableError as error:
            return _replace(snap, topology_window=Reading(error=str(error)))
        return _replace(snap, topology_window=Reading(window))

    async def _window(
        self, snap: Snapshot, trial: TuningTrial, span_s: float, at: datetime
    ) -> Reading[WindowMeasurement]:
        assert self.query is not None
        slo = snap.slo
        hashes = {Track.CANARY: rec.canary_config_hash(trial), Track.STABLE: snap.incumbent.config_hash()}
        try:
            window = await self._blocking(
                measure_window,
                self.query,
                snap.name,
                snap.namespace,
                window_text(span_s),
                at,
                slo.itl_quantile,
                slo.ttft_quantile,
                None,
                hashes,
                str(snap.isvc.spec.engine.kind),
                min_samples=rec.abort_rules(snap.isvc).min_samples,
            )
        except MetricsUnavailableError as error:
            return Reading(error=str(error))
        return Reading(window)

    async def _blocking(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a blocking call (Prometheus queries) off the event loop."""
        if self._inline:
            return fn(*args, **kwargs)
        return await asyncio.to_thread(fn, *args, **kwargs)


def _replace(snap: Snapshot, **changes: Any) -> Snapshot:
    return replace(snap, **changes)
