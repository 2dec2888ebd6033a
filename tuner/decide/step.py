"""Decide: from one snapshot, the plan of one step (:class:`~chunkpilot.tuner.decide.plan.Plan`).

Pure: no I/O, the same snapshot and settings always give the same plan (the sampler
is seeded by the trial number). One function per service-level phase; the active
trial's phases are in :mod:`chunkpilot.tuner.decide.phases`:

.. code-block:: text

    disabled | paused | no Prometheus   -> abort the running trial, remove the canary
    disaggregated                       -> size the pools; pools a topology trial promoted, in
                                           Auto: the planner's proposal of colocated replicas
                                           (topotrial.consider_colocated, advance_colocated)
    a trial is active                   -> phases.advance (roll out, warm up, measure, judge);
                                           a topology trial: topotrial.advance
    stopped infeasible, allowTopologyChange -> topotrial.consider (the recommended topology)
    stopped otherwise, allowTopologyChange, scaling Auto -> topotrial.consider (the planner's
                                           proposal of prefill/decode pools)
    a promotion awaits the operator     -> wait (stable must run it before the next trial)
    stopped (max trials, converged, infeasible, exhausted) -> keep stopped; retune on a
                                           sustained SLO violation
    otherwise (idle)                    -> ask the study for the next trial

Invariants stated once: at most one trial of a service is active; a canary Deployment
exists only while its trial is active or while it is parked for the next one (any other
is an orphan and deleted); a trial's name is derived from its number, so a restart
between "ask" and "create" cannot duplicate it; nothing is promoted without a
measurement of both tracks from the same window; a promotion is applied by the
operator, and a trial is marked applied only once the stable track runs it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from enum import StrEnum
from typing import Any

from chunkpilot.operator.events import EventType
from chunkpilot.operator.objects import adopt
from chunkpilot.tuner import records as rec
from chunkpilot.tuner.decide import lifecycle, phases
from chunkpilot.tuner.decide import topology_trial as topotrial
from chunkpilot.tuner.decide import twin as twinplan
from chunkpilot.tuner.decide.canary import release_parked, remove_orphan
from chunkpilot.tuner.decide.lifecycle import TunerSettings, metrics_down, metrics_ok
from chunkpilot.tuner.decide.plan import (
    CreateTrial,
    CurrentTrialGauge,
    Log,
    Plan,
)
from chunkpilot.tuner.decide.recommendation import disaggregated_note, infeasible_note
from chunkpilot.tuner.decide.recommendation import record as record_recommendation
from chunkpilot.tuner.decide.scaling import plan_scaling
from chunkpilot.tuner.measure import TrackMeasurement
from chunkpilot.tuner.observe.recommendation import is_disaggregated
from chunkpilot.tuner.observe.snapshot import Snapshot
from chunkpilot.tuner.policy import (
    TWIN_INFEASIBLE_MIN_TRIALS,
    StopReason,
    TwinBound,
    TwinCheck,
    assess_infeasibility,
    check_slo,
    should_stop,
    sustained_violation,
)
from chunkpilot.tuner.space import (
    DEFAULT_OUTPUT_TOKENS,
    DEFAULT_PROMPT_TOKENS,
    SearchSpace,
    ServiceFacts,
    SpaceError,
    TunedConfig,
    build_space,
)
from chunkpilot.tuner.study import RecordState, SamplerUnavailableError, TrialRecord, seed_for, suggest
from chunkpilot.tuner.twin.online import TOLERANCE as TWIN_TOLERANCE
from chunkpilot.tuner.warmstart import warm_start

from chunkpilot.api import (
    ConditionStatus,
    ConditionType,
    EngineConfig,
    ObjectMeta,
    ServiceSummary,
    SLOState,
    TokenMix,
    Track,
    TrialPhase,
    TrialTwin,
    TrialVerdict,
    TuningTrial,
    TuningTrialSpec,
    TuningTrialStatus,
    parse_duration,
    trial_labels,
    trial_name,
)


class TuningReason(StrEnum):
    """Reasons of the Tuning condition."""

    TRIAL_RUNNING = "TrialRunning"
    WAITING = "WaitingForStable"
    WAITING_FOR_TWIN = "WaitingForTwin"
    PAUSED = "Paused"
    DISABLED = "Disabled"
    INVALID_SPACE = "InvalidSearchSpace"
    DISAGGREGATED = "Disaggregated"
    NAME_CONFLICT = "NameConflict"


def decide(snap: Snapshot, settings: TunerSettings) -> Plan:
    """The plan of one step of the service's tuning loop."""
    plan = Plan(snap)
    active = snap.active()
    for extra in active[1:]:  # never more than one: abort the newer ones
        lifecycle.finish(plan, extra, TrialPhase.FAILED, TrialVerdict.ABORTED, "another trial was active")
    current = active[0] if active else None
    pending = phases.pending_promotion(plan)
    autotune = snap.isvc.spec.autotune
    if not autotune.enabled or snap.isvc.spec.slo is None:
        disabled(plan, current)
        return plan
    if autotune.paused:
        paused(plan, current)
        return plan
    if snap.conflicts:
        name_conflict(plan, current)
        return plan
    if not snap.prometheus:
        no_prometheus(plan, current)
        return plan
    if is_disaggregated(snap):
        disaggregated(plan, current, settings)
        return plan
    if current is not None and current.spec.tries_colocated:  # its pools no longer run
        topotrial.abort(plan, current, "the service no longer runs the pools a topology trial promoted")
        return plan  # its canary goes (the router first); the next step goes on colocated
    topotrial.remove_colocated_canary(plan, current, keep_parked=True)
    topotrial.remove_orphans(plan, current)
    if current is None and topotrial.complete_promotion(plan):
        return plan
    if current is None:
        topotrial.note_not_running(plan)  # a topology trial, or its gate, may say more below
    record_stable(plan)
    twinplan.record_twin(plan)
    record_recommendation(plan)
    plan_scaling(plan)
    if current is not None:
        (topotrial.advance if current.spec.is_topology else phases.advance)(plan, current, settings)
        return plan
    if pending is not None:
        plan.condition(
            ConditionType.TUNING,
            ConditionStatus.TRUE,
            TuningReason.WAITING,
            f"waiting for the stable Deployment to run the config promoted by trial {pending.spec.number}",
        )
        return plan
    idle(plan, settings)
    if plan.status.get("currentTrial") is None and plan.set_condition_false(ConditionType.TUNING):
        release_parked(plan)
    return plan


