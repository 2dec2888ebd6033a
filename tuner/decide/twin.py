"""Decide, with the twin: record it on the service, choose the next trial, build a trial's evidence.

Pure, like the rest of deciding: the twin's fit, ranking and canary check were computed while
observing (:mod:`chunkpilot.tuner.observe.twin`) and arrive in :attr:`Snapshot.twin`.

* :func:`record_twin` writes ``status.twin`` (the ranking, the fit and its error, the stable
  config's predicted capacity next to the live request rate) and the ``TwinUnavailable``
  condition: True with the reason when there is no twin (no step telemetry, or too little yet).
* :func:`choose` picks the best-ranked configuration not tried yet (the sampler takes over when the
  twin has no ranking, or all of it was tried).
* :func:`evidence` is what :func:`chunkpilot.tuner.policy.judge_capacity` judges a canary with.
* :func:`unpredicted`, :func:`verdict_twin` and :func:`aborted_twin` give every trial a twin block:
  predicted capacity and the twin's error where they exist, otherwise a ``message`` saying why not.
* :func:`drift_retune` says when a workload that drifted from the one the tuning round was sized for
  makes another configuration need fewer GPUs at the live rate (a new round then canaries it).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from chunkpilot.tuner import records as rec
from chunkpilot.tuner.decide.plan import Plan
from chunkpilot.tuner.observe.snapshot import TwinReading
from chunkpilot.tuner.planner import Capacity, replicas_for
from chunkpilot.tuner.policy import TwinEvidence
from chunkpilot.tuner.space import SearchSpace, TunedConfig
from chunkpilot.tuner.twin.online import TOLERANCE, Calibration, capacity_unit
from chunkpilot.tuner.twin.search import Candidate, twin_objective

from chunkpilot.api import (
    ConditionStatus,
    ConditionType,
    ServiceTwin,
    TrialTwin,
    TuningTrial,
    TwinCandidate,
    TwinState,
)

#: Candidates written to the service status.
MAX_CANDIDATES = 8
#: A mean of prompt or output tokens per request this far (relative) from the one the tuning round
#: was sized for is a drifted workload.
WORKLOAD_DRIFT = 0.3


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, digits)


def _gpus(plan: Plan) -> int:
    return plan.snap.isvc.spec.engine.tensor_parallel_size


def _capacity(plan: Plan, candidate: Candidate) -> float:
    return twin_objective(candidate, rec.objective_kind(plan.snap.isvc), _gpus(plan))


def _robust(plan: Plan, candidate: Candidate) -> float:
    """The candidate's robust capacity (under the twin's uncertainty) in the objective's unit (its
    capacity where it was not evaluated: an upper bound, as the ranking orders)."""
    capacity = _capacity(plan, candidate)
    if candidate.robust_req_s is None or candidate.capacity_req_s <= 0:
        return capacity
    return capacity * candidate.robust_req_s / candidate.capacity_req_s


def service_twin(plan: Plan, reading: TwinReading, calibration: Calibration) -> ServiceTwin:
    """The ``status.twin`` of a ranking made this step."""
    fit = calibration.fit
    incumbent = calibration.incumbent
    (p_itl, p_ttft), (m_itl, m_ttft) = calibration.predicted_ms, reading.measured_ms
    return ServiceTwin(
        state=TwinState.FITTED,
        message=fitted_message(calibration),
        fitted_at=plan.snap.now.replace(microsecond=0),
        config_hash=plan.stable_config.config_hash(),
        refit_trial=reading.refit_trial,
        steps=round(fit.steps),
        step_fit_error=_round(fit.rms_relative_error),
        scales={
            "compute": round(fit.scales.compute, 4),
            "memory": round(fit.scales.memory, 4),
            "stepOverhead": round(fit.scales.step_overhead, 4),
            "sequenceOverhead": round(fit.scales.sequence_overhead, 4),
            "attentionCompute": round(fit.scales.attention_compute, 4),
            "attentionMemory": round(fit.scales.attention_memory, 4),
            "elementwise": round(fit.scales.elementwise, 4),
        },
        error=_round(calibration.error),
        tolerance=TOLERANCE,
        itl_offset_ms=_round(calibration.offset_ms[0], 1),
        ttft_offset_ms=_round(calibration.offset_ms[1], 1),
        predicted_itl_ms=_round(p_itl, 1),
        predicted_ttft_ms=_round(p_ttft, 1),
        measured_itl_ms=_round(m_itl, 1),
        measured_ttft_ms=_round(m_ttft, 1),
        capacity_req_s=_round(incumbent.capacity_req_s, 3) if incumbent else None,
        capacity=_round(_capacity(plan, incumbent)) if incumbent else None,
        capacity_unit=capacity_unit(rec.objective_kind(plan.snap.isvc)),
        live_request_rate=_round(reading.live_rate_req_s, 2),
        candidates=[
            TwinCandidate(
                config=rec.engine_config(c.config),
                capacity_req_s=round(c.capacity_req_s, 3),
                capacity=round(_capacity(plan, c), 4),
                robust_capacity=None if c.robust_req_s is None else round(_robust(plan, c), 4),
            )
            for c in sorted(calibration.ranked, key=lambda c: -_robust(plan, c))[:MAX_CANDIDATES]
        ],
        evaluations=calibration.evaluations,
        cpu_seconds=round(calibration.cpu_seconds, 1),
    )


def fitted_message(calibration: Calibration) -> str:
    fit = calibration.fit
    error = f"{calibration.error:.0%}" if math.isfinite(calibration.error) else "unknown"
    return (
        f"twin fitted on {fit.steps:.0f} engine steps (step-time error {fit.rms_relative_error:.1%}); "
        f"its error on the stable track at the live load is {error} (tolerance {TOLERANCE:.0%})"
    )


def record_twin(plan: Plan) -> None:
    """``status.twin`` and the ``TwinUnavailable`` condition from the snapshot's twin reading."""
    reading = plan.snap.twin
    if reading.state is None or reading.settling or reading.pending:
        return  # settling, or ranking in a Job: the last calibration's status stands until then
    if reading.state is not TwinState.FITTED or reading.calibration is None:
        reason = "NoStepTelemetry" if reading.state is TwinState.UNAVAILABLE else "WaitingForTelemetry"
        prefix = "" if reading.state is TwinState.UNAVAILABLE else "waiting to fit the twin: "
        plan.condition(ConditionType.TWIN_UNAVAILABLE, ConditionStatus.TRUE, reason, prefix + reading.message)
        plan.status["twin"] = {"state": reading.state.value, "message": reading.message[:1024]}
        return
    plan.condition(
        ConditionType.TWIN_UNAVAILABLE,
        ConditionStatus.FALSE,
        "TwinFitted",
        fitted_message(reading.calibration),
    )
    if reading.ranked:
        plan.status["twin"] = service_twin(plan, reading, reading.calibration).to_k8s()
        return
    update: dict[str, object] = {"liveRequestRate": _round(reading.live_rate_req_s, 2)}
    before = plan.snap.status.twin
    if before is None or before.state is not TwinState.FITTED:  # fitted again after a wait
        update.update(state=TwinState.FITTED.value, message=fitted_message(reading.calibration))
    plan.status["twin"] = update


