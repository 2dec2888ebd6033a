"""Writing one InferenceService's children: apply unless the live one already matches, delete owned leftovers.

What :class:`~chunkpilot.operator.reconcile.Reconciler` writes children through, one at a time:
the stable track's roll and repair Events, the live-adjustment token Secret and the "is the
PodMonitor API served?" check. Which children to write, and when, is the reconciler's to decide.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from chunkpilot.operator import events as ev
from chunkpilot.operator.builders import (
    LIVE_ADJUST_SECRET,
    POD_MONITOR_API_VERSION,
    ROTATED_PREFIX,
    build_live_adjust_secret,
    is_live_adjust_secret,
    live_adjust_tokens,
    token_rotation,
    wants_live_adjust_secret,
)
from chunkpilot.operator.config import OperatorConfig, PodMonitorMode
from chunkpilot.operator.drift import foreign_selector_keys, is_subset, is_terminating
from chunkpilot.operator.kube import KubeClient, KubeError, object_path, resource_path
from chunkpilot.operator.objects import NameConflictError, adopt, owned_by
from chunkpilot.operator.status import DeploymentState

from chunkpilot.api import LABEL_SERVICE, InferenceService

logger = logging.getLogger(__name__)

#: How long the answer to "is the PodMonitor API served?" is trusted.
API_DISCOVERY_TTL_S: Final = 300.0


@dataclass
class Ensured:
    """What :meth:`ChildWriter.ensure` found and did: the live object, the one before, whether written."""

    actual: dict[str, Any] | None
    previous: dict[str, Any] | None
    created: bool = False
    written: bool = False


@dataclass
class ChildWriter:
    """Applies and deletes the children of InferenceServices through one API client."""

    kube: KubeClient
    config: OperatorConfig
    post_event: Callable[[Mapping[str, Any], ev.EventSpec], None] | None = None
    _pod_monitor_api: tuple[float, bool] | None = None
    #: The resourceVersion of each child as this writer last wrote it, per service (namespace,
    #: name) and child (kind, name).
    _written: dict[tuple[str, str], dict[tuple[str, str], str]] = field(default_factory=dict)

    def is_echo(self, child: Mapping[str, Any]) -> bool:
        """Whether ``child`` (a watch event's object) is exactly what this writer last wrote.

        Such an event tells the operator nothing it does not know: the reconcile that wrote the
        child computed the service's status from the answer to its write.
        """
        service, key, version = _child_key(child)
        return version is not None and self._written.get(service, {}).get(key) == version

    def forget(self, namespace: str, service: str) -> None:
        """Drop what was recorded of the children of ``service`` (deleted)."""
        self._written.pop((namespace, service), None)

    def _record(self, written: Mapping[str, Any] | None) -> None:
        if written is None:
            return
        service, key, version = _child_key(written)
        if version is not None:
            self._written.setdefault(service, {})[key] = version

    async def ensure(self, desired: dict[str, Any], owner: Mapping[str, Any], current: Any) -> Ensured:
        """Apply ``desired`` unless the live object already matches it.

        Raises :class:`NameConflictError` when an object of that name exists that the service does
        not own (:func:`owned_by`): it is never overwritten.
        """
        adopt(desired, owner)
        if current is UNKNOWN:
            current = await self.kube.get(object_path(desired))
        if current is not None and not owned_by(current, owner):
            raise NameConflictError(current)
        if current is not None and is_terminating(current):
            return Ensured(actual=current, previous=current)  # recreated once the deletion completes
        extra = foreign_selector_keys(desired, current) if current is not None else {}
        if current is not None and not extra and is_subset(desired, current):
            return Ensured(actual=current, previous=current)
        actual = await self.kube.apply(desired)
        if extra:
            # Keys added by another field manager survive an apply: remove them explicitly.
            actual = await self.kube.merge_patch(object_path(desired), {"spec": {"selector": extra}})
        self._record(actual)
        return Ensured(actual=actual, previous=current, created=current is None, written=True)

    async def ensure_stable(
        self,
        body: Mapping[str, Any],
        isvc: InferenceService,
        desired: dict[str, Any],
        current: Any,
        repair: bool,
        created: list[tuple[str, str]],
    ) -> dict[str, Any] | None:
        """Apply the stable Deployment (and the live-adjust Secret); Events for a roll or a repair."""
        if wants_live_adjust_secret(isvc) and await self.ensure_live_adjust_secret(isvc, body):
            created.append(("Secret", LIVE_ADJUST_SECRET))
        ensured = await self.ensure(desired, body, current)
        name = desired["metadata"]["name"]
        if ensured.created:
            created.append(("Deployment", name))
        if ensured.written and not ensured.created:
            old_state = DeploymentState.from_manifest(ensured.previous) if ensured.previous else None
            new_state = DeploymentState.from_manifest(desired)
            if old_state is not None and old_state.config_hash != new_state.config_hash and new_state.config:
                self.emit(
                    body, ev.rolled(name, old_state.config, new_state.config, new_state.config_hash or "")
                )
            elif repair:
                self.emit(body, ev.restored("Deployment", name, "edited by hand"))
        elif ensured.created and repair:
            self.emit(body, ev.restored("Deployment", name, "deleted by hand"))
        return ensured.actual

    async def ensure_live_adjust_secret(self, isvc: InferenceService, owner: Mapping[str, Any]) -> bool:
        """Put the service's track tokens into the namespace's live-adjustment Secret; True when added now.

        The Secret (:data:`LIVE_ADJUST_SECRET`) is created when missing, with this service as its
        owner; otherwise the service becomes one more owner and its missing tokens are added. A token
        is replaced only when the service asks for a rotation (:data:`ANNOTATION_ROTATE_TOKENS` with a
        value the Secret has not recorded for it); its engines restart with the new ones (the value
        is on their pod template). The write is conditional on the version read. A Secret of that
        name the installation did not create raises :class:`NameConflictError`.
        """
        namespace = isvc.metadata.namespace
        secret = build_live_adjust_secret(namespace, live_adjust_tokens(isvc))
        if token_rotation(isvc):
            marker = f"{ROTATED_PREFIX}/{service_name(isvc)}"
            secret["metadata"]["annotations"] = {marker: token_rotation(isvc)}
        adopt(secret, owner)
        path = object_path(secret)
        current = await self.kube.get(path)
        if current is not None and not is_live_adjust_secret(current):
            raise NameConflictError(current)
        if current is None:
            try:
                await self.kube.create(resource_path("v1", "secrets", namespace), secret)
            except KubeError as error:
                if not error.conflict:
                    raise
                return False  # created meanwhile by another writer: the next pass adds the tokens
            return True
        meta = current["metadata"]
        held = current.get("data") or {}
        marker = f"{ROTATED_PREFIX}/{service_name(isvc)}"
        rotation = token_rotation(isvc)
        rotate = (meta.get("annotations") or {}).get(marker, "") != rotation
        fresh = secret["stringData"]
        missing = {key: token for key, token in fresh.items() if rotate or not held.get(key)}
        owners = list(meta.get("ownerReferences") or [])
        uid = owner["metadata"]["uid"]
        if not missing and any(ref.get("uid") == uid for ref in owners):
            return False
        reference = {**secret["metadata"]["ownerReferences"][0], "controller": False}
        patch: dict[str, Any] = {"metadata": {"resourceVersion": meta["resourceVersion"]}}
        if not any(ref.get("uid") == uid for ref in owners):
            patch["metadata"]["ownerReferences"] = [*owners, reference]
        if missing:
            patch["stringData"] = missing
        if rotate:
            patch["metadata"]["annotations"] = {marker: rotation}
        try:
            await self.kube.merge_patch(path, patch)
        except KubeError as error:
            if not error.conflict:
                raise
            return False  # changed meanwhile: the next pass looks again
        return bool(missing)

    def note(
        self,
        body: Mapping[str, Any],
        kind: str,
        name: str,
        ensured: Ensured,
        repair: bool,
        created: list[tuple[str, str]],
    ) -> None:
        """Record a created child, or report a repaired one."""
        if ensured.created and not repair:
            created.append((kind, name))
        elif ensured.written and repair:
            self.emit(
                body, ev.restored(kind, name, "deleted by hand" if ensured.created else "edited by hand")
            )

    async def owned(self, path: str, owner: Mapping[str, Any]) -> dict[str, Any] | None:
        """The child at ``path`` when this InferenceService owns it and it is not being deleted."""
        current = await self.kube.get(path)
        if current is None or is_terminating(current):
            return None
        return current if owned_by(current, owner) else None

    async def delete_owned(self, path: str, owner: Mapping[str, Any]) -> None:
        """Delete the child at ``path`` when this InferenceService owns it (a topology change left it)."""
        current = await self.owned(path, owner)
        if current is None:
            return
        await self.kube.delete(path)
        logger.info("deleted %s %s, left from the service's previous topology", current["kind"], path)

    async def pod_monitor_wanted(self) -> bool:
        """Whether to write PodMonitors: the configured mode, or (auto) whether the API is served."""
        mode = self.config.pod_monitor
        if mode != PodMonitorMode.AUTO:
            return mode == PodMonitorMode.ENABLED
        now = time.monotonic()
        if self._pod_monitor_api is None or now - self._pod_monitor_api[0] > API_DISCOVERY_TTL_S:
            served = await self.kube.has_resource(POD_MONITOR_API_VERSION, "podmonitors")
            self._pod_monitor_api = (now, served)
        return self._pod_monitor_api[1]

    def emit(self, body: Mapping[str, Any], spec: ev.EventSpec) -> None:
        """Post an Event about ``body`` (nothing without an Event sink)."""
        if self.post_event is not None:
            self.post_event(body, spec)


class _Unknown:
    """Marker: the child's live state has not been fetched yet."""


UNKNOWN: Final = _Unknown()


def service_name(isvc: InferenceService) -> str:
    assert isvc.metadata.name is not None
    return isvc.metadata.name


def deployment_state(manifest: Mapping[str, Any] | None) -> DeploymentState | None:
    return DeploymentState.from_manifest(manifest) if manifest is not None else None


def _child_key(child: Mapping[str, Any]) -> tuple[tuple[str, str], tuple[str, str], str | None]:
    """(namespace, service), (kind, name) and the resourceVersion of a child."""
    meta = child.get("metadata") or {}
    service = str((meta.get("labels") or {}).get(LABEL_SERVICE, ""))
    version = meta.get("resourceVersion")
    return (
        (str(meta.get("namespace")), service),
        (str(child.get("kind")), str(meta.get("name"))),
        None if version is None else str(version),
    )