# --------------------------------------------------------------------------- service phases


def disabled(plan: Plan, current: TuningTrial | None) -> None:
    if current is not None:
        lifecycle.abort(plan, current, "autotuning was disabled")
    remove_orphan(plan, None)
    topotrial.remove_orphans(plan, None)
    if plan.current_condition(ConditionType.TUNING) is not None:
        plan.condition(
            ConditionType.TUNING, ConditionStatus.FALSE, TuningReason.DISABLED, "autotune.enabled is false"
        )
    plan.status["currentTrial"] = None


def paused(plan: Plan, current: TuningTrial | None) -> None:
    if current is not None:
        lifecycle.abort(plan, current, "autotuning was paused")
    remove_orphan(plan, None)
    topotrial.remove_orphans(plan, None)
    plan.condition(
        ConditionType.TUNING,
        ConditionStatus.FALSE,
        TuningReason.PAUSED,
        "autotune.paused is true: keeping the current config",
    )
    plan.status["currentTrial"] = None
    plan.do(CurrentTrialGauge(0))
    record_stable(plan)


def name_conflict(plan: Plan, current: TuningTrial | None) -> None:
    """An object of a canary's name exists that is not the service's: it is left alone, and nothing
    is tried while it is there (the active trial is aborted; the stable track serves on)."""
    message = "; ".join(plan.snap.conflicts)
    if current is not None:
        lifecycle.abort(plan, current, message)
    before = plan.current_condition(ConditionType.TUNING)
    if before is None or before.reason != TuningReason.NAME_CONFLICT:
        plan.emit(EventType.WARNING, TuningReason.NAME_CONFLICT, message)
    plan.condition(ConditionType.TUNING, ConditionStatus.FALSE, TuningReason.NAME_CONFLICT, message)
    plan.status["currentTrial"] = None
    plan.do(CurrentTrialGauge(0))
    record_stable(plan)


