"""Decide about the canary Deployment: its manifest, orphans, parking, reuse and live adjustment.

Any canary no active trial owns is an orphan and deleted, except a parked one kept for the next
trial to adjust (see :mod:`chunkpilot.tuner.observe.canary` for what a canary says about itself).

Live adjustment lowers a running canary's scheduler limits instead of rolling out a new one.
With ``spec.autotune.liveAdjust`` the engine serves an authenticated route (the vLLM plugin's, see
:mod:`chunkpilot.engine.vllm_plugin.endpoint`; the simulator serves the same one) that lowers
``max_num_batched_tokens``, ``max_num_seqs`` and ``max_num_active_seqs`` at run time and refuses
raises above the start-up values. The tuner starts a canary at the top of the search space for
those three knobs and reaches each trial's values through the route, so a trial that only lowers
them needs no restart.

Pure decisions (:func:`live_adjust_refusal`, :func:`ceiling_config`) and plan steps
(:func:`remove_orphan`, :func:`take_over_parked`, :func:`park_or_delete`, :func:`release_parked`,
:func:`adjust_or_fall_back`); the HTTP call is :mod:`chunkpilot.tuner.act.live_adjust`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from chunkpilot.operator.builders import (
    ANNOTATION_LIVE_LIMITS,
    RenderError,
    build_deployment,
)
from chunkpilot.operator.config import without_live_adjust
from chunkpilot.operator.events import EventSpec, EventType
from chunkpilot.operator.objects import adopt
from chunkpilot.tuner import records as rec
from chunkpilot.tuner.decide.plan import (
    Action,
    AdjustLive,
    AnnotateCanary,
    ApplyCanary,
    DeleteCanary,
    Emit,
    PatchTrial,
    Plan,
)
from chunkpilot.tuner.observe.canary import (
    ANNOTATION_PARKED,
    LIVE_KNOBS,
    canary_owner,
    enabled,
    is_parked,
    is_terminating,
    pod_ready,
    started_config,
)
from chunkpilot.tuner.space import Knob, SearchSpace

from chunkpilot.api import (
    LABEL_CONFIG_HASH,
    EngineConfig,
    InferenceService,
    Track,
    TrialPhase,
    TrialProgress,
    TrialVerdict,
    TuningTrial,
    TuningTrialStatus,
)


def _active(config: EngineConfig) -> int:
    return config.max_num_active_seqs or config.max_num_seqs


def live_adjust_refusal(started: EngineConfig, target: EngineConfig) -> str | None:
    """Why pods started with ``started`` cannot serve ``target`` through the route; None if they can.

    They can when every knob but :data:`LIVE_KNOBS` is equal and none of those is raised.
    """
    for knob in EngineConfig.KNOBS:
        if knob in LIVE_KNOBS:
            continue
        before, after = getattr(started, knob), getattr(target, knob)
        if before != after:
            return f"{knob} changes ({before} -> {after}): only a restart applies it"
    pairs = {
        "max_num_batched_tokens": (started.max_num_batched_tokens, target.max_num_batched_tokens),
        "max_num_seqs": (started.max_num_seqs, target.max_num_seqs),
        "max_num_active_seqs": (_active(started), _active(target)),
    }
    for knob, (ceiling, wanted) in pairs.items():
        if wanted > ceiling:
            return f"{knob} {wanted} is above the start-up value {ceiling}: only a restart raises it"
    return None


def target_limits(target: EngineConfig) -> dict[str, int]:
    """The route's JSON body for ``target`` (all three limits, so nothing stays from a previous trial)."""
    return {
        "max_num_batched_tokens": target.max_num_batched_tokens,
        "max_num_seqs": target.max_num_seqs,
        "max_num_active_seqs": _active(target),
    }


def ceiling_config(target: EngineConfig, budget_high: int | None, seqs_high: int | None) -> EngineConfig:
    """``target`` with the live limits raised to the search space's top (never lowered).

    Pods started so can reach any later trial that changes only those limits. The
    active-sequence cap is left unset (it then equals max-num-seqs).
    """
    budget = max(target.max_num_batched_tokens, budget_high or 0)
    seqs = max(target.max_num_seqs, seqs_high or 0)
    values = {**target.model_dump(), "max_num_batched_tokens": budget, "max_num_seqs": seqs}
    values["max_num_active_seqs"] = None
    return EngineConfig.model_validate(values)


def canary_manifest(
    isvc: InferenceService, body: Mapping[str, Any], trial: TuningTrial, start: EngineConfig | None = None
) -> dict[str, Any]:
    """The canary Deployment of ``trial`` (raises :class:`RenderError` for a knob the engine refuses).

    ``start``: the config to start the pods with when it is not the trial's own (live
    adjustment then lowers the limits to the trial's).
    """
    if isvc.spec.autotune.live_adjust and not enabled(isvc):
        isvc = without_live_adjust(isvc)  # no route, so no token Secret to reference
    manifest = build_deployment(isvc, Track.CANARY, config=start or trial.spec.params)
    assert trial.metadata.name is not None
    annotations = manifest["metadata"].setdefault("annotations", {})
    annotations[rec.ANNOTATION_TRIAL] = trial.metadata.name
    annotations[ANNOTATION_PARKED] = ""
    return adopt(manifest, body)


def live_usable(plan: Plan) -> bool:
    """``autotune.liveAdjust`` is on and no trial of the service saw the route fail."""
    if not enabled(plan.snap.isvc):
        return False
    return not any(rec.trial_progress(t).live_adjusted is False for t in plan.snap.trials)


