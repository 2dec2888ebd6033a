"""Pure status logic: conditions, phase and the status patch.

One setter per condition; ``lastTransitionTime`` moves only when a condition's
status flips; :func:`status_patch` returns a patch only when something the
operator owns actually changed, so an unchanged reconcile writes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Final

from chunkpilot.operator.builders import ANNOTATION_CONFIG, ANNOTATION_LIVE_LIMITS
from chunkpilot.operator.engines import RenderProblem

from chunkpilot.api import (
    CONDITION_OWNERS,
    LABEL_CONFIG_HASH,
    Condition,
    ConditionOwner,
    ConditionStatus,
    ConditionType,
    EngineConfig,
    InferenceServiceStatus,
    PoolRole,
    PoolStatus,
    RouterStatus,
    ServicePhase,
    TopologyMode,
    TopologyStatus,
)
from chunkpilot.api.knobs import LIVE_NAMES

#: Fields of ``.status`` this operator writes; everything else belongs to the tuner.
OWNED_FIELDS: Final = (
    "phase",
    "observedGeneration",
    "conditions",
    "appliedConfig",
    "appliedConfigHash",
    "replicas",
    "readyReplicas",
    "topology",
    "stableReplicas",
    "selector",
)


class Reason(StrEnum):
    """CamelCase reasons of the Ready, Progressing and Degraded conditions."""

    AVAILABLE = "Available"
    REPLICAS_NOT_READY = "ReplicasNotReady"
    SCALED_TO_ZERO = "ScaledToZero"
    CREATING = "Creating"
    ROLLING_OUT = "RollingOut"
    ROLLOUT_COMPLETE = "RolloutComplete"
    PROGRESS_DEADLINE_EXCEEDED = "ProgressDeadlineExceeded"
    REPLICA_FAILURE = "ReplicaFailure"
    AS_EXPECTED = "AsExpected"
    UNSUPPORTED_KNOB = "UnsupportedKnob"
    UNSUPPORTED_ENGINE_VERSION = "UnsupportedEngineVersion"
    DISAGGREGATION_DISABLED = "DisaggregationDisabled"
    TOPOLOGY_SWITCHING = "TopologySwitching"
    NAME_CONFLICT = "NameConflict"
    INVALID_SPEC = "InvalidSpec"
    INVALID_EXTRA_ARGS = "InvalidExtraArgs"


#: Ready=False reasons that only a spec change (or, for DisaggregationDisabled, the installation's) can fix.
TERMINAL_REASONS: Final = frozenset(
    {
        Reason.UNSUPPORTED_KNOB,
        Reason.UNSUPPORTED_ENGINE_VERSION,
        Reason.DISAGGREGATION_DISABLED,
        Reason.INVALID_SPEC,
        Reason.INVALID_EXTRA_ARGS,
    }
)


def invalid_spec_reason(problems: list[tuple[str, str]]) -> Reason:
    """``InvalidExtraArgs`` when every problem of a refused spec is in ``engine.extraArgs``;
    ``InvalidSpec`` otherwise."""
    in_extra_args = all(path.split("[")[0].endswith("engine.extraArgs") for path, _ in problems)
    return Reason.INVALID_EXTRA_ARGS if problems and in_extra_args else Reason.INVALID_SPEC


@dataclass(frozen=True)
class InstallationProblem:
    """The installation cannot serve what the spec asks for (e.g. disaggregation is disabled)."""

    reason: str
    message: str


def live_limits(raw: str | None, config_hash: str | None) -> tuple[tuple[str, int], ...]:
    """The limits of an ``ANNOTATION_LIVE_LIMITS`` value, if set on pods of ``config_hash``."""
    try:
        limits = json.loads(raw) if raw else None
    except ValueError:
        return ()
    if not isinstance(limits, dict) or config_hash is None or limits.get("configHash") != config_hash:
        return ()
    return tuple((key, limits[key]) for key in LIVE_NAMES if isinstance(limits.get(key), int))


@dataclass(frozen=True)
class DeploymentState:
    """What the operator reads from a Deployment to judge the service."""

    desired: int
    replicas: int = 0
    ready: int = 0
    updated: int = 0
    available: int = 0
    generation: int = 0
    observed_generation: int = 0
    progress_deadline_exceeded: bool = False
    replica_failure: str | None = None
    config: EngineConfig | None = None
    config_hash: str | None = None
    #: Limits set on the running pods since they started (``ANNOTATION_LIVE_LIMITS``).
    live_limits: tuple[tuple[str, int], ...] = ()

    @property
    def running_config(self) -> EngineConfig | None:
        """What the pods run: the config they started with, and the limits set since."""
        if self.config is None or not self.live_limits:
            return self.config
        return self.config.model_copy(update=dict(self.live_limits))

    @classmethod
    def from_manifest(cls, deployment: Mapping[str, Any]) -> DeploymentState:
        meta = deployment.get("metadata", {})
        spec = deployment.get("spec", {})
        status = deployment.get("status", {}) or {}
        deadline = False
        failure = None
        for condition in status.get("conditions", []) or []:
            if (
                condition.get("type") == "Progressing"
                and condition.get("reason") == "ProgressDeadlineExceeded"
            ):
                deadline = condition.get("status") == "False"
            if condition.get("type") == "ReplicaFailure" and condition.get("status") == "True":
                failure = condition.get("message") or condition.get("reason") or "ReplicaFailure"
        annotations = meta.get("annotations") or {}
        config = None
        raw = annotations.get(ANNOTATION_CONFIG)
        if raw:
            try:
                config = EngineConfig.model_validate(json.loads(raw))
            except ValueError:
                config = None
        config_hash = (meta.get("labels") or {}).get(LABEL_CONFIG_HASH)
        return cls(
            desired=int(spec.get("replicas", 1)),
            replicas=int(status.get("replicas", 0) or 0),
            ready=int(status.get("readyReplicas", 0) or 0),
            updated=int(status.get("updatedReplicas", 0) or 0),
            available=int(status.get("availableReplicas", 0) or 0),
            generation=int(meta.get("generation", 0) or 0),
            observed_generation=int(status.get("observedGeneration", 0) or 0),
            progress_deadline_exceeded=deadline,
            replica_failure=failure,
            config=config,
            config_hash=config_hash,
            live_limits=live_limits(annotations.get(ANNOTATION_LIVE_LIMITS), config_hash),
        )

    @property
    def rollout_complete(self) -> bool:
        """The controller saw the latest template and every pod runs it; no old pod is left."""
        return (
            self.observed_generation >= self.generation
            and self.updated >= self.desired
            and self.replicas <= self.desired
            and self.ready >= self.desired
        )


class TopologyPart(StrEnum):
    """A Deployment of a disaggregated topology (promoted, declared or a trial's canary): a pool, by
    its :class:`~chunkpilot.api.PoolRole`, or the router; in this order (pools first)."""

    PREFILL = PoolRole.PREFILL.value
    DECODE = PoolRole.DECODE.value
    ROUTER = "router"


#: The pools among :class:`TopologyPart`.
POOL_PARTS: Final = (TopologyPart.PREFILL, TopologyPart.DECODE)


@dataclass(frozen=True)
class TopologyObservation:
    """The Deployments of a disaggregated service: both pools and the router (None: not there yet)."""

    prefill: DeploymentState | None
    decode: DeploymentState | None
    router: DeploymentState | None

    def parts(self) -> list[tuple[TopologyPart, DeploymentState | None]]:
        """(part, state) of the pools and the router, in that order."""
        return [
            (TopologyPart.PREFILL, self.prefill),
            (TopologyPart.DECODE, self.decode),
            (TopologyPart.ROUTER, self.router),
        ]

    def missing(self) -> list[TopologyPart]:
        return [name for name, state in self.parts() if state is None]

    def states(self) -> list[tuple[TopologyPart, DeploymentState]]:
        return [(name, state) for name, state in self.parts() if state is not None]

    def ready_summary(self) -> str:
        """e.g. ``prefill 1/1, decode 2/3, router 1/1 ready``."""
        return ", ".join(f"{name} {state.ready}/{state.desired}" for name, state in self.states()) + " ready"


@dataclass(frozen=True)
class TopologySwitch:
    """A change of topology under way: the new side's Deployments, while the old side serves.

    ``target`` names the new side (``the prefill/decode pools``, ``the stable Deployment``),
    ``serving`` the old one; ``parts`` are the new side's (name, state; None: not there yet).
    """

    target: str
    serving: str
    parts: tuple[tuple[str, DeploymentState | None], ...]

    @property
    def ready(self) -> bool:
        """Every Deployment of the new side rolled out with all its replicas ready."""
        return all(state is not None and state.rollout_complete for _, state in self.parts)

    def message(self) -> str:
        """e.g. ``switching to the prefill/decode pools: waiting for them to be Ready (0/3: ...)``."""
        done = sum(1 for _, state in self.parts if state is not None and state.rollout_complete)
        detail = ", ".join(
            f"{name} {state.ready}/{state.desired}" if state is not None else f"{name} not created"
            for name, state in self.parts
        )
        return (
            f"switching to {self.target}: waiting for them to be Ready ({done}/{len(self.parts)}: "
            f"{detail}); {self.serving} serves until then"
            if not self.ready
            else f"switching to {self.target}: Ready, the Service selects them; deleting {self.serving} next"
        )


@dataclass(frozen=True)
class Observation:
    """Everything the status is computed from, gathered by the reconciler.

    ``topology`` is set for a disaggregated service (whose ``stable`` is None). During a change
    of topology the observation is of the side still serving, and ``switch`` is the new side.
    """

    generation: int
    stable: DeploymentState | None
    canary: DeploymentState | None = None
    problem: RenderProblem | InstallationProblem | None = None
    topology: TopologyObservation | None = None
    switch: TopologySwitch | None = None
    #: The label selector of the stable engine pods (a colocated service's scale subresource).
    selector: str | None = None


def set_condition(
    conditions: Sequence[Condition],
    type_: ConditionType | str,
    status: ConditionStatus,
    reason: str,
    message: str,
    generation: int,
    now: datetime,
) -> list[Condition]:
    """``conditions`` with ``type_`` set; its transition time moves only when ``status`` changes."""

    def updated(previous: Condition | None) -> Condition:
        transition = now
        if previous is not None and previous.status == status and previous.last_transition_time is not None:
            transition = previous.last_transition_time
        return Condition(
            type=str(type_),
            status=status,
            reason=reason,
            message=message,
            last_transition_time=transition,
            observed_generation=generation,
        )

    if get_condition(conditions, type_) is None:
        return [*conditions, updated(None)]
    return [updated(condition) if condition.type == str(type_) else condition for condition in conditions]


@dataclass(frozen=True)
class ConditionUpdate:
    """One condition to set (type, status, reason, message); times come from :func:`set_conditions`."""

    type: str
    status: ConditionStatus
    reason: str
    message: str


def check_owner(type_: ConditionType | str, owner: ConditionOwner) -> None:
    """Raise ValueError unless ``owner`` is the one writer of ``type_`` (see ``CONDITION_OWNERS``)."""
    try:
        kind = ConditionType(str(type_))
    except ValueError:
        raise ValueError(
            f"{type_!r} is not a condition type: add it to ConditionType and CONDITION_OWNERS"
        ) from None
    writer = CONDITION_OWNERS[kind]
    if writer is not owner:
        raise ValueError(f"condition {kind.value} is set by the {writer.value}, not by the {owner.value}")


def set_conditions(
    conditions: Sequence[Condition],
    updates: Iterable[ConditionUpdate],
    generation: int,
    now: datetime,
    *,
    owner: ConditionOwner,
) -> list[Condition]:
    """``conditions`` with every update applied by :func:`set_condition`, in order.

    ``owner`` is the component writing: an update of a condition it does not own raises ValueError.
    """
    result = list(conditions)
    for update in updates:
        check_owner(update.type, owner)
        result = set_condition(
            result, update.type, update.status, update.reason, update.message, generation, now
        )
    return result


def get_condition(conditions: Iterable[Condition], type_: ConditionType | str) -> Condition | None:
    return next((c for c in conditions if c.type == str(type_)), None)


def is_true(conditions: Iterable[Condition], type_: ConditionType | str) -> bool:
    condition = get_condition(conditions, type_)
    return condition is not None and condition.status == ConditionStatus.TRUE


def _listed(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _ready_topology(topology: TopologyObservation) -> tuple[ConditionStatus, str, str]:
    missing = topology.missing()
    if missing:
        return ConditionStatus.FALSE, Reason.CREATING, f"creating the {_listed(missing)} Deployments"
    if all(state.ready >= state.desired for _, state in topology.states()):
        return ConditionStatus.TRUE, Reason.AVAILABLE, topology.ready_summary()
    return ConditionStatus.FALSE, Reason.REPLICAS_NOT_READY, topology.ready_summary()


def _progressing_topology(topology: TopologyObservation) -> tuple[ConditionStatus, str, str]:
    missing = topology.missing()
    if missing:
        return ConditionStatus.TRUE, Reason.CREATING, f"creating the {_listed(missing)} Deployments"
    stuck = [name for name, state in topology.states() if state.progress_deadline_exceeded]
    if stuck:
        return (
            ConditionStatus.FALSE,
            Reason.PROGRESS_DEADLINE_EXCEEDED,
            f"the {_listed(stuck)} rollout stopped making progress",
        )
    if all(state.rollout_complete for _, state in topology.states()):
        configs = [
            f"{name} (config {state.config_hash})" if state.config_hash else name
            for name, state in topology.states()
        ]
        return ConditionStatus.FALSE, Reason.ROLLOUT_COMPLETE, f"{_listed(configs)} up to date"
    rolling = ", ".join(
        f"{name} {state.updated}/{state.desired} updated" for name, state in topology.states()
    )
    return ConditionStatus.TRUE, Reason.ROLLING_OUT, rolling


def _degraded_topology(topology: TopologyObservation) -> tuple[ConditionStatus, str, str]:
    for name, state in topology.states():
        if state.progress_deadline_exceeded:
            return (
                ConditionStatus.TRUE,
                Reason.PROGRESS_DEADLINE_EXCEEDED,
                f"the {name} Deployment exceeded its progress deadline: check its pods' events and logs",
            )
    for name, state in topology.states():
        if state.replica_failure:
            return ConditionStatus.TRUE, Reason.REPLICA_FAILURE, f"{name}: {state.replica_failure}"
    return ConditionStatus.FALSE, Reason.AS_EXPECTED, ""


def _ready(obs: Observation) -> tuple[ConditionStatus, str, str]:
    if obs.problem is not None:
        return ConditionStatus.FALSE, obs.problem.reason, obs.problem.message
    if obs.topology is not None:
        return _ready_topology(obs.topology)
    stable = obs.stable
    if stable is None:
        return ConditionStatus.FALSE, Reason.CREATING, "creating the stable Deployment"
    if stable.desired == 0:
        return ConditionStatus.FALSE, Reason.SCALED_TO_ZERO, "spec.replicas is 0: no engine pod is serving"
    ready = f"{stable.ready}/{stable.desired} stable replicas ready"
    if stable.ready >= stable.desired:
        return ConditionStatus.TRUE, Reason.AVAILABLE, ready
    return ConditionStatus.FALSE, Reason.REPLICAS_NOT_READY, ready


def _progressing(obs: Observation) -> tuple[ConditionStatus, str, str]:
    if obs.problem is not None:
        return ConditionStatus.FALSE, obs.problem.reason, "nothing is rolled out until the spec is fixed"
    if obs.switch is not None:
        return ConditionStatus.TRUE, Reason.TOPOLOGY_SWITCHING, obs.switch.message()
    if obs.topology is not None:
        return _progressing_topology(obs.topology)
    stable = obs.stable
    if stable is None:
        return ConditionStatus.TRUE, Reason.CREATING, "creating the stable Deployment"
    if stable.progress_deadline_exceeded:
        return (
            ConditionStatus.FALSE,
            Reason.PROGRESS_DEADLINE_EXCEEDED,
            "the stable rollout stopped making progress",
        )
    if stable.rollout_complete:
        config = f" (config {stable.config_hash})" if stable.config_hash else ""
        return (
            ConditionStatus.FALSE,
            Reason.ROLLOUT_COMPLETE,
            f"all {stable.desired} stable replicas up to date{config}",
        )
    return (
        ConditionStatus.TRUE,
        Reason.ROLLING_OUT,
        f"{stable.updated}/{stable.desired} stable replicas updated, {stable.ready} ready",
    )


def _degraded(obs: Observation) -> tuple[ConditionStatus, str, str]:
    if obs.problem is not None:
        return ConditionStatus.TRUE, obs.problem.reason, obs.problem.message
    if obs.topology is not None:
        return _degraded_topology(obs.topology)
    stable = obs.stable
    if stable is not None and stable.progress_deadline_exceeded:
        return (
            ConditionStatus.TRUE,
            Reason.PROGRESS_DEADLINE_EXCEEDED,
            "the stable Deployment exceeded its progress deadline: check the engine pods' events and logs",
        )
    if stable is not None and stable.replica_failure:
        return ConditionStatus.TRUE, Reason.REPLICA_FAILURE, stable.replica_failure
    return ConditionStatus.FALSE, Reason.AS_EXPECTED, ""


def compute_phase(conditions: Sequence[Condition]) -> ServicePhase:
    """Failed > Degraded > Tuning > Deploying > Ready > Pending, from the conditions."""
    ready = get_condition(conditions, ConditionType.READY)
    if ready is not None and ready.status == ConditionStatus.FALSE and ready.reason in TERMINAL_REASONS:
        return ServicePhase.FAILED
    if is_true(conditions, ConditionType.DEGRADED):
        return ServicePhase.DEGRADED
    if is_true(conditions, ConditionType.TUNING) and is_true(conditions, ConditionType.READY):
        return ServicePhase.TUNING
    if is_true(conditions, ConditionType.PROGRESSING):
        return ServicePhase.DEPLOYING
    if is_true(conditions, ConditionType.READY):
        return ServicePhase.READY
    return ServicePhase.PENDING


def compute_status(
    current: InferenceServiceStatus | None, obs: Observation, now: datetime | None = None
) -> InferenceServiceStatus:
    """The new status: ``current`` with the operator's fields recomputed from ``obs``."""
    now = now or datetime.now(UTC).replace(microsecond=0)
    status = current.model_copy(deep=True) if current is not None else InferenceServiceStatus()
    conditions = list(status.conditions)
    for type_, (value, reason, message) in (
        (ConditionType.READY, _ready(obs)),
        (ConditionType.PROGRESSING, _progressing(obs)),
        (ConditionType.DEGRADED, _degraded(obs)),
    ):
        check_owner(type_, ConditionOwner.OPERATOR)
        conditions = set_condition(conditions, type_, value, str(reason), message, obs.generation, now)
    status.conditions = conditions
    status.phase = compute_phase(conditions)
    status.observed_generation = obs.generation
    if obs.topology is not None:
        # Each pool runs its own knobs: they are in status.topology, not in appliedConfig.
        status.applied_config = None
        status.applied_config_hash = None
        status.topology = topology_status(obs.topology)
        tracks = [d for d in (obs.topology.prefill, obs.topology.decode, obs.canary) if d is not None]
    else:
        status.topology = None
        if obs.stable is not None:
            status.applied_config = obs.stable.config
            status.applied_config_hash = obs.stable.config_hash
        tracks = [d for d in (obs.stable, obs.canary) if d is not None]
    status.replicas = sum(d.replicas for d in tracks)
    status.ready_replicas = sum(d.ready for d in tracks)
    colocated = obs.topology is None and obs.stable is not None
    status.stable_replicas = obs.stable.replicas if colocated and obs.stable is not None else None
    status.selector = obs.selector if colocated else None
    return status


def _pool_status(state: DeploymentState | None) -> PoolStatus | None:
    if state is None:
        return None
    return PoolStatus(
        desired_replicas=state.desired,
        replicas=state.replicas,
        ready_replicas=state.ready,
        config=state.config,
        config_hash=state.config_hash,
    )


def topology_status(topology: TopologyObservation) -> TopologyStatus:
    """``status.topology`` of a disaggregated service: each pool's replicas and knobs, the router's."""
    router = topology.router
    return TopologyStatus(
        mode=TopologyMode.DISAGGREGATED,
        prefill=_pool_status(topology.prefill),
        decode=_pool_status(topology.decode),
        router=RouterStatus(
            desired_replicas=router.desired, replicas=router.replicas, ready_replicas=router.ready
        )
        if router is not None
        else None,
    )


def _owned(status: Mapping[str, Any]) -> dict[str, Any]:
    return {key: status[key] for key in OWNED_FIELDS if key in status}


def status_patch(current: Mapping[str, Any] | None, new: InferenceServiceStatus) -> dict[str, Any] | None:
    """A merge patch for ``.status`` carrying the operator's fields, or None when nothing changed.

    ``current`` is the raw ``.status`` from the API. Only fields the operator
    owns are compared and written; fields the tuner writes are left alone (the
    conditions list is written whole, with the tuner's conditions kept).
    """
    before = _owned(dict(current or {}))
    after = _owned(new.to_k8s())
    if _normalise(before) == _normalise(after):
        return None
    patch: dict[str, Any] = {key: after.get(key) for key in OWNED_FIELDS}
    return {"status": patch}


def _normalise(value: Any) -> Any:
    # Round-trip through the model so that e.g. timestamps compare equal however they were written.
    return json.loads(
        json.dumps(InferenceServiceStatus.model_validate(value).to_k8s(), sort_keys=True, default=str)
    )