def disaggregated(plan: Plan, current: TuningTrial | None, settings: TunerSettings) -> None:
    """A disaggregated service: no canary of its knobs runs against it (and none is left running);
    with ``scaling`` its pools are sized. In ``Auto``, pools a topology trial promoted may be tried
    colocated again: the planner's proposal of colocated replicas, as a colocated topology trial."""
    note = disaggregated_note(plan)
    colocated = current if current is not None and current.spec.tries_colocated else None
    if current is not None and colocated is None:
        lifecycle.abort(plan, current, note)
    topotrial.remove_colocated_canary(plan, colocated)
    topotrial.remove_orphans(plan, colocated)
    if colocated is None and topotrial.complete_promotion(plan):
        return
    record_stable(plan)
    plan_scaling(plan)
    if colocated is not None:
        topotrial.advance_colocated(plan, colocated, settings)
        return
    plan.condition(ConditionType.TUNING, ConditionStatus.FALSE, TuningReason.DISAGGREGATED, note)
    plan.status["currentTrial"] = None
    plan.do(CurrentTrialGauge(0))
    topotrial.consider_colocated(plan)


def no_prometheus(plan: Plan, current: TuningTrial | None) -> None:
    plan.condition(
        ConditionType.METRICS_UNAVAILABLE,
        ConditionStatus.TRUE,
        "NoPrometheus",
        "no Prometheus URL configured: set --prometheus-url "
        "(CHUNKPILOT_PROMETHEUS_URL, chart value prometheus.url)",
    )
    if current is not None:
        lifecycle.abort(plan, current, "no Prometheus to measure with")
    remove_orphan(plan, None)
    topotrial.remove_orphans(plan, None)


#: Seconds a stable measurement that changes no state stands on the status before it is rewritten.
MEASUREMENT_REFRESH_S = 60.0


def measurement_current(snap: Snapshot, state: SLOState) -> bool:
    """The status's stable measurement is younger than :data:`MEASUREMENT_REFRESH_S` and its SLO state
    is ``state``: rewriting it (its time, its latest values) would only churn the object.

    Without this every tick of every service wrote its status (its measurement's time at the
    least), and every write came back to the operator as a watch event: at a thousand tuned services,
    a hundred writes a second.
    """
    previous, summary = snap.status.last_measurement, snap.status.summary
    if previous is None or previous.time is None or summary is None or summary.slo is not state:
        return False
    return timedelta(0) <= snap.now - previous.time < timedelta(seconds=MEASUREMENT_REFRESH_S)


def record_stable(plan: Plan) -> None:
    """SLOMet, lastMeasurement and the summary from the stable reading (MetricsUnavailable if none).

    A measurement that changes no SLO state is written at most every :data:`MEASUREMENT_REFRESH_S`.
    """
    snap = plan.snap
    reading = snap.stable_reading
    if reading.error is not None:
        metrics_down(plan, reading.error)
        return
    m = reading.value
    if m is None:
        return
    metrics_ok(plan)
    slo, abort = snap.slo, rec.abort_rules(snap.isvc)
    api = m.to_api()
    state = rec.slo_state(api, slo, m.enough_samples(abort.min_samples))
    if measurement_current(snap, state):
        return
    itl, ttft = rec.latency_summary(api.itl_ms, slo.itl_ms), rec.latency_summary(api.ttft_ms, slo.ttft_ms)
    plan.status["lastMeasurement"] = api.to_k8s()
    plan.status["summary"] = ServiceSummary(itl=itl, ttft=ttft, slo=state).to_k8s()
    text = f"{itl} ITL, {ttft} TTFT" + (f" ({m.itl_note})" if m.itl_note else "")
    if state is SLOState.MET:
        plan.condition(
            ConditionType.SLO_MET, ConditionStatus.TRUE, "SLOMet", f"stable meets the SLOs: {text}"
        )
    elif state is SLOState.VIOLATED:
        check = check_slo(m, slo)
        broken = ", ".join(k.upper() for k, v in check.excess_ms.items() if v > 0)
        plan.condition(
            ConditionType.SLO_MET, ConditionStatus.FALSE, "SLOViolated", f"stable violates {broken}: {text}"
        )
    else:
        plan.condition(
            ConditionType.SLO_MET,
            ConditionStatus.UNKNOWN,
            "InsufficientData",
            f"stable served {m.ttft_samples:.0f} requests in {m.window}; {abort.min_samples} needed",
        )


