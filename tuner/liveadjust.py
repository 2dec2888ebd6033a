"""Live adjustment: lower a running canary's scheduler limits instead of rolling out a new one.

With ``spec.autotune.liveAdjust`` the engine serves an authenticated route (the vLLM
plugin's, see :mod:`chunkpilot.engine.vllm_plugin.endpoint`; the simulator serves the
same one) that lowers ``max_num_batched_tokens``, ``max_num_seqs`` and
``max_num_active_seqs`` at run time and refuses raises above the start-up values.
The tuner starts a canary at the top of the search space for those three knobs and
reaches each trial's values through the route, so a trial that only lowers them
needs no restart.

This module holds the pure decision (:func:`live_adjust_refusal`, :func:`ceiling_config`),
the request (:func:`build_request`) and the HTTP client (:class:`HttpLiveAdjuster`).
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
from chunkpilot.operator.builders import LIVE_ADJUST_SECRET_KEY
from chunkpilot.operator.engines.common import ENGINE_PORT
from chunkpilot.tuner.records import GROUP_PREFIX

from chunkpilot.api import EngineConfig

#: The knobs the route can change; every other knob needs a restart.
LIVE_KNOBS: Final = ("max_num_batched_tokens", "max_num_seqs", "max_num_active_seqs")
#: On the canary Deployment: the config its pods were started with (JSON, API spelling).
ANNOTATION_STARTED_CONFIG: Final = f"{GROUP_PREFIX}/started-config"
#: On the canary Deployment: kept between trials for the next one to adjust ("true").
ANNOTATION_PARKED: Final = f"{GROUP_PREFIX}/parked"
#: On a TuningTrial: "true" when its limits were set through the route, else why not.
ANNOTATION_LIVE_ADJUSTED: Final = f"{GROUP_PREFIX}/live-adjusted"
#: On a TuningTrial: the config hash of the pods that serve it (labels Prometheus selects on).
ANNOTATION_CANARY_HASH: Final = f"{GROUP_PREFIX}/canary-config-hash"
#: Prefix of a :data:`ANNOTATION_LIVE_ADJUSTED` value recording a failed call (the route is unusable).
FAILED_PREFIX: Final = "failed: "
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


def started_config(deployment: Mapping[str, Any]) -> EngineConfig | None:
    """The config a canary Deployment's pods were started with (None: not recorded or unreadable)."""
    raw = ((deployment.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_STARTED_CONFIG)
    if not raw:
        return None
    try:
        return EngineConfig.model_validate(json.loads(raw))
    except ValueError:
        return None


def started_config_annotation(config: EngineConfig) -> str:
    """The :data:`ANNOTATION_STARTED_CONFIG` value for ``config``."""
    return json.dumps(config.to_k8s(), sort_keys=True, separators=(",", ":"))


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
