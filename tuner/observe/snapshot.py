"""Observe: one frozen snapshot of everything a tuning step decides from.

:class:`Snapshot` holds the InferenceService, its TuningTrials, the stable and canary Deployments,
the canary's pods, the live-adjustment token, the measurements from Prometheus (an unanswered
Prometheus is an explicit :attr:`Reading.error`, never a value of the measurement) and what
observing found out about the twin (:class:`TwinReading`). Frozen data and pure views of it only:
:mod:`chunkpilot.tuner.observe.observer` gathers it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar

from chunkpilot.operator.status import DeploymentState
from chunkpilot.tuner import records as rec
from chunkpilot.tuner.measure import (
    PoolsMeasurement,
    TopologyWindow,
    TrackMeasurement,
    WindowMeasurement,
)
from chunkpilot.tuner.policy import AbortRules, Decision, SLOTargets, judge_early, trial_deadline
from chunkpilot.tuner.topology.pools import PoolCheck
from chunkpilot.tuner.topology.recommend import RecommendationResult
from chunkpilot.tuner.topology.sizing import PoolCapacities
from chunkpilot.tuner.twin.online import Calibration, CanaryCheck

from chunkpilot.api import (
    EngineConfig,
    InferenceService,
    InferenceServiceStatus,
    TopologyMode,
    TuningTrial,
    TwinState,
)

M = TypeVar("M")

#: The shortest window the early-abort check looks at (Prometheus needs a few scrapes for a rate).
MIN_EARLY_WINDOW_S = 5


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
class TwinReading:
    """What observing found out about the twin this step (``state`` None: not looked at)."""

    state: TwinState | None = None
    message: str = ""
    calibration: Calibration | None = None
    #: The calibration carries a ranking made this step (to be recorded on the service).
    ranked: bool = False
    key: str | None = None
    refit_trial: int | None = None
    live_rate_req_s: float | None = None
    measured_ms: tuple[float | None, float | None] = (None, None)
    #: The active trial's canary against the twin, at the end of its window, and the stable track
    #: against it in the same window (the twin's error that the verdict uses).
    check: CanaryCheck | None = None
    stable_check: CanaryCheck | None = None
    #: Prefill/decode disaggregation evaluated on the twin this step (only once SLOInfeasible).
    recommendation: RecommendationResult | None = None
    #: Why the twin waits for a window of steady traffic before it refits ("": it does not); the
    #: last calibration stands meanwhile, and no next trial starts.
    settling: str = ""
    #: What the ranking waits for while it runs as a Job ("": nothing); the fit is this step's, the
    #: last ranking's status stands, and no next trial starts until the Job's ranking arrives.
    pending: str = ""
    #: The active topology trial's layout predicted on its pools' own steps, once its window is final
    #: (its ``key`` names the trial); None: not (yet) computed.
    pools: PoolCheck | None = None
    #: The twin's ITL and TTFT quantiles (ms) of the stable config at the live rate split over N
    #: replicas, by N (the planner's decision and the replicas running; computed at most every
    #: half minute).
    forecast: Mapping[int, tuple[float, float]] = field(default_factory=dict)
    #: One replica's sustained capacity at SLO of the stable config, and at the SLO tightened by the
    #: twin's error (req/s; once per fit); None: not computed (the planner uses the ranking's).
    planning: tuple[float, float] | None = None
    #: One replica's capacity of each pool: a sized disaggregated service's running pools, on a twin
    #: fitted to their own telemetry (refitted at most every few minutes); a sized colocated
    #: service's replicas split into pools, on its twin (once per fit); None: not computed.
    pool_capacities: PoolCapacities | None = None


@dataclass(frozen=True)
class CanaryWindow:
    """The final window of the active trial (what the canary check compares)."""

    trial: TuningTrial
    span_s: float
    at: datetime


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
    #: The stable engine pods (every pool's), read only while the planner looks for their start-up
    #: time (:func:`~chunkpilot.tuner.planner.watches_startup`).
    stable_pods: tuple[Mapping[str, Any], ...] = ()
    #: A Prometheus is configured.
    prometheus: bool = False
    #: Stable over the SLO window (not asked without Prometheus, SLO or autotuning).
    stable_reading: Reading[TrackMeasurement] = Reading()
    #: A disaggregated service's stable pools over the SLO window (``stable_reading`` is then the
    #: two together, as clients see them).
    pools_reading: Reading[PoolsMeasurement] = Reading()
    #: A colocated topology trial's canary engines' request rate over the SLO window (req/s).
    canary_rate: float | None = None
    #: The active trial's window, and the widened one past its end (asked only when due).
    window: Reading[WindowMeasurement] = Reading()
    widened: Reading[WindowMeasurement] = Reading()
    #: The live-adjustment bearer token, or why there is none (read only for a rollout to finish).
    live_token: str | None = None
    live_token_error: str | None = None
    #: The canary pods whose owner chain (ReplicaSet, then Deployment) ends at the canary Deployment,
    #: checked by uid: the only pods the token is sent to (read with it).
    live_pods: tuple[Mapping[str, Any], ...] = ()
    #: The service's digital twin (fit, ranking, the active canary's check); empty: not looked at.
    twin: TwinReading = field(default_factory=TwinReading)
    #: A topology trial's canary Deployments by part (``prefill``, ``decode``, ``router``; None:
    #: absent) and their pods; empty: not looked at (see :func:`watches_topology`).
    topology_canary: Mapping[str, Mapping[str, Any] | None] = field(default_factory=dict)
    topology_pods: tuple[Mapping[str, Any], ...] = ()
    #: The active topology trial's window (its end, or widened past it; asked only when due).
    topology_window: Reading[TopologyWindow] = Reading()
    #: Objects of a canary's name (Deployment, router) that exist and are not the service's: why
    #: nothing is tried while they are there.
    conflicts: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.body["metadata"]["namespace"])

    @property
    def slo(self) -> SLOTargets:
        return rec.slo_targets(self.isvc) if self.isvc.spec.slo is not None else SLOTargets(1.0, 1.0)

    def service_rate(self) -> float | None:
        """The live request rate over the whole service (req/s): the rate requests arrived at the
        stable track (:attr:`~chunkpilot.tuner.measure.TrackMeasurement.offered_rate`: what it was
        asked to serve, not only what it completed), plus a stable replica's share for every canary
        pod the Service also spreads requests over (None: not measured). Counted on the pods
        measured, not the replicas asked for: right after a change of replicas they differ."""
        stable = self.stable_reading.value
        if stable is None:
            return None
        per_replica = stable.per_replica(stable.offered_rate)
        if per_replica is None:
            return None
        return per_replica * (stable.replicas + len(self.canary_pods))

    def runs_promoted_pools(self) -> bool:
        """The service runs pools a topology trial promoted (``status.bestTopology``), not pools its
        manifest declares."""
        declared = ((self.body.get("spec") or {}).get("topology") or {}).get("mode")
        return (
            self.isvc.spec.disaggregated
            and self.status.best_topology is not None
            and declared != TopologyMode.DISAGGREGATED.value
        )

    def pools_rate(self) -> float | None:
        """The live request rate over a disaggregated service (req/s): the rate requests arrived at
        its pools (the decode pool's completions plus the growth of the requests in both pools'
        engines), plus what a colocated topology trial's canary engines served over the same
        window; None: not measured."""
        pools = self.pools_reading.value
        rate = pools.combined().offered_rate if pools is not None else None
        if rate is None or self.canary_rate is None:
            return rate
        return rate + self.canary_rate

    def active(self) -> list[TuningTrial]:
        """The active trials, oldest first (at most one, but a crash may have left more)."""
        return sorted((t for t in self.trials if rec.is_active(t)), key=lambda t: t.spec.number)


def watches_topology(isvc: InferenceService, trials: tuple[TuningTrial, ...]) -> bool:
    """Whether a step looks at canary topologies: the service allows them, or has had a topology trial."""
    return isvc.spec.autotune.allow_topology_change or any(t.spec.is_topology for t in trials)