# --------------------------------------------------------------------------- idle: ask the study


def idle(plan: Plan, settings: TunerSettings) -> None:
    """No trial is active: stay stopped, or ask the study for the next trial and create it."""
    snap = plan.snap
    try:
        space = build_space(rec.service_facts(snap.isvc), rec.space_bounds(snap.isvc))
    except SpaceError as error:
        invalid_space(plan, str(error))
        return
    if snap.stable_reading.down:
        return  # Prometheus unreachable: wait (MetricsUnavailable set)
    round_ = max((rec.trial_round(t) for t in snap.trials), default=0)
    in_round = [t for t in snap.trials if rec.trial_round(t) == round_]
    reason = stop_reason(plan, records(plan, space, in_round), in_round)
    if reason is not None:
        drift = twinplan.drift_retune(plan, in_round)
        if drift is None and not should_retune(plan, settings):
            # allowTopologyChange: the recommended topology, or (in Auto) the planner's proposed pools
            topotrial.consider(plan, round_, settings, proposal=reason is not StopReason.INFEASIBLE)
            return
        round_ += 1
        if drift is not None:
            plan.emit(EventType.NORMAL, "Retuning", f"{drift}: starting tuning round {round_}")
        else:
            plan.emit(
                EventType.WARNING,
                "Retuning",
                f"SLO violated for a sustained window after tuning stopped: starting tuning round {round_}",
            )
    if snap.stable is None or not snap.stable.rollout_complete:
        plan.condition(
            ConditionType.TUNING,
            ConditionStatus.TRUE,
            TuningReason.WAITING,
            "waiting for the stable Deployment to finish rolling out before the next trial",
        )
        return
    waiting = twinplan.waiting(plan)
    if waiting is not None:
        plan.condition(ConditionType.TUNING, ConditionStatus.TRUE, TuningReason.WAITING_FOR_TWIN, waiting)
        return
    ask(plan, space, round_)


@dataclass(frozen=True)
class Next:
    """The next trial's config, its study parameters, where it came from and the twin's evidence."""

    config: TunedConfig
    params: Mapping[str, int]
    source: str
    twin: TrialTwin | None = None


def next_config(plan: Plan, space: SearchSpace, number: int, facts: ServiceFacts) -> Next | None:
    """The twin's best untried candidate, else the study's suggestion; None: the space is exhausted.

    Raises :class:`SpaceError` or :class:`SamplerUnavailableError` for a space the sampler cannot use.
    """
    snap = plan.snap
    known = records(plan, space, snap.trials)
    tried = [rec.tuned_config(t.spec.params) for t in snap.trials]
    choice = twinplan.choose(plan, space, tried)
    if choice is not None:
        params = space.to_params(choice.config) or {}
        return Next(choice.config, params, choice.reason, choice.twin)
    incumbent_record = rec.incumbent_record(snap.trials, space, plan.stable_config, snap.slo)
    if incumbent_record is not None:
        known.append(incumbent_record)
    suggestion = suggest(
        space,
        known,
        sampler=str(snap.isvc.spec.autotune.sampler),
        seed=seed_for(snap.isvc.metadata.uid or snap.name, number),
        warm_starts=warm_start(space, facts),
        exclude=[rec.tuned_config(plan.stable_config)],
    )
    if suggestion is None:
        return None
    return Next(suggestion.config, suggestion.params, suggestion.source)


