"""The tick's reads of watched objects served from the operator's watch, its own writes read back.

Each tick reads the InferenceService and its stable and canary Deployments (and a topology trial's
canary pools; where rankings run as Jobs, its ranking's Job), and lists the service's TuningTrials.
The operator already watches the first two kinds and watches TuningTrials and the twin's Jobs for
this; :func:`index_object` keeps the last body of each object in a Kopf index by name,
:func:`index_by_label` each TuningTrial under its service's label (``managedFields`` left out).
Kopf fills its indices from its first listing before it starts any handler or timer, so an object
missing from one does not exist (as far as the watch has seen). :class:`WatchedKube` answers those
GETs and lists from the indices and sends every other call to the API.

What the watch has not shown yet is read from the API instead: after the tuner writes a watched
object (apply, patch, create, delete; a subresource such as ``status`` too) its path is *pending*
until the index holds the resourceVersion the write returned (or, for a delete, no longer holds the
object), so a tick never reads back an older object than it wrote. A write refused for a conflict
makes the object pending too (someone else changed it; the index may not show that yet). A pending
write the index never matches (another writer changed the object again in between) is settled by
the read that finds the index and the API agreeing, and at the latest after :data:`PENDING_S`. A
write of a listed kind is pending for the list of its label's value, which is read from the API
while one of its writes is.
"""

from __future__ import annotations

import builtins
import copy
import re
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, Protocol

from chunkpilot.operator.kube import KubeError, object_path

from chunkpilot.api import GROUP, ISVC_PLURAL, LABEL_SERVICE, TRIAL_PLURAL, VERSION

__all__ = [
    "LISTED",
    "PENDING_S",
    "WATCHED",
    "Kube",
    "ObjectIndex",
    "WatchedKube",
    "index_by_label",
    "index_object",
]

#: Longest a written object is read from the API rather than the index (seconds).
PENDING_S: Final = 120.0

#: The kinds the tick reads from the watch: plural -> its API group/version (the twin's ranking Jobs
#: only where they run: their index is then handed over with the others).
WATCHED: Final[Mapping[str, str]] = {
    "deployments": "apps/v1",
    ISVC_PLURAL: f"{GROUP}/{VERSION}",
    "jobs": "batch/v1",
}

#: The kinds the tick lists from the watch, by the one label its lists select on: plural -> label.
LISTED: Final[Mapping[str, str]] = {TRIAL_PLURAL: LABEL_SERVICE}
_LISTED_VERSION: Final = f"{GROUP}/{VERSION}"

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


def index_by_label(body: Mapping[str, Any], label: str) -> dict[tuple[str, str], dict[str, Any]]:
    """The index entry of one listed object: under (namespace, its ``label``'s value); none without it."""
    meta = body.get("metadata") or {}
    value = (meta.get("labels") or {}).get(label)
    if value is None:
        return {}
    (_, kept) = next(iter(index_object(body).items()))
    return {(str(meta.get("namespace")), str(value)): kept}


def _key(path: str, *, subresource: bool = False) -> _Key | None:
    """The watched object ``path`` names (a subresource's too, with ``subresource``); None: not one."""
    match = _OBJECT.match(path)
    if match is None or (match.group(5) and not subresource):
        return None
    api_version, namespace, plural, name = match.group(1, 2, 3, 4)
    return (plural, namespace, name) if WATCHED.get(plural) == api_version else None


def _version(body: Mapping[str, Any] | None) -> str | None:
    return None if body is None else (body.get("metadata") or {}).get("resourceVersion")


def _name(body: Mapping[str, Any]) -> str | None:
    return (body.get("metadata") or {}).get("name")


def _version_of(bodies: Iterable[Mapping[str, Any]], name: str) -> str | None:
    """The resourceVersion of the object ``name`` among ``bodies``; None when it is not there."""
    return next((_version(b) for b in bodies if _name(b) == name), None)


def _listed(path: str, label_selector: str | None) -> _Key | None:
    """The listed group ``(plural, namespace, label value)`` a list call reads; None: not one."""
    match = _COLLECTION.match(path)
    if match is None or label_selector is None or "," in label_selector:
        return None
    api_version, namespace, plural = match.group(1, 2, 3)
    label, _, value = label_selector.partition("=")
    if plural not in LISTED or api_version != _LISTED_VERSION or label != LISTED[plural] or not value:
        return None
    return plural, namespace, value


