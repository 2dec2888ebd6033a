"""Status: condition setters, phase, and patches written only on change."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from chunkpilot.operator.engines import UnsupportedKnob
from chunkpilot.operator.events import status_transitions
from chunkpilot.operator.status import (
    TERMINAL_REASONS,
    ConditionUpdate,
    DeploymentState,
    Observation,
    Reason,
    check_owner,
    compute_status,
    get_condition,
    invalid_spec_reason,
    set_condition,
    set_conditions,
    status_patch,
)

from chunkpilot.api import (
    CONDITION_OWNERS,
    ConditionOwner,
    ConditionStatus,
    ConditionType,
    EngineConfig,
    EngineSpec,
    InferenceServiceStatus,
    ServicePhase,
)
from chunkpilot.testing.deployments import a_deployment_state

T0 = datetime(2026, 1, 1, tzinfo=UTC)
T1 = T0 + timedelta(minutes=5)
CONFIG = EngineConfig.from_engine(EngineSpec())


def deployment(
    desired: int = 2, ready: int = 2, updated: int = 2, replicas: int | None = None
) -> DeploymentState:
    return a_deployment_state(
        desired,
        ready=ready,
        updated=updated,
        replicas=replicas,
        config=CONFIG,
        config_hash=CONFIG.config_hash(),
    )


def condition(status: InferenceServiceStatus, type_: ConditionType) -> tuple[str, str]:
    found = get_condition(status.conditions, type_)
    assert found is not None
    return found.status.value, found.reason


def test_transition_time_moves_only_when_status_flips() -> None:
    first = set_condition([], ConditionType.READY, ConditionStatus.FALSE, "Creating", "", 1, T0)
    same = set_condition(first, ConditionType.READY, ConditionStatus.FALSE, "ReplicasNotReady", "0/1", 2, T1)
    flipped = set_condition(same, ConditionType.READY, ConditionStatus.TRUE, "Available", "1/1", 2, T1)
    assert same[0].last_transition_time == T0
    assert same[0].observed_generation == 2
    assert flipped[0].last_transition_time == T1


def test_ready_when_all_stable_replicas_ready() -> None:
    status = compute_status(None, Observation(generation=3, stable=deployment()), T0)
    assert condition(status, ConditionType.READY) == ("True", "Available")
    assert condition(status, ConditionType.PROGRESSING) == ("False", "RolloutComplete")
    assert condition(status, ConditionType.DEGRADED) == ("False", "AsExpected")
    assert status.phase == ServicePhase.READY
    assert status.observed_generation == 3
    assert all(c.observed_generation == 3 for c in status.conditions)
    assert status.applied_config_hash == CONFIG.config_hash()
    assert (status.replicas, status.ready_replicas) == (2, 2)


def test_rolling_out_while_old_pods_serve() -> None:
    rolling = deployment(updated=1, replicas=3)
    status = compute_status(None, Observation(generation=2, stable=rolling), T0)
    assert condition(status, ConditionType.READY) == ("True", "Available")
    assert condition(status, ConditionType.PROGRESSING) == ("True", "RollingOut")
    assert status.phase == ServicePhase.DEPLOYING


def test_not_ready_before_pods_are_ready() -> None:
    status = compute_status(None, Observation(generation=1, stable=deployment(ready=0, updated=0)), T0)
    assert condition(status, ConditionType.READY) == ("False", "ReplicasNotReady")
    assert status.phase == ServicePhase.DEPLOYING


def test_unsupported_knob_fails_the_service() -> None:
    problem = UnsupportedKnob(
        "spec.engine.maxNumPartialPrefills", "--max-num-partial-prefills", "vLLM", "0.33.0", "d", "r"
    )
    status = compute_status(None, Observation(generation=4, stable=None, problem=problem), T0)
    assert condition(status, ConditionType.READY) == ("False", "UnsupportedKnob")
    ready = get_condition(status.conditions, ConditionType.READY)
    assert ready is not None and "0.33.0" in ready.message and "maxNumPartialPrefills" in ready.message
    assert status.phase == ServicePhase.FAILED


def test_progress_deadline_is_degraded() -> None:
    stuck = DeploymentState(
        desired=1, replicas=1, generation=1, observed_generation=1, progress_deadline_exceeded=True
    )
    status = compute_status(None, Observation(generation=1, stable=stuck), T0)
    assert condition(status, ConditionType.DEGRADED) == ("True", "ProgressDeadlineExceeded")
    assert status.phase == ServicePhase.DEGRADED


def test_tuning_phase_comes_from_the_tuner_condition() -> None:
    tuned = InferenceServiceStatus(
        conditions=set_condition([], ConditionType.TUNING, ConditionStatus.TRUE, "TrialRunning", "", 1, T0)
    )
    status = compute_status(tuned, Observation(generation=1, stable=deployment()), T0)
    assert status.phase == ServicePhase.TUNING
    assert condition(status, ConditionType.TUNING) == ("True", "TrialRunning")  # kept


def test_canary_counts_towards_replicas() -> None:
    status = compute_status(
        None, Observation(generation=1, stable=deployment(), canary=deployment(1, 1, 1)), T0
    )
    assert (status.replicas, status.ready_replicas) == (3, 3)


def test_patch_only_when_changed() -> None:
    observation = Observation(generation=1, stable=deployment())
    first = compute_status(None, observation, T0)
    patch = status_patch(None, first)
    assert patch is not None and patch["status"]["phase"] == "Ready"
    raw = first.to_k8s()
    again = compute_status(InferenceServiceStatus.model_validate(raw), observation, T1)
    assert status_patch(raw, again) is None


def test_patch_leaves_tuner_fields_alone() -> None:
    raw = {"currentTrial": "chat-trial-3", "summary": {"itl": "40/50ms"}}
    new = compute_status(InferenceServiceStatus.model_validate(raw), Observation(1, deployment()), T0)
    patch = status_patch(raw, new)
    assert patch is not None
    assert "currentTrial" not in patch["status"] and "summary" not in patch["status"]


def test_deployment_state_from_manifest() -> None:
    manifest = {
        "metadata": {
            "generation": 4,
            "labels": {"chunkpilot.io/config-hash": "abcd1234"},
            "annotations": {"chunkpilot.io/config": '{"maxNumBatchedTokens": 4096, "maxNumSeqs": 64}'},
        },
        "spec": {"replicas": 2},
        "status": {
            "observedGeneration": 4,
            "replicas": 2,
            "readyReplicas": 1,
            "updatedReplicas": 2,
            "conditions": [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}],
        },
    }
    state = DeploymentState.from_manifest(manifest)
    assert (state.desired, state.ready, state.updated) == (2, 1, 2)
    assert state.progress_deadline_exceeded
    assert state.config is not None and state.config.max_num_batched_tokens == 4096
    assert state.config_hash == "abcd1234"


def test_events_for_transitions() -> None:
    pending = compute_status(None, Observation(1, deployment(ready=0, updated=0)), T0)
    ready = compute_status(pending, Observation(1, deployment()), T1)
    assert [e.reason for e in status_transitions(pending, ready)] == ["Ready"]
    assert status_transitions(ready, ready) == []
    problem = UnsupportedKnob(
        "spec.engine.maxNumActiveSeqs", "--max-num-active-seqs", "vLLM", "0.8.5", "d", "r"
    )
    failed = compute_status(ready, Observation(2, None, problem=problem), T1)
    assert [(e.type.value, e.reason) for e in status_transitions(ready, failed)] == [
        ("Warning", "UnsupportedKnob")
    ]
    assert status_transitions(failed, failed) == []


def test_the_parts_of_a_topology_are_one_enum_for_the_operator_and_the_tuner() -> None:
    from chunkpilot.operator.objects import TOPOLOGY_PARTS, canary_topology_paths
    from chunkpilot.operator.status import POOL_PARTS, TopologyObservation, TopologyPart

    assert [part for part, _ in TopologyObservation(None, None, None).parts()] == list(TopologyPart)
    assert tuple(TopologyPart) == TOPOLOGY_PARTS and POOL_PARTS == (TopologyPart.PREFILL, TopologyPart.DECODE)
    assert [p.rsplit("/", 1)[1] for p in canary_topology_paths("ns", "chat")][-2:] == [
        "chat-prefill-canary",
        "chat-decode-canary",
    ]


def test_every_condition_has_one_writer_and_the_writers_refuse_the_others() -> None:
    assert set(CONDITION_OWNERS) == set(ConditionType)
    tuner = ConditionUpdate(ConditionType.TUNING.value, ConditionStatus.TRUE, "TrialRunning", "")
    ready = ConditionUpdate(ConditionType.READY.value, ConditionStatus.TRUE, "Available", "")
    written = set_conditions([], [tuner], 1, T0, owner=ConditionOwner.TUNER)
    assert [c.type for c in written] == ["Tuning"]
    with pytest.raises(ValueError, match="Ready is set by the operator, not by the tuner"):
        set_conditions(written, [ready], 1, T0, owner=ConditionOwner.TUNER)
    unknown = ConditionUpdate("Typo", ConditionStatus.TRUE, "Reason", "")
    with pytest.raises(ValueError, match="'Typo' is not a condition type"):
        set_conditions([], [unknown], 1, T0, owner=ConditionOwner.TUNER)
    check_owner(ConditionType.LIVE_ADJUST, ConditionOwner.OPERATOR)
    with pytest.raises(ValueError, match="LiveAdjust is set by the operator"):
        check_owner(ConditionType.LIVE_ADJUST, ConditionOwner.TUNER)


def test_a_spec_refused_only_for_its_extra_args_says_so() -> None:
    extra = [("spec.engine.extraArgs", "extraArgs[0]: '--max-num-seq=7' sets --max-num-seqs")]
    other = [("spec.engine.maxNumSeqs", "Input should be greater than or equal to 1")]
    assert invalid_spec_reason(extra) == Reason.INVALID_EXTRA_ARGS
    assert invalid_spec_reason(extra + other) == Reason.INVALID_SPEC
    assert invalid_spec_reason([]) == Reason.INVALID_SPEC
    assert Reason.INVALID_EXTRA_ARGS in TERMINAL_REASONS