def waiting(plan: Plan) -> str | None:
    """Why the next trial waits for the twin (telemetry present but too little to fit); None: go on."""
    reading = plan.snap.twin
    if reading.state is TwinState.WAITING:
        return f"waiting for enough telemetry to fit the twin before the next trial: {reading.message}"
    if reading.settling:
        return f"waiting for a window of steady traffic before refitting the twin: {reading.settling}"
    if reading.pending:
        return f"waiting for the twin's ranking before the next trial: {reading.pending}"
    return None


@dataclass(frozen=True)
class Choice:
    """The twin's next trial: its config, the twin's evidence for it and why it was chosen."""

    config: TunedConfig
    twin: TrialTwin
    reason: str


def ranking(plan: Plan) -> tuple[list[TwinCandidate], ServiceTwin] | None:
    """The twin's current ranking: made this step, else the service's of the same key; None: none."""
    reading = plan.snap.twin
    if reading.state is not TwinState.FITTED or reading.calibration is None:
        return None
    if reading.ranked:
        fresh = service_twin(plan, reading, reading.calibration)
        return list(fresh.candidates), fresh
    twin = plan.snap.status.twin
    if twin is None or twin.state is not TwinState.FITTED:
        return None
    if twin.config_hash != plan.stable_config.config_hash() or twin.refit_trial != reading.refit_trial:
        return None
    return list(twin.candidates), twin