def live_start(plan: Plan, trial: TuningTrial, space: SearchSpace | None) -> EngineConfig | None:
    """The config to start a new canary with so later trials can go down (None: the trial's own)."""
    if not live_usable(plan) or space is None:
        return None
    budget = space.ranges.get(Knob.MAX_NUM_BATCHED_TOKENS)
    seqs = space.ranges.get(Knob.MAX_NUM_SEQS)
    try:
        start = ceiling_config(
            trial.spec.params, budget.high if budget else None, seqs.high if seqs else None
        )
    except ValueError:
        return None
    return None if start == trial.spec.params else start


def delete_canary(plan: Plan) -> None:
    plan.do(DeleteCanary())
    plan.canary = None


def remove_orphan(plan: Plan, current: TuningTrial | None, *, keep_parked: bool = False) -> None:
    """Delete a canary no active trial owns (a parked one stays while it may be reused)."""
    canary = plan.canary
    if canary is None or is_terminating(canary):
        return
    owner = canary_owner(canary)
    if current is not None and owner == current.metadata.name:
        return
    if keep_parked and is_parked(canary) and enabled(plan.snap.isvc):
        return  # kept for the next trial to adjust (removed when tuning stops)
    delete_canary(plan)
    plan.emit(
        EventType.WARNING,
        "OrphanRemoved",
        f"removed canary Deployment {canary['metadata']['name']} of {owner or 'no trial'}: "
        "no active trial owns it",
    )


def take_over_parked(plan: Plan, trial: TuningTrial, ready: bool) -> bool:
    """Hand a parked, Ready canary whose start-up limits cover ``trial`` to it (no new rollout)."""
    canary = plan.canary
    if not live_usable(plan) or canary is None or is_terminating(canary) or not is_parked(canary):
        return False
    started = started_config(canary)
    if started is None or live_adjust_refusal(started, trial.spec.params) is not None:
        return False  # the new rollout replaces it
    if not ready:
        return False
    plan.do(AnnotateCanary({rec.ANNOTATION_TRIAL: trial.metadata.name, ANNOTATION_PARKED: None}))
    return True


def park_or_delete(plan: Plan, trial: TuningTrial, verdict: TrialVerdict) -> None:
    """Keep a finished trial's canary for the next trial to adjust, else delete it."""
    canary = plan.canary
    if (
        verdict is not TrialVerdict.ABORTED
        and live_usable(plan)
        and rec.trial_progress(trial).live_adjusted is not False
        and canary is not None
        and started_config(canary) is not None
        and canary_owner(canary) == trial.metadata.name
    ):
        plan.do(AnnotateCanary({rec.ANNOTATION_TRIAL: None, ANNOTATION_PARKED: "true"}))
        return
    delete_canary(plan)


def release_parked(plan: Plan) -> None:
    """Delete a parked canary once no next trial will use it."""
    if enabled(plan.snap.isvc) and plan.canary is not None and is_parked(plan.canary):
        delete_canary(plan)


def adjust_or_fall_back(
    plan: Plan,
    trial: TuningTrial,
    started: EngineConfig,
    measuring: Callable[[TrialProgress], Sequence[Action]],
    abort: Callable[[str], Sequence[Action]],
) -> bool:
    """Set the trial's limits on the Ready canary pods, then start measuring; on failure roll out.

    Returns False when live adjustment is not wanted (the caller starts measuring itself).
    After a successful adjustment ``measuring`` gets the progress with the live marks;
    a failure records why and rolls out a canary with the trial's own config
    (``abort``: the actions that abort the trial, should that config not render).
    """
    # With live adjustment usable, always set the limits: a parked canary taken over
    # still runs the previous trial's, even when this trial's equal the start-up ones.
    if started == trial.spec.params and not live_usable(plan):
        return False
    snap = plan.snap
    name = trial.metadata.name or ""
    progress = rec.trial_progress(trial)
    adjusted = progress.model_copy(
        update={"live_adjusted": True, "canary_config_hash": started.config_hash()}
    )

    def fall_back(reason: str) -> list[Action]:
        failed = progress.model_copy(update={"live_adjusted": False, "live_adjust_error": reason[:1024]})
        actions: list[Action] = [
            PatchTrial(name, rec.progress_patch(failed)),
            _event(
                EventType.WARNING,
                "LiveAdjustFailed",
                f"trial {trial.spec.number}: live adjustment failed ({reason}); "
                "rolling out a canary with the trial's config",
            ),
        ]
        try:
            manifest = canary_manifest(snap.isvc, snap.body, trial)
        except RenderError as error:
            return [*actions, *abort(f"the engine refuses the config: {error}")]
        status = TuningTrialStatus(phase=TrialPhase.ROLLING_OUT, started_at=snap.now)
        return [*actions, ApplyCanary(manifest), PatchTrial(name, {"status": status.to_k8s()})]

    refusal = live_adjust_refusal(started, trial.spec.params)
    failure = refusal or snap.live_token_error
    if failure is not None or snap.live_token is None:
        plan.do(*fall_back(failure or "no live-adjustment token"))
        return True
    pods = tuple(
        pod
        for pod in snap.live_pods
        if pod_ready(pod)
        and ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_CONFIG_HASH) == started.config_hash()
    )
    limits = target_limits(trial.spec.params)
    # What the pods now run, for the operator's gauges (it holds while the pods run ``started``).
    running = json.dumps({"configHash": started.config_hash(), **limits})
    record = AnnotateCanary({ANNOTATION_LIVE_LIMITS: running})
    success = (record, *measuring(adjusted))
    plan.do(AdjustLive(pods, snap.live_token, limits, success, fall_back))
    return True


def _event(type_: EventType, reason: str, message: str) -> Action:
    return Emit(EventSpec(type_, reason, message))
