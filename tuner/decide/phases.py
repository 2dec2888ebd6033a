"""Decide, for the active trial: one function per phase, each pure (a snapshot in, a plan filled).

.. code-block:: text

    Pending     -- canary applied (or a parked one taken over) -->  RollingOut
    RollingOut  -- canary Ready (limits set live, if so) -->  Measuring (warm-up first)
    Measuring   -- early breach -->  Pruned                      (canary parked or deleted)
                -- window over  -->  Promoted | RolledBack | Failed
                -- Prometheus silent --> metrics gap: restart the window, or abort after a long gap
                -- too few samples at the end --> the window widens up to its deadline
    Promoted    -- the operator runs it on stable (appliedConfigHash) -->  promotion applied

Every phase writes progress through the trial's ``status.progress`` block; the
stable Deployment is the operator's alone: a promotion writes ``status.bestConfig``
and is marked applied once the operator reports the promoted config's hash.
"""

from __future__ import annotations

import contextlib

from chunkpilot.operator.builders import RenderError, promoted_config
from chunkpilot.operator.events import EventType
from chunkpilot.operator.status import DeploymentState
from chunkpilot.tuner import records as rec
from chunkpilot.tuner.decide import twin as twinplan
from chunkpilot.tuner.decide.canary import (
    adjust_or_fall_back,
    canary_manifest,
    live_start,
    take_over_parked,
)
from chunkpilot.tuner.decide.lifecycle import (
    VERDICTS,
    TunerSettings,
    abort,
    crash_message,
    due_measurement,
    finish,
    metrics_gap,
    ready,
    rollout_failure,
    space_of,
    start_warmup,
    status_patch,
)
from chunkpilot.tuner.decide.plan import (
    Action,
    ApplyCanary,
    CurrentTrialGauge,
    Log,
    PatchTrial,
    Plan,
)
from chunkpilot.tuner.measure import WindowMeasurement
from chunkpilot.tuner.observe.canary import canary_owner, started_config
from chunkpilot.tuner.observe.snapshot import WindowPlan
from chunkpilot.tuner.policy import (
    Decision,
    Judgement,
    judge_capacity,
    judge_early,
    judge_final,
    objective_value,
)

from chunkpilot.api import (
    ConditionStatus,
    ConditionType,
    EngineConfig,
    TrialPhase,
    TrialProgress,
    TrialVerdict,
    TuningTrial,
    TuningTrialStatus,
)


def advance(plan: Plan, trial: TuningTrial, settings: TunerSettings) -> None:
    """The active trial's step: roll out, wait for Ready, measure, judge."""
    snap = plan.snap
    phase = rec.trial_phase(trial)
    plan.status["currentTrial"] = trial.metadata.name
    plan.condition(
        ConditionType.TUNING,
        ConditionStatus.TRUE,
        "TrialRunning",
        f"trial {trial.spec.number} {phase.value}: {trial.spec.params.summary()}",
    )
    plan.do(CurrentTrialGauge(trial.spec.number))
    if phase is TrialPhase.PENDING or canary_owner(plan.canary) != trial.metadata.name:
        roll_out(plan, trial)  # new, or lost (deleted by hand, or never applied before a restart)
        return
    started = started_config(plan.canary)
    config_hash = (started or trial.spec.params).config_hash()
    crashed = crash_message(snap.canary_pods, settings.crash_restarts, config_hash)
    if crashed is not None:
        abort(plan, trial, crashed)
        return
    assert plan.canary is not None
    if snap.stable_reading.down:
        # Nothing is measured while Prometheus is down, but the deadlines hold: a canary that never
        # gets Ready times out, and any trial is aborted after a long outage (its canary removed).
        state = DeploymentState.from_manifest(plan.canary)
        if phase is TrialPhase.ROLLING_OUT and not ready(state) and timed_out(plan, trial, state, settings):
            return
        metrics_gap(plan, trial, None, settings)
        return
    if phase is TrialPhase.ROLLING_OUT:
        check_rollout(plan, trial, DeploymentState.from_manifest(plan.canary), started, settings)
    else:
        measure(plan, trial, settings)