def ask(plan: Plan, space: SearchSpace, round_: int) -> None:
    """Choose trial ``n + 1`` of ``round_`` (the twin's ranking, else the study) and create it."""
    snap = plan.snap
    number = max((t.spec.number for t in snap.trials), default=0) + 1
    round_trials = [t for t in snap.trials if rec.trial_round(t) == round_]
    facts, mix = round_token_mix(rec.service_facts(snap.isvc), snap.stable_reading.value, round_trials)
    try:
        chosen = next_config(plan, space, number, facts)
    except (SpaceError, SamplerUnavailableError) as error:
        invalid_space(plan, str(error))
        return
    if chosen is None:
        stopped(plan, StopReason.EXHAUSTED, "no untried configuration is left in the search space")
        return
    config = rec.engine_config(chosen.config)
    manifest = trial_manifest(plan, number, config, chosen.params, round_, mix)
    status = TuningTrialStatus(phase=TrialPhase.PENDING, params_summary=config.summary(), twin=chosen.twin)
    plan.do(CreateTrial(manifest, lifecycle.status_patch(status)))
    plan.status["currentTrial"] = manifest["metadata"]["name"]
    plan.condition(
        ConditionType.TUNING,
        ConditionStatus.TRUE,
        TuningReason.TRIAL_RUNNING,
        f"trial {number} ({chosen.source}): {config.summary()}",
    )
    plan.do(CurrentTrialGauge(number))
    if chosen.source == "warm-start":
        plan.emit(
            EventType.NORMAL,
            "WarmStart",
            f"trial {number} is a model-based warm start ({config.summary()}) sized for {mix.note}",
        )
    elif chosen.twin is not None:
        plan.emit(EventType.NORMAL, "TwinCandidate", f"trial {number} ({config.summary()}): {chosen.source}")
    plan.do(Log(f"trial {number} created ({chosen.source}): {config.summary()}"))


def invalid_space(plan: Plan, message: str) -> None:
    plan.condition(ConditionType.TUNING, ConditionStatus.FALSE, TuningReason.INVALID_SPACE, message)


def records(plan: Plan, space: SearchSpace, trials: Iterable[TuningTrial]) -> list[TrialRecord]:
    return [r for t in trials if (r := rec.trial_record(t, space, plan.snap.slo)) is not None]


def trial_manifest(
    plan: Plan,
    number: int,
    config: EngineConfig,
    params: Mapping[str, int],
    round_: int,
    mix: TokenMix,
) -> dict[str, Any]:
    """The new TuningTrial, owned by the service; its study inputs travel in its spec."""
    snap = plan.snap
    trial = TuningTrial(
        metadata=ObjectMeta(
            name=trial_name(snap.name, number),
            namespace=snap.namespace,
            labels={**trial_labels(snap.name, number), rec.LABEL_ROUND: str(round_)},
        ),
        spec=TuningTrialSpec(
            service_name=snap.name,
            number=number,
            params=config,
            baseline_config_hash=plan.stable_config.config_hash(),
            track=Track.CANARY,
            window=snap.isvc.spec.autotune.trial_window,
            study_params=dict(params),
            token_mix=mix,
        ),
    )
    return adopt(trial.to_manifest(), snap.body)


# --------------------------------------------------------------------------- stopping


