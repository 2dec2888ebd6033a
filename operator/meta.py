"""Names and metadata every child of an InferenceService shares (used by every builder)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from chunkpilot.api import InferenceService

MANAGED_BY: Final = "chunkpilot"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"


def service_name(isvc: InferenceService) -> str:
    """The InferenceService's name; ValueError when the manifest has none."""
    if not isvc.metadata.name:
        raise ValueError("metadata.name is required: name the InferenceService")
    return isvc.metadata.name


def object_metadata(
    isvc: InferenceService, name: str, labels: Mapping[str, str], annotations: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """``metadata`` of a child named ``name`` in the service's namespace."""
    meta: dict[str, Any] = {"name": name}
    if isvc.metadata.namespace:
        meta["namespace"] = isvc.metadata.namespace
    meta["labels"] = dict(labels)
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta
