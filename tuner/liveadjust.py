"""The canary Deployment: its manifest, ownership, parking, reuse and live adjustment.

A canary belongs to the trial named in its ``chunkpilot.io/trial`` annotation; any
canary no active trial owns is an orphan and deleted, except a *parked* one
(``chunkpilot.io/parked``) kept for the next trial to adjust. Both annotations, and
the start-up config in ``chunkpilot.io/config``, describe the Deployment itself (who
uses it, what its pods were started with), so they stay on it rather than on a trial.

Live adjustment lowers a running canary's scheduler limits instead of rolling out a new one.

With ``spec.autotune.liveAdjust`` the engine serves an authenticated route (the vLLM
plugin's, see :mod:`chunkpilot.engine.vllm_plugin.endpoint`; the simulator serves the
same one) that lowers ``max_num_batched_tokens``, ``max_num_seqs`` and
``max_num_active_seqs`` at run time and refuses raises above the start-up values.
The tuner starts a canary at the top of the search space for those three knobs and
reaches each trial's values through the route, so a trial that only lowers them
needs no restart.

This module holds the pure decisions (:func:`live_adjust_refusal`, :func:`ceiling_config`,
and the plan steps :func:`remove_orphan`, :func:`take_over_parked`, :func:`park_or_delete`,
:func:`release_parked`, :func:`adjust_or_fall_back`), the request (:func:`build_request`)
and the HTTP client (:class:`HttpLiveAdjuster`).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

import aiohttp
from chunkpilot.engine.vllm_plugin.config import LIVE_ADJUST_ROUTE
from chunkpilot.operator.builders import (
    ANNOTATION_CONFIG,
    LIVE_ADJUST_SECRET_KEY,
    RenderError,
    build_deployment,
)
from chunkpilot.operator.config import live_adjust_allowed, without_live_adjust
from chunkpilot.operator.engines.common import ENGINE_PORT
from chunkpilot.operator.events import EventSpec, EventType
from chunkpilot.operator.objects import adopt
from chunkpilot.tuner import records as rec
from chunkpilot.tuner.actions import (
    Action,
    AdjustLive,
    AnnotateCanary,
    ApplyCanary,
    DeleteCanary,
    Emit,
    PatchTrial,
    Plan,
    TrackGauges,
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
    knobs,
)

#: The knobs the route can change (the knob table's ``live`` column); every other knob needs a restart.
LIVE_KNOBS: Final = knobs.LIVE_NAMES
#: On the canary Deployment: kept between trials for the next one to adjust ("true").
ANNOTATION_PARKED: Final = f"{rec.GROUP_PREFIX}/parked"
DEFAULT_TIMEOUT_S: Final = 5.0


class LiveAdjustError(RuntimeError):
    """A live adjustment did not happen (HTTP status, refusal, timeout); the message says which."""


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


def started_config(deployment: Mapping[str, Any] | None) -> EngineConfig | None:
    """The config a canary Deployment's pods were started with (None: not recorded or unreadable)."""
    raw = _annotations(deployment).get(ANNOTATION_CONFIG)
    if not raw:
        return None
    try:
        return EngineConfig.model_validate(json.loads(raw))
    except ValueError:
        return None