def roll_out(plan: Plan, trial: TuningTrial) -> None:
    """Start the trial's canary: take over a parked one, else apply a new one."""
    snap = plan.snap
    canary = plan.canary
    is_ready = canary is not None and ready(DeploymentState.from_manifest(canary))
    if not take_over_parked(plan, trial, is_ready):
        try:
            manifest = canary_manifest(snap.isvc, snap.body, trial)
        except RenderError as error:
            abort(plan, trial, f"the engine refuses the config: {error}")
            return
        start = live_start(plan, trial, space_of(plan))
        if start is not None:
            # The top of the space may not render: the trial's own config it is, then.
            with contextlib.suppress(RenderError):
                manifest = canary_manifest(snap.isvc, snap.body, trial, start)
        plan.do(ApplyCanary(manifest))
    started_at = trial.status.started_at if trial.status is not None and trial.status.started_at else snap.now
    # A trial the twin did not choose (the sampler did) says why it has no prediction.
    unpredicted = trial.status is None or trial.status.twin is None
    status = TuningTrialStatus(
        phase=TrialPhase.ROLLING_OUT,
        params_summary=trial.spec.params.summary(),
        started_at=started_at,
        twin=twinplan.unpredicted(plan) if unpredicted else None,
    )
    plan.do(PatchTrial(trial.metadata.name or "", status_patch(status)))
    if rec.trial_phase(trial) is TrialPhase.PENDING:
        plan.emit(
            EventType.NORMAL,
            "TrialStarted",
            f"trial {trial.spec.number} canary started: "
            f"{rec.config_change(plan.stable_config, trial.spec.params)}",
        )


def check_rollout(
    plan: Plan,
    trial: TuningTrial,
    state: DeploymentState,
    started: EngineConfig | None,
    settings: TunerSettings,
) -> None:
    """RollingOut: once the canary is Ready, set live limits if so and start the warm-up; else time out."""
    snap = plan.snap
    if ready(state):

        def measuring(progress: TrialProgress) -> list[Action]:
            return start_warmup(plan, trial, progress)

        def aborting(reason: str) -> list[Action]:
            sub = Plan(snap)
            sub.canary = plan.canary
            abort(sub, trial, reason)
            return sub.actions

        if started is None or not adjust_or_fall_back(plan, trial, started, measuring, aborting):
            plan.do(*measuring(rec.trial_progress(trial)))
        return
    timed_out(plan, trial, state, settings)


def timed_out(plan: Plan, trial: TuningTrial, state: DeploymentState, settings: TunerSettings) -> bool:
    """Abort the trial of a canary that is not Ready (or failed) in time; True when it was."""
    since = trial.status.started_at if trial.status is not None else None
    failed = rollout_failure([state], "the canary", since, plan.snap.now, settings)
    if failed is not None:
        abort(plan, trial, failed)
    return failed is not None


def measure(plan: Plan, trial: TuningTrial, settings: TunerSettings) -> None:
    """Measuring: wait out the warm-up, prune early on a breach, judge once the window is over."""
    snap = plan.snap
    found = due_measurement(plan, trial, snap.window, "no measurement of the trial window", settings)
    if found is None:
        return
    due, window = found
    if not due.final:
        early = judge_early(window.canary, snap.slo, rec.abort_rules(snap.isvc))
        if early.decision is Decision.PRUNE:
            conclude(plan, trial, Decision.PRUNE, early.reason, window)
    else:
        window_over(plan, trial, due, window, settings)


def window_over(
    plan: Plan, trial: TuningTrial, due: WindowPlan, window: WindowMeasurement, settings: TunerSettings
) -> None:
    """The window is over: judge it; too few samples widen it up to now, until the deadline."""
    snap = plan.snap
    verdict = judge(plan, window, trial)
    if verdict.decision is Decision.INCONCLUSIVE and due.widened_at is not None:
        if snap.widened.down or snap.widened.value is None:
            metrics_gap(plan, trial, snap.widened.error or "no measurement of the widened window", settings)
            return
        window = snap.widened.value
        verdict = judge(plan, window, trial)
    if verdict.decision is Decision.INCONCLUSIVE and snap.now < due.deadline:
        return
    conclude(plan, trial, verdict.decision, verdict.reason, window)


