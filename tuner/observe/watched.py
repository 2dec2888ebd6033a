"""The tick's reads of watched objects served from the operator's watch, its own writes read back.

Each tick reads the InferenceService and its stable and canary Deployments (and a topology trial's
canary pools). The operator already watches all of them; :func:`index_object` keeps the last body
of each in a Kopf index (``managedFields`` left out), which Kopf fills from its first listing before
it starts any handler or timer, so an object missing from it does not exist (as far as the watch
has seen). :class:`WatchedKube` answers those GETs from the indices and sends every other verb to
the API.

What the watch has not shown yet is read from the API instead: after the tuner writes a watched
object (apply, patch, create, delete; a subresource such as ``status`` too) its path is *pending*
until the index holds the resourceVersion the write returned (or, for a delete, no longer holds the
object), so a tick never reads back an older object than it wrote. A write refused for a conflict
makes the object pending too (someone else changed it; the index may not show that yet). A pending
write the index never matches (another writer changed the object again in between) is settled by
the read that finds the index and the API agreeing, and at the latest after :data:`PENDING_S`.
"""

from __future__ import annotations

import copy
import re
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, Protocol

from chunkpilot.operator.kube import KubeError, object_path

from chunkpilot.api import GROUP, ISVC_PLURAL, VERSION

__all__ = ["PENDING_S", "WATCHED", "Kube", "ObjectIndex", "WatchedKube", "index_object"]

#: Longest a written object is read from the API rather than the index (seconds).
PENDING_S: Final = 120.0

#: The kinds the tick reads from the watch: plural -> its API group/version.
WATCHED: Final[Mapping[str, str]] = {"deployments": "apps/v1", ISVC_PLURAL: f"{GROUP}/{VERSION}"}

_OBJECT = re.compile(r"^/apis/([^/]+/[^/]+)/namespaces/([^/]+)/([^/]+)/([^/?]+)(/[a-z]+)?$")
_COLLECTION = re.compile(r"^/apis/([^/]+/[^/]+)/namespaces/([^/]+)/([^/]+)/?$")
#: A write whose resourceVersion is not known (refused for a conflict): settled when the index and
#: the API agree.
_UNKNOWN: Final = "?"

#: Kopf's index of one kind: ``(namespace, name)`` -> the stores of the bodies (one each).
ObjectIndex = Mapping[tuple[str, str], Iterable[Mapping[str, Any]]]
#: Key of a watched object: plural, namespace, name.
_Key = tuple[str, str, str]


class Kube(Protocol):
    """The API verbs the tuning loop needs (``chunkpilot.operator.kube.KubeClient`` has them)."""

    async def get(self, path: str) -> dict[str, Any] | None: ...
    async def apply(self, manifest: Mapping[str, Any], *, force: bool = True) -> dict[str, Any]: ...
    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any]: ...
    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]: ...
    async def delete(self, path: str) -> None: ...
    async def list(self, path: str, *, label_selector: str | None = None) -> list[dict[str, Any]]: ...


def index_object(body: Mapping[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """The index entry of one watched object: its body without ``metadata.managedFields``."""
    meta = body.get("metadata") or {}
    kept = {k: v for k, v in meta.items() if k != "managedFields"}
    return {(str(meta.get("namespace")), str(meta.get("name"))): {**body, "metadata": kept}}


def _key(path: str, *, subresource: bool = False) -> _Key | None:
    """The watched object ``path`` names (a subresource's too, with ``subresource``); None: not one."""
    match = _OBJECT.match(path)
    if match is None or (match.group(5) and not subresource):
        return None
    api_version, namespace, plural, name = match.group(1, 2, 3, 4)
    return (plural, namespace, name) if WATCHED.get(plural) == api_version else None


def _version(body: Mapping[str, Any] | None) -> str | None:
    return None if body is None else (body.get("metadata") or {}).get("resourceVersion")


class WatchedKube:
    """``kube`` with GETs of :data:`WATCHED` kinds answered from the watch's :attr:`indices`.

    :attr:`indices` (plural -> index) is set by the tuner's timer from Kopf's; a kind without one
    (all of them in tests and tools that run no watch) is read from the API.
    """

    def __init__(self, kube: Kube, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.kube = kube
        self.indices: dict[str, ObjectIndex] = {}
        self._clock = clock
        #: Deployments written and not yet seen by the watch: key -> (resourceVersion or None for
        #: deleted, when written).
        self._pending: dict[_Key, tuple[str | None, float]] = {}
        #: Reads answered from the index and from the API (what the benchmark and tests look at).
        self.reads = {"index": 0, "api": 0}

    # ---------------------------------------------------------------- reads

    async def get(self, path: str) -> dict[str, Any] | None:
        key = _key(path)
        if key is None or key[0] not in self.indices:
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

    def _watched(self, key: _Key) -> dict[str, Any] | None:
        plural, namespace, name = key
        store = self.indices[plural].get((namespace, name))
        for body in store or ():
            return dict(body)
        return None

    # ---------------------------------------------------------------- writes

    async def apply(self, manifest: Mapping[str, Any], *, force: bool = True) -> dict[str, Any]:
        result = await self.kube.apply(manifest, force=force)
        self._wrote(object_path(manifest), result)
        return result

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        try:
            result = await self.kube.merge_patch(path, patch)
        except KubeError as error:
            if error.conflict:  # changed by someone else, maybe not yet in the index
                self._wrote(path, {"metadata": {"resourceVersion": _UNKNOWN}})
            raise
        self._wrote(path, result)
        return result

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        result = await self.kube.create(path, body)
        meta = result.get("metadata") or {}
        if _COLLECTION.match(path) and meta.get("name"):
            self._wrote(f"{path.rstrip('/')}/{meta['name']}", result)
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
