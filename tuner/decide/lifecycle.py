"""The trial lifecycle both kinds of trial share: settings, rollout checks, warm-up, metrics gaps,
abort and finish (pure: a plan filled).

A colocated trial's phases (:mod:`chunkpilot.tuner.decide.phases`) and a topology trial's
(:mod:`chunkpilot.tuner.decide.topology_trial`) are built on these steps; neither imports the other."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from chunkpilot.operator.events import EventType
from chunkpilot.operator.status import DeploymentState, TopologyPart
from chunkpilot.tuner import records as rec
from chunkpilot.tuner.decide import twin as twinplan
from chunkpilot.tuner.decide.canary import delete_canary, park_or_delete
from chunkpilot.tuner.decide.plan import (
    Action,
    CountFinished,
    CurrentTrialGauge,
    DeleteCanaryTopology,
    Log,
    MirrorStudy,
    PatchTrial,
    Plan,
)
from chunkpilot.tuner.measure import WindowMeasurement
from chunkpilot.tuner.observe.snapshot import Reading, WindowPlan, window_plan
from chunkpilot.tuner.policy import (
    Decision,
    SLOTargets,
)
from chunkpilot.tuner.space import SearchSpace, SpaceError, build_space

from chunkpilot.api import (
    LABEL_CONFIG_HASH,
    ConditionStatus,
    ConditionType,
    Constraints,
    Measurement,
    TrialPhase,
    TrialProgress,
    TrialSummary,
    TrialVerdict,
    TuningTrial,
    TuningTrialStatus,
    parse_duration,
)


@dataclass(frozen=True)
class TunerSettings:
    """Timing and safety limits of the loop that are not part of the API."""

    #: Longest a canary may take to become Ready before the trial is aborted.
    rollout_timeout_s: float = 900.0
    #: Restarts of a canary container that abort its trial (1: the first crash).
    crash_restarts: int = 1
    #: How long Prometheus may be unreachable during a trial before the trial is aborted
    #: (None: the trial window).
    metrics_outage_abort_s: float | None = None
    #: SLO violated for this long after tuning stopped starts a new tuning round
    #: (None: the SLO window).
    retune_after_s: float | None = None
    #: The installation runs disaggregated topologies (the chart's ``disaggregation.enabled``): a
    #: topology trial's router needs its RBAC.
    disaggregation: bool = True


VERDICTS = {
    Decision.PROMOTE: (TrialPhase.PROMOTED, TrialVerdict.PROMOTED),
    Decision.DISCARD: (TrialPhase.ROLLED_BACK, TrialVerdict.DISCARDED),
    Decision.PRUNE: (TrialPhase.PRUNED, TrialVerdict.PRUNED),
}


def space_of(plan: Plan) -> SearchSpace | None:
    """The service's search space (None when it cannot be built)."""
    try:
        return build_space(rec.service_facts(plan.snap.isvc), rec.space_bounds(plan.snap.isvc))
    except SpaceError:
        return None


def crash_message(
    pods: Iterable[Mapping[str, Any]], limit: int, config_hash: str | None = None
) -> str | None:
    """Why the canary counts as crashed (a container restarted ``limit`` times or is in back-off).

    Pods being deleted and pods of another config (an earlier trial's) are not looked at.
    """
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            continue
        if config_hash is not None and (meta.get("labels") or {}).get(LABEL_CONFIG_HASH) != config_hash:
            continue
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            waiting = (status.get("state") or {}).get("waiting") or {}
            restarts = int(status.get("restartCount") or 0)
            if restarts >= limit or waiting.get("reason") == "CrashLoopBackOff":
                last = ((status.get("lastState") or {}).get("terminated")) or {}
                details = [f"{restarts} restart(s)"]
                if waiting.get("reason"):
                    details.append(str(waiting["reason"]))
                if "exitCode" in last:
                    details.append(f"exit code {last['exitCode']}")
                return f"canary pod {pod['metadata']['name']} crashed ({', '.join(details)})"
    return None


def excess_constraints(m: Measurement | None, slo: SLOTargets) -> Constraints | None:
    if m is None or m.itl_ms is None or m.ttft_ms is None:
        return None
    return Constraints(itl=round(m.itl_ms - slo.itl_ms, 1), ttft=round(m.ttft_ms - slo.ttft_ms, 1))


def status_patch(status: TuningTrialStatus) -> dict[str, object]:
    return {"status": status.to_k8s()}


def metrics_down(plan: Plan, error: str) -> None:
    before = plan.current_condition(ConditionType.METRICS_UNAVAILABLE)
    if before is None or before.status != ConditionStatus.TRUE:
        plan.emit(EventType.WARNING, "MetricsUnavailable", f"tuning paused: {error}")
    plan.condition(
        ConditionType.METRICS_UNAVAILABLE,
        ConditionStatus.TRUE,
        "PrometheusUnreachable",
        f"tuning paused, nothing is promoted: {error}",
    )


