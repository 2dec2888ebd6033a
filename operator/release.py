"""Leaving the cluster: take the operator's finalizer off InferenceServices it will no longer serve.

Kopf keeps a finalizer on every InferenceService the tuner ticks for, so it can stop the tick when
the service is deleted. Once the operator is uninstalled nobody removes it, and deleting such a
service waits forever. ``chunkpilot operator release`` (after ``helm uninstall``) removes that
finalizer and nothing else: the services keep serving, unmanaged, and delete normally (their
children follow by garbage collection, through their ownerReferences).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from chunkpilot.operator.config import FINALIZER
from chunkpilot.operator.kube import KubeClient, KubeError, resource_path
from chunkpilot.operator.objects import isvc_path

from chunkpilot.api import API_VERSION, ISVC_PLURAL

#: Conflicting writes (someone else changed the object meanwhile) retried per service.
_ATTEMPTS = 5


async def release_finalizers(kube: KubeClient, namespaces: Sequence[str] = ()) -> list[str]:
    """Remove :data:`FINALIZER` from every InferenceService of ``namespaces`` (none: all of them).

    Returns ``namespace/name`` of each service released. Other finalizers are kept; each write is
    conditional on the version read, and re-read and retried on a conflict.
    """
    lists = [resource_path(API_VERSION, ISVC_PLURAL, ns) for ns in namespaces] or [
        resource_path(API_VERSION, ISVC_PLURAL)
    ]
    released: list[str] = []
    for path in lists:
        for item in await kube.list(path):
            meta = item["metadata"]
            if await _release(kube, meta["namespace"], meta["name"], item):
                released.append(f"{meta['namespace']}/{meta['name']}")
    return released


async def _release(kube: KubeClient, namespace: str, name: str, body: dict[str, Any] | None) -> bool:
    path = isvc_path(namespace, name)
    for _ in range(_ATTEMPTS):
        if body is None:
            return False
        meta = body["metadata"]
        finalizers = list(meta.get("finalizers") or [])
        if FINALIZER not in finalizers:
            return False
        kept = [f for f in finalizers if f != FINALIZER]
        patch = {"metadata": {"finalizers": kept or None, "resourceVersion": meta["resourceVersion"]}}
        try:
            await kube.merge_patch(path, patch)
            return True
        except KubeError as error:
            if not error.conflict:
                raise
        body = await kube.get(path)
    raise RuntimeError(f"{namespace}/{name}: still changing after {_ATTEMPTS} attempts; run again")
