"""decide(): one snapshot in, a plan out, per phase; no API server, no Prometheus, no clock.

Every snapshot is built from the API models directly; the assertions read the plan's
typed actions, status fields and conditions.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest
from chunkpilot.operator.status import DeploymentState
from chunkpilot.tuner import records as rec
from chunkpilot.tuner.decide.canary import canary_manifest, target_limits
from chunkpilot.tuner.decide.lifecycle import TunerSettings
from chunkpilot.tuner.decide.plan import (
    Action,
    AdjustLive,
    AnnotateCanary,
    ApplyCanary,
    CreateTrial,
    DeleteCanary,
    Emit,
    PatchTrial,
    Plan,
)
from chunkpilot.tuner.decide.step import decide
from chunkpilot.tuner.measure import WindowMeasurement
from chunkpilot.tuner.observe.canary import ANNOTATION_PARKED, started_config
from chunkpilot.tuner.observe.snapshot import Reading, Snapshot, TwinReading
from chunkpilot.tuner.observe.twin import NO_TELEMETRY
from chunkpilot.tuner.space import TunedConfig
from chunkpilot.tuner.twin import Twin, TwinFit
from chunkpilot.tuner.twin.online import Calibration, CanaryCheck
from chunkpilot.tuner.twin.search import Candidate

from chunkpilot.api import (
    EngineConfig,
    TokenMix,
    TrialPhase,
    TrialProgress,
    TrialTwin,
    TuningTrial,
    TwinState,
)
from chunkpilot.testing.deployments import a_ready_state, after_rollout
from chunkpilot.testing.services import NOW, a_service, a_service_body
from chunkpilot.testing.trials import STARTED, TRIAL_CONFIG, a_missed_trial, a_trial, with_status
from chunkpilot.testing.tuner import a_fitted_reading, a_measurement, a_snapshot, of_type, trial_status

SETTINGS = TunerSettings(rollout_timeout_s=120)
READY = a_ready_state()
STABLE_VIOLATING = Reading(a_measurement("stable", 90.0))


def service_body(**autotune: Any) -> dict[str, Any]:
    """The chat service at an 8192-token budget, six trials at most, ``autotune`` fields on top."""
    return a_service_body(engine={"maxNumBatchedTokens": 8192}, autotune={"maxTrials": 6, **autotune})


def canary_of(body: dict[str, Any], owner: TuningTrial, ready: bool = True, **start: Any) -> dict[str, Any]:
    start_config = owner.spec.params.model_copy(update=start) if start else None
    return after_rollout(canary_manifest(a_service(body), body, owner, start_config), ready)


def snapshot(
    body: dict[str, Any] | None = None, trials: Sequence[TuningTrial] = (), **fields: Any
) -> Snapshot:
    """A step of ``body`` (default :func:`service_body`): stable ready, violating its ITL SLO."""
    values: dict[str, Any] = {
        "stable": READY,
        "prometheus": True,
        "stable_reading": STABLE_VIOLATING,
        **fields,
    }
    return a_snapshot(body or service_body(), trials, **values)


def events(actions: Sequence[Action]) -> list[str]:
    return [a.event.reason for a in actions if isinstance(a, Emit)]


def condition(plan: Plan, type_: str) -> tuple[str, str] | None:
    found = next((c for c in plan.conditions if c.type == type_), None)
    return (found.status.value, found.reason) if found else None


# --------------------------------------------------------------------------- service phases


def test_idle_asks_the_study_and_creates_trial_one_with_its_study_inputs_in_the_spec() -> None:
    plan = decide(snapshot(), SETTINGS)
    (create,) = of_type(plan, CreateTrial)
    created = TuningTrial.from_manifest(dict(create.manifest))
    assert created.metadata.name == "chat-trial-1" and created.spec.number == 1
    assert created.spec.study_params is not None and created.spec.token_mix is not None
    assert created.spec.token_mix.note.endswith("(measured on stable over 60s)")
    assert create.manifest["metadata"]["ownerReferences"][0]["uid"] == "uid-chat"
    assert create.status["status"]["phase"] == "Pending"
    assert plan.status["currentTrial"] == "chat-trial-1"
    assert condition(plan, "Tuning") == ("True", "TrialRunning")
    assert condition(plan, "SLOMet") == ("False", "SLOViolated")
    assert decide(snapshot(), SETTINGS).actions == plan.actions  # pure: the same snapshot, the same plan


def test_without_a_stable_rollout_nothing_is_asked() -> None:
    plan = decide(snapshot(stable=None), SETTINGS)
    assert of_type(plan, CreateTrial) == []
    assert condition(plan, "Tuning") == ("True", "WaitingForStable")


def test_prometheus_down_is_an_explicit_reading_and_starts_nothing() -> None:
    plan = decide(snapshot(stable_reading=Reading(error="connection refused")), SETTINGS)
    assert of_type(plan, CreateTrial) == []
    assert condition(plan, "MetricsUnavailable") == ("True", "PrometheusUnreachable")
    assert "MetricsUnavailable" in events(plan.actions)


def test_stopped_after_max_trials_creates_nothing_and_releases_a_parked_canary() -> None:
    body = service_body(maxTrials=2, liveAdjust=True)
    done = [a_trial(n, TrialPhase.ROLLED_BACK, verdict="Discarded") for n in (1, 2)]
    parked = canary_of(body, done[-1])
    parked["metadata"]["annotations"].update({rec.ANNOTATION_TRIAL: None, ANNOTATION_PARKED: "true"})
    plan = decide(snapshot(body, done, canary=parked), SETTINGS)
    assert of_type(plan, CreateTrial) == []
    assert condition(plan, "Tuning") == ("False", "MaxTrialsReached")
    assert of_type(plan, DeleteCanary) and "TuningStopped" in events(plan.actions)


@pytest.mark.parametrize(
    ("change", "reason"), [({"paused": True}, "Paused"), ({"enabled": False}, "Disabled")]
)
def test_paused_or_disabled_aborts_the_running_trial_and_deletes_its_canary(
    change: dict[str, Any], reason: str
) -> None:
    body = service_body(**change)
    running = a_trial()
    body["status"] = {
        "conditions": [{"type": "Tuning", "status": "True", "reason": "TrialRunning", "message": ""}]
    }
    plan = decide(snapshot(body, [running], canary=canary_of(body, running)), SETTINGS)
    assert trial_status(plan)["verdict"] == "Aborted"
    assert of_type(plan, DeleteCanary)
    assert condition(plan, "Tuning") == ("False", reason)
    assert plan.status["currentTrial"] is None


def test_an_orphaned_canary_is_deleted() -> None:
    body = service_body()
    orphan = canary_of(body, a_trial(7))
    plan = decide(snapshot(body, [a_trial(7, TrialPhase.ROLLED_BACK)], canary=orphan), SETTINGS)
    assert of_type(plan, DeleteCanary) and "OrphanRemoved" in events(plan.actions)


def test_a_canary_name_taken_by_another_object_stops_tuning_and_reports_it_once() -> None:
    body = service_body()
    running = a_trial()
    conflict = "Deployment default/chat-canary already exists and does not belong to this InferenceService"
    plan = decide(snapshot(body, [running], conflicts=(conflict,)), SETTINGS)
    assert trial_status(plan)["verdict"] == "Aborted" and conflict in trial_status(plan)["reason"]
    assert of_type(plan, CreateTrial) == [] and of_type(plan, ApplyCanary) == []
    assert condition(plan, "Tuning") == ("False", "NameConflict")
    assert "NameConflict" in events(plan.actions) and plan.status["currentTrial"] is None
    # The next step (the condition already says so): no second Event, no trial.
    body["status"] = {
        "conditions": [{"type": "Tuning", "status": "False", "reason": "NameConflict", "message": conflict}]
    }
    again = decide(snapshot(body, [], conflicts=(conflict,)), SETTINGS)
    assert "NameConflict" not in events(again.actions) and of_type(again, CreateTrial) == []
    assert condition(again, "Tuning") == ("False", "NameConflict")


# --------------------------------------------------------------------------- trial phases


def test_pending_applies_the_canary_and_moves_to_rolling_out() -> None:
    pending = a_trial(phase=TrialPhase.PENDING)
    plan = decide(snapshot(trials=[pending]), SETTINGS)
    (apply,) = of_type(plan, ApplyCanary)
    assert apply.manifest["metadata"]["annotations"][rec.ANNOTATION_TRIAL] == "chat-trial-1"
    assert started_config(apply.manifest) == TRIAL_CONFIG
    assert trial_status(plan)["phase"] == "RollingOut"
    assert "TrialStarted" in events(plan.actions)


def test_rolling_out_starts_the_warm_up_once_the_canary_is_ready() -> None:
    body = service_body()
    rolling = a_trial(phase=TrialPhase.ROLLING_OUT)
    plan = decide(snapshot(body, [rolling], canary=canary_of(body, rolling)), SETTINGS)
    status = trial_status(plan)
    assert status["phase"] == "Measuring"
    assert status["progress"]["readyAt"] == "2026-01-01T12:00:00Z"
    assert status["progress"]["measureFrom"] == "2026-01-01T12:00:10Z"  # warmup 10s


def test_rolling_out_times_out() -> None:
    body = service_body()
    late = a_trial(phase=TrialPhase.ROLLING_OUT, started_at=NOW - timedelta(seconds=121))
    plan = decide(snapshot(body, [late], canary=canary_of(body, late, ready=False)), SETTINGS)
    assert trial_status(plan)["verdict"] == "Aborted"
    assert "did not become Ready within 120s" in trial_status(plan)["reason"]


def test_while_prometheus_is_down_a_rollout_still_times_out_and_a_long_outage_aborts() -> None:
    body = service_body()
    down = Reading[Any](error="connection refused")
    late = a_trial(phase=TrialPhase.ROLLING_OUT, started_at=NOW - timedelta(seconds=121))
    plan = decide(
        snapshot(body, [late], canary=canary_of(body, late, ready=False), stable_reading=down), SETTINGS
    )
    assert trial_status(plan)["verdict"] == "Aborted"
    assert "did not become Ready within 120s" in trial_status(plan)["reason"]
    assert of_type(plan, DeleteCanary)
    # In time, or Ready: the outage is noted (it starts the outage clock), nothing is judged.
    rolling = a_trial(phase=TrialPhase.ROLLING_OUT, started_at=NOW - timedelta(seconds=30))
    for canary in (canary_of(body, rolling, ready=False), canary_of(body, rolling)):
        noted = decide(snapshot(body, [rolling], canary=canary, stable_reading=down), SETTINGS)
        assert of_type(noted, DeleteCanary) == []
        (patch,) = [a for a in of_type(noted, PatchTrial) if "progress" in str(a.patch)]
        assert "metricsGapSince" in str(patch.patch)


def test_a_live_canary_is_adjusted_with_both_outcomes_decided_up_front() -> None:
    body = service_body(liveAdjust=True)
    rolling = a_trial(phase=TrialPhase.ROLLING_OUT)
    canary = canary_of(body, rolling, max_num_batched_tokens=8192, max_num_seqs=256)
    pod = {
        "metadata": {"name": "p", "labels": dict(canary["spec"]["template"]["metadata"]["labels"])},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    snap = snapshot(body, [rolling], canary=canary, canary_pods=(pod,), live_pods=(pod,), live_token="tok")
    (adjust,) = of_type(decide(snap, SETTINGS), AdjustLive)
    assert adjust.limits == target_limits(TRIAL_CONFIG) and adjust.token == "tok"
    success = trial_status(adjust.on_success)
    assert success["progress"]["liveAdjusted"] is True and success["phase"] == "Measuring"
    # On success the canary records the limits it now runs; the operator's gauges read them back.
    (record,) = [a for a in adjust.on_success if isinstance(a, AnnotateCanary)]
    canary["metadata"].setdefault("annotations", {}).update(record.annotations)
    running = DeploymentState.from_manifest(canary).running_config
    assert running is not None and running.max_num_batched_tokens == TRIAL_CONFIG.max_num_batched_tokens
    assert running.max_num_seqs == TRIAL_CONFIG.max_num_seqs
    failure = adjust.on_failure("answered 409")
    assert not [a for a in failure if isinstance(a, AnnotateCanary)]
    assert trial_status(failure)["progress"]["liveAdjusted"] is False
    assert trial_status(failure)["progress"]["liveAdjustError"] == "answered 409"
    assert trial_status(failure)["phase"] == "RollingOut"
    (rollout,) = [a for a in failure if isinstance(a, ApplyCanary)]
    assert started_config(rollout.manifest) == TRIAL_CONFIG  # rolled out with the trial's own config
    assert "LiveAdjustFailed" in events(failure)
    # Without the token the fallback is decided at once.
    plan = decide(snapshot(body, [rolling], canary=canary, live_token_error="no token"), SETTINGS)
    assert of_type(plan, AdjustLive) == [] and "LiveAdjustFailed" in events(plan.actions)


def measuring(measure_from: datetime, **progress: Any) -> TuningTrial:
    return a_trial(
        progress=TrialProgress(
            ready_at=measure_from - timedelta(seconds=10), measure_from=measure_from, **progress
        )
    )


def window(canary_itl: float, samples: float = 500.0) -> Reading[WindowMeasurement]:
    return Reading(
        WindowMeasurement(
            a_measurement("canary", canary_itl, samples=samples),
            a_measurement("stable", 90.0, samples=samples),
        )
    )


def test_warm_up_waits() -> None:
    body = service_body()
    warming = measuring(NOW + timedelta(seconds=5))
    plan = decide(snapshot(body, [warming], canary=canary_of(body, warming)), SETTINGS)
    assert of_type(plan, PatchTrial) == [] and of_type(plan, DeleteCanary) == []
    assert condition(plan, "Tuning") == ("True", "TrialRunning")


def test_an_early_breach_prunes_and_a_good_window_promotes_through_best_config() -> None:
    body = service_body()
    early = measuring(NOW - timedelta(seconds=20))
    plan = decide(snapshot(body, [early], canary=canary_of(body, early), window=window(500.0)), SETTINGS)
    assert trial_status(plan)["verdict"] == "Pruned" and of_type(plan, DeleteCanary)

    done = measuring(NOW - timedelta(seconds=61))
    plan = decide(snapshot(body, [done], canary=canary_of(body, done), window=window(30.0)), SETTINGS)
    status = trial_status(plan)
    assert status["verdict"] == "Promoted" and status["progress"]["stableObjective"] is not None
    assert plan.status["bestConfig"] == TRIAL_CONFIG.to_k8s() and plan.status["bestTrial"] == "chat-trial-1"
    assert "Promoted" in events(plan.actions)
    assert not [a for a in plan.actions if isinstance(a, ApplyCanary)]  # the operator rolls stable


def test_too_few_samples_at_the_end_judges_the_widened_window() -> None:
    body = service_body()
    late = measuring(NOW - timedelta(seconds=75))
    snap = snapshot(
        body, [late], canary=canary_of(body, late), window=window(30.0, samples=10), widened=window(30.0)
    )
    assert trial_status(decide(snap, SETTINGS))["verdict"] == "Promoted"
    inconclusive = replace(snap, widened=window(30.0, samples=10))
    assert of_type(decide(inconclusive, SETTINGS), PatchTrial) == []  # wait until the deadline


def test_a_metrics_gap_is_noted_restarts_the_window_and_aborts_when_long() -> None:
    body = service_body()
    open_window = measuring(NOW - timedelta(seconds=20))
    snap = snapshot(body, [open_window], canary=canary_of(body, open_window), window=Reading(error="down"))
    assert trial_status(decide(snap, SETTINGS))["progress"]["metricsGapSince"] == "2026-01-01T12:00:00Z"

    gap = measuring(NOW - timedelta(seconds=20), metrics_gap_since=NOW - timedelta(seconds=5))
    snap = snapshot(body, [gap], canary=canary_of(body, gap), window=window(30.0))
    plan = decide(snap, SETTINGS)
    progress = trial_status(plan)["progress"]
    assert progress["metricsGapSince"] is None and progress["measureFrom"] == "2026-01-01T12:00:00Z"
    assert "MetricsRestored" in events(plan.actions)

    long = measuring(NOW - timedelta(seconds=90), metrics_gap_since=NOW - timedelta(seconds=61))
    snap = snapshot(body, [long], canary=canary_of(body, long), stable_reading=Reading(error="down"))
    assert "Prometheus unreachable for more than 60s" in trial_status(decide(snap, SETTINGS))["reason"]


def test_a_change_of_stable_replicas_in_auto_restarts_the_window_once_they_have_started() -> None:
    scaled_at = NOW - timedelta(seconds=15)
    scaling = {"mode": "Auto", "minReplicas": 1, "maxReplicas": 4}
    status = {
        "scaling": {
            "mode": "Auto",
            "desiredReplicas": 3,
            "lastScaleTime": scaled_at.isoformat(),
            "startupSeconds": 20.0,
        }
    }
    body = a_service_body(
        engine={"maxNumBatchedTokens": 8192},
        autotune={"maxTrials": 6},
        spec={"scaling": scaling},
        status=status,
    )
    open_window = measuring(NOW - timedelta(seconds=61))
    snap = snapshot(body, [open_window], canary=canary_of(body, open_window), window=window(30.0))
    plan = decide(snap, SETTINGS)
    progress = trial_status(plan)["progress"]
    assert progress["measureFrom"] == "2026-01-01T12:00:30Z"  # start-up 20 s, then the 10-s warm-up
    assert "WindowRestarted" in events(plan.actions)
    assert "verdict" not in trial_status(plan)

    # Once restarted the change lies before the window: it is judged as usual.
    restarted = a_trial(progress=TrialProgress(ready_at=NOW - timedelta(seconds=95), measure_from=NOW))
    later = replace(snap, trials=[restarted], now=NOW + timedelta(seconds=61))
    assert "WindowRestarted" not in events(decide(later, SETTINGS).actions)

    # In Advise nothing ran the decision, and a trial four windows old is judged on what it has.
    advise = {**status, "scaling": {**status["scaling"], "mode": "Advise"}}
    advised = a_service_body(
        engine={"maxNumBatchedTokens": 8192},
        autotune={"maxTrials": 6},
        spec={"scaling": {**scaling, "mode": "Advise"}},
        status=advise,
    )
    snap_advise = snapshot(
        advised, [open_window], canary=canary_of(advised, open_window), window=window(30.0)
    )
    assert trial_status(decide(snap_advise, SETTINGS))["verdict"] == "Promoted"
    old = a_trial(
        progress=TrialProgress(
            ready_at=NOW - timedelta(seconds=250), measure_from=NOW - timedelta(seconds=61)
        )
    )
    snap_old = snapshot(body, [old], canary=canary_of(body, old), window=window(30.0))
    assert trial_status(decide(snap_old, SETTINGS))["verdict"] == "Promoted"


def test_a_finished_live_trial_parks_its_canary() -> None:
    body = service_body(liveAdjust=True)
    done = measuring(NOW - timedelta(seconds=61), live_adjusted=True)
    plan = decide(snapshot(body, [done], canary=canary_of(body, done), window=window(70.0)), SETTINGS)
    assert trial_status(plan)["verdict"] == "Discarded"
    (park,) = of_type(plan, AnnotateCanary)
    assert park.annotations == {rec.ANNOTATION_TRIAL: None, ANNOTATION_PARKED: "true"}
    assert of_type(plan, DeleteCanary) == []


def test_a_parked_canary_is_taken_over_by_the_next_trial_without_a_rollout() -> None:
    body = service_body(liveAdjust=True)
    previous = a_trial(1, TrialPhase.ROLLED_BACK, verdict="Discarded")
    parked = canary_of(body, previous, max_num_batched_tokens=8192, max_num_seqs=256)
    parked["metadata"]["annotations"].update({rec.ANNOTATION_TRIAL: None, ANNOTATION_PARKED: "true"})
    plan = decide(snapshot(body, [previous, a_trial(2, TrialPhase.PENDING)], canary=parked), SETTINGS)
    assert of_type(plan, ApplyCanary) == [] and of_type(plan, DeleteCanary) == []
    (take,) = of_type(plan, AnnotateCanary)
    assert take.annotations == {rec.ANNOTATION_TRIAL: "chat-trial-2", ANNOTATION_PARKED: None}


# --------------------------------------------------------------------------- pending promotion


def promoted_body(applied: str | None) -> tuple[dict[str, Any], TuningTrial]:
    body = service_body()
    body["status"] = {
        "bestConfig": TRIAL_CONFIG.to_k8s(),
        "bestTrial": "chat-trial-1",
        "appliedConfigHash": applied,
    }
    return body, a_trial(1, TrialPhase.PROMOTED, verdict="Promoted")


def test_a_promotion_waits_for_the_operator_and_is_marked_applied_when_stable_runs_it() -> None:
    body, promoted = promoted_body(
        applied=EngineConfig(max_num_batched_tokens=8192, max_num_seqs=128).config_hash()
    )
    plan = decide(snapshot(body, [promoted]), SETTINGS)
    assert of_type(plan, CreateTrial) == [] and of_type(plan, PatchTrial) == []
    assert condition(plan, "Tuning") == ("True", "WaitingForStable")

    body, promoted = promoted_body(applied=TRIAL_CONFIG.config_hash())
    plan = decide(snapshot(body, [promoted]), SETTINGS)
    assert trial_status(plan)["progress"]["promotionApplied"] is True
    (create,) = of_type(plan, CreateTrial)  # stable runs it: the next trial is compared against it
    assert create.manifest["spec"]["baselineConfigHash"] == TRIAL_CONFIG.config_hash()


def test_a_promotion_the_spec_can_no_longer_run_does_not_block_tuning() -> None:
    """The engine changed since (upstream vLLM has no partial-prefill limits): the operator ignores it."""
    body = service_body()
    body["spec"]["engine"].update(kind="vllm", image="vllm/vllm-openai:v0.33.0")
    unrunnable = TRIAL_CONFIG.model_copy(update={"max_num_partial_prefills": 2})
    body["status"] = {
        "bestConfig": unrunnable.to_k8s(),
        "bestTrial": "chat-trial-1",
        "appliedConfigHash": "0",
    }
    promoted = a_trial(1, TrialPhase.PROMOTED, params=unrunnable, verdict="Promoted")
    plan = decide(snapshot(body, [promoted]), SETTINGS)
    assert condition(plan, "Tuning") == ("True", "TrialRunning")
    (create,) = of_type(plan, CreateTrial)
    spec_config = EngineConfig.from_engine(a_service(body).spec.engine)
    assert create.manifest["spec"]["baselineConfigHash"] == spec_config.config_hash()  # what stable runs


def test_an_interrupted_promotion_writes_best_config_again() -> None:
    body = service_body()
    plan = decide(snapshot(body, [a_trial(1, TrialPhase.PROMOTED, verdict="Promoted")]), SETTINGS)
    assert plan.status["bestConfig"] == TRIAL_CONFIG.to_k8s()
    assert of_type(plan, PatchTrial) == []


def test_a_trial_of_the_previous_release_is_read_from_its_annotations() -> None:
    legacy = a_trial(progress=None)
    legacy.metadata.annotations = {
        "chunkpilot.io/measure-from": "2026-01-01T11:59:40Z",
        "chunkpilot.io/metrics-gap-since": "2026-01-01T11:59:55Z",
        "chunkpilot.io/live-adjusted": "failed: answered 409",
        "chunkpilot.io/canary-config-hash": "abcd",
        "chunkpilot.io/stable-objective": "123.5",
    }
    progress = rec.trial_progress(legacy)
    assert progress.measure_from == NOW - timedelta(seconds=20)
    assert progress.metrics_gap_since == NOW - timedelta(seconds=5)
    assert progress.live_adjusted is False and progress.live_adjust_error == "answered 409"
    assert (progress.canary_config_hash, progress.stable_objective) == ("abcd", 123.5)
    assert rec.canary_config_hash(legacy) == "abcd"
    # Once the block is written it is authoritative: a cleared gap stays cleared.
    written = copy.deepcopy(legacy)
    assert written.status is not None
    written.status.progress = progress.model_copy(update={"metrics_gap_since": None})
    assert rec.trial_progress(written).metrics_gap_since is None


# --------------------------------------------------------------------------- with the twin


@pytest.fixture(scope="module")
def calibration(sim_twin: Callable[[int], tuple[TwinFit, Twin]]) -> Calibration:
    """A real fit (the simulator's steps on its datasheet H100) and a hand-made ranking."""
    fit, twin = sim_twin(256)
    ranked = (
        Candidate(TunedConfig(2048, 128), 12.0, tokens_s=3000.0),
        Candidate(TunedConfig(1536, 128), 11.0, tokens_s=2800.0),
    )
    incumbent_ = Candidate(TunedConfig(8192, 256), 4.0, tokens_s=1000.0)
    return Calibration("k", fit, twin, (30.0, 400.0), 0.05, ranked, incumbent_)


def fitted(calibration: Calibration, **fields: Any) -> TwinReading:
    """Ranked this step, 5 req/s live, stable measured at 31 and 420 ms."""
    values: dict[str, Any] = {"ranked": True, "live_rate_req_s": 5.0, "measured_ms": (31.0, 420.0), **fields}
    return a_fitted_reading(calibration, **values)


def test_a_fitted_twin_picks_its_best_candidate_and_records_itself_on_the_service(
    calibration: Calibration,
) -> None:
    plan = decide(snapshot(twin=fitted(calibration)), SETTINGS)
    (create,) = of_type(plan, CreateTrial)
    created = TuningTrial.from_manifest(dict(create.manifest))
    assert created.spec.params.max_num_batched_tokens == 2048
    block = create.status["status"]["twin"]
    assert block["capacityReqS"] == 12.0 and block["rank"] == 1 and block["fitError"] == 0.05
    # objective: throughput -> capacities in output tokens/s per GPU at capacity
    assert block["capacity"] == 3000.0 and block["incumbentCapacity"] == 1000.0
    assert block["capacityUnit"] == "tok/s/GPU"
    twin = plan.status["twin"]
    assert twin["state"] == "Fitted" and twin["capacityReqS"] == 4.0 and twin["capacity"] == 1000.0
    assert twin["liveRequestRate"] == 5.0
    assert [c["capacityReqS"] for c in twin["candidates"]] == [12.0, 11.0]
    assert twin["error"] == 0.05 and twin["measuredItlMs"] == 31.0 and twin["predictedItlMs"] == 30.0
    assert condition(plan, "TwinUnavailable") == ("False", "TwinFitted")
    assert "TwinCandidate" in events(plan.actions)
    # Tried candidates are skipped; the ranking of an earlier step (same key) serves as well.
    first = a_trial(
        1, TrialPhase.ROLLED_BACK, params=EngineConfig(max_num_batched_tokens=2048, max_num_seqs=128)
    )
    body = service_body()
    body["status"] = {"twin": plan.status["twin"]}
    later = decide(snapshot(body, [first], twin=fitted(calibration, ranked=False)), SETTINGS)
    (create,) = of_type(later, CreateTrial)
    assert TuningTrial.from_manifest(dict(create.manifest)).spec.params.max_num_batched_tokens == 1536


def test_a_drifted_workload_that_another_config_serves_on_fewer_gpus_starts_a_new_round(
    calibration: Calibration,
) -> None:
    body = service_body(maxTrials=1)
    done = a_trial(
        1, TrialPhase.ROLLED_BACK, verdict="Discarded", canary=a_measurement("canary", 40.0).to_api()
    )
    done.spec.token_mix = TokenMix(prompt=400.0, output=200.0, note="measured on stable over 60s")
    # The round was sized for 400 prompt tokens per request; the stable track now sees 800.
    drifted = a_measurement("stable", 30.0, prompt_tok_s=4000.0, request_rate=5.0)
    plan = decide(snapshot(body, [done], stable_reading=Reading(drifted), twin=fitted(calibration)), SETTINGS)
    (create,) = of_type(plan, CreateTrial)
    assert create.manifest["metadata"]["labels"][rec.LABEL_ROUND] == "1"
    (said,) = [a.event.message for a in of_type(plan, Emit) if a.event.reason == "Retuning"]
    assert "prompt 400 -> 800 tokens per request" in said
    assert "best configuration (budget=2048" in said and "needs 1 GPU(s), the running one 2" in said

    # The same mix, or a drift the running configuration serves as well, starts nothing.
    same = a_measurement("stable", 30.0, prompt_tok_s=2000.0, request_rate=5.0)
    steady = decide(snapshot(body, [done], stable_reading=Reading(same), twin=fitted(calibration)), SETTINGS)
    assert of_type(steady, CreateTrial) == []
    level = replace(calibration, incumbent=replace(calibration.incumbent, capacity_req_s=11.5))
    plan = decide(snapshot(body, [done], stable_reading=Reading(drifted), twin=fitted(level)), SETTINGS)
    assert of_type(plan, CreateTrial) == []


def test_a_ranking_of_another_stable_config_is_not_used(calibration: Calibration) -> None:
    body = service_body()
    stale = dict(decide(snapshot(twin=fitted(calibration)), SETTINGS).status["twin"], configHash="0000")
    body["status"] = {"twin": stale}
    plan = decide(snapshot(body, twin=fitted(calibration, ranked=False)), SETTINGS)
    (create,) = of_type(plan, CreateTrial)
    assert "twin" not in create.status["status"]  # the study's warm start, as without a twin


def test_without_step_telemetry_tuning_goes_on_as_before_and_says_why() -> None:
    reading = TwinReading(TwinState.UNAVAILABLE, NO_TELEMETRY)
    plan = decide(snapshot(twin=reading), SETTINGS)
    assert condition(plan, "TwinUnavailable") == ("True", "NoStepTelemetry")
    message = next(c.message for c in plan.conditions if c.type == "TwinUnavailable")
    assert "step telemetry" in message and "measurements alone" in message
    (create,) = of_type(plan, CreateTrial)
    without = decide(snapshot(), SETTINGS)
    assert create.manifest == of_type(without, CreateTrial)[0].manifest
    assert plan.status["twin"]["state"] == "Unavailable"


@pytest.mark.parametrize(
    ("waiting", "says"),
    [
        ({"settling": "the service's pods changed in the last 40s"}, ("steady traffic", "pods changed")),
        (
            {"pending": "the ranking on the twin runs as Job chunkpilot-twin-x"},
            ("waiting for the twin's ranking", "chunkpilot-twin-x"),
        ),
    ],
    ids=["settling", "ranking-in-a-job"],
)
def test_a_twin_that_waits_keeps_its_status_and_starts_no_trial(
    calibration: Calibration, waiting: dict[str, str], says: tuple[str, str]
) -> None:
    body = service_body()
    body["status"] = {"twin": decide(snapshot(twin=fitted(calibration)), SETTINGS).status["twin"]}
    plan = decide(snapshot(body, twin=fitted(calibration, ranked=False, **waiting)), SETTINGS)
    assert not of_type(plan, CreateTrial)
    assert condition(plan, "Tuning") == ("True", "WaitingForTwin")
    message = next(c.message for c in plan.conditions if c.type == "Tuning")
    assert all(part in message for part in says), message
    assert "twin" not in plan.status and condition(plan, "TwinUnavailable") is None


def test_too_little_telemetry_waits_and_says_so() -> None:
    reading = TwinReading(
        TwinState.WAITING, "12 engine steps in the window, 50 needed to fit the step-time model"
    )
    plan = decide(snapshot(twin=reading), SETTINGS)
    assert condition(plan, "TwinUnavailable") == ("True", "WaitingForTelemetry")
    message = next(c.message for c in plan.conditions if c.type == "TwinUnavailable")
    assert message.startswith("waiting to fit the twin: 12 engine steps")


def twin_trial(measure_from: datetime, robust_capacity: float | None = None) -> TuningTrial:
    block = TrialTwin(
        capacity_req_s=12.0,
        capacity=12.0,
        robust_capacity=robust_capacity,
        incumbent_capacity=8.0,
        capacity_unit="req/s/GPU",
        fit_error=0.05,
        tolerance=0.25,
        rank=1,
    )
    return with_status(measuring(measure_from), twin=block)


def stable_meeting() -> Reading[WindowMeasurement]:
    return Reading(
        WindowMeasurement(a_measurement("canary", 30.0), a_measurement("stable", 40.0)),
    )


def judged_at_window_end(calibration: Calibration, done: TuningTrial, **twin: Any) -> dict[str, Any]:
    """What the step at the end of ``done``'s window writes to its status: both tracks meet the SLOs
    (stable at 40 ms) and the twin's fields (its ``check`` of the canary, …) are ``twin``."""
    body = service_body()
    snap = snapshot(
        body,
        [done],
        canary=canary_of(body, done),
        stable_reading=Reading(a_measurement("stable", 40.0)),
        window=stable_meeting(),
        twin=fitted(calibration, ranked=False, **twin),
    )
    return trial_status(decide(snap, SETTINGS))


def test_a_canary_that_confirms_the_twin_is_promoted_on_predicted_capacity(calibration: Calibration) -> None:
    done = twin_trial(NOW - timedelta(seconds=61))
    status = judged_at_window_end(calibration, done, check=CanaryCheck(2.5, (28.0, 450.0), (30.0, 500.0)))
    assert status["verdict"] == "Promoted" and status["objective"] == 12.0
    assert "predicted capacity 12 vs 8 req/s/GPU (+50%)" in status["reason"]
    assert status["twin"]["error"] == 0.1 and status["twin"]["measuredTtftMs"] == 500.0
    assert status["twin"]["predictedItlMs"] == 28.0 and status["twin"]["rateReqS"] == 2.5


def test_a_predicted_gain_within_the_twins_uncertainty_promotes_nothing(calibration: Calibration) -> None:
    agreeing = CanaryCheck(2.5, (28.0, 450.0), (30.0, 500.0))
    unsure = judged_at_window_end(calibration, twin_trial(NOW - timedelta(seconds=61), 7.5), check=agreeing)
    assert unsure["verdict"] == "Discarded"
    assert (
        "the gain is within the twin's uncertainty: its robust capacity 7.5 req/s/GPU is below"
        in (unsure["reason"])
    )
    sure = judged_at_window_end(calibration, twin_trial(NOW - timedelta(seconds=61), 9.0), check=agreeing)
    assert sure["verdict"] == "Promoted"


def test_candidates_are_ordered_by_the_capacity_they_keep_on_the_slowed_twin(
    calibration: Calibration,
) -> None:
    ranked = (
        Candidate(TunedConfig(2048, 128), 12.0, tokens_s=3000.0, robust_req_s=6.0),  # at an SLO's edge
        Candidate(TunedConfig(1536, 128), 11.0, tokens_s=2800.0, robust_req_s=10.5),
        Candidate(TunedConfig(1024, 128), 7.0, tokens_s=1800.0),  # not evaluated: its capacity bounds it
    )
    plan = decide(snapshot(twin=fitted(replace(calibration, ranked=ranked))), SETTINGS)
    candidates = plan.status["twin"]["candidates"]
    assert [c["capacityReqS"] for c in candidates] == [11.0, 7.0, 12.0]
    # objective: throughput -> tok/s per GPU, scaled by the share of req/s kept on the slowed twin
    assert [c.get("robustCapacity") for c in candidates] == [pytest.approx(2800 * 10.5 / 11), None, 1500.0]
    (create,) = of_type(plan, CreateTrial)
    block = create.status["status"]["twin"]
    assert block["capacityReqS"] == 11.0 and block["robustCapacity"] == pytest.approx(2800 * 10.5 / 11)


def test_a_canary_that_contradicts_the_twin_is_not_promoted_on_the_prediction(
    calibration: Calibration,
) -> None:
    done = twin_trial(NOW - timedelta(seconds=61))
    status = judged_at_window_end(calibration, done, check=CanaryCheck(2.5, (15.0, 450.0), (30.0, 500.0)))
    assert status["verdict"] == "Discarded" and status["twin"]["error"] == 0.5
    assert "disagree" in status["reason"] and "refitting the twin" in status["reason"]


def test_a_canary_a_few_ms_off_far_below_its_target_confirms_the_twin(calibration: Calibration) -> None:
    # ITL p99 predicted 10 ms, measured 7 (43% off, tolerance 25%), but 3 ms from the prediction
    # where the target is 50 ms: within 10% of the target, it says nothing of the capacity at it.
    done = twin_trial(NOW - timedelta(seconds=61))
    status = judged_at_window_end(calibration, done, check=CanaryCheck(2.5, (10.0, 450.0), (7.0, 500.0)))
    assert status["verdict"] == "Promoted", status["reason"]
    assert "error 43%, tolerance 25%, each within 10% of its target" in status["reason"]
    # 6 ms off is more than 10% of the target: a disagreement, as before.
    off = judged_at_window_end(calibration, done, check=CanaryCheck(2.5, (13.0, 450.0), (7.0, 500.0)))
    assert off["verdict"] == "Discarded" and "disagree" in off["reason"]


def test_a_twin_the_stable_track_contradicts_in_the_same_window_promotes_nothing_on_its_word(
    calibration: Calibration,
) -> None:
    done = twin_trial(NOW - timedelta(seconds=61))
    agreeing = CanaryCheck(2.5, (28.0, 450.0), (30.0, 500.0))
    stable_off = CanaryCheck(2.5, (20.0, 300.0), (40.0, 500.0))
    status = judged_at_window_end(calibration, done, check=agreeing, stable_check=stable_off)
    assert status["verdict"] == "Discarded" and status["twin"]["fitError"] == 0.5
    assert (
        "the twin's error on the stable track is 50%: no promotion on the prediction alone"
        in status["reason"]
    )


# --------------------------------------------------------------------------- every trial's twin block


def test_a_trial_the_sampler_chose_says_why_the_twin_predicted_nothing(calibration: Calibration) -> None:
    pending = a_trial(phase=TrialPhase.PENDING)  # created without a twin block: the sampler chose it

    def rolled_out(snap: Snapshot) -> dict[str, Any]:
        status = trial_status(decide(snap, SETTINGS))
        assert status["phase"] == "RollingOut"
        block: dict[str, Any] = status["twin"]
        return block

    unavailable = rolled_out(
        snapshot(trials=[pending], twin=TwinReading(TwinState.UNAVAILABLE, NO_TELEMETRY))
    )
    assert unavailable["message"] == f"no prediction: twin unavailable: {NO_TELEMETRY}"
    assert "capacityReqS" not in unavailable
    off = rolled_out(snapshot(trials=[pending]))
    assert off["message"].startswith("no prediction: the twin was not consulted (")
    stale = rolled_out(snapshot(trials=[pending], twin=fitted(calibration, ranked=False)))
    assert (
        stale["message"] == "no prediction: chosen by the sampler: the twin has no ranking of its current fit"
    )
    # Every candidate of the twin's ranking tried: the sampler's trial says so.
    tried = [
        a_trial(n, TrialPhase.ROLLED_BACK, params=EngineConfig(max_num_batched_tokens=b, max_num_seqs=128))
        for n, b in ((1, 2048), (2, 1536))
    ]
    exhausted = rolled_out(
        snapshot(trials=[*tried, a_trial(3, TrialPhase.PENDING)], twin=fitted(calibration))
    )
    assert exhausted["message"] == (
        "no prediction: chosen by the sampler: every configuration the twin ranked was tried"
    )
    # A trial the twin chose keeps its block as it is.
    chosen = a_trial(phase=TrialPhase.PENDING, twin=TrialTwin(capacity_req_s=12.0, rank=1))
    assert "twin" not in trial_status(decide(snapshot(trials=[chosen], twin=fitted(calibration)), SETTINGS))


def sampler_trial(measure_from: datetime) -> TuningTrial:
    block = TrialTwin(tolerance=0.15, message="no prediction: chosen by the sampler: every configuration …")
    return with_status(measuring(measure_from), twin=block)


def test_a_trial_without_a_prediction_still_records_the_twins_error_on_its_canary(
    calibration: Calibration,
) -> None:
    done = sampler_trial(NOW - timedelta(seconds=61))
    status = judged_at_window_end(calibration, done, check=CanaryCheck(2.5, (28.0, 450.0), (30.0, 500.0)))
    assert status["verdict"] == "Promoted"  # on the measured objective, as without a twin
    assert status["twin"]["error"] == 0.1 and status["twin"]["predictedItlMs"] == 28.0
    assert status["twin"]["measuredTtftMs"] == 500.0 and "capacityReqS" not in status["twin"]
    assert status["twin"]["message"].startswith("no prediction: chosen by the sampler")


def test_a_pruned_trial_keeps_its_capacity_and_the_twins_error_on_the_part_it_ran(
    calibration: Calibration,
) -> None:
    body = service_body()
    early = twin_trial(NOW - timedelta(seconds=20))
    check = CanaryCheck(2.5, (28.0, 450.0), (500.0, 500.0))
    snap = snapshot(
        body,
        [early],
        canary=canary_of(body, early),
        window=window(500.0),
        twin=fitted(calibration, check=check),
    )
    status = trial_status(decide(snap, SETTINGS))
    assert status["verdict"] == "Pruned"
    assert status["twin"]["capacityReqS"] == 12.0 and status["twin"]["error"] is not None
    assert status["twin"]["error"] == 0.944 and status["twin"]["measuredItlMs"] == 500.0  # 28 vs 500 ms
    # Without a check (no twin at the end), the block says why the error is missing.
    unchecked = decide(snapshot(body, [early], canary=canary_of(body, early), window=window(500.0)), SETTINGS)
    block = trial_status(unchecked)["twin"]
    assert block["capacityReqS"] == 12.0 and "error" not in block
    assert block["message"] == "not checked: the twin was not consulted"


def test_an_aborted_trial_says_the_twin_was_not_checked() -> None:
    body = service_body()
    late = a_trial(phase=TrialPhase.ROLLING_OUT, started_at=NOW - timedelta(seconds=121))
    plan = decide(snapshot(body, [late], canary=canary_of(body, late, ready=False)), SETTINGS)
    block = trial_status(plan)["twin"]
    assert block["message"] == "not checked: aborted (the canary did not become Ready within 120s)"


def test_the_twins_bound_is_ranked_for_the_infeasibility_only_from_its_minimum_of_measured_trials(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Below TWIN_INFEASIBLE_MIN_TRIALS measured trials the bound can decide nothing: not computed."""
    from chunkpilot.tuner.decide import step as decide_module

    calls: list[int] = []
    real = decide_module.twin_bound

    def spy(plan: Plan, round_trials: Sequence[TuningTrial]) -> Any:
        calls.append(len(round_trials))
        return real(plan, round_trials)

    monkeypatch.setattr(decide_module, "twin_bound", spy)

    def missed(number: int, budget: int) -> TuningTrial:
        return a_missed_trial(
            number,
            budget,
            90.0,
            900.0,
            max_num_seqs=64,
            objective=10.0,
            started_at=STARTED,
            finished_at=NOW - timedelta(minutes=10 - number),
        )

    decide(snapshot(), SETTINGS)
    decide(snapshot(trials=[missed(1, 512)]), SETTINGS)
    assert calls == []
    decide(snapshot(trials=[missed(1, 512), missed(2, 2048)]), SETTINGS)
    assert calls == [2]


@pytest.mark.parametrize(
    ("age_s", "itl_ms", "written"),
    [
        (20.0, 91.0, False),  # young, the SLO still violated: the status stands (no churn per tick)
        (70.0, 91.0, True),  # older than the refresh: rewritten
        (20.0, 30.0, True),  # the SLO state changed: written at once
    ],
)
def test_a_stable_measurement_that_changes_nothing_is_not_rewritten_every_tick(
    age_s: float, itl_ms: float, written: bool
) -> None:
    first = decide(snapshot(), SETTINGS)
    body = service_body()
    body["status"] = {k: first.status[k] for k in ("lastMeasurement", "summary")}
    later = NOW + timedelta(seconds=age_s)
    reading = Reading(a_measurement("stable", itl_ms, time=later))
    plan = decide(snapshot(body, stable_reading=reading, now=later), SETTINGS)
    assert ("lastMeasurement" in plan.status) is written
    assert ("summary" in plan.status) is written