def metrics_ok(plan: Plan) -> None:
    plan.condition(
        ConditionType.METRICS_UNAVAILABLE, ConditionStatus.FALSE, "MetricsAvailable", "Prometheus answers"
    )


def ready(state: DeploymentState) -> bool:
    """The Deployment rolled out and all its desired replicas are Ready."""
    return state.rollout_complete and state.ready >= state.desired > 0


def rollout_failure(
    states: Sequence[DeploymentState],
    what: str,
    since: datetime | None,
    now: datetime,
    settings: TunerSettings,
) -> str | None:
    """Why a rollout that is not Ready yet failed: a Deployment past its progress deadline, or
    ``what`` not Ready within the rollout timeout since ``since``; None: keep waiting."""
    if any(s.progress_deadline_exceeded for s in states):
        return f"{what} Deployment exceeded its progress deadline"
    if since is not None and (now - since).total_seconds() > settings.rollout_timeout_s:
        return f"{what} did not become Ready within {settings.rollout_timeout_s:g}s"
    return None


def start_warmup(plan: Plan, trial: TuningTrial, progress: TrialProgress) -> list[Action]:
    """Ready now: phase Measuring, its window starting after the warm-up (``progress`` kept)."""
    snap, name = plan.snap, trial.metadata.name or ""
    warmup = timedelta(seconds=parse_duration(snap.isvc.spec.autotune.warmup))
    ready = progress.model_copy(update={"ready_at": snap.now, "measure_from": snap.now + warmup})
    phase = TuningTrialStatus(phase=TrialPhase.MEASURING)
    return [PatchTrial(name, rec.progress_patch(ready)), PatchTrial(name, status_patch(phase))]


def restart_window(plan: Plan, trial: TuningTrial, progress: TrialProgress) -> None:
    """Prometheus answers again after a gap: the window has a hole, so measure again from now on."""
    restarted = progress.model_copy(update={"metrics_gap_since": None, "measure_from": plan.snap.now})
    plan.do(PatchTrial(trial.metadata.name or "", rec.progress_patch(restarted)))
    plan.emit(
        EventType.NORMAL,
        "MetricsRestored",
        f"trial {trial.spec.number}: Prometheus answers again; restarting the measurement window",
    )


def metrics_gap(plan: Plan, trial: TuningTrial, error: str | None, settings: TunerSettings) -> None:
    """Note when Prometheus stopped answering during the trial; abort after a long outage."""
    snap = plan.snap
    if error is not None:
        metrics_down(plan, error)
    progress = rec.trial_progress(trial)
    since = progress.metrics_gap_since
    if since is None:
        gap = progress.model_copy(update={"metrics_gap_since": snap.now})
        plan.do(PatchTrial(trial.metadata.name or "", rec.progress_patch(gap)))
        return
    limit = settings.metrics_outage_abort_s
    if limit is None:
        limit = float(parse_duration(snap.isvc.spec.autotune.trial_window))
    if (snap.now - since).total_seconds() > limit:
        abort(plan, trial, f"Prometheus unreachable for more than {limit:g}s; not judging without data")


M = TypeVar("M")


def due_measurement(
    plan: Plan, trial: TuningTrial, reading: Reading[M], missing: str, settings: TunerSettings
) -> tuple[WindowPlan, M] | None:
    """The trial's window to judge now and its measurement, or None when there is nothing to judge.

    Nothing while warming up or while the window is too short yet; nothing during a metrics gap
    (noted, the trial aborted after a long outage; ``missing`` says why when Prometheus gave no
    error); nothing right after one either (the window restarts from now).
    """
    snap = plan.snap
    progress = rec.trial_progress(trial)
    due = window_plan(progress.measure_from, parse_duration(snap.isvc.spec.autotune.trial_window), snap.now)
    if due is None:
        return None
    if reading.down or reading.value is None:
        metrics_gap(plan, trial, reading.error or missing, settings)
        return None
    metrics_ok(plan)
    if progress.metrics_gap_since is not None:
        restart_window(plan, trial, progress)
        return None
    # A colocated topology trial's canary carries its share of the whole service's rate, whatever
    # replicas its pools run.
    rescaled = None if trial.spec.tries_colocated else rescaled_during(plan, progress)
    if rescaled is not None:
        restart_after_rescale(plan, trial, progress, rescaled)
        return None
    return due, reading.value


#: A trial older than this many trial windows is judged on the window it has, even if the replica
#: planner changed the stable replicas in it (a load that moves all the time must not stall tuning).
MAX_RESCALE_RESTARTS_WINDOWS = 4