def twin_bound(plan: Plan, round_trials: Sequence[TuningTrial]) -> TwinBound | None:
    """What the twin's current ranking says about the colocated space at the live load; None: no ranking.

    The best predicted capacity is the stable config's or a ranked candidate's (the ranking leaves
    out the configurations tried on canaries: those were measured); the twin's error on each
    canary of the round is the one recorded at its verdict, over its whole window (not a pruned one's).
    """
    found = twinplan.ranking(plan)
    if found is None:
        return None
    candidates, twin = found
    live_rate = plan.snap.twin.live_rate_req_s or twin.live_request_rate
    if live_rate is None:
        return None
    capacities = [c.capacity_req_s for c in candidates]
    if twin.capacity_req_s is not None:
        capacities.append(twin.capacity_req_s)
    checks = {
        t.spec.number: twin_check(t.status.twin)
        for t in round_trials
        if t.status is not None
        and t.status.twin is not None
        and t.status.verdict is not TrialVerdict.PRUNED
        and not t.spec.is_topology  # it checks the recommendation, not the colocated twin
    }
    return TwinBound(
        best_capacity_req_s=max(capacities, default=0.0),
        live_rate_req_s=live_rate,
        fit_error=twin.error,
        canary_checks=checks,
        tolerance=twin.tolerance if twin.tolerance is not None else TWIN_TOLERANCE,
        evaluations=twin.evaluations,
    )


def twin_check(twin: TrialTwin) -> TwinCheck:
    """The twin's error on a canary, and whether it predicted a higher ITL or TTFT than measured."""
    pairs = ((twin.predicted_itl_ms, twin.measured_itl_ms), (twin.predicted_ttft_ms, twin.measured_ttft_ms))
    pessimistic = any(p is not None and m is not None and p > m for p, m in pairs)
    return TwinCheck(twin.error, pessimistic)


def stop_reason(
    plan: Plan, round_records: Sequence[TrialRecord], round_trials: Sequence[TuningTrial]
) -> StopReason | None:
    """Why tuning stops (infeasible SLOs, max trials, converged), with its conditions set; None: go on."""
    autotune = plan.snap.isvc.spec.autotune
    # Below the twin's minimum of measured trials its bound decides nothing: not ranked for it.
    measured = sum(1 for r in round_records if r.state is RecordState.COMPLETE and r.constraints)
    bound = twin_bound(plan, round_trials) if measured >= TWIN_INFEASIBLE_MIN_TRIALS else None
    infeasible = assess_infeasibility(round_records, plan.snap.slo, incumbent_met(plan), twin=bound)
    before = plan.current_condition(ConditionType.SLO_INFEASIBLE)
    declared = before is not None and before.status == ConditionStatus.TRUE
    if infeasible is None and bound is None and declared and holds_without_twin(plan, round_records):
        return StopReason.INFEASIBLE  # the twin cannot tell this step: the declaration stands
    if infeasible is not None:
        remedies = ", ".join(r.value for r in infeasible.remedies)
        note = infeasible_note(plan)
        message = f"{infeasible.message} Remedies: {remedies}." + (f" {note}" if note else "")
        if not declared:
            plan.emit(EventType.WARNING, "SLOInfeasible", message)
        plan.condition(ConditionType.SLO_INFEASIBLE, ConditionStatus.TRUE, "SLOInfeasible", message)
        stopped(plan, StopReason.INFEASIBLE, infeasible.message)
        return StopReason.INFEASIBLE
    plan.condition(
        ConditionType.SLO_INFEASIBLE,
        ConditionStatus.FALSE,
        "Feasible",
        "no evidence that the SLOs are out of reach",
    )
    reason: StopReason | None
    if len(round_trials) >= autotune.max_trials:
        reason = StopReason.MAX_TRIALS
    else:
        reason = should_stop(round_records, autotune.max_trials)
    if reason is not None:
        detail = {
            StopReason.MAX_TRIALS: f"{len(round_trials)} of {autotune.max_trials} trials run",
            StopReason.CONVERGED: "the best objective stopped improving",
        }.get(reason, reason.value)
        stopped(plan, reason, detail)
    return reason


def holds_without_twin(plan: Plan, round_records: Sequence[TrialRecord]) -> bool:
    """An infeasibility declared on the twin's evidence stands while the twin has no ranking (a
    telemetry gap): the measurements still miss; only a ranking that no longer predicts it lifts it."""
    slo, met = plan.snap.slo, incumbent_met(plan)
    return assess_infeasibility(round_records, slo, met, min_trials=TWIN_INFEASIBLE_MIN_TRIALS) is not None


