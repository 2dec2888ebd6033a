"""Deployment reads served from the operator's watch, with the tuner's own writes read back.

Each tick reads the service's stable and canary Deployments (and a topology trial's canary pools).
The operator already watches every Deployment it labels; :func:`index_deployment` keeps the last
body of each in a Kopf index (``managedFields`` left out), which Kopf fills from its first listing
before it starts any handler or timer, so a Deployment missing from it does not exist (as far as
the watch has seen). :class:`WatchedKube` answers those GETs from the index and sends every other
verb to the API.

What the watch has not shown yet is read from the API instead: after the tuner writes a Deployment
(apply, patch, create, delete) its path is *pending* until the index holds the resourceVersion the
write returned (or, for a delete, no longer holds the object), so a tick never reads back an older
Deployment than it wrote. A pending write the index never matches (another writer changed the object
again in between) is settled by the read that finds the index and the API agreeing, and at the latest
after :data:`PENDING_S`.
"""

from __future__ import annotations

import copy
import re
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, Protocol

from chunkpilot.operator.kube import object_path

__all__ = ["PENDING_S", "DeploymentIndex", "WatchedKube", "index_deployment"]

#: Longest a written Deployment is read from the API rather than the index (seconds).
PENDING_S: Final = 120.0

_DEPLOYMENT = re.compile(r"^/apis/apps/v1/namespaces/([^/]+)/deployments/([^/?]+)(/[a-z]+)?$")
_DEPLOYMENTS = re.compile(r"^/apis/apps/v1/namespaces/([^/]+)/deployments/?$")

#: Kopf's index of Deployments: ``(namespace, name)`` -> the stores of the bodies (one each).
DeploymentIndex = Mapping[tuple[str, str], Iterable[Mapping[str, Any]]]


class Kube(Protocol):
    """The API verbs the tuner uses (``chunkpilot.operator.kube.KubeClient`` has them)."""

    async def get(self, path: str) -> dict[str, Any] | None: ...
    async def apply(self, manifest: Mapping[str, Any], *, force: bool = True) -> dict[str, Any]: ...
    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any]: ...
    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]: ...
    async def delete(self, path: str) -> None: ...
    async def list(self, path: str, *, label_selector: str | None = None) -> list[dict[str, Any]]: ...


def index_deployment(body: Mapping[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """The index entry of one watched Deployment: its body without ``metadata.managedFields``."""
    meta = body.get("metadata") or {}
    kept = {k: v for k, v in meta.items() if k != "managedFields"}
    return {(str(meta.get("namespace")), str(meta.get("name"))): {**body, "metadata": kept}}


def _key(path: str, *, subresource: bool = False) -> tuple[str, str] | None:
    """The Deployment ``path`` names (a subresource's too, with ``subresource``); None: not one."""
    match = _DEPLOYMENT.match(path)
    if match is None or (match.group(3) and not subresource):
        return None
    return match.group(1), match.group(2)


def _version(body: Mapping[str, Any] | None) -> str | None:
    return None if body is None else (body.get("metadata") or {}).get("resourceVersion")


class WatchedKube:
    """``kube`` with Deployment GETs answered from the watch's :attr:`index` where it is current.

    Without an index (set by the tuner's timer from Kopf's; None in tests and tools that run no
    watch) every read goes to the API.
    """

    def __init__(self, kube: Kube, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.kube = kube
        self.index: DeploymentIndex | None = None
        self._clock = clock
        #: Deployments written and not yet seen by the watch: key -> (resourceVersion or None for
        #: deleted, when written).
        self._pending: dict[tuple[str, str], tuple[str | None, float]] = {}
        #: Reads answered from the index and from the API (what the benchmark and tests look at).
        self.reads = {"index": 0, "api": 0}

    # ---------------------------------------------------------------- reads

    async def get(self, path: str) -> dict[str, Any] | None:
        key = _key(path) if self.index is not None else None
        if key is None or self.index is None:
            return await self.kube.get(path)
        watched = self._watched(key)
        pending = self._pending.get(key)
        if pending is not None:
            version, since = pending
            if _version(watched) == version or self._clock() - since > PENDING_S:
                del self._pending[key]
            else:
                self.reads["api"] += 1
                body = await self.kube.get(path)
                if _version(body) == _version(watched):  # the watch caught up past the write
                    del self._pending[key]
                return body
        self.reads["index"] += 1
        return copy.deepcopy(watched) if watched is not None else None

    async def list(self, path: str, *, label_selector: str | None = None) -> list[dict[str, Any]]:
        return await self.kube.list(path, label_selector=label_selector)

    def _watched(self, key: tuple[str, str]) -> dict[str, Any] | None:
        assert self.index is not None
        store = self.index.get(key)
        for body in store or ():
            return dict(body)
        return None

    # ---------------------------------------------------------------- writes

    async def apply(self, manifest: Mapping[str, Any], *, force: bool = True) -> dict[str, Any]:
        result = await self.kube.apply(manifest, force=force)
        self._wrote(object_path(manifest), result)
        return result

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        result = await self.kube.merge_patch(path, patch)
        self._wrote(path, result)
        return result

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        result = await self.kube.create(path, body)
        if _DEPLOYMENTS.match(path):
            self._wrote(object_path({"apiVersion": "apps/v1", "kind": "Deployment", **result}), result)
        return result

    async def delete(self, path: str) -> None:
        try:
            await self.kube.delete(path)
        finally:
            self._wrote(path, None)

    def _wrote(self, path: str, result: Mapping[str, Any] | None) -> None:
        key = _key(path, subresource=True)
        if key is not None:
            self._pending[key] = (_version(result), self._clock())