def _listed_object(path: str) -> str | None:
    """The object path of a listed kind's object or subresource path; None: not one."""
    match = _OBJECT.match(path)
    if match is None or match.group(3) not in LISTED or match.group(1) != _LISTED_VERSION:
        return None
    return path[: len(path) - len(match.group(5) or "")]


class WatchedKube:
    """``kube`` with GETs of :data:`WATCHED` kinds and lists of :data:`LISTED` kinds by their label
    answered from the watch's :attr:`indices`.

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
        #: Writes of listed kinds the watch has not shown: (plural, namespace, label value) -> name ->
        #: (resourceVersion or None for deleted, when written).
        self._pending_lists: dict[_Key, dict[str, tuple[str | None, float]]] = {}
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
        group = _listed(path, label_selector)
        if group is None or group[0] not in self.indices:
            return await self.kube.list(path, label_selector=label_selector)
        watched = self._listed_bodies(group)
        pending = self._pending_lists.get(group)
        if pending:
            for name in [
                n for n, (version, since) in pending.items() if self._settled(watched, n, version, since)
            ]:
                del pending[name]
        if pending:
            self.reads["api"] += 1
            listed = await self.kube.list(path, label_selector=label_selector)
            for name in [n for n in pending if _version_of(listed, n) == _version_of(watched, n)]:
                del pending[name]  # the watch caught up past the write
            return listed
        self._pending_lists.pop(group, None)
        self.reads["index"] += 1
        return copy.deepcopy(watched)

    def _listed_bodies(self, group: _Key) -> builtins.list[dict[str, Any]]:
        plural, namespace, value = group
        return [dict(body) for body in self.indices[plural].get((namespace, value)) or ()]

    def _settled(
        self, watched: Iterable[Mapping[str, Any]], name: str, version: str | None, since: float
    ) -> bool:
        return _version_of(watched, name) == version or self._clock() - since > PENDING_S

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
                await self._conflicted(path)
            raise
        self._wrote(path, result)
        return result

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        try:
            result = await self.kube.create(path, body)
        except KubeError as error:
            name = (body.get("metadata") or {}).get("name")
            if error.conflict and name and _COLLECTION.match(path):  # it exists: maybe not in the index
                await self._conflicted(f"{path.rstrip('/')}/{name}")
            raise
        meta = result.get("metadata") or {}
        if _COLLECTION.match(path) and meta.get("name"):
            self._wrote(f"{path.rstrip('/')}/{meta['name']}", result)
        return result

    async def delete(self, path: str) -> None:
        try:
            await self.kube.delete(path)
        finally:
            self._wrote(path, None)

    async def _conflicted(self, path: str) -> None:
        """A write to ``path`` refused for a conflict: its object (and, for a listed kind, its list,
        which the object's labels name) is read from the API until the index agrees with it."""
        unknown: dict[str, Any] = {"metadata": {"resourceVersion": _UNKNOWN}}
        listed = _listed_object(path)
        if listed is not None:
            current = await self.kube.get(listed) or {}
            unknown = {
                **current,
                "metadata": {**(current.get("metadata") or {}), "resourceVersion": _UNKNOWN},
            }
        self._wrote(path, unknown)

    def _wrote(self, path: str, result: Mapping[str, Any] | None) -> None:
        key = _key(path, subresource=True)
        if key is not None:
            self._pending[key] = (_version(result), self._clock())
        match = _OBJECT.match(path)
        if match is None or _listed_object(path) is None:
            return
        namespace, plural, name = match.group(2, 3, 4)
        meta = (result or {}).get("metadata") or {}
        value = (meta.get("labels") or {}).get(LISTED[plural])
        if value is None and result is None and plural in self.indices:  # deleted: the index knows
            value = next(
                (
                    v
                    for (ns, v), store in self.indices[plural].items()
                    if ns == namespace and any(_name(b) == name for b in store)
                ),
                None,
            )
        if value is not None:
            pending = self._pending_lists.setdefault((plural, namespace, str(value)), {})
            pending[name] = (_version(result), self._clock())