def stopped(plan: Plan, reason: StopReason, detail: str) -> None:
    status = plan.snap.status
    before = plan.current_condition(ConditionType.TUNING)
    best = f"; best: {status.best_trial} ({status.best_config.summary()})" if status.best_config else ""
    message = f"tuning stopped: {detail}{best}"
    if before is None or before.status != ConditionStatus.FALSE or before.reason != reason.value:
        plan.emit(EventType.NORMAL, "TuningStopped", message)
    plan.condition(ConditionType.TUNING, ConditionStatus.FALSE, reason.value, message)
    plan.status["currentTrial"] = None
    plan.do(CurrentTrialGauge(0))


def incumbent_met(plan: Plan) -> bool | None:
    slo = plan.current_condition(ConditionType.SLO_MET)
    if slo is None or slo.status == ConditionStatus.UNKNOWN:
        return None
    return bool(slo.status == ConditionStatus.TRUE)


def should_retune(plan: Plan, settings: TunerSettings) -> bool:
    """SLOMet turned False after tuning stopped and stayed so for the retune window."""
    tuning = plan.current_condition(ConditionType.TUNING)
    slo = plan.current_condition(ConditionType.SLO_MET)
    if tuning is None or slo is None or tuning.status != ConditionStatus.FALSE:
        return False
    if tuning.reason == StopReason.INFEASIBLE.value or slo.status != ConditionStatus.FALSE:
        return False
    since, stopped_at = slo.last_transition_time, tuning.last_transition_time
    if since is None or stopped_at is None or since <= stopped_at:
        return False  # violated already when tuning stopped: a new round would find nothing new
    window = settings.retune_after_s
    if window is None:
        assert plan.snap.isvc.spec.slo is not None
        window = parse_duration(plan.snap.isvc.spec.slo.window)
    return sustained_violation(since, plan.snap.now, timedelta(seconds=window))


# --------------------------------------------------------------------------- the token mix


def with_token_mix(facts: ServiceFacts, stable: TrackMeasurement | None) -> tuple[ServiceFacts, TokenMix]:
    """``facts`` with the stable track's measured tokens per request, and the mix used.

    A mean Prometheus has no data for stays None, so the warm start assumes the default.
    """
    prompt = stable.mean_prompt_tokens if stable is not None else None
    output = stable.mean_output_tokens if stable is not None else None
    facts = replace(facts, mean_prompt_tokens=prompt, mean_output_tokens=output)
    window = f" over {stable.window}" if stable is not None else ""
    if prompt is not None and output is not None:
        source = f"measured on stable{window}"
    elif prompt is None and output is None:
        source = f"defaults: Prometheus has no stable traffic{window}"
    else:
        source = f"{'output' if prompt is not None else 'prompt'} default: no data{window}"
    shown_prompt = prompt if prompt is not None else DEFAULT_PROMPT_TOKENS
    shown_output = output if output is not None else DEFAULT_OUTPUT_TOKENS
    note = f"{shown_prompt:.0f} prompt + {shown_output:.0f} output tokens per request ({source})"
    return facts, TokenMix(prompt=prompt, output=output, note=note)


def round_token_mix(
    facts: ServiceFacts, stable: TrackMeasurement | None, round_trials: Sequence[TuningTrial]
) -> tuple[ServiceFacts, TokenMix]:
    """The token mix the round's first trial recorded, or (first trial of a round) the measured one.

    The round's first trial fixes it, so a drifting measurement cannot mint a new warm start every trial.
    """
    first = min(round_trials, key=lambda t: t.spec.number, default=None)
    mix = rec.token_mix(first) if first is not None else None
    if mix is not None:
        return replace(facts, mean_prompt_tokens=mix.prompt, mean_output_tokens=mix.output), mix
    return with_token_mix(facts, stable)
