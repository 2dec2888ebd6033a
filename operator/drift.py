"""Drift: which children a reconcile checks, whether a live one still matches what the operator
wants, and which changed children are the operator's to restore.

Pure functions of manifests and labels; :class:`~chunkpilot.operator.children.ChildWriter` and
:class:`~chunkpilot.operator.reconcile.Reconciler` act on their answers.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Final

from chunkpilot.operator.builders import deployment_name
from chunkpilot.operator.router import COMPONENT_ROUTER

from chunkpilot.api import LABEL_COMPONENT, LABEL_TRACK, Track


class ChildKind(StrEnum):
    DEPLOYMENT = "Deployment"
    SERVICE = "Service"
    POD_MONITOR = "PodMonitor"


ALL_KINDS: Final = frozenset(ChildKind)


def is_subset(desired: Any, actual: Any) -> bool:
    """True when every field of ``desired`` has the same value in ``actual``.

    Fields the API server adds (defaults, status, bookkeeping) are ignored, so an
    untouched child compares equal and is not written again.
    """
    if isinstance(desired, Mapping):
        return isinstance(actual, Mapping) and all(
            key in actual and is_subset(value, actual[key]) for key, value in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(actual, list)
            and len(desired) == len(actual)
            and all(is_subset(d, a) for d, a in zip(desired, actual, strict=True))
        )
    return bool(desired == actual)


def foreign_selector_keys(desired: Mapping[str, Any], actual: Mapping[str, Any]) -> dict[str, None]:
    """Selector keys of a live Service that ``desired`` lacks, as a merge patch removing them.

    Elsewhere extra fields are server defaults and ignored; in a Service selector an extra
    key silently routes traffic away from the engine pods.
    """
    if desired.get("kind") != "Service":
        return {}
    wanted = (desired.get("spec") or {}).get("selector") or {}
    live = (actual.get("spec") or {}).get("selector") or {}
    return {key: None for key in live if key not in wanted}


def is_operator_owned(labels: Mapping[str, str]) -> bool:
    """Whether a Deployment with ``labels`` is the operator's: the stable track's, or the stable router.

    Canary Deployments, a topology trial's canary router among them, belong to the tuner.
    """
    track = labels.get(LABEL_TRACK)
    if track == Track.STABLE.value:
        return True
    return track is None and labels.get(LABEL_COMPONENT) == COMPONENT_ROUTER


def restored_name(kind: ChildKind, service: str) -> str:
    """The name of the colocated child of ``kind`` that a reconcile restores when it is deleted."""
    return deployment_name(service, Track.STABLE) if kind == ChildKind.DEPLOYMENT else service


def is_terminating(body: Mapping[str, Any] | None) -> bool:
    return body is not None and bool(body.get("metadata", {}).get("deletionTimestamp"))
