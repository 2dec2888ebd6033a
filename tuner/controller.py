"""The per-service tuning loop as a timer-driven state machine.

Every tick (a Kopf timer, see :mod:`chunkpilot.tuner.handlers`) calls
:meth:`TuningController.step` for one InferenceService.  A step reads the
service, its ``TuningTrial`` objects and its Deployments, does at most one
transition and writes the result back at once, so all state lives in the cluster:

.. code-block:: text

    (no active trial)  -- ask Optuna -->  Pending  -- canary applied -->  RollingOut
    RollingOut  -- canary Ready -->  Measuring (warm-up, then the trial window)
    Measuring   -- verdict -->  Promoted | RolledBack | Pruned | Failed  (canary deleted)

With ``autotune.liveAdjust`` (:mod:`chunkpilot.tuner.liveadjust`) a canary starts at the
top of the space for the live limits, RollingOut -> Measuring first lowers them through
the engine's route, and a finished trial parks its canary for the next trial to adjust
(falling back to a rollout whenever that is not possible).

Invariants stated once: at most one trial of a service is active; a canary
Deployment exists only while its trial is active (any other is an orphan and is
deleted); a trial's name is derived from its number, so a restart between
"ask" and "create" cannot duplicate it (the sampler is seeded by the number and
asks the same again); a promotion is applied (``status.bestConfig`` and the
stable Deployment) before the trial is marked as applied, and re-applied on the
next step if the operator stopped in between.  Nothing is promoted without a
measurement of both tracks from the same window.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, ParamSpec, Protocol, TypeVar

from chunkpilot.operator.builders import (
    RenderError,
    build_deployment,
    deployment_name,
    live_adjust_secret_name,
)
from chunkpilot.operator.events import EventSpec, EventType
from chunkpilot.operator.kube import KubeError, resource_path
from chunkpilot.operator.status import DeploymentState
from chunkpilot.tuner import liveadjust as live
from chunkpilot.tuner import records as rec
from chunkpilot.tuner.measure import (
    MetricsUnavailableError,
    QueryFn,
    Selector,
    TrackMeasurement,
    TrackName,
    WindowMeasurement,
    measure_track,
    measure_window,
)
from chunkpilot.tuner.policy import (
    AbortRules,
    Decision,
    Judgement,
    SLOTargets,
    StopReason,
    assess_infeasibility,
    check_slo,
    judge_early,
    judge_final,
    objective_value,
    should_stop,
    trial_deadline,
)
from chunkpilot.tuner.space import (
    DEFAULT_OUTPUT_TOKENS,
    DEFAULT_PROMPT_TOKENS,
    Knob,
    SearchSpace,
    ServiceFacts,
    SpaceError,
    build_space,
    warm_start,
)
from chunkpilot.tuner.study import SamplerUnavailableError, TrialRecord, seed_for, suggest

from chunkpilot import telemetry
from chunkpilot.api import (
    API_VERSION,
    ISVC_KIND,
    ISVC_PLURAL,
    LABEL_CONFIG_HASH,
    LABEL_SERVICE,
    LABEL_TRACK,
    TRIAL_PLURAL,
    Condition,
    ConditionStatus,
    ConditionType,
    Constraints,
    EngineConfig,
    InferenceService,
    InferenceServiceStatus,
    ManifestError,
    Measurement,
    ObjectMeta,
    ServiceSummary,
    SLOState,
    Track,
    TrialPhase,
    TrialSummary,
    TrialVerdict,
    TuningTrial,
    TuningTrialSpec,
    TuningTrialStatus,
    parse_duration,
    trial_labels,
    trial_name,
)

logger = logging.getLogger(__name__)
P = ParamSpec("P")
T = TypeVar("T")

#: The shortest window the early-abort check looks at (Prometheus needs a few scrapes for a rate).
MIN_EARLY_WINDOW_S = 5
STATUS_WRITE_ATTEMPTS = 5
#: TuningTrial annotation: the token mix the warm start was sized for when the trial was asked.
ANNOTATION_TOKEN_MIX = f"{rec.GROUP_PREFIX}/token-mix"
#: TuningTrial annotation: the same mix as JSON ``{"prompt": …, "output": …}`` (null = default). The
#: round's first trial fixes it, so a drifting measurement cannot mint a new warm start every trial.
ANNOTATION_TOKEN_MIX_MEANS = f"{rec.GROUP_PREFIX}/token-mix-means"


class Kube(Protocol):
    """The API verbs the loop needs (``chunkpilot.operator.kube.KubeClient`` has them)."""

    async def get(self, path: str) -> dict[str, Any] | None: ...
    async def apply(self, manifest: Mapping[str, Any], *, force: bool = True) -> dict[str, Any]: ...
    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any]: ...
    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]: ...
    async def delete(self, path: str) -> None: ...
    async def list(self, path: str, *, label_selector: str | None = None) -> list[dict[str, Any]]: ...


PostEvent = Callable[[Mapping[str, Any], EventSpec], None]
Mirror = Callable[
    [str, str, SearchSpace, list[TrialRecord], Mapping[int, Mapping[str, Any]]], Awaitable[object]
]
"""Copies the finished trials of a service somewhere (e.g. an Optuna RDB for optuna-dashboard)."""
Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


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


class TuningReason(StrEnum):
    """Reasons of the Tuning condition."""

    TRIAL_RUNNING = "TrialRunning"
    WAITING = "WaitingForStable"
    PAUSED = "Paused"
    DISABLED = "Disabled"
    METRICS_UNAVAILABLE = "MetricsUnavailable"
    INVALID_SPACE = "InvalidSearchSpace"


# --------------------------------------------------------------------------- small pure helpers


def seconds(duration: str) -> int:
    return parse_duration(duration)


def window_text(total_s: float) -> str:
    return f"{max(1, int(total_s))}s"


def owner_reference(body: Mapping[str, Any]) -> dict[str, Any]:
    meta = body["metadata"]
    return {
        "apiVersion": body.get("apiVersion", API_VERSION),
        "kind": body.get("kind", ISVC_KIND),
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def adopt(manifest: dict[str, Any], owner: Mapping[str, Any]) -> dict[str, Any]:
    """``manifest`` owned by ``owner`` (garbage-collected with it), in its namespace."""
    meta = manifest.setdefault("metadata", {})
    meta["namespace"] = owner["metadata"]["namespace"]
    meta["ownerReferences"] = [owner_reference(owner)]
    return manifest


def canary_manifest(
    isvc: InferenceService, body: Mapping[str, Any], trial: TuningTrial, start: EngineConfig | None = None
) -> dict[str, Any]:
    """The canary Deployment of ``trial`` (raises :class:`RenderError` for a knob the engine refuses).

    ``start``: the config to start the pods with when it is not the trial's own (live
    adjustment then lowers the limits to the trial's).
    """
    config = start or trial.spec.params
    manifest = build_deployment(isvc, Track.CANARY, config=config)
    assert trial.metadata.name is not None
    annotations = manifest["metadata"].setdefault("annotations", {})
    annotations[rec.ANNOTATION_TRIAL] = trial.metadata.name
    annotations[live.ANNOTATION_STARTED_CONFIG] = live.started_config_annotation(config)
    annotations[live.ANNOTATION_PARKED] = ""
    return adopt(manifest, body)


def canary_config_hash(trial: TuningTrial) -> str:
    """The config hash of the pods serving ``trial`` (their start-up config's, when live-adjusted)."""
    return trial.metadata.annotations.get(live.ANNOTATION_CANARY_HASH) or trial.spec.params.config_hash()


def stable_manifest(isvc: InferenceService, body: Mapping[str, Any], config: EngineConfig) -> dict[str, Any]:
    """The stable Deployment running ``config`` (the promotion contract)."""
    return adopt(build_deployment(isvc, Track.STABLE, config=config), body)


def trial_manifest(
    isvc: InferenceService,
    body: Mapping[str, Any],
    number: int,
    config: EngineConfig,
    params: Mapping[str, int],
    baseline: EngineConfig,
    round_: int,
    token_mix: str | None = None,
    token_mix_means: tuple[float | None, float | None] | None = None,
) -> dict[str, Any]:
    service = body["metadata"]["name"]
    annotations = {rec.ANNOTATION_STUDY_PARAMS: json.dumps(dict(params), sort_keys=True)}
    if token_mix is not None:
        annotations[ANNOTATION_TOKEN_MIX] = token_mix
    if token_mix_means is not None:
        prompt, output = token_mix_means
        annotations[ANNOTATION_TOKEN_MIX_MEANS] = json.dumps({"prompt": prompt, "output": output})
    trial = TuningTrial(
        metadata=ObjectMeta(
            name=trial_name(service, number),
            namespace=body["metadata"]["namespace"],
            labels={**trial_labels(service, number), rec.LABEL_ROUND: str(round_)},
            annotations=annotations,
        ),
        spec=TuningTrialSpec(
            service_name=service,
            number=number,
            params=config,
            baseline_config_hash=baseline.config_hash(),
            track=Track.CANARY,
            window=isvc.spec.autotune.trial_window,
        ),
    )
    return adopt(trial.to_manifest(), body)


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


def with_token_mix(facts: ServiceFacts, stable: TrackMeasurement | None) -> tuple[ServiceFacts, str]:
    """``facts`` with the stable track's measured tokens per request, and a note of the values used.

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
    return facts, f"{shown_prompt:.0f} prompt + {shown_output:.0f} output tokens per request ({source})"


def round_token_mix(
    facts: ServiceFacts, stable: TrackMeasurement | None, round_trials: Sequence[TuningTrial]
) -> tuple[ServiceFacts, str]:
    """The token mix the round's first trial recorded, or (first trial of a round) the measured one."""
    first = min(round_trials, key=lambda t: t.spec.number, default=None)
    annotations = (first.metadata.annotations or {}) if first is not None else {}
    raw, note = annotations.get(ANNOTATION_TOKEN_MIX_MEANS), annotations.get(ANNOTATION_TOKEN_MIX)
    if raw is not None and note is not None:
        try:
            means = json.loads(raw)
            prompt, output = means.get("prompt"), means.get("output")
        except (ValueError, AttributeError):
            pass
        else:
            return replace(facts, mean_prompt_tokens=prompt, mean_output_tokens=output), note
    return with_token_mix(facts, stable)


@dataclass
class _Context:
    """What one step knows about a service."""

    body: dict[str, Any]
    isvc: InferenceService
    status: InferenceServiceStatus
    namespace: str
    name: str
    slo: SLOTargets
    abort: AbortRules
    trials: list[TuningTrial]
    now: datetime
    incumbent: EngineConfig
    status_update: dict[str, Any] = field(default_factory=dict)
    conditions: list[rec.ConditionUpdate] = field(default_factory=list)

    def condition(self, type_: ConditionType, status: ConditionStatus, reason: str, message: str) -> None:
        self.conditions = [c for c in self.conditions if c.type != type_.value]
        self.conditions.append(rec.ConditionUpdate(type_.value, status, reason, message))

    def current_condition(self, type_: ConditionType) -> Condition | None:
        return rec.find_condition(self.status.conditions, type_.value)


# --------------------------------------------------------------------------- the controller


class TuningController:
    """Advances the tuning of one InferenceService per :meth:`step`; keeps no state between steps."""

    def __init__(
        self,
        kube: Kube,
        query: QueryFn | None,
        *,
        post_event: PostEvent | None = None,
        clock: Clock = utc_now,
        settings: TunerSettings | None = None,
        inline: bool = False,
        mirror: Mirror | None = None,
        live_adjuster: live.LiveAdjuster | None = None,
    ) -> None:
        self.kube = kube
        self.live_adjuster = live_adjuster or live.HttpLiveAdjuster()
        self.mirror = mirror
        self.query = query
        self.post_event = post_event
        self.clock = clock
        self.settings = settings or TunerSettings()
        self._inline = inline  # run blocking calls on the loop itself (tests)

    # ------------------------------------------------------------------ paths

    @staticmethod
    def isvc_path(namespace: str, name: str, sub: str | None = None) -> str:
        return resource_path(API_VERSION, ISVC_PLURAL, namespace, name, sub)

    @staticmethod
    def trial_path(namespace: str, name: str | None = None, sub: str | None = None) -> str:
        return resource_path(API_VERSION, TRIAL_PLURAL, namespace, name, sub)

    @staticmethod
    def deployment_path(namespace: str, service: str, track: Track) -> str:
        return resource_path("apps/v1", "deployments", namespace, deployment_name(service, track))

    # ------------------------------------------------------------------ entry point

    async def step(self, namespace: str, name: str) -> None:
        """One transition of the service's tuning loop."""
        body = await self.kube.get(self.isvc_path(namespace, name))
        if body is None or body.get("metadata", {}).get("deletionTimestamp"):
            return
        try:
            isvc = InferenceService.from_manifest({k: v for k, v in body.items() if k != "status"})
        except ManifestError as error:
            logger.warning("%s/%s: not tuning an invalid InferenceService: %s", namespace, name, error)
            return
        try:
            status = InferenceServiceStatus.model_validate(body.get("status") or {})
        except ValueError:
            status = InferenceServiceStatus()
        isvc = isvc.model_copy(update={"status": status})
        trials = await self._trials(namespace, name)
        ctx = _Context(
            body=body,
            isvc=isvc,
            status=status,
            namespace=namespace,
            name=name,
            slo=rec.slo_targets(isvc) if isvc.spec.slo is not None else SLOTargets(1.0, 1.0),
            abort=rec.abort_rules(isvc),
            trials=trials,
            now=self.clock(),
            incumbent=rec.incumbent(isvc),
        )
        try:
            await self._step(ctx)
        finally:
            await self._write_service_status(ctx)

    async def _step(self, ctx: _Context) -> None:
        autotune = ctx.isvc.spec.autotune
        active = sorted((t for t in ctx.trials if rec.is_active(t)), key=lambda t: t.spec.number)
        for extra in active[1:]:  # never more than one: abort the newer ones
            await self._finish(
                ctx, extra, TrialPhase.FAILED, TrialVerdict.ABORTED, "another trial was active"
            )
        current = active[0] if active else None
        await self._apply_pending_promotion(ctx)
        if not autotune.enabled or ctx.isvc.spec.slo is None:
            if current is not None:
                await self._abort(ctx, current, "autotuning was disabled")
            await self._remove_orphan_canary(ctx, None)
            if ctx.current_condition(ConditionType.TUNING) is not None:
                ctx.condition(
                    ConditionType.TUNING,
                    ConditionStatus.FALSE,
                    TuningReason.DISABLED,
                    "autotune.enabled is false",
                )
            ctx.status_update["currentTrial"] = None
            return
        telemetry.record_slo_targets(
            ctx.namespace,
            ctx.name,
            (ctx.slo.itl_quantile, ctx.slo.itl_ms),
            (ctx.slo.ttft_quantile, ctx.slo.ttft_ms),
        )
        telemetry.TOKEN_BUDGET.labels(ctx.namespace, ctx.name, "stable").set(
            ctx.incumbent.max_num_batched_tokens
        )
        telemetry.MAX_NUM_SEQS.labels(ctx.namespace, ctx.name, "stable").set(ctx.incumbent.max_num_seqs)
        if autotune.paused:
            if current is not None:
                await self._abort(ctx, current, "autotuning was paused")
            await self._remove_orphan_canary(ctx, None)
            ctx.condition(
                ConditionType.TUNING,
                ConditionStatus.FALSE,
                TuningReason.PAUSED,
                "autotune.paused is true: keeping the current config",
            )
            ctx.status_update["currentTrial"] = None
            telemetry.CURRENT_TRIAL.labels(ctx.namespace, ctx.name).set(0)
            await self._monitor_stable(ctx)
            return
        if self.query is None:
            ctx.condition(
                ConditionType.METRICS_UNAVAILABLE,
                ConditionStatus.TRUE,
                "NoPrometheus",
                "no Prometheus URL configured: set --prometheus-url "
                "(CHUNKPILOT_PROMETHEUS_URL, chart value prometheus.url)",
            )
            if current is not None:
                await self._abort(ctx, current, "no Prometheus to measure with")
            await self._remove_orphan_canary(ctx, None)
            return
        await self._remove_orphan_canary(ctx, current, keep_parked=True)
        if current is not None:
            await self._advance(ctx, current)
        else:
            await self._maybe_start_trial(ctx)
            if ctx.status_update.get("currentTrial") is None and self._is_stopped(ctx):
                await self._release_parked_canary(ctx)

    # ------------------------------------------------------------------ trials

    async def _trials(self, namespace: str, service: str) -> list[TuningTrial]:
        items = await self.kube.list(self.trial_path(namespace), label_selector=f"{LABEL_SERVICE}={service}")
        result = []
        for item in items:
            try:
                result.append(TuningTrial.from_manifest(item))
            except ManifestError as error:
                logger.warning("%s/%s: skipping invalid TuningTrial: %s", namespace, service, error)
        return sorted(result, key=lambda t: t.spec.number)

    def _space(self, ctx: _Context) -> SearchSpace:
        return build_space(rec.service_facts(ctx.isvc), rec.space_bounds(ctx.isvc))

    def _records(self, ctx: _Context, space: SearchSpace, trials: Iterable[TuningTrial]) -> list[TrialRecord]:
        found = []
        for trial in trials:
            record = rec.trial_record(trial, space, ctx.slo)
            if record is not None:
                found.append(record)
        return found

    def _round(self, ctx: _Context) -> int:
        return max((rec.trial_round(t) for t in ctx.trials), default=0)

    async def _maybe_start_trial(self, ctx: _Context) -> None:
        autotune = ctx.isvc.spec.autotune
        try:
            space = self._space(ctx)
        except SpaceError as error:
            ctx.condition(ConditionType.TUNING, ConditionStatus.FALSE, TuningReason.INVALID_SPACE, str(error))
            return
        stable = await self.kube.get(self.deployment_path(ctx.namespace, ctx.name, Track.STABLE))
        stable_state = DeploymentState.from_manifest(stable) if stable is not None else None
        measurement = await self._monitor_stable(ctx)
        if measurement is False:
            return  # Prometheus unreachable: wait (MetricsUnavailable set)
        round_ = self._round(ctx)
        in_round = [t for t in ctx.trials if rec.trial_round(t) == round_]
        round_records = self._records(ctx, space, in_round)
        stop = self._stop_reason(ctx, space, round_records, len(in_round))
        if stop is not None:
            if self._should_retune(ctx):
                round_ += 1
                self._emit(
                    ctx,
                    EventType.WARNING,
                    "Retuning",
                    "SLO violated for a sustained window after tuning stopped: "
                    f"starting tuning round {round_}",
                )
            else:
                return
        if stable_state is None or not stable_state.rollout_complete:
            ctx.condition(
                ConditionType.TUNING,
                ConditionStatus.TRUE,
                TuningReason.WAITING,
                "waiting for the stable Deployment to finish rolling out before the next trial",
            )
            return
        number = max((t.spec.number for t in ctx.trials), default=0) + 1
        all_records = self._records(ctx, space, ctx.trials)
        incumbent_record = rec.incumbent_record(ctx.trials, space, ctx.incumbent, ctx.slo)
        if incumbent_record is not None:
            all_records.append(incumbent_record)
        stable_m = measurement if isinstance(measurement, TrackMeasurement) else None
        round_trials = [t for t in ctx.trials if rec.trial_round(t) == round_]
        facts, token_mix = round_token_mix(rec.service_facts(ctx.isvc), stable_m, round_trials)
        try:
            starts = warm_start(space, facts)
        except SpaceError as error:
            ctx.condition(ConditionType.TUNING, ConditionStatus.FALSE, TuningReason.INVALID_SPACE, str(error))
            return
        try:
            suggestion = await self._blocking(
                suggest,
                space,
                all_records,
                sampler=str(autotune.sampler),
                seed=seed_for(ctx.isvc.metadata.uid or ctx.name, number),
                warm_starts=starts,
                exclude=[rec.tuned_config(ctx.incumbent)],
            )
        except SamplerUnavailableError as error:
            ctx.condition(ConditionType.TUNING, ConditionStatus.FALSE, TuningReason.INVALID_SPACE, str(error))
            return
        if suggestion is None:
            self._stopped(ctx, StopReason.EXHAUSTED, "no untried configuration is left in the search space")
            return
        config = rec.engine_config(suggestion.config)
        manifest = trial_manifest(
            ctx.isvc,
            ctx.body,
            number,
            config,
            suggestion.params,
            ctx.incumbent,
            round_,
            token_mix,
            (facts.mean_prompt_tokens, facts.mean_output_tokens),
        )
        try:
            await self.kube.create(self.trial_path(ctx.namespace), manifest)
        except KubeError as error:
            if error.conflict:
                return  # created by an earlier step that did not finish: picked up next tick
            raise
        name = manifest["metadata"]["name"]
        status = TuningTrialStatus(phase=TrialPhase.PENDING, params_summary=config.summary())
        await self._patch_trial_status(ctx.namespace, name, status)
        ctx.status_update["currentTrial"] = name
        ctx.condition(
            ConditionType.TUNING,
            ConditionStatus.TRUE,
            TuningReason.TRIAL_RUNNING,
            f"trial {number} ({suggestion.source}): {config.summary()}",
        )
        telemetry.CURRENT_TRIAL.labels(ctx.namespace, ctx.name).set(number)
        if suggestion.source == "warm-start":
            self._emit(
                ctx,
                EventType.NORMAL,
                "WarmStart",
                f"trial {number} is a model-based warm start ({config.summary()}) sized for {token_mix}",
            )
        logger.info(
            "%s/%s: trial %d created (%s): %s",
            ctx.namespace,
            ctx.name,
            number,
            suggestion.source,
            config.summary(),
        )

    def _stop_reason(
        self, ctx: _Context, space: SearchSpace, round_records: Sequence[TrialRecord], round_trials: int
    ) -> StopReason | None:
        autotune = ctx.isvc.spec.autotune
        incumbent_met = self._incumbent_met(ctx)
        infeasible = assess_infeasibility(round_records, ctx.slo, incumbent_met)
        if infeasible is not None:
            remedies = ", ".join(r.value for r in infeasible.remedies)
            message = f"{infeasible.message} Remedies: {remedies}."
            before = ctx.current_condition(ConditionType.SLO_INFEASIBLE)
            if before is None or before.status != ConditionStatus.TRUE:
                self._emit(ctx, EventType.WARNING, "SLOInfeasible", message)
            ctx.condition(ConditionType.SLO_INFEASIBLE, ConditionStatus.TRUE, "SLOInfeasible", message)
            self._stopped(ctx, StopReason.INFEASIBLE, infeasible.message)
            return StopReason.INFEASIBLE
        ctx.condition(
            ConditionType.SLO_INFEASIBLE,
            ConditionStatus.FALSE,
            "Feasible",
            "no evidence that the SLOs are out of reach",
        )
        reason: StopReason | None
        if round_trials >= autotune.max_trials:
            reason = StopReason.MAX_TRIALS
        else:
            reason = should_stop(round_records, autotune.max_trials)
        if reason is not None:
            detail = {
                StopReason.MAX_TRIALS: f"{round_trials} of {autotune.max_trials} trials run",
                StopReason.CONVERGED: "the best objective stopped improving",
            }.get(reason, reason.value)
            self._stopped(ctx, reason, detail)
        return reason

    def _stopped(self, ctx: _Context, reason: StopReason, detail: str) -> None:
        before = ctx.current_condition(ConditionType.TUNING)
        best = (
            f"; best: {ctx.status.best_trial} ({ctx.status.best_config.summary()})"
            if ctx.status.best_config
            else ""
        )
        message = f"tuning stopped: {detail}{best}"
        if before is None or before.status != ConditionStatus.FALSE or before.reason != reason.value:
            self._emit(ctx, EventType.NORMAL, "TuningStopped", message)
        ctx.condition(ConditionType.TUNING, ConditionStatus.FALSE, reason.value, message)
        ctx.status_update["currentTrial"] = None
        telemetry.CURRENT_TRIAL.labels(ctx.namespace, ctx.name).set(0)

    def _incumbent_met(self, ctx: _Context) -> bool | None:
        slo = ctx.current_condition(ConditionType.SLO_MET)
        if slo is None or slo.status == ConditionStatus.UNKNOWN:
            return None
        return bool(slo.status == ConditionStatus.TRUE)

    def _should_retune(self, ctx: _Context) -> bool:
        tuning = ctx.current_condition(ConditionType.TUNING)
        slo = ctx.current_condition(ConditionType.SLO_MET)
        if tuning is None or slo is None or tuning.status != ConditionStatus.FALSE:
            return False
        if tuning.reason == StopReason.INFEASIBLE.value or slo.status != ConditionStatus.FALSE:
            return False
        since = slo.last_transition_time
        stopped = tuning.last_transition_time
        if since is None or stopped is None or since <= stopped:
            return False  # violated already when tuning stopped: a new round would find nothing new
        window = self.settings.retune_after_s
        if window is None:
            assert ctx.isvc.spec.slo is not None
            window = seconds(ctx.isvc.spec.slo.window)
        return ctx.now - since >= timedelta(seconds=window)

    # ------------------------------------------------------------------ advancing a trial

    async def _advance(self, ctx: _Context, trial: TuningTrial) -> None:
        phase = rec.trial_phase(trial)
        number = trial.spec.number
        ctx.status_update["currentTrial"] = trial.metadata.name
        ctx.condition(
            ConditionType.TUNING,
            ConditionStatus.TRUE,
            TuningReason.TRIAL_RUNNING,
            f"trial {number} {phase.value}: {trial.spec.params.summary()}",
        )
        telemetry.CURRENT_TRIAL.labels(ctx.namespace, ctx.name).set(number)
        if phase is TrialPhase.PENDING:
            await self._roll_out(ctx, trial)
            return
        canary = await self.kube.get(self.deployment_path(ctx.namespace, ctx.name, Track.CANARY))
        if (
            canary is None
            or (canary["metadata"].get("annotations") or {}).get(rec.ANNOTATION_TRIAL) != trial.metadata.name
        ):
            await self._roll_out(ctx, trial)  # lost (deleted by hand, or never applied before a restart)
            return
        started = live.started_config(canary)
        crashed = await self._crashed(ctx, trial, started)
        if crashed is not None:
            await self._abort(ctx, trial, crashed)
            return
        monitored = await self._monitor_stable(ctx)
        if monitored is False:
            if phase is TrialPhase.MEASURING:
                await self._metrics_gap(ctx, trial, None)
            return
        if phase is TrialPhase.ROLLING_OUT:
            await self._check_rollout(ctx, trial, DeploymentState.from_manifest(canary), started)
        else:
            await self._measure(ctx, trial)

    async def _roll_out(self, ctx: _Context, trial: TuningTrial) -> None:
        if not await self._reuse_parked_canary(ctx, trial):
            try:
                manifest = canary_manifest(ctx.isvc, ctx.body, trial)
            except RenderError as error:
                await self._abort(ctx, trial, f"the engine refuses the config: {error}")
                return
            start = self._live_start(ctx, trial)
            if start is not None:
                # The top of the space may not render: the trial's own config it is, then.
                with contextlib.suppress(RenderError):
                    manifest = canary_manifest(ctx.isvc, ctx.body, trial, start)
            await self.kube.apply(manifest)
        started = trial.status.started_at if trial.status is not None and trial.status.started_at else ctx.now
        await self._patch_trial_status(
            ctx.namespace,
            trial.metadata.name or "",
            TuningTrialStatus(
                phase=TrialPhase.ROLLING_OUT, params_summary=trial.spec.params.summary(), started_at=started
            ),
        )
        if rec.trial_phase(trial) is TrialPhase.PENDING:
            self._emit(
                ctx,
                EventType.NORMAL,
                "TrialStarted",
                f"trial {trial.spec.number} canary started: "
                f"{rec.config_change(ctx.incumbent, trial.spec.params)}",
            )
        telemetry.TOKEN_BUDGET.labels(ctx.namespace, ctx.name, "canary").set(
            trial.spec.params.max_num_batched_tokens
        )
        telemetry.MAX_NUM_SEQS.labels(ctx.namespace, ctx.name, "canary").set(trial.spec.params.max_num_seqs)

    # ------------------------------------------------------------------ live adjustment

    def _live_usable(self, ctx: _Context) -> bool:
        """``autotune.liveAdjust`` is on and no earlier trial of the service saw the route fail."""
        if not ctx.isvc.spec.autotune.live_adjust:
            return False
        return not any(
            t.metadata.annotations.get(live.ANNOTATION_LIVE_ADJUSTED, "").startswith(live.FAILED_PREFIX)
            for t in ctx.trials
        )

    def _live_start(self, ctx: _Context, trial: TuningTrial) -> EngineConfig | None:
        """The config to start a new canary with so later trials can go down (None: the trial's own)."""
        if not self._live_usable(ctx):
            return None
        space = self._space_or_none(ctx)
        if space is None:
            return None
        budget = space.ranges.get(Knob.MAX_NUM_BATCHED_TOKENS)
        seqs = space.ranges.get(Knob.MAX_NUM_SEQS)
        try:
            start = live.ceiling_config(
                trial.spec.params, budget.high if budget else None, seqs.high if seqs else None
            )
        except ValueError:
            return None
        return None if start == trial.spec.params else start

    async def _reuse_parked_canary(self, ctx: _Context, trial: TuningTrial) -> bool:
        """Hand a parked canary whose start-up limits cover ``trial`` to it (no new rollout)."""
        if not self._live_usable(ctx):
            return False
        canary = await self.kube.get(self.deployment_path(ctx.namespace, ctx.name, Track.CANARY))
        if canary is None or canary["metadata"].get("deletionTimestamp"):
            return False
        if not (canary["metadata"].get("annotations") or {}).get(live.ANNOTATION_PARKED):
            return False
        started = live.started_config(canary)
        if started is None or live.live_adjust_refusal(started, trial.spec.params) is not None:
            return False  # the new rollout replaces it
        state = DeploymentState.from_manifest(canary)
        if not (state.rollout_complete and state.ready >= state.desired > 0):
            return False
        annotations = {rec.ANNOTATION_TRIAL: trial.metadata.name, live.ANNOTATION_PARKED: None}
        await self.kube.merge_patch(
            self.deployment_path(ctx.namespace, ctx.name, Track.CANARY),
            {"metadata": {"annotations": annotations}},
        )
        return True

    async def _adjust_canary(self, ctx: _Context, trial: TuningTrial, started: EngineConfig) -> str | None:
        """Set the trial's limits on every Ready canary pod; None on success, else why not."""
        refusal = live.live_adjust_refusal(started, trial.spec.params)
        if refusal is not None:
            return refusal
        secret_name = live_adjust_secret_name(ctx.name)
        try:
            secret = await self.kube.get(resource_path("v1", "secrets", ctx.namespace, secret_name))
            token = live.secret_token(secret)
            if token is None:
                return f"no live-adjustment token in Secret {secret_name}"
            pods = await self.kube.list(
                resource_path("v1", "pods", ctx.namespace),
                label_selector=(
                    f"{LABEL_SERVICE}={ctx.name},{LABEL_TRACK}={Track.CANARY.value},"
                    f"{LABEL_CONFIG_HASH}={started.config_hash()}"
                ),
            )
            ready = [pod for pod in pods if live.pod_ready(pod)]
            await self.live_adjuster.adjust(ready, token, live.target_limits(trial.spec.params))
        except (live.LiveAdjustError, KubeError, OSError) as error:
            return str(error)
        return None

    async def _live_fallback(self, ctx: _Context, trial: TuningTrial, reason: str) -> None:
        """Record why live adjustment failed and roll out a canary with the trial's own config."""
        name = trial.metadata.name or ""
        note = f"{live.FAILED_PREFIX}{reason}"[:1024]
        await self.kube.merge_patch(
            self.trial_path(ctx.namespace, name),
            {"metadata": {"annotations": {live.ANNOTATION_LIVE_ADJUSTED: note}}},
        )
        self._emit(
            ctx,
            EventType.WARNING,
            "LiveAdjustFailed",
            f"trial {trial.spec.number}: live adjustment failed ({reason}); "
            "rolling out a canary with the trial's config",
        )
        try:
            manifest = canary_manifest(ctx.isvc, ctx.body, trial)
        except RenderError as error:
            await self._abort(ctx, trial, f"the engine refuses the config: {error}")
            return
        await self.kube.apply(manifest)
        await self._patch_trial_status(
            ctx.namespace, name, TuningTrialStatus(phase=TrialPhase.ROLLING_OUT, started_at=ctx.now)
        )

    async def _park_canary(self, ctx: _Context, trial: TuningTrial, verdict: TrialVerdict) -> bool:
        """Keep a finished trial's canary for the next trial to adjust (True) instead of deleting it."""
        if verdict is TrialVerdict.ABORTED or not self._live_usable(ctx):
            return False
        if trial.metadata.annotations.get(live.ANNOTATION_LIVE_ADJUSTED, "").startswith(live.FAILED_PREFIX):
            return False
        path = self.deployment_path(ctx.namespace, ctx.name, Track.CANARY)
        canary = await self.kube.get(path)
        if canary is None or live.started_config(canary) is None:
            return False
        if (canary["metadata"].get("annotations") or {}).get(rec.ANNOTATION_TRIAL) != trial.metadata.name:
            return False
        annotations = {rec.ANNOTATION_TRIAL: None, live.ANNOTATION_PARKED: "true"}
        await self.kube.merge_patch(path, {"metadata": {"annotations": annotations}})
        telemetry.TOKEN_BUDGET.labels(ctx.namespace, ctx.name, "canary").set(0)
        telemetry.MAX_NUM_SEQS.labels(ctx.namespace, ctx.name, "canary").set(0)
        return True

    async def _release_parked_canary(self, ctx: _Context) -> None:
        """Delete a parked canary once no next trial will use it."""
        if not ctx.isvc.spec.autotune.live_adjust:
            return
        canary = await self.kube.get(self.deployment_path(ctx.namespace, ctx.name, Track.CANARY))
        if canary is not None and (canary["metadata"].get("annotations") or {}).get(live.ANNOTATION_PARKED):
            await self._delete_canary(ctx)

    @staticmethod
    def _is_stopped(ctx: _Context) -> bool:
        return any(
            c.type == ConditionType.TUNING.value and c.status == ConditionStatus.FALSE for c in ctx.conditions
        )

    async def _crashed(self, ctx: _Context, trial: TuningTrial, started: EngineConfig | None) -> str | None:
        pods = await self.kube.list(
            resource_path("v1", "pods", ctx.namespace),
            label_selector=f"{LABEL_SERVICE}={ctx.name},{LABEL_TRACK}={Track.CANARY.value}",
        )
        config_hash = (started or trial.spec.params).config_hash()
        return crash_message(pods, self.settings.crash_restarts, config_hash)

    async def _check_rollout(
        self, ctx: _Context, trial: TuningTrial, state: DeploymentState, started: EngineConfig | None
    ) -> None:
        name = trial.metadata.name or ""
        if state.rollout_complete and state.ready >= state.desired > 0:
            annotations: dict[str, str] = {}
            # With live adjustment usable, always set the limits: a parked canary taken over
            # still runs the previous trial's, even when this trial's equal the start-up ones.
            if started is not None and (started != trial.spec.params or self._live_usable(ctx)):
                failure = await self._adjust_canary(ctx, trial, started)
                if failure is not None:
                    await self._live_fallback(ctx, trial, failure)
                    return
                annotations = {
                    live.ANNOTATION_LIVE_ADJUSTED: "true",
                    live.ANNOTATION_CANARY_HASH: started.config_hash(),
                }
            warmup = seconds(ctx.isvc.spec.autotune.warmup)
            annotations[rec.ANNOTATION_READY_AT] = rec.rfc3339(ctx.now)
            annotations[rec.ANNOTATION_MEASURE_FROM] = rec.rfc3339(ctx.now + timedelta(seconds=warmup))
            await self.kube.merge_patch(
                self.trial_path(ctx.namespace, name), {"metadata": {"annotations": annotations}}
            )
            await self._patch_trial_status(ctx.namespace, name, TuningTrialStatus(phase=TrialPhase.MEASURING))
            return
        since = trial.status.started_at if trial.status is not None else None
        if state.progress_deadline_exceeded:
            await self._abort(ctx, trial, "the canary Deployment exceeded its progress deadline")
        elif since is not None and (ctx.now - since).total_seconds() > self.settings.rollout_timeout_s:
            await self._abort(
                ctx, trial, f"the canary did not become Ready within {self.settings.rollout_timeout_s:g}s"
            )

    async def _measure(self, ctx: _Context, trial: TuningTrial) -> None:
        name = trial.metadata.name or ""
        annotations = trial.metadata.annotations
        measure_from = rec.annotation_time(annotations, rec.ANNOTATION_MEASURE_FROM) or ctx.now
        if ctx.now < measure_from:
            return  # warming up
        window_s = seconds(ctx.isvc.spec.autotune.trial_window)
        end = measure_from + timedelta(seconds=window_s)
        final = ctx.now >= end
        at = end if final else ctx.now
        span = (at - measure_from).total_seconds()
        if not final and span < MIN_EARLY_WINDOW_S:
            return
        try:
            window = await self._measure_window(ctx, trial, window_text(span), at)
        except MetricsUnavailableError as error:
            await self._metrics_gap(ctx, trial, str(error))
            return
        gap = rec.annotation_time(annotations, rec.ANNOTATION_METRICS_GAP)
        self._metrics_ok(ctx)
        if gap is not None:
            # The window has a hole: measure again from now on.
            await self.kube.merge_patch(
                self.trial_path(ctx.namespace, name),
                {
                    "metadata": {
                        "annotations": {
                            rec.ANNOTATION_METRICS_GAP: None,
                            rec.ANNOTATION_MEASURE_FROM: rec.rfc3339(ctx.now),
                        }
                    }
                },
            )
            self._emit(
                ctx,
                EventType.NORMAL,
                "MetricsRestored",
                f"trial {trial.spec.number}: Prometheus answers again; restarting the measurement window",
            )
            return
        if not final:
            early = judge_early(window.canary, ctx.slo, ctx.abort)
            if early.decision is Decision.PRUNE:
                await self._conclude(ctx, trial, Decision.PRUNE, early.reason, window)
            return
        space = self._space_or_none(ctx)
        incumbent = rec.incumbent_record(ctx.trials, space, ctx.incumbent, ctx.slo) if space else None

        def judge(measured: WindowMeasurement) -> Judgement:
            return judge_final(
                measured,
                ctx.slo,
                ctx.abort,
                rec.objective_kind(ctx.isvc),
                ctx.isvc.spec.engine.tensor_parallel_size,
                incumbent_objective=incumbent.objective if incumbent is not None else None,
            )

        verdict = judge(window)
        deadline = measure_from + trial_deadline(timedelta(seconds=window_s))
        if verdict.decision is Decision.INCONCLUSIVE and ctx.now > end:
            # Too few samples in the window: widen it up to now (until the deadline).
            try:
                window = await self._measure_window(
                    ctx,
                    trial,
                    window_text((min(ctx.now, deadline) - measure_from).total_seconds()),
                    min(ctx.now, deadline),
                )
            except MetricsUnavailableError as error:
                await self._metrics_gap(ctx, trial, str(error))
                return
            verdict = judge(window)
        if verdict.decision is Decision.INCONCLUSIVE and ctx.now < deadline:
            return
        await self._conclude(ctx, trial, verdict.decision, verdict.reason, window)

    def _space_or_none(self, ctx: _Context) -> SearchSpace | None:
        try:
            return self._space(ctx)
        except SpaceError:
            return None

    async def _measure_window(
        self, ctx: _Context, trial: TuningTrial, window: str, at: datetime
    ) -> WindowMeasurement:
        assert self.query is not None
        stable_hash = ctx.incumbent.config_hash()
        return await self._blocking(
            measure_window,
            self.query,
            ctx.name,
            ctx.namespace,
            window,
            at,
            ctx.slo.itl_quantile,
            ctx.slo.ttft_quantile,
            None,
            {TrackName.CANARY: canary_config_hash(trial), TrackName.STABLE: stable_hash},
        )

    async def _metrics_gap(self, ctx: _Context, trial: TuningTrial, error: str | None) -> None:
        """Note when Prometheus stopped answering during the trial; abort after a long outage."""
        if error is not None:
            self._metrics_down(ctx, error)
        name = trial.metadata.name or ""
        since = rec.annotation_time(trial.metadata.annotations, rec.ANNOTATION_METRICS_GAP)
        if since is None:
            await self.kube.merge_patch(
                self.trial_path(ctx.namespace, name),
                {"metadata": {"annotations": {rec.ANNOTATION_METRICS_GAP: rec.rfc3339(ctx.now)}}},
            )
            return
        limit = self.settings.metrics_outage_abort_s
        if limit is None:
            limit = float(seconds(ctx.isvc.spec.autotune.trial_window))
        if (ctx.now - since).total_seconds() > limit:
            await self._abort(
                ctx, trial, f"Prometheus unreachable for more than {limit:g}s; not judging without data"
            )

    # ------------------------------------------------------------------ verdicts

    async def _conclude(
        self, ctx: _Context, trial: TuningTrial, decision: Decision, reason: str, window: WindowMeasurement
    ) -> None:
        kind = rec.objective_kind(ctx.isvc)
        gpus = ctx.isvc.spec.engine.tensor_parallel_size
        canary_obj = objective_value(window.canary, ctx.slo, kind, gpus)
        stable_obj = (
            objective_value(window.stable, ctx.slo, kind, gpus)
            if window.stable.enough_samples(ctx.abort.min_samples)
            else None
        )
        phase, verdict = {
            Decision.PROMOTE: (TrialPhase.PROMOTED, TrialVerdict.PROMOTED),
            Decision.DISCARD: (TrialPhase.ROLLED_BACK, TrialVerdict.DISCARDED),
            Decision.PRUNE: (TrialPhase.PRUNED, TrialVerdict.PRUNED),
        }.get(decision, (TrialPhase.FAILED, TrialVerdict.ABORTED))
        name = trial.metadata.name or ""
        if stable_obj is not None:
            await self.kube.merge_patch(
                self.trial_path(ctx.namespace, name),
                {"metadata": {"annotations": {rec.ANNOTATION_STABLE_OBJECTIVE: f"{stable_obj:.4f}"}}},
            )
        await self._finish(
            ctx,
            trial,
            phase,
            verdict,
            reason,
            window,
            None if verdict is TrialVerdict.ABORTED else canary_obj,
        )
        if verdict is TrialVerdict.PROMOTED:
            trial = trial.model_copy(update={"status": TuningTrialStatus(phase=phase, verdict=verdict)})
            await self._promote(ctx, trial, reason)

    async def _abort(self, ctx: _Context, trial: TuningTrial, reason: str) -> None:
        await self._finish(ctx, trial, TrialPhase.FAILED, TrialVerdict.ABORTED, reason)

    async def _finish(
        self,
        ctx: _Context,
        trial: TuningTrial,
        phase: TrialPhase,
        verdict: TrialVerdict,
        reason: str,
        window: WindowMeasurement | None = None,
        objective: float | None = None,
    ) -> None:
        """Record the verdict first, then remove the canary (an orphan is removed on the next step)."""
        name = trial.metadata.name or ""
        canary = window.canary.to_api() if window is not None else None
        stable = window.stable.to_api() if window is not None else None
        status = TuningTrialStatus(
            phase=phase,
            params_summary=trial.spec.params.summary(),
            canary=canary,
            stable=stable,
            constraints=excess_constraints(canary, ctx.slo),
            objective=None if objective is None or not math.isfinite(objective) else round(objective, 4),
            verdict=verdict,
            reason=reason[:4096],
            finished_at=ctx.now,
            summary=TrialSummary(
                itl=rec.latency_summary(canary.itl_ms if canary else None, ctx.slo.itl_ms),
                ttft=rec.latency_summary(canary.ttft_ms if canary else None, ctx.slo.ttft_ms),
            ),
        )
        await self._patch_trial_status(ctx.namespace, name, status)
        if not await self._park_canary(ctx, trial, verdict):
            await self._delete_canary(ctx)
        finished = sum(1 for t in ctx.trials if not rec.is_active(t) or t.metadata.name == name)
        ctx.status_update["trialsCompleted"] = finished
        ctx.status_update["currentTrial"] = None
        telemetry.TRIALS_FINISHED.labels(ctx.namespace, ctx.name, verdict.value).inc()
        telemetry.CURRENT_TRIAL.labels(ctx.namespace, ctx.name).set(0)
        event_type = (
            EventType.WARNING if verdict in (TrialVerdict.ABORTED, TrialVerdict.PRUNED) else EventType.NORMAL
        )
        if verdict is not TrialVerdict.PROMOTED:
            self._emit(
                ctx,
                event_type,
                f"Trial{verdict.value}",
                f"trial {trial.spec.number} {verdict.value.lower()} "
                f"({trial.spec.params.summary()}): {reason}",
            )
        ctx.trials = [
            t if t.metadata.name != name else t.model_copy(update={"status": status}) for t in ctx.trials
        ]
        await self._mirror(ctx)
        logger.info(
            "%s/%s: trial %d %s: %s", ctx.namespace, ctx.name, trial.spec.number, verdict.value, reason
        )

    async def _promote(self, ctx: _Context, trial: TuningTrial, reason: str) -> None:
        best = trial.spec.params
        old = ctx.incumbent
        ctx.status_update["bestConfig"] = best.to_k8s()
        ctx.status_update["bestTrial"] = trial.metadata.name
        # Write bestConfig now: the operator renders the stable Deployment from it.
        await self._write_service_status(ctx)
        ctx.status = ctx.status.model_copy(update={"best_config": best, "best_trial": trial.metadata.name})
        await self._apply_stable(ctx, best)
        await self.kube.merge_patch(
            self.trial_path(ctx.namespace, trial.metadata.name or ""),
            {"metadata": {"annotations": {rec.ANNOTATION_PROMOTION_APPLIED: "true"}}},
        )
        ctx.incumbent = best
        self._emit(
            ctx,
            EventType.NORMAL,
            "Promoted",
            f"promoted trial {trial.spec.number}: {rec.config_change(old, best)}; {reason}",
        )
        telemetry.TOKEN_BUDGET.labels(ctx.namespace, ctx.name, "stable").set(best.max_num_batched_tokens)
        telemetry.MAX_NUM_SEQS.labels(ctx.namespace, ctx.name, "stable").set(best.max_num_seqs)

    async def _apply_stable(self, ctx: _Context, config: EngineConfig) -> None:
        isvc = ctx.isvc.model_copy(update={"status": ctx.status})
        try:
            await self.kube.apply(stable_manifest(isvc, ctx.body, config))
        except RenderError as error:  # cannot happen for a config its canary ran with
            logger.error("%s/%s: cannot render the promoted config: %s", ctx.namespace, ctx.name, error)

    async def _apply_pending_promotion(self, ctx: _Context) -> None:
        """Finish a promotion an earlier step recorded but did not apply (the operator stopped in between)."""
        for trial in reversed(ctx.trials):
            if rec.trial_phase(trial) is not TrialPhase.PROMOTED:
                continue
            if trial.metadata.annotations.get(rec.ANNOTATION_PROMOTION_APPLIED):
                return
            await self._promote(ctx, trial, "completing a promotion interrupted by a restart")
            return

    async def _mirror(self, ctx: _Context) -> None:
        """Hand the whole finished history to the mirror (it skips what it already has)."""
        space = self._space_or_none(ctx) if self.mirror is not None else None
        if self.mirror is None or space is None:
            return
        finished = [t for t in ctx.trials if not rec.is_active(t)]
        attrs: dict[int, Mapping[str, Any]] = {
            t.spec.number: {"verdict": str(t.status.verdict), "reason": t.status.reason or ""}
            for t in finished
            if t.status is not None and t.status.verdict is not None
        }
        try:
            await self.mirror(ctx.namespace, ctx.name, space, self._records(ctx, space, finished), attrs)
        except Exception as error:  # a read-only copy must never stop tuning
            logger.warning("%s/%s: mirroring the study failed: %s", ctx.namespace, ctx.name, error)

    # ------------------------------------------------------------------ canary

    async def _delete_canary(self, ctx: _Context) -> None:
        await self.kube.delete(self.deployment_path(ctx.namespace, ctx.name, Track.CANARY))
        telemetry.TOKEN_BUDGET.labels(ctx.namespace, ctx.name, "canary").set(0)
        telemetry.MAX_NUM_SEQS.labels(ctx.namespace, ctx.name, "canary").set(0)

    async def _remove_orphan_canary(
        self, ctx: _Context, current: TuningTrial | None, *, keep_parked: bool = False
    ) -> None:
        canary = await self.kube.get(self.deployment_path(ctx.namespace, ctx.name, Track.CANARY))
        if canary is None or canary["metadata"].get("deletionTimestamp"):
            return
        annotations = canary["metadata"].get("annotations") or {}
        owner = annotations.get(rec.ANNOTATION_TRIAL)
        if current is not None and owner == current.metadata.name:
            return
        if keep_parked and annotations.get(live.ANNOTATION_PARKED) and ctx.isvc.spec.autotune.live_adjust:
            return  # kept for the next trial to adjust (removed when tuning stops)
        await self._delete_canary(ctx)
        self._emit(
            ctx,
            EventType.WARNING,
            "OrphanRemoved",
            f"removed canary Deployment {canary['metadata']['name']} of {owner or 'no trial'}: "
            "no active trial owns it",
        )

    # ------------------------------------------------------------------ stable monitoring

    async def _monitor_stable(self, ctx: _Context) -> TrackMeasurement | bool | None:
        """Measure stable over the SLO window (SLOMet, lastMeasurement); False: Prometheus is down."""
        if self.query is None:
            return None
        assert ctx.isvc.spec.slo is not None
        window = ctx.isvc.spec.slo.window
        selector = Selector(
            ctx.name, ctx.namespace, TrackName.STABLE, config_hash=ctx.incumbent.config_hash()
        )
        try:
            m = await self._blocking(
                measure_track,
                self.query,
                selector,
                window,
                ctx.now,
                ctx.slo.itl_quantile,
                ctx.slo.ttft_quantile,
            )
        except MetricsUnavailableError as error:
            self._metrics_down(ctx, str(error))
            return False
        self._metrics_ok(ctx)
        self._record_stable(ctx, m)
        return m

    def _record_stable(self, ctx: _Context, m: TrackMeasurement) -> None:
        enough = m.enough_samples(ctx.abort.min_samples)
        api = m.to_api()
        state = rec.slo_state(api, ctx.slo, enough)
        ctx.status_update["lastMeasurement"] = api.to_k8s()
        ctx.status_update["summary"] = ServiceSummary(
            itl=rec.latency_summary(api.itl_ms, ctx.slo.itl_ms),
            ttft=rec.latency_summary(api.ttft_ms, ctx.slo.ttft_ms),
            slo=state,
        ).to_k8s()
        text = (
            rec.latency_summary(api.itl_ms, ctx.slo.itl_ms)
            + " ITL, "
            + rec.latency_summary(api.ttft_ms, ctx.slo.ttft_ms)
            + " TTFT"
        )
        if state is SLOState.MET:
            ctx.condition(
                ConditionType.SLO_MET, ConditionStatus.TRUE, "SLOMet", f"stable meets the SLOs: {text}"
            )
        elif state is SLOState.VIOLATED:
            check = check_slo(m, ctx.slo)
            broken = ", ".join(k.upper() for k, v in check.excess_ms.items() if v > 0)
            ctx.condition(
                ConditionType.SLO_MET,
                ConditionStatus.FALSE,
                "SLOViolated",
                f"stable violates {broken}: {text}",
            )
        else:
            ctx.condition(
                ConditionType.SLO_MET,
                ConditionStatus.UNKNOWN,
                "InsufficientData",
                f"stable served {m.ttft_samples:.0f} requests in {m.window}; {ctx.abort.min_samples} needed",
            )

    def _metrics_down(self, ctx: _Context, error: str) -> None:
        before = ctx.current_condition(ConditionType.METRICS_UNAVAILABLE)
        if before is None or before.status != ConditionStatus.TRUE:
            self._emit(ctx, EventType.WARNING, "MetricsUnavailable", f"tuning paused: {error}")
        ctx.condition(
            ConditionType.METRICS_UNAVAILABLE,
            ConditionStatus.TRUE,
            "PrometheusUnreachable",
            f"tuning paused, nothing is promoted: {error}",
        )

    def _metrics_ok(self, ctx: _Context) -> None:
        ctx.condition(
            ConditionType.METRICS_UNAVAILABLE, ConditionStatus.FALSE, "MetricsAvailable", "Prometheus answers"
        )

    # ------------------------------------------------------------------ writes

    async def _patch_trial_status(self, namespace: str, name: str, status: TuningTrialStatus) -> None:
        await self.kube.merge_patch(self.trial_path(namespace, name, "status"), {"status": status.to_k8s()})

    async def _write_service_status(self, ctx: _Context) -> None:
        """Merge the step's status fields and conditions into the service (conditional on resourceVersion)."""
        if not ctx.status_update and not ctx.conditions:
            return
        path = self.isvc_path(ctx.namespace, ctx.name)
        for _ in range(STATUS_WRITE_ATTEMPTS):
            fresh = await self.kube.get(path)
            if fresh is None:
                return
            raw = dict(fresh.get("status") or {})
            try:
                current = InferenceServiceStatus.model_validate(raw)
            except ValueError:
                current = InferenceServiceStatus()
            conditions = rec.merge_conditions(
                current.conditions,
                ctx.conditions,
                int(fresh["metadata"].get("generation") or 0),
                ctx.now.replace(microsecond=0),
            )
            patch: dict[str, Any] = dict(ctx.status_update)
            new_conditions = [c.to_k8s() for c in conditions]
            if new_conditions != [c.to_k8s() for c in current.conditions]:
                patch["conditions"] = new_conditions
            changed = {k: v for k, v in patch.items() if raw.get(k) != v}
            if not changed:
                break
            try:
                await self.kube.merge_patch(
                    self.isvc_path(ctx.namespace, ctx.name, "status"),
                    {
                        "metadata": {"resourceVersion": fresh["metadata"]["resourceVersion"]},
                        "status": changed,
                    },
                )
            except KubeError as error:
                if error.conflict:
                    continue
                raise
            break
        ctx.status_update = {}
        ctx.conditions = []

    def _emit(self, ctx: _Context, type_: EventType, reason: str, message: str) -> None:
        if self.post_event is not None:
            self.post_event(ctx.body, EventSpec(type_, reason, message))

    async def _blocking(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a blocking call (Prometheus queries, the sampler) off the event loop."""
        if self._inline:
            return fn(*args, **kwargs)
        return await asyncio.to_thread(fn, *args, **kwargs)