def judge(plan: Plan, window: WindowMeasurement, trial: TuningTrial | None = None) -> Judgement:
    """The final verdict on ``window``: on predicted capacity when the twin checked the canary,
    else against the incumbent's last measured objective."""
    snap = plan.snap
    evidence = twinplan.evidence(plan, trial) if trial is not None else None
    if evidence is not None:
        return judge_capacity(window, snap.slo, rec.abort_rules(snap.isvc), evidence)
    space = space_of(plan)
    incumbent = rec.incumbent_record(snap.trials, space, plan.stable_config, snap.slo) if space else None
    return judge_final(
        window,
        snap.slo,
        rec.abort_rules(snap.isvc),
        rec.objective_kind(snap.isvc),
        snap.isvc.spec.engine.tensor_parallel_size,
        incumbent_objective=incumbent.objective if incumbent is not None else None,
    )


def conclude(
    plan: Plan, trial: TuningTrial, decision: Decision, reason: str, window: WindowMeasurement
) -> None:
    """Record the verdict with both tracks' measurements; promote a winner."""
    snap = plan.snap
    kind = rec.objective_kind(snap.isvc)
    gpus = snap.isvc.spec.engine.tensor_parallel_size
    canary_obj = objective_value(window.canary, snap.slo, kind, gpus)
    stable_obj = (
        objective_value(window.stable, snap.slo, kind, gpus)
        if window.stable.enough_samples(rec.abort_rules(snap.isvc).min_samples)
        else None
    )
    phase, verdict = VERDICTS.get(decision, (TrialPhase.FAILED, TrialVerdict.ABORTED))
    if stable_obj is not None:
        progress = rec.trial_progress(trial).model_copy(update={"stable_objective": round(stable_obj, 4)})
        plan.do(PatchTrial(trial.metadata.name or "", rec.progress_patch(progress)))
    evidence = twinplan.evidence(plan, trial)
    if evidence is not None:  # the objective is the predicted capacity
        canary_obj = evidence.capacity
    # Every trial keeps the twin's check of its canary, or why there is none.
    checked = twinplan.verdict_twin(plan, trial)
    plan.do(PatchTrial(trial.metadata.name or "", {"status": {"twin": checked.to_k8s()}}))
    objective = None if verdict is TrialVerdict.ABORTED else canary_obj
    finish(plan, trial, phase, verdict, reason, window, objective)
    if verdict is TrialVerdict.PROMOTED:
        promote(plan, trial, reason)


def promote(plan: Plan, trial: TuningTrial, reason: str) -> None:
    """Make the trial's config the service's best; the operator rolls the stable Deployment to it."""
    best = trial.spec.params
    old = plan.stable_config
    plan.status["bestConfig"] = best.to_k8s()
    plan.status["bestTrial"] = trial.metadata.name
    plan.incumbent = best
    plan.emit(
        EventType.NORMAL,
        "Promoted",
        f"promoted trial {trial.spec.number}: {rec.config_change(old, best)}; {reason}",
    )


def pending_promotion(plan: Plan) -> TuningTrial | None:
    """Complete the latest promotion: re-write bestConfig if it is missing, mark it applied once it runs.

    Returns the promoted trial while the operator has not rolled the stable track to it yet.
    """
    snap = plan.snap
    promoted = next(
        (
            t
            for t in reversed(snap.trials)
            if rec.trial_phase(t) is TrialPhase.PROMOTED and not t.spec.is_topology
        ),
        None,
    )
    if promoted is None:
        return None
    progress = rec.trial_progress(promoted)
    if progress.promotion_applied:
        return None
    best = promoted.spec.params
    if snap.status.best_config != best or snap.status.best_trial != promoted.metadata.name:
        # The verdict was recorded but the step stopped before bestConfig was written.
        promote(plan, promoted, "completing a promotion interrupted by a restart")
        return promoted
    if promoted_config(snap.isvc) != best:
        return None  # the operator ignores it (the spec can no longer run it): nothing to wait for
    if snap.status.applied_config_hash != best.config_hash():
        return promoted  # the operator has not rolled the stable Deployment to it yet
    applied = progress.model_copy(update={"promotion_applied": True})
    plan.do(PatchTrial(promoted.metadata.name or "", rec.progress_patch(applied)))
    plan.do(Log(f"trial {promoted.spec.number}: the stable track runs the promoted config"))
    return None
