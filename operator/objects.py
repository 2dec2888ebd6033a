"""Kubernetes plumbing the operator and the tuner share: paths, ownership, the service status write.

The operator's reconciler and the tuner's controller both adopt what they create
with :func:`adopt` (Kopf's owner reference, namespace and labels), address the
InferenceService with :func:`isvc_path` and write its status through
:func:`write_service_status`: a merge patch conditional on the ``resourceVersion``
it was computed from, recomputed and retried on a conflict.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final, Protocol

import kopf
from chunkpilot.operator.builders import deployment_name, pool_deployment_name
from chunkpilot.operator.kube import KubeError, resource_path
from chunkpilot.operator.meta import LABEL_MANAGED_BY, MANAGED_BY
from chunkpilot.operator.router import router_name
from chunkpilot.operator.status import POOL_PARTS, TopologyPart

from chunkpilot.api import (
    API_VERSION,
    ISVC_KIND,
    ISVC_PLURAL,
    LABEL_SERVICE,
    TRIAL_PLURAL,
    InferenceServiceStatus,
    Track,
)

#: Attempts of a conditional status write before giving up.
STATUS_WRITE_ATTEMPTS: Final = 5


class StatusKube(Protocol):
    """The two verbs a status write needs."""

    async def get(self, path: str) -> dict[str, Any] | None: ...
    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any]: ...


def isvc_path(namespace: str, name: str, subresource: str | None = None) -> str:
    """The API path of an InferenceService (``subresource``: e.g. ``status``)."""
    return resource_path(API_VERSION, ISVC_PLURAL, namespace, name, subresource)


def owner(body: Mapping[str, Any]) -> dict[str, Any]:
    """The owner body Kopf adopts children with (an InferenceService's identity and labels)."""
    meta = body["metadata"]
    return {
        "apiVersion": body.get("apiVersion", API_VERSION),
        "kind": body.get("kind", ISVC_KIND),
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
            "labels": dict(meta.get("labels") or {}),
        },
    }


def adopt(manifest: dict[str, Any], body: Mapping[str, Any]) -> dict[str, Any]:
    """``manifest`` owned by the InferenceService ``body`` (garbage-collected with it), in its namespace."""
    kopf.adopt(manifest, owner=owner(body))  # type: ignore[arg-type]  # a plain dict is a valid owner body
    return manifest


def owned_by(child: Mapping[str, Any], body: Mapping[str, Any]) -> bool:
    """Whether ``child`` belongs to the InferenceService ``body``: an owner reference with its uid, or
    the labels the operator gives what it creates for a service of this name (managed by Chunkpilot,
    ``chunkpilot.io/service`` = the name: left by an earlier object of the same name, adopted anew).
    Nothing else is ever written, patched or deleted on a service's behalf."""
    meta = child.get("metadata") or {}
    uid = body["metadata"].get("uid")
    if uid and any(ref.get("uid") == uid for ref in meta.get("ownerReferences") or []):
        return True
    labels = meta.get("labels") or {}
    service = body["metadata"]["name"]
    return labels.get(LABEL_MANAGED_BY) == MANAGED_BY and labels.get(LABEL_SERVICE) == service


class NameConflictError(Exception):
    """An object Chunkpilot would write already exists and is someone else's: it is left untouched.

    ``owner`` is who would have written it and ``mark`` what would show it theirs; ``remedy`` how to
    free the name. The defaults are a service's child's.
    """

    def __init__(
        self,
        found: Mapping[str, Any],
        *,
        owner: str = "this InferenceService",
        mark: str = f"no owner reference to it, no {LABEL_MANAGED_BY}={MANAGED_BY} label for it",
        remedy: str = "rename the InferenceService or remove",
    ) -> None:
        meta = found.get("metadata") or {}
        self.kind = str(found.get("kind") or "object")
        self.name = str(meta.get("name") or "")
        self.namespace = str(meta.get("namespace") or "")
        super().__init__(
            f"{self.kind} {self.namespace}/{self.name} already exists and does not belong to {owner} "
            f"({mark}): it is left untouched; {remedy} that {self.kind}"
        )


