"""What a tuning step decided to do: typed actions and the :class:`Plan` that collects them.

:func:`chunkpilot.tuner.decide.step.decide` fills a plan from a snapshot without any I/O;
:class:`chunkpilot.tuner.act.actor.Actor` carries it out, in order, and then writes the
plan's service status and conditions in one conditional patch. A plan also keeps
what the step has already changed (the canary it deleted, the trials it finished,
the incumbent it promoted), so later decisions of the same step see them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from chunkpilot.operator.events import EventSpec, EventType
from chunkpilot.operator.status import ConditionUpdate, get_condition
from chunkpilot.tuner.space import SearchSpace
from chunkpilot.tuner.study import TrialRecord

from chunkpilot.api import (
    Condition,
    ConditionStatus,
    ConditionType,
    EngineConfig,
    TrialVerdict,
    TuningTrial,
)

if TYPE_CHECKING:  # the snapshot module uses the canary helpers, which build actions
    from chunkpilot.tuner.observe.snapshot import Snapshot


@dataclass(frozen=True)
class CreateTrial:
    """Create a TuningTrial, then write its first status (a name conflict: made by an earlier step)."""

    manifest: Mapping[str, Any]
    status: Mapping[str, Any]


@dataclass(frozen=True)
class PatchTrial:
    """Merge ``patch`` (``{"status": …}``) into a trial's status subresource."""

    name: str
    patch: Mapping[str, Any]


@dataclass(frozen=True)
class ApplyCanary:
    """Server-side apply the canary Deployment."""

    manifest: Mapping[str, Any]


@dataclass(frozen=True)
class AnnotateCanary:
    """Set (None: remove) annotations of the canary Deployment."""

    annotations: Mapping[str, str | None]


@dataclass(frozen=True)
class DeleteCanary:
    """Delete the canary Deployment."""


@dataclass(frozen=True)
class DeleteCanaryTopology:
    """Delete a topology trial's canary router and its RBAC objects, then (``pools``) its canary pools.

    Without ``pools`` the pools stay: the router goes first so that the Service never sends its
    share of the traffic to a router without backends; the pools go on a later step, once it is gone.
    """

    pools: bool = True


@dataclass(frozen=True)
class AdjustLive:
    """Set ``limits`` on the canary ``pods`` through the engines' route, then run one branch.

    Both outcomes are decided up front: ``on_success``, or ``on_failure(why)``.
    """

    pods: tuple[Mapping[str, Any], ...]
    token: str
    limits: Mapping[str, int]
    on_success: tuple[Action, ...]
    on_failure: Callable[[str], Sequence[Action]]


@dataclass(frozen=True)
class Emit:
    """Post an Event on the InferenceService."""

    event: EventSpec


@dataclass(frozen=True)
class CurrentTrialGauge:
    number: int


@dataclass(frozen=True)
class ScalingGauges:
    """The planner's numbers as gauges, for a user's own HPA or KEDA to scale on (None: unknown)."""

    desired: int | None
    capacity_req_s: float | None


@dataclass(frozen=True)
class CountFinished:
    verdict: TrialVerdict


@dataclass(frozen=True)
class MirrorStudy:
    """Hand the finished history to the study mirror (failures are logged, never raised)."""

    space: SearchSpace
    records: tuple[TrialRecord, ...]
    attrs: Mapping[int, Mapping[str, Any]]


@dataclass(frozen=True)
class Log:
    message: str


Action = (
    CreateTrial
    | PatchTrial
    | ApplyCanary
    | AnnotateCanary
    | DeleteCanary
    | DeleteCanaryTopology
    | AdjustLive
    | Emit
    | CurrentTrialGauge
    | ScalingGauges
    | CountFinished
    | MirrorStudy
    | Log
)


@dataclass
class Plan:
    """The actions, service status fields and conditions one step decided, plus what they changed."""

    snap: Snapshot
    actions: list[Action] = field(default_factory=list)
    #: ``.status`` fields of the InferenceService (None: remove).
    status: dict[str, Any] = field(default_factory=dict)
    conditions: list[ConditionUpdate] = field(default_factory=list)
    #: The canary Deployment as this step left it (None: deleted or absent).
    canary: Mapping[str, Any] | None = None
    trials: list[TuningTrial] = field(default_factory=list)
    incumbent: EngineConfig | None = None

    def __post_init__(self) -> None:
        self.canary = self.snap.canary
        self.trials = list(self.snap.trials)
        self.incumbent = self.snap.incumbent

    def do(self, *actions: Action) -> None:
        self.actions.extend(actions)

    def emit(self, type_: EventType, reason: str, message: str) -> None:
        self.actions.append(Emit(EventSpec(type_, reason, message)))

    def condition(self, type_: ConditionType, status: ConditionStatus, reason: str, message: str) -> None:
        """Set a condition of the service (the last setting of a type in a step wins)."""
        self.conditions = [c for c in self.conditions if c.type != type_.value]
        self.conditions.append(ConditionUpdate(type_.value, status, reason, message))

    def current_condition(self, type_: ConditionType) -> Condition | None:
        """The condition as the service had it when the step began."""
        return get_condition(self.snap.status.conditions, type_)

    def set_condition_false(self, type_: ConditionType) -> bool:
        """Whether this step set ``type_`` to False."""
        return any(c.type == type_.value and c.status == ConditionStatus.FALSE for c in self.conditions)

    @property
    def stable_config(self) -> EngineConfig:
        assert self.incumbent is not None
        return self.incumbent