def secret_token(secret: Mapping[str, Any] | None) -> str | None:
    """The bearer token in the service's live-adjustment Secret (``data`` or ``stringData``)."""
    if secret is None:
        return None
    encoded = (secret.get("data") or {}).get(LIVE_ADJUST_SECRET_KEY)
    if encoded:
        try:
            return base64.b64decode(encoded).decode() or None
        except (ValueError, UnicodeDecodeError):
            return None
    plain = (secret.get("stringData") or {}).get(LIVE_ADJUST_SECRET_KEY)
    return str(plain) if plain else None


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """Running, Ready and not being deleted."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


# --------------------------------------------------------------------------- the canary in a plan


def _annotations(deployment: Mapping[str, Any] | None) -> Mapping[str, str]:
    return ((deployment or {}).get("metadata") or {}).get("annotations") or {}


def canary_owner(canary: Mapping[str, Any] | None) -> str | None:
    """The trial a canary Deployment belongs to (None: none, or no canary)."""
    return _annotations(canary).get(rec.ANNOTATION_TRIAL) or None


def is_parked(canary: Mapping[str, Any] | None) -> bool:
    return bool(_annotations(canary).get(ANNOTATION_PARKED))


def _terminating(canary: Mapping[str, Any] | None) -> bool:
    return bool(((canary or {}).get("metadata") or {}).get("deletionTimestamp"))


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


def enabled(isvc: InferenceService) -> bool:
    """``autotune.liveAdjust`` is on and the installation allows it (the chart's ``liveAdjust.enabled``).

    Without the chart value the operator holds no Secrets: it renders no route and sets the
    ``LiveAdjustDisabled`` condition, and the tuner rolls every trial out instead.
    """
    return isvc.spec.autotune.live_adjust and live_adjust_allowed()


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
    plan.do(DeleteCanary(), TrackGauges(Track.CANARY, None))
    plan.canary = None


def remove_orphan(plan: Plan, current: TuningTrial | None, *, keep_parked: bool = False) -> None:
    """Delete a canary no active trial owns (a parked one stays while it may be reused)."""
    canary = plan.canary
    if canary is None or _terminating(canary):
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
    if not live_usable(plan) or canary is None or _terminating(canary) or not is_parked(canary):
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
        plan.do(
            AnnotateCanary({rec.ANNOTATION_TRIAL: None, ANNOTATION_PARKED: "true"}),
            TrackGauges(Track.CANARY, None),
        )
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
        for pod in snap.canary_pods
        if pod_ready(pod)
        and ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_CONFIG_HASH) == started.config_hash()
    )
    success = tuple(measuring(adjusted))
    plan.do(AdjustLive(pods, snap.live_token, target_limits(trial.spec.params), success, fall_back))
    return True


def _event(type_: EventType, reason: str, message: str) -> Action:
    return Emit(EventSpec(type_, reason, message))


# --------------------------------------------------------------------------- where pods listen

PodEndpointResolver = Callable[[Mapping[str, Any]], str | None]
"""``host:port`` of a pod's engine port, or None when it cannot be reached."""


def pod_ip_endpoint(pod: Mapping[str, Any]) -> str | None:
    """In a cluster: the pod IP and the engine port."""
    ip = (pod.get("status") or {}).get("podIP")
    return f"{ip}:{ENGINE_PORT}" if ip else None


def targets_file_resolver(path: str | Path) -> PodEndpointResolver:
    """Locally: the address the pod runner published for the pod in its Prometheus file_sd file."""

    def resolve(pod: Mapping[str, Any]) -> str | None:
        meta = pod.get("metadata") or {}
        try:
            groups = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            return None
        for group in groups if isinstance(groups, list) else []:
            labels = group.get("labels") or {}
            if labels.get("pod") == meta.get("name") and labels.get("namespace") == meta.get("namespace"):
                targets = group.get("targets") or []
                return str(targets[0]) if targets else None
        return None

    return resolve


# --------------------------------------------------------------------------- the request


@dataclass(frozen=True)
class LiveAdjustRequest:
    """One PUT to one pod's live-adjustment route."""

    url: str
    headers: Mapping[str, str]
    body: Mapping[str, int]


def build_request(endpoint: str, token: str, limits: Mapping[str, int]) -> LiveAdjustRequest:
    """The PUT that sets ``limits`` on the engine at ``endpoint`` (``host:port``)."""
    return LiveAdjustRequest(
        url=f"http://{endpoint}{LIVE_ADJUST_ROUTE}",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        body=dict(limits),
    )


class LiveAdjuster(Protocol):
    """Sets limits on every given pod, or raises :class:`LiveAdjustError`."""

    async def adjust(
        self, pods: Sequence[Mapping[str, Any]], token: str, limits: Mapping[str, int]
    ) -> None: ...


class HttpLiveAdjuster:
    """Calls each pod's route over HTTP (aiohttp); any answer but 200 is a failure.

    202 (the vLLM engine has not stepped since the request) counts as a failure too: the
    measurement must not start before the limits hold.
    """

    def __init__(self, resolver: PodEndpointResolver = pod_ip_endpoint, timeout_s: float = DEFAULT_TIMEOUT_S):
        self.resolver = resolver
        self.timeout_s = timeout_s

    async def adjust(self, pods: Sequence[Mapping[str, Any]], token: str, limits: Mapping[str, int]) -> None:
        if not pods:
            raise LiveAdjustError("no Ready canary pod to adjust")
        requests = []
        for pod in pods:
            endpoint = self.resolver(pod)
            if endpoint is None:
                name = (pod.get("metadata") or {}).get("name")
                raise LiveAdjustError(f"no address for canary pod {name}")
            requests.append(build_request(endpoint, token, limits))
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for request in requests:
                await _put(session, request)


async def _put(session: aiohttp.ClientSession, request: LiveAdjustRequest) -> None:
    try:
        async with session.put(
            request.url, json=dict(request.body), headers=dict(request.headers)
        ) as response:
            text = await response.text()
            if response.status != 200:
                raise LiveAdjustError(f"PUT {request.url} answered {response.status}: {text[:300]}")
    except (TimeoutError, aiohttp.ClientError) as error:
        raise LiveAdjustError(f"PUT {request.url} failed: {error or type(error).__name__}") from error