def parse_status(raw: Any) -> InferenceServiceStatus | None:
    """The typed status of a raw ``.status`` (None when it does not validate)."""
    try:
        return InferenceServiceStatus.model_validate(raw or {})
    except ValueError:
        return None


StatusPatcher = Callable[[Mapping[str, Any]], dict[str, Any] | None]
"""From the fresh InferenceService, the ``.status`` fields to write (None or empty: nothing)."""


async def write_service_status(
    kube: StatusKube,
    namespace: str,
    name: str,
    patcher: StatusPatcher,
    *,
    skip_terminating: bool = False,
    on_written: Callable[[Mapping[str, Any]], None] | None = None,
    read: Mapping[str, Any] | None = None,
) -> bool:
    """Write what ``patcher`` computes from the fresh object, conditional on its resourceVersion.

    Retried on a conflict (``patcher`` sees the newer object); returns False only when every
    attempt conflicted. ``on_written`` gets the object the written patch was computed from.
    ``read``: the object as the caller read it moments ago, tried first instead of reading it
    again (a conflict reads it afresh), so a status with nothing to change costs no request.
    """
    path = isvc_path(namespace, name)
    for attempt in range(STATUS_WRITE_ATTEMPTS):
        known = attempt == 0 and read is not None and (read.get("metadata") or {}).get("resourceVersion")
        fresh = read if known else await kube.get(path)
        if fresh is None or (skip_terminating and fresh.get("metadata", {}).get("deletionTimestamp")):
            return True
        status = patcher(fresh)
        if not status:
            return True
        patch = {"metadata": {"resourceVersion": fresh["metadata"]["resourceVersion"]}, "status": status}
        try:
            await kube.merge_patch(isvc_path(namespace, name, "status"), patch)
        except KubeError as error:
            if error.conflict:
                continue
            raise
        if on_written is not None:
            on_written(fresh)
        return True
    return False


def trial_path(namespace: str, name: str | None = None, sub: str | None = None) -> str:
    """A TuningTrial (or, without ``name``, the collection), with an optional subresource."""
    return resource_path(API_VERSION, TRIAL_PLURAL, namespace, name, sub)


def named_deployment_path(namespace: str | None, name: str) -> str:
    """The Deployment ``name`` in ``namespace``."""
    return resource_path("apps/v1", "deployments", namespace, name)


def deployment_path(namespace: str, service: str, track: Track) -> str:
    """The Deployment of a colocated service's ``track``."""
    return named_deployment_path(namespace, deployment_name(service, track))


#: The parts of a canary topology, as the tuner's snapshot keys them.
TOPOLOGY_PARTS: Final = tuple(TopologyPart)


def canary_topology_deployment_path(namespace: str, service: str, part: str) -> str:
    """The canary Deployment of a topology trial's ``part`` (a pool's role, or ``router``)."""
    name = (
        router_name(service, Track.CANARY)
        if part == TopologyPart.ROUTER
        else pool_deployment_name(service, part, Track.CANARY)
    )
    return named_deployment_path(namespace, name)


def canary_topology_paths(namespace: str, service: str, *, pools: bool = True) -> list[str]:
    """The objects of a canary topology in the order they are deleted: the router and its RBAC, then
    (``pools``) both pools: the router never outlives the backends it routes to."""
    router = router_name(service, Track.CANARY)
    return [
        canary_topology_deployment_path(namespace, service, TopologyPart.ROUTER),
        resource_path("rbac.authorization.k8s.io/v1", "rolebindings", namespace, router),
        resource_path("rbac.authorization.k8s.io/v1", "roles", namespace, router),
        resource_path("v1", "serviceaccounts", namespace, router),
        *(canary_topology_deployment_path(namespace, service, part) for part in POOL_PARTS if pools),
    ]
