"""Act on a live adjustment: the PUT to each canary pod's live-adjustment route.

Where pods listen (:func:`pod_ip_endpoint` in a cluster, :func:`targets_file_resolver` locally),
the request (:func:`build_request`) and the aiohttp client (:class:`HttpLiveAdjuster`). What to
set, and when, is decided in :mod:`chunkpilot.tuner.decide.canary`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

import aiohttp
from chunkpilot.engine.live_adjust import LIVE_ADJUST_ROUTE
from chunkpilot.operator.engines.common import ENGINE_PORT

DEFAULT_TIMEOUT_S: Final = 5.0


class LiveAdjustError(RuntimeError):
    """A live adjustment did not happen (HTTP status, refusal, timeout); the message says which."""


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
