"""Event selection (which Kubernetes Events a reconcile should post) and the one poster of Events.

Events mark transitions a person reading ``kubectl describe`` cares about:
children created, the stable track rolled to a new config, the service became
ready, a knob the engine cannot honour, a hand-made change undone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import kopf
from chunkpilot.operator.status import Reason, get_condition

from chunkpilot.api import ConditionStatus, ConditionType, EngineConfig, InferenceServiceStatus, knobs


class EventType(StrEnum):
    NORMAL = "Normal"
    WARNING = "Warning"


@dataclass(frozen=True)
class EventSpec:
    """One Event to post on the InferenceService."""

    type: EventType
    reason: str
    message: str


def post_event(body: Mapping[str, Any], spec: EventSpec) -> None:
    """Post a Kubernetes Event on ``body`` (queued; Kopf sends it in the background)."""
    kopf.event(body, type=spec.type.value, reason=spec.reason, message=spec.message)  # type: ignore[arg-type]


def created(kinds_and_names: Sequence[tuple[str, str]]) -> EventSpec:
    listed = ", ".join(f"{kind} {name}" for kind, name in kinds_and_names)
    return EventSpec(EventType.NORMAL, "Created", f"created {listed}")


def rolled(deployment: str, old: EngineConfig | None, new: EngineConfig, new_hash: str) -> EventSpec:
    if old is None:
        change = new.summary()
    else:
        change = knobs.change(old.model_dump(), new.model_dump()) or "engine settings changed"
    return EventSpec(EventType.NORMAL, "Rolled", f"rolling {deployment} to config {new_hash} ({change})")


def restored(kind: str, name: str, how: str) -> EventSpec:
    return EventSpec(EventType.WARNING, "DriftCorrected", f"restored {kind} {name} ({how})")


def status_transitions(
    before: InferenceServiceStatus | None, after: InferenceServiceStatus
) -> list[EventSpec]:
    """Events for condition flips between two statuses (became ready, unsupported knob, degraded)."""
    old = before.conditions if before is not None else []
    events: list[EventSpec] = []
    ready_old = get_condition(old, ConditionType.READY)
    ready_new = get_condition(after.conditions, ConditionType.READY)
    if ready_new is not None:
        was_true = ready_old is not None and ready_old.status == ConditionStatus.TRUE
        if ready_new.status == ConditionStatus.TRUE and not was_true:
            events.append(EventSpec(EventType.NORMAL, "Ready", f"service is ready: {ready_new.message}"))
        problem_reasons = {Reason.UNSUPPORTED_KNOB, Reason.UNSUPPORTED_ENGINE_VERSION}
        newly_refused = ready_new.reason in problem_reasons and (
            ready_old is None
            or (ready_old.reason, ready_old.message) != (ready_new.reason, ready_new.message)
        )
        if newly_refused:
            events.append(EventSpec(EventType.WARNING, ready_new.reason, ready_new.message))
    degraded_old = get_condition(old, ConditionType.DEGRADED)
    degraded_new = get_condition(after.conditions, ConditionType.DEGRADED)
    if (
        degraded_new is not None
        and degraded_new.status == ConditionStatus.TRUE
        and degraded_new.reason not in {Reason.UNSUPPORTED_KNOB, Reason.UNSUPPORTED_ENGINE_VERSION}
        and (degraded_old is None or degraded_old.status != ConditionStatus.TRUE)
    ):
        events.append(EventSpec(EventType.WARNING, degraded_new.reason, degraded_new.message))
    live_old = get_condition(old, ConditionType.LIVE_ADJUST)
    live_new = get_condition(after.conditions, ConditionType.LIVE_ADJUST)
    if live_new is not None and (live_old is None or live_old.reason != live_new.reason):
        events.append(EventSpec(EventType.WARNING, live_new.reason, live_new.message))
    return events