def choose(plan: Plan, space: SearchSpace, tried: Iterable[TunedConfig]) -> Choice | None:
    """The best-ranked candidate not tried yet; None: no twin ranking, or all of it tried (the sampler).

    Canaries verify the ranking in order, also below the promotion margin (the margin gates the
    promotion, not the verification: each canary's steps also refit the twin).
    """
    found = ranking(plan)
    if found is None:
        return None
    candidates, twin = found
    seen = set(tried) | {rec.tuned_config(plan.stable_config)}
    incumbent = twin.capacity
    for rank, candidate in enumerate(candidates, start=1):
        config = rec.tuned_config(candidate.config)
        if config in seen or space.to_params(config) is None:
            continue
        evidence = TrialTwin(
            capacity_req_s=candidate.capacity_req_s,
            capacity=candidate.capacity,
            robust_capacity=candidate.robust_capacity,
            incumbent_capacity=incumbent,
            capacity_unit=twin.capacity_unit,
            fit_error=twin.error,
            tolerance=TOLERANCE,
            rank=rank,
        )
        versus = f" vs the stable config's {incumbent:.4g}" if incumbent is not None else ""
        why = f"twin rank {rank}: predicted capacity {candidate.capacity:.4g}{versus} {twin.capacity_unit}"
        return Choice(config, evidence, why)
    return None


def unpredicted(plan: Plan) -> TrialTwin:
    """The twin block of a trial the sampler chose: why the twin predicted nothing for it."""
    reading = plan.snap.twin
    if reading.state is TwinState.UNAVAILABLE:
        why = f"twin unavailable: {reading.message}"
    elif reading.state is TwinState.WAITING:
        why = f"the twin is not fitted yet: {reading.message}"
    elif reading.state is None:
        why = "the twin was not consulted (the operator runs with CHUNKPILOT_TWIN=off, or without Prometheus)"
    elif ranking(plan) is None:
        why = "chosen by the sampler: the twin has no ranking of its current fit"
    else:
        why = "chosen by the sampler: every configuration the twin ranked was tried"
    return TrialTwin(tolerance=TOLERANCE, message=f"no prediction: {why}"[:1024])


def _unchecked(plan: Plan) -> str:
    reading = plan.snap.twin
    if reading.state is TwinState.FITTED:
        return "the canary's live load or latency quantiles could not be read at the end of its window"
    if reading.state is None:
        return "the twin was not consulted"
    return f"no fitted twin at the end of the window ({reading.message})"


def _note(base: TrialTwin, note: str) -> str:
    return "; ".join(m for m in (base.message, note) if m)[:1024]


def verdict_twin(plan: Plan, trial: TuningTrial) -> TrialTwin:
    """The trial's twin block at its verdict: the canary's check this step, or why there is none.

    Recorded for every judged (or pruned) trial, with a prediction of its capacity or without.
    """
    base = trial.status.twin if trial.status is not None and trial.status.twin else TrialTwin()
    check, stable = plan.snap.twin.check, plan.snap.twin.stable_check
    if check is None:
        return base.model_copy(update={"message": _note(base, f"not checked: {_unchecked(plan)}")})
    fit_error = stable.error if stable is not None else base.fit_error
    (p_itl, p_ttft), (m_itl, m_ttft) = check.predicted_ms, check.measured_ms
    error = _round(check.error)
    message = base.message
    if error is None:
        message = _note(base, "no error: neither quantile had both a prediction and a measurement")
    return base.model_copy(
        update={
            "message": message,
            "error": error,
            "fit_error": _round(fit_error),
            "tolerance": base.tolerance if base.tolerance is not None else TOLERANCE,
            "rate_req_s": _round(check.rate_req_s, 3),
            "predicted_itl_ms": _round(p_itl, 1),
            "predicted_ttft_ms": _round(p_ttft, 1),
            "measured_itl_ms": _round(m_itl, 1),
            "measured_ttft_ms": _round(m_ttft, 1),
        }
    )


def aborted_twin(trial: TuningTrial, reason: str) -> TrialTwin:
    """The twin block of an aborted trial: nothing was measured to check the twin against."""
    base = trial.status.twin if trial.status is not None and trial.status.twin else TrialTwin()
    return base.model_copy(update={"message": _note(base, f"not checked: aborted ({reason})")})


def evidence(plan: Plan, trial: TuningTrial) -> TwinEvidence | None:
    """What the judge compares: the trial's predicted capacities and the canary check of this step."""
    check, stable = plan.snap.twin.check, plan.snap.twin.stable_check
    twin = trial.status.twin if trial.status is not None else None
    if check is None or twin is None or twin.capacity is None:
        return None
    # The twin's error on the stable track in the canary's own window (else: when it was chosen).
    fit_error = stable.error if stable is not None else twin.fit_error
    tolerance = twin.tolerance if twin.tolerance is not None else TOLERANCE
    slo = plan.snap.slo
    targets = (slo.itl_ms, slo.ttft_ms)
    return TwinEvidence(
        predicted_ms=check.predicted_ms,
        measured_ms=check.measured_ms,
        rate_req_s=check.rate_req_s,
        error=check.error,
        capacity=twin.capacity,
        robust_capacity=twin.robust_capacity,
        incumbent_capacity=twin.incumbent_capacity,
        unit=twin.capacity_unit or "",
        fit_error=fit_error if fit_error is not None else math.nan,
        tolerance=tolerance,
        confirmed=check.confirms(targets, tolerance),
        fit_confirmed=stable.confirms(targets, tolerance) if stable is not None else None,
    )


def drift_retune(plan: Plan, round_trials: Sequence[TuningTrial]) -> str | None:
    """Why a new tuning round pays, or None: the stable track's tokens per request moved more than
    :data:`WORKLOAD_DRIFT` from the mix the round's first trial recorded, and the twin, ranked on the
    live workload this step, has a configuration that needs fewer GPUs than the running one at the
    live request rate (plus the planner's headroom)."""
    snap = plan.snap
    reading, stable = snap.twin, snap.stable_reading.value
    calibration = reading.calibration
    if not reading.ranked or calibration is None or calibration.incumbent is None or not calibration.ranked:
        return None
    first = min(round_trials, key=lambda t: t.spec.number, default=None)
    if first is None or stable is None:
        return None
    mix = rec.token_mix(first)
    if mix is None:
        return None
    moved = [
        f"{name} {then:.0f} -> {now:.0f}"
        for name, then, now in (
            ("prompt", mix.prompt, stable.mean_prompt_tokens),
            ("output", mix.output, stable.mean_output_tokens),
        )
        if then and now and abs(now / then - 1.0) > WORKLOAD_DRIFT
    ]
    rate = snap.service_rate()
    if not moved or rate is None or not rate > 0:
        return None
    planned = rate * (1.0 + snap.isvc.spec.scaling.headroom)
    best = max(calibration.ranked, key=lambda c: c.capacity_req_s)
    need_best = replicas_for(planned, Capacity(best.capacity_req_s, 0.0))
    need_now = replicas_for(planned, Capacity(calibration.incumbent.capacity_req_s, 0.0))
    if need_best is None or (need_now is not None and need_best >= need_now):
        return None
    gpus = _gpus(plan)
    running = "more than any count" if need_now is None else f"{need_now * gpus}"
    return (
        f"the workload drifted from the one tuning round {rec.trial_round(first)} was sized for "
        f"({', '.join(moved)} tokens per request): at the live {rate:.3g} req/s the twin's best "
        f"configuration ({best.config.summary()}) needs {need_best * gpus} GPU(s), the running one {running}"
    )