def rescaled_during(plan: Plan, progress: TrialProgress) -> datetime | None:
    """When the replica planner (in Auto) changed the stable replicas within the trial's window or
    its warm-up; None when it did not, or when the trial has waited long enough already.

    The stable track's window then mixes two loads per replica: its latencies and the twin's error
    on them judge neither, so the window restarts once the new replicas have started."""
    snap = plan.snap
    scaling = snap.status.scaling
    if not snap.isvc.spec.scaling.acts or scaling is None or scaling.last_scale_time is None:
        return None
    autotune = snap.isvc.spec.autotune
    warmup = timedelta(seconds=parse_duration(autotune.warmup))
    if progress.measure_from is None or scaling.last_scale_time <= progress.measure_from - warmup:
        return None
    since = progress.ready_at or progress.measure_from - warmup
    longest = MAX_RESCALE_RESTARTS_WINDOWS * parse_duration(autotune.trial_window)
    if (snap.now - since).total_seconds() > longest:
        return None
    return scaling.last_scale_time


def restart_after_rescale(plan: Plan, trial: TuningTrial, progress: TrialProgress, at: datetime) -> None:
    """Measure again once the new stable replicas have started and warmed up."""
    snap = plan.snap
    scaling = snap.status.scaling
    startup = scaling.startup_seconds if scaling is not None and scaling.startup_seconds else 0.0
    warmup = parse_duration(snap.isvc.spec.autotune.warmup)
    restarted = progress.model_copy(
        update={"measure_from": snap.now + timedelta(seconds=max(warmup, startup + warmup))}
    )
    plan.do(PatchTrial(trial.metadata.name or "", rec.progress_patch(restarted)))
    plan.emit(
        EventType.NORMAL,
        "WindowRestarted",
        f"trial {trial.spec.number}: the replica planner changed the stable replicas at "
        f"{at:%H:%M:%S}; restarting the measurement window once they have started",
    )


def abort(plan: Plan, trial: TuningTrial, reason: str) -> None:
    if not trial.spec.is_topology:  # a topology trial's twin block is its recommendation's check
        twin = twinplan.aborted_twin(trial, reason)
        plan.do(PatchTrial(trial.metadata.name or "", {"status": {"twin": twin.to_k8s()}}))
    finish(plan, trial, TrialPhase.FAILED, TrialVerdict.ABORTED, reason)


def finish(
    plan: Plan,
    trial: TuningTrial,
    phase: TrialPhase,
    verdict: TrialVerdict,
    reason: str,
    window: WindowMeasurement | None = None,
    objective: float | None = None,
) -> None:
    """Record the verdict first, then remove the canary (an orphan is removed on the next step)."""
    snap = plan.snap
    name = trial.metadata.name or ""
    canary = window.canary.to_api() if window is not None else None
    stable = window.stable.to_api() if window is not None else None
    status = TuningTrialStatus(
        phase=phase,
        params_summary=rec.trial_label(trial),
        canary=canary,
        stable=stable,
        constraints=excess_constraints(canary, snap.slo),
        objective=None if objective is None or not math.isfinite(objective) else round(objective, 4),
        verdict=verdict,
        reason=reason[:4096],
        finished_at=snap.now,
        summary=TrialSummary(
            itl=rec.latency_summary(canary.itl_ms if canary else None, snap.slo.itl_ms),
            ttft=rec.latency_summary(canary.ttft_ms if canary else None, snap.slo.ttft_ms),
        ),
    )
    plan.do(PatchTrial(name, status_patch(status)))
    if trial.spec.is_topology:
        # Every canary object of the topology, whatever the verdict: the router first, the pools (a
        # colocated topology trial's canary engines) once it is gone (on this step if it already
        # is, else as leftovers on a later one).
        gone = snap.topology_canary.get(TopologyPart.ROUTER) is None
        plan.do(DeleteCanaryTopology(pools=gone))
        if trial.spec.tries_colocated and gone:
            delete_canary(plan)
    else:
        park_or_delete(plan, trial, verdict)
    plan.status["trialsCompleted"] = sum(
        1 for t in plan.trials if not rec.is_active(t) or t.metadata.name == name
    )
    plan.status["currentTrial"] = None
    plan.do(CountFinished(verdict), CurrentTrialGauge(0))
    if verdict is not TrialVerdict.PROMOTED:
        warning = verdict in (TrialVerdict.ABORTED, TrialVerdict.PRUNED)
        plan.emit(
            EventType.WARNING if warning else EventType.NORMAL,
            f"Trial{verdict.value}",
            f"trial {trial.spec.number} {verdict.value.lower()} ({rec.trial_label(trial)}): {reason}",
        )
    plan.trials = [
        t if t.metadata.name != name else t.model_copy(update={"status": status}) for t in plan.trials
    ]
    mirror(plan)
    plan.do(Log(f"trial {trial.spec.number} {verdict.value}: {reason}"))


def mirror(plan: Plan) -> None:
    """Hand the whole finished history to the mirror (it skips what it already has)."""
    space = space_of(plan)
    if space is None:
        return
    finished = [t for t in plan.trials if not rec.is_active(t)]
    attrs = {
        t.spec.number: {"verdict": str(t.status.verdict), "reason": t.status.reason or ""}
        for t in finished
        if t.status is not None and t.status.verdict is not None
    }
    records = tuple(r for t in finished if (r := rec.trial_record(t, space, plan.snap.slo)) is not None)
    plan.do(MirrorStudy(space, records, attrs))
