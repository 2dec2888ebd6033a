"""Observe: gather one :class:`~chunkpilot.tuner.observe.snapshot.Snapshot` of a service.

:class:`Observer` reads the InferenceService, its TuningTrials, the stable and canary Deployments,
the canary's pods, the live-adjustment token (only when a rollout may need it) and the measurements
from Prometheus: the stable track over the SLO window and, for a trial past its warm-up, canary and
stable over the trial's window; the twin is read by :mod:`chunkpilot.tuner.observe.twin`. Nothing
here writes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any, ParamSpec, Protocol, TypeVar

from chunkpilot.engine.metrics_names import tuner_metrics
from chunkpilot.operator.builders import (
    LIVE_ADJUST_SECRET,
    incumbent,
    live_adjust_token_key,
)
from chunkpilot.operator.config import OperatorConfig
from chunkpilot.operator.kube import KubeError, resource_path
from chunkpilot.operator.objects import (
    TOPOLOGY_PARTS,
    NameConflictError,
    canary_topology_deployment_path,
    deployment_path,
    isvc_path,
    owned_by,
    parse_status,
    trial_path,
)
from chunkpilot.operator.router import ENGINE_COMPONENT_LABEL
from chunkpilot.operator.served import with_best_topology
from chunkpilot.operator.status import DeploymentState
from chunkpilot.tuner import records as rec
from chunkpilot.tuner.measure import (
    MetricsUnavailableError,
    QueryFn,
    Selector,
    VectorFn,
    WindowMeasurement,
    measure_colocated_trial,
    measure_pools,
    measure_topology,
    measure_track,
    measure_track_batched,
    measure_window,
    rate_query,
)
from chunkpilot.tuner.observe import canary as live
from chunkpilot.tuner.observe.snapshot import (
    CanaryWindow,
    Reading,
    Snapshot,
    twin_checks,
    watches_topology,
    window_plan,
    window_text,
)
from chunkpilot.tuner.observe.twin import TwinObserver
from chunkpilot.tuner.observe.twinjobs import TwinJobs
from chunkpilot.tuner.planner import watches_startup
from chunkpilot.tuner.twin.online import TwinBudget

from chunkpilot.api import (
    LABEL_SERVICE,
    LABEL_TRACK,
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


class ReadKube(Protocol):
    """The read verbs observing needs."""

    async def get(self, path: str) -> dict[str, Any] | None: ...
    async def list(self, path: str, *, label_selector: str | None = None) -> list[dict[str, Any]]: ...


def parse_service(
    body: Mapping[str, Any], *, live_adjust: bool = True, image_registry: str | None = None
) -> InferenceService | None:
    """The typed service with its status (an invalid status reads as empty); None: invalid spec.

    ``live_adjust``: whether the installation allows ``autotune.liveAdjust`` (the tuner's settings,
    ``CHUNKPILOT_LIVE_ADJUST``); without it the service reads with live adjustment off, as the
    operator runs it; ``image_registry``: the one the installation pulls its default images from.
    """
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
    installation = OperatorConfig(live_adjust=live_adjust, image_registry=image_registry)
    served = installation.served(isvc.model_copy(update={"status": status}))
    return with_best_topology(served, body.get("status"))


class Observer:
    """Gathers a :class:`Snapshot` through the read verbs of the API and a Prometheus query function."""

    def __init__(
        self,
        kube: ReadKube,
        query: QueryFn | None,
        *,
        inline: bool = False,
        vector: VectorFn | None = None,
        live_adjust: bool = True,
        image_registry: str | None = None,
        twin_budget: TwinBudget | None = None,
        twin_jobs: TwinJobs | None = None,
        batch: VectorFn | None = None,
    ) -> None:
        self.kube = kube
        self.query = query
        #: Instant-vector queries, to ask all of a track's queries at once (None: one by one).
        self.batch = batch if query is not None else None
        self._inline = inline  # run blocking calls on the loop itself (tests)
        #: The installation allows ``autotune.liveAdjust`` (the tuner's settings).
        self.live_adjust = live_adjust
        #: The registry the installation's default images come from.
        self.image_registry = image_registry
        self.twins = TwinObserver(
            vector if query is not None else None, inline=inline, budget=twin_budget, jobs=twin_jobs
        )

    async def observe(self, namespace: str, name: str, now: datetime) -> Snapshot | None:
        """The snapshot of one service; None when it is gone, being deleted or invalid."""
        body = await self.kube.get(isvc_path(namespace, name))
        if body is None or body.get("metadata", {}).get("deletionTimestamp"):
            return None
        isvc = parse_service(body, live_adjust=self.live_adjust, image_registry=self.image_registry)
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
            pods = await self.kube.list(  # its engines (a colocated topology trial's router has its own)
                resource_path("v1", "pods", namespace),
                label_selector=f"{LABEL_SERVICE}={name},{LABEL_TRACK}={Track.CANARY.value},"
                f"{ENGINE_COMPONENT_LABEL}=engine",
            )
        snap = _replace(
            snap,
            stable=DeploymentState.from_manifest(stable) if stable is not None else None,
            canary=canary,
            canary_pods=tuple(pods),
            stable_pods=tuple(await self._stable_pods(snap)),
        )
        snap = await self._topology(snap)
        foreign = [c for c in (canary, *snap.topology_canary.values()) if c and not owned_by(c, body)]
        if foreign:
            snap = _replace(snap, conflicts=tuple(str(NameConflictError(c)) for c in foreign))
        snap = await self._token(snap)
        snap, final = await self._measure(snap)
        return _replace(snap, twin=await self.twins.observe(snap, final))

    async def _stable_pods(self, snap: Snapshot) -> list[dict[str, Any]]:
        """The stable engine pods, while the planner looks for their start-up time (else none)."""
        scaling, decided = snap.isvc.spec.scaling, snap.status.scaling
        if not scaling.plans or not watches_startup(
            decided.startup_seconds if decided is not None else None,
            decided.last_scale_time if decided is not None else None,
            scaling.acts,
            snap.now,
        ):
            return []
        return await self.kube.list(
            resource_path("v1", "pods", snap.namespace),
            label_selector=f"{LABEL_SERVICE}={snap.name},{LABEL_TRACK}={Track.STABLE.value}",
        )

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
        key = live_adjust_token_key(snap.name, Track.CANARY)
        try:
            secret = await self.kube.get(resource_path("v1", "secrets", snap.namespace, LIVE_ADJUST_SECRET))
        except (KubeError, OSError) as error:
            return _replace(snap, live_token_error=str(error))
        token = live.secret_token(secret, key)
        if token is None:
            return _replace(snap, live_token_error=f"no token {key} in Secret {LIVE_ADJUST_SECRET}")
        canary_uid = ((snap.canary or {}).get("metadata") or {}).get("uid")
        if not canary_uid or not snap.canary_pods:
            return _replace(snap, live_token=token)
        try:
            sets = await self.kube.list(
                resource_path("apps/v1", "replicasets", snap.namespace),
                label_selector=f"{LABEL_SERVICE}={snap.name},{LABEL_TRACK}={Track.CANARY.value}",
            )
        except (KubeError, OSError) as error:
            return _replace(snap, live_token_error=str(error))
        pods = live.owned_through(snap.canary_pods, sets, str(canary_uid))
        return _replace(snap, live_token=token, live_pods=pods)

    async def _measure(self, snap: Snapshot) -> tuple[Snapshot, CanaryWindow | None]:
        """The stable reading and the active trial's window; the window when it is final."""
        autotune, slo_spec = snap.isvc.spec.autotune, snap.isvc.spec.slo
        if self.query is None or slo_spec is None or not autotune.enabled:
            return snap, None
        if snap.isvc.spec.disaggregated:  # its stable engines are its pools, with knobs of their own
            snap = await self._pools(snap)
            active = snap.active()
            if active and active[0].spec.tries_colocated and not snap.stable_reading.down:
                snap = await self._colocated_window(await self._canary_rate(snap, active[0]), active[0])
            return snap, None
        slo = snap.slo
        selector = Selector(snap.name, snap.namespace, Track.STABLE, config_hash=snap.incumbent.config_hash())
        args = (selector, slo_spec.window, snap.now, slo.itl_quantile, slo.ttft_quantile)
        engine = str(snap.isvc.spec.engine.kind)
        try:
            if self.batch is not None:  # every query of the track in one request
                stable = await self._blocking(measure_track_batched, self.batch, self.query, *args, engine)
            else:
                stable = await self._blocking(measure_track, self.query, *args, engine)
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

    async def _pools(self, snap: Snapshot) -> Snapshot:
        """A disaggregated service's stable pools over the SLO window, each by its ``role`` (what the
        planner sizes on), and the stable reading they make together as its clients see them (what
        ``SLOMet`` and the status summary report)."""
        slo_spec = snap.isvc.spec.slo
        assert self.query is not None and slo_spec is not None
        slo = snap.slo
        try:
            pools = await self._blocking(
                measure_pools,
                self.query,
                snap.name,
                snap.namespace,
                slo_spec.window,
                snap.now,
                slo.itl_quantile,
                slo.ttft_quantile,
                str(snap.isvc.spec.engine.kind),
                min_samples=rec.abort_rules(snap.isvc).min_samples,
            )
        except MetricsUnavailableError as error:
            down: Reading[Any] = Reading(error=str(error))
            return _replace(snap, pools_reading=down, stable_reading=down)
        return _replace(snap, pools_reading=Reading(pools), stable_reading=Reading(pools.combined()))

    async def _trial_window(
        self, snap: Snapshot, trial: TuningTrial, measure: Callable[..., M], config_hash: str | None
    ) -> Reading[M] | None:
        """``measure`` over a measuring topology trial's window (widened past its end): its pools, or
        a colocated topology trial's canary engines, beside the stable; None: nothing to measure yet."""
        autotune = snap.isvc.spec.autotune
        if autotune.paused or rec.trial_phase(trial) is not TrialPhase.MEASURING:
            return None
        due = window_plan(
            rec.trial_progress(trial).measure_from, parse_duration(autotune.trial_window), snap.now
        )
        if due is None:
            return None
        at = due.widened_at or due.at
        assert self.query is not None
        slo = snap.slo
        try:
            found = await self._blocking(
                measure,
                self.query,
                snap.name,
                snap.namespace,
                window_text((at - due.measure_from).total_seconds()),
                at,
                slo.itl_quantile,
                slo.ttft_quantile,
                config_hash,
                str(snap.isvc.spec.engine.kind),
                min_samples=rec.abort_rules(snap.isvc).min_samples,
            )
        except MetricsUnavailableError as error:
            return Reading(error=str(error))
        return Reading(found)

    async def _topology_window(self, snap: Snapshot, trial: TuningTrial) -> Snapshot:
        """A measuring topology trial's pools and stable over its window (widened past its end)."""
        found = await self._trial_window(snap, trial, measure_topology, snap.incumbent.config_hash())
        return snap if found is None else _replace(snap, topology_window=found)

    async def _canary_rate(self, snap: Snapshot, trial: TuningTrial) -> Snapshot:
        """What a colocated topology trial's canary engines served over the SLO window: the pools are
        planned on the whole service's rate, theirs and the canary's share."""
        slo_spec = snap.isvc.spec.slo
        if snap.canary is None or slo_spec is None:
            return snap
        assert self.query is not None
        config_hash = rec.canary_config_hash(trial)
        selector = Selector(snap.name, snap.namespace, Track.CANARY, config_hash=config_hash)
        request = tuner_metrics(str(snap.isvc.spec.engine.kind)).request_success
        try:
            rate = await self._blocking(self.query, rate_query(request, selector, slo_spec.window), snap.now)
        except MetricsUnavailableError as error:
            logger.info("%s/%s: the canary's rate was not read: %s", snap.namespace, snap.name, error)
            return snap
        return _replace(snap, canary_rate=rate or 0.0)

    async def _colocated_window(self, snap: Snapshot, trial: TuningTrial) -> Snapshot:
        """A measuring colocated topology trial's canary engines and the stable pools over its window
        (widened past its end), as ``snap.window``."""
        hashed = rec.canary_config_hash(trial)
        found = await self._trial_window(snap, trial, measure_colocated_trial, hashed)
        return snap if found is None else _replace(snap, window=found)

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
