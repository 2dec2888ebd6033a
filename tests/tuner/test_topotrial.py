"""Topology trials (``autotune.allowTopologyChange``): the gate, the canary topology's phases, the verdicts.

Pure like the other decide tests: snapshots are built from the API models, the canary topology's
Deployments from the builders, the pools' measurements as observing delivers them.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import kubernetes
import pytest
from aiohttp import web
from chunkpilot.engine.metrics_names import LABEL_SCHEDULED_TOKENS
from chunkpilot.engine.sim.metrics import StepTelemetry, StepTotals
from chunkpilot.engine.sim.offline import simulate
from chunkpilot.engine.sim.scheduler import SchedulerConfig
from chunkpilot.operator.builders import build_canary_topology
from chunkpilot.operator.config import OperatorConfig
from chunkpilot.operator.kube import KubeClient, _Credentials
from chunkpilot.operator.objects import (
    TOPOLOGY_PARTS,
    canary_topology_deployment_path,
    canary_topology_paths,
    deployment_path,
    isvc_path,
    trial_path,
)
from chunkpilot.operator.served import with_best_topology
from chunkpilot.tuner.act.actor import Actor
from chunkpilot.tuner.decide import topology_trial as topotrial
from chunkpilot.tuner.decide.lifecycle import TunerSettings
from chunkpilot.tuner.decide.plan import (
    ApplyCanary,
    CreateTrial,
    DeleteCanary,
    DeleteCanaryTopology,
    PatchTrial,
    Plan,
)
from chunkpilot.tuner.decide.step import decide
from chunkpilot.tuner.measure import ItlSource, TopologyWindow, TrackMeasurement, measure_topology
from chunkpilot.tuner.observe.observer import Observer, parse_service
from chunkpilot.tuner.observe.snapshot import Reading, Snapshot, TwinReading
from chunkpilot.tuner.observe.twin import TwinObserver
from chunkpilot.tuner.policy import Decision, SLOTargets
from chunkpilot.tuner.topology.pools import PoolCheck, PoolFit
from chunkpilot.tuner.twin import Twin, TwinFit
from chunkpilot.tuner.twin.capture import STEP_FIELDS
from chunkpilot.tuner.twin.online import Calibration

from chunkpilot.api import (
    EngineConfig,
    InferenceService,
    TopologySpec,
    Track,
    TrialPhase,
    TrialProgress,
    TrialVerdict,
    TuningTrial,
    TuningTrialStatus,
)
from chunkpilot.testing.deployments import a_ready_state, after_rollout
from chunkpilot.testing.kube import MemoryKube, someone_elses_role_binding
from chunkpilot.testing.services import NOW, a_condition, a_service_body
from chunkpilot.testing.trials import a_trial, missed_trials
from chunkpilot.testing.tuner import a_measurement, a_snapshot, condition, events, of_type, trial_status

SETTINGS = TunerSettings(rollout_timeout_s=120)
READY = a_ready_state(2)
RECOMMENDATION = {
    "key": "k",
    "message": "Disaggregation: 1 prefill + 1 decode replicas ...",
    "meetsSlo": True,
    "prefillReplicas": 1,
    "decodeReplicas": 1,
    "prefillMaxNumBatchedTokens": 4096,
    "decodeMaxNumSeqs": 128,
    "capacityReqS": 2.1,
    "colocatedCapacityReqS": 0.6,
}


def service_body(replicas: int = 2, allow: bool = True, **status: Any) -> dict[str, Any]:
    """The chat service found SLOInfeasible with :data:`RECOMMENDATION`, ``allow``-ing a topology trial."""
    infeasible = a_condition(
        "SLOInfeasible", "True", "SLOInfeasible", "no configuration of 6 measured meets both SLOs"
    )
    return a_service_body(
        replicas=replicas,
        engine={"maxNumBatchedTokens": 512},
        itl_ms=35,
        ttft_ms=600,
        autotune={"maxTrials": 6, "allowTopologyChange": allow},
        status={"conditions": [infeasible], "recommendation": RECOMMENDATION, **status},
    )


#: Six colocated trials: small budgets miss TTFT, large ones ITL.
INFEASIBLE = missed_trials(
    [
        (128, 30.0, 900.0),
        (256, 33.0, 700.0),
        (1024, 45.0, 560.0),
        (2048, 60.0, 450.0),
        (192, 31.0, 800.0),
        (768, 40.0, 620.0),
    ]
)


def measurement(
    track: str, itl_ms: float, ttft_ms: float, samples: float = 200.0, rate: float = 1.0, replicas: int = 1
) -> TrackMeasurement:
    """A track at the topology trials' light load: ``rate`` req/s, 200 output tokens/s."""
    return a_measurement(
        track,
        itl_ms,
        ttft_ms,
        samples=samples,
        generation_tok_s=200.0,
        request_rate=rate,
        replicas=replicas,
    )


#: The service's two colocated replicas at 1 req/s: 0.5 per replica, as each canary pool's one replica.
STABLE = measurement("stable", 68.0, 512.0, replicas=2)


def snapshot(body: dict[str, Any], trials: Sequence[TuningTrial] = (), **fields: Any) -> Snapshot:
    """A step of ``body``: stable ready on both replicas and measured as :data:`STABLE`."""
    values: dict[str, Any] = {
        "stable": READY,
        "prometheus": True,
        "stable_reading": Reading(STABLE),
        **fields,
    }
    return a_snapshot(body, trials, **values)


def the_topology(body: dict[str, Any]) -> TopologySpec:
    snap = snapshot(body, INFEASIBLE)
    assert snap.status.recommendation is not None
    found = topotrial.layout(snap.status.recommendation, snap.incumbent)
    assert found is not None
    return found


def topology_trial(
    body: dict[str, Any], phase: TrialPhase, progress: TrialProgress | None = None, **status: Any
) -> TuningTrial:
    """Trial 7, trying :func:`the_topology` of ``body`` from the 512-token stable config."""
    params = EngineConfig(max_num_batched_tokens=512, max_num_seqs=128)
    return a_trial(7, phase, params=params, topology=the_topology(body), progress=progress, **status)


def canary_parts(body: dict[str, Any], ready: bool = True) -> dict[str, dict[str, Any]]:
    """The canary topology's Deployments as the API returns them."""
    isvc = parse_service(body)
    assert isvc is not None
    deployments = [m for m in build_canary_topology(isvc, the_topology(body)) if m["kind"] == "Deployment"]
    return dict(zip(TOPOLOGY_PARTS, (after_rollout(m, ready) for m in deployments), strict=True))


MEASURING = TrialProgress(ready_at=NOW - timedelta(seconds=80), measure_from=NOW - timedelta(seconds=70))


# --------------------------------------------------------------------------- the gate


def test_an_infeasible_service_that_allows_it_tries_the_recommended_topology_as_a_topology_trial() -> None:
    plan = decide(snapshot(service_body(), INFEASIBLE), SETTINGS)
    (created,) = of_type(plan, CreateTrial)
    spec = created.manifest["spec"]
    assert spec["number"] == 7 and spec["params"]["maxNumBatchedTokens"] == 512
    prefill, decode = spec["topology"]["prefill"], spec["topology"]["decode"]
    assert (prefill["replicas"], prefill["maxNumBatchedTokens"], prefill["maxNumSeqs"]) == (1, 4096, 128)
    assert (decode["replicas"], decode["maxNumBatchedTokens"], decode["maxNumSeqs"]) == (1, 512, 128)
    assert created.manifest["metadata"]["ownerReferences"][0]["uid"] == "uid-chat"
    assert plan.status["currentTrial"] == "chat-trial-7"
    found = condition(plan, "TopologyChange")
    assert found is not None and found[:2] == ("True", "TopologyTrialRunning")
    assert "1 prefill + 1 decode (prefill maxNumBatchedTokens 4096, decode maxNumSeqs 128)" in found[2]
    tuning = condition(plan, "Tuning")
    assert tuning is not None and tuning[0] == "True"


def test_without_allow_topology_change_nothing_changes() -> None:
    plan = decide(snapshot(service_body(allow=False), INFEASIBLE), SETTINGS)
    assert not of_type(plan, CreateTrial) and condition(plan, "TopologyChange") is None
    assert not [a for a in plan.actions if isinstance(a, (ApplyCanary, DeleteCanaryTopology))]


def test_a_layout_with_more_replicas_than_the_service_is_not_rolled_out_and_the_condition_says_why() -> None:
    body = service_body(replicas=1)
    plan = decide(snapshot(body, INFEASIBLE), SETTINGS)
    assert not of_type(plan, CreateTrial)
    found = condition(plan, "TopologyChange")
    assert found is not None and found[:2] == ("False", "TopologyNeedsReplicas")
    assert "it needs 2 GPUs (2 replicas), the service has 1 (spec.replicas 1)" in found[2]
    assert "raise spec.replicas to 2" in found[2]
    assert [r for r, _ in events(plan)].count("TopologyNeedsReplicas") == 1
    # Said once: the next step keeps the condition without a new Event.
    body["status"]["conditions"].append(
        {"type": "TopologyChange", "status": "False", "reason": "TopologyNeedsReplicas", "message": found[2]}
    )
    later = decide(snapshot(body, INFEASIBLE), SETTINGS)
    assert "TopologyNeedsReplicas" not in [r for r, _ in events(later)]


def test_a_spec_that_cannot_run_a_disaggregated_topology_is_not_tried() -> None:
    body = service_body()
    body["spec"]["autotune"]["liveAdjust"] = True  # the limits route adjusts one colocated track
    plan = decide(snapshot(body, INFEASIBLE), SETTINGS)
    assert not of_type(plan, CreateTrial)
    found = condition(plan, "TopologyChange")
    assert found is not None and found[1] == "TopologyUnsupported"


def test_one_topology_trial_per_round() -> None:
    body = service_body()
    done = topology_trial(body, TrialPhase.ROLLED_BACK, verdict=TrialVerdict.DISCARDED, reason="missed ITL")
    plan = decide(snapshot(body, (*INFEASIBLE, done)), SETTINGS)
    assert not of_type(plan, CreateTrial)
    found = condition(plan, "TopologyChange")
    assert found is not None and found[:2] == ("False", "TopologyRolledBack") and "missed ITL" in found[2]


# --------------------------------------------------------------------------- the active topology trial


def test_a_pending_topology_trial_rolls_out_its_canary_pools_first_and_the_router_once_both_are_ready() -> (
    None
):
    body = service_body()
    trial = topology_trial(body, TrialPhase.PENDING)
    plan = decide(snapshot(body, (*INFEASIBLE, trial), topology_canary={}), SETTINGS)
    applied = [a.manifest["metadata"]["name"] for a in of_type(plan, ApplyCanary)]
    assert applied == ["chat-prefill-canary", "chat-decode-canary"]  # no router: it would have no backends
    assert all(a.manifest["metadata"]["ownerReferences"] for a in of_type(plan, ApplyCanary))
    assert trial_status(plan)["phase"] == "RollingOut"
    assert any(r == "TopologyTrialStarted" for r, _ in events(plan))
    assert not of_type(plan, DeleteCanary) and not of_type(plan, DeleteCanaryTopology)
    rolling = topology_trial(body, TrialPhase.ROLLING_OUT)
    # One pool not Ready yet: still no router.
    loading = {**canary_parts(body), "decode": canary_parts(body, ready=False)["decode"], "router": None}
    waiting = decide(snapshot(body, (*INFEASIBLE, rolling), topology_canary=loading), SETTINGS)
    assert not of_type(waiting, ApplyCanary) and "phase" not in trial_status(waiting)
    # It waits in the rollout check (a step that did nothing would pass the line above): the same
    # state past the rollout timeout aborts.
    tuning = condition(waiting, "Tuning")
    assert tuning is not None and "topology trial 7 RollingOut" in tuning[2]
    late = decide(
        snapshot(body, (*INFEASIBLE, rolling), topology_canary=loading), TunerSettings(rollout_timeout_s=10)
    )
    assert trial_status(late)["verdict"] == "Aborted" and not of_type(late, ApplyCanary)
    # Both pools Ready: the router and its RBAC.
    pools = {**canary_parts(body), "router": None}
    routed = decide(snapshot(body, (*INFEASIBLE, rolling), topology_canary=pools), SETTINGS)
    kinds = [(a.manifest["kind"], a.manifest["metadata"]["name"]) for a in of_type(routed, ApplyCanary)]
    assert sorted(k for k, _ in kinds) == ["Deployment", "Role", "RoleBinding", "ServiceAccount"]
    assert {n for _, n in kinds} == {"chat-router-canary"}
    assert trial_status(routed)["phase"] == "RollingOut"


def test_once_both_pools_and_the_router_are_ready_the_warm_up_starts() -> None:
    body = service_body()
    trial = topology_trial(body, TrialPhase.ROLLING_OUT)
    not_yet = decide(
        snapshot(body, (*INFEASIBLE, trial), topology_canary=canary_parts(body, ready=False)), SETTINGS
    )
    assert not of_type(not_yet, PatchTrial) and not of_type(not_yet, ApplyCanary)  # nothing to do but wait
    assert not of_type(not_yet, DeleteCanaryTopology)
    tuning = condition(not_yet, "Tuning")
    assert tuning is not None and "topology trial 7 RollingOut" in tuning[2]
    plan = decide(snapshot(body, (*INFEASIBLE, trial), topology_canary=canary_parts(body)), SETTINGS)
    status = trial_status(plan)
    assert status["phase"] == "Measuring"
    assert status["progress"]["measureFrom"] == (NOW + timedelta(seconds=10)).isoformat().replace(
        "+00:00", "Z"
    )


def test_the_rollout_timeout_and_progress_deadline_apply_while_prometheus_is_down() -> None:
    body = service_body()
    trial = topology_trial(body, TrialPhase.ROLLING_OUT)  # started 30 s ago
    down = Reading[TrackMeasurement](error="connection refused")
    late = decide(
        snapshot(
            body, (*INFEASIBLE, trial), topology_canary=canary_parts(body, ready=False), stable_reading=down
        ),
        TunerSettings(rollout_timeout_s=10),
    )
    status = trial_status(late)
    assert status["verdict"] == "Aborted" and "did not become Ready within 10s" in status["reason"]
    parts = canary_parts(body, ready=False)
    parts["decode"]["status"]["conditions"] = [
        {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}
    ]
    stuck = decide(snapshot(body, (*INFEASIBLE, trial), topology_canary=parts, stable_reading=down), SETTINGS)
    assert "exceeded its progress deadline" in trial_status(stuck)["reason"]


def test_every_verdict_deletes_the_router_first_and_the_pools_once_it_is_gone() -> None:
    body = service_body()
    plan = measured(body, window(prefill_ttft=580.0, decode_itl=20.0))
    assert of_type(plan, DeleteCanaryTopology) == [DeleteCanaryTopology(pools=False)]
    done = topology_trial(body, TrialPhase.ROLLED_BACK, verdict=TrialVerdict.DISCARDED, reason="missed")
    pools = {**canary_parts(body), "router": None}
    later = decide(snapshot(body, (*INFEASIBLE, done), topology_canary=pools), SETTINGS)
    assert of_type(later, DeleteCanaryTopology) == [DeleteCanaryTopology(pools=True)]
    with_router = decide(snapshot(body, (*INFEASIBLE, done), topology_canary=canary_parts(body)), SETTINGS)
    assert of_type(with_router, DeleteCanaryTopology) == [DeleteCanaryTopology(pools=False)]
    gone = decide(snapshot(body, (*INFEASIBLE, done), topology_canary={}), SETTINGS)
    assert not of_type(gone, DeleteCanaryTopology)


def window(prefill_ttft: float, decode_itl: float, decode_ttft: float = 60.0) -> TopologyWindow:
    return TopologyWindow(
        prefill=measurement("canary", 5.0, prefill_ttft),
        decode=measurement("canary", decode_itl, decode_ttft),
        stable=STABLE,
    )


def measured(
    body: dict[str, Any], measured_window: TopologyWindow, progress: TrialProgress = MEASURING, **fields: Any
) -> Plan:
    """The step of trial 7 measuring (since ``progress``) whose pools measured ``measured_window``;
    ``fields`` add to the snapshot."""
    trial = topology_trial(body, TrialPhase.MEASURING, progress)
    snap = snapshot(
        body,
        (*INFEASIBLE, trial),
        topology_canary=canary_parts(body),
        topology_window=Reading(measured_window),
        **fields,
    )
    return decide(snap, SETTINGS)


def test_a_canary_topology_that_meets_both_slos_is_promoted_into_the_status_and_its_canaries_go() -> None:
    body = service_body()
    plan = measured(body, window(prefill_ttft=300.0, decode_itl=20.0))
    status = trial_status(plan)
    assert (status["phase"], status["verdict"]) == ("Promoted", "Promoted")
    assert status["canary"]["itlMs"] == 20.0 and status["canary"]["ttftMs"] == 360.0  # 300 + 60
    assert status["prefill"]["ttftMs"] == 300.0 and status["decode"]["itlMs"] == 20.0
    assert status["stable"]["itlMs"] == 68.0
    twin = status["twin"]
    assert twin["capacityReqS"] == 2.1 and twin["rateReqS"] == 1.0 and twin["measuredItlMs"] == 20.0
    assert "predicted it meets both SLOs up to 2.1 req/s" in twin["message"]
    assert "meets both SLOs" in status["reason"]
    assert status["paramsSummary"].startswith("1 prefill + 1 decode")
    assert of_type(plan, DeleteCanaryTopology)
    assert plan.status["bestTopology"]["prefill"]["maxNumBatchedTokens"] == 4096
    assert plan.status["bestTopologyTrial"] == "chat-trial-7"
    assert "bestConfig" not in plan.status  # the colocated promotion is untouched
    assert any(r == "TopologyPromoted" for r, _ in events(plan))
    found = condition(plan, "TopologyChange")
    assert found is not None and found[:2] == ("True", "TopologyPromoted")


def test_a_canary_topology_that_misses_an_slo_is_rolled_back_and_every_canary_object_removed() -> None:
    body = service_body()
    plan = measured(body, window(prefill_ttft=580.0, decode_itl=20.0))  # 580 + 60 > 600
    status = trial_status(plan)
    assert (status["phase"], status["verdict"]) == ("RolledBack", "Discarded")
    assert "misses TTFT" in status["reason"] and "prefill 580 ms + decode 60 ms" in status["reason"]
    assert of_type(plan, DeleteCanaryTopology) and "bestTopology" not in plan.status
    assert any(r == "TrialDiscarded" and "1 prefill + 1 decode" in m for r, m in events(plan))
    found = condition(plan, "TopologyChange")
    assert found is not None and found[:2] == ("False", "TopologyRolledBack")


def test_too_few_samples_widen_the_window_and_at_the_deadline_the_trial_is_aborted() -> None:
    body = service_body()
    thin = replace(window(300.0, 20.0), decode=measurement("canary", 20.0, 60.0, samples=3))
    waiting = measured(body, thin)
    assert "verdict" not in trial_status(waiting) and not of_type(waiting, DeleteCanaryTopology)
    late = TrialProgress(ready_at=NOW - timedelta(hours=1), measure_from=NOW - timedelta(minutes=50))
    plan = measured(body, thin, late)
    status = trial_status(plan)
    assert status["verdict"] == "Aborted" and "too few samples" in status["reason"]
    assert of_type(plan, DeleteCanaryTopology)


def test_a_crashed_canary_pool_aborts_the_trial_and_leaves_the_colocated_service_serving() -> None:
    body = service_body()
    trial = topology_trial(body, TrialPhase.MEASURING, MEASURING)
    pod = {
        "metadata": {"name": "chat-decode-canary-abc", "labels": {}},
        "status": {"containerStatuses": [{"restartCount": 1, "lastState": {"terminated": {"exitCode": 1}}}]},
    }
    snap = snapshot(body, (*INFEASIBLE, trial), topology_canary=canary_parts(body), topology_pods=(pod,))
    plan = decide(snap, SETTINGS)
    status = trial_status(plan)
    assert status["verdict"] == "Aborted" and "chat-decode-canary-abc crashed" in status["reason"]
    assert of_type(plan, DeleteCanaryTopology)
    assert "bestTopology" not in plan.status and "bestConfig" not in plan.status
    found = condition(plan, "TopologyChange")
    assert found is not None and found[:2] == ("False", "TopologyTrialAborted")


def test_prometheus_down_mid_trial_records_a_gap_and_judges_nothing() -> None:
    body = service_body()
    trial = topology_trial(body, TrialPhase.MEASURING, MEASURING)
    snap = snapshot(
        body,
        (*INFEASIBLE, trial),
        stable_reading=Reading(error="connection refused"),
        topology_canary=canary_parts(body),
    )
    plan = decide(snap, SETTINGS)
    status = trial_status(plan)
    assert "verdict" not in status and status["progress"]["metricsGapSince"]
    assert not of_type(plan, DeleteCanaryTopology)


def test_a_lost_canary_topology_is_applied_again_and_an_orphaned_one_is_deleted() -> None:
    body = service_body()
    trial = topology_trial(body, TrialPhase.MEASURING, MEASURING)
    parts: dict[str, Any] = {**canary_parts(body), "router": None}  # deleted by hand, or an operator restart
    plan = decide(snapshot(body, (*INFEASIBLE, trial), topology_canary=parts), SETTINGS)
    assert of_type(plan, ApplyCanary) and trial_status(plan)["phase"] == "RollingOut"
    done = topology_trial(body, TrialPhase.ROLLED_BACK, verdict=TrialVerdict.DISCARDED, reason="missed")
    orphaned = decide(snapshot(body, (*INFEASIBLE, done), topology_canary=canary_parts(body)), SETTINGS)
    assert of_type(orphaned, DeleteCanaryTopology) and not of_type(orphaned, CreateTrial)


def test_turning_the_flag_off_mid_trial_aborts_it() -> None:
    body = service_body(allow=False)
    trial = topology_trial(body, TrialPhase.MEASURING, MEASURING)
    plan = decide(snapshot(body, (*INFEASIBLE, trial), topology_canary=canary_parts(body)), SETTINGS)
    status = trial_status(plan)
    assert status["verdict"] == "Aborted" and "allowTopologyChange was turned off" in status["reason"]
    assert of_type(plan, DeleteCanaryTopology)


def test_a_promoted_topology_makes_the_service_disaggregated_and_an_interrupted_promotion_is_completed() -> (
    None
):
    body = service_body()
    done = topology_trial(body, TrialPhase.PROMOTED, verdict=TrialVerdict.PROMOTED, reason="meets both SLOs")
    # The verdict was recorded but the step stopped before status.bestTopology was written.
    plan = decide(snapshot(body, (*INFEASIBLE, done)), SETTINGS)
    assert done.spec.topology is not None
    assert plan.status["bestTopology"] == done.spec.topology.to_k8s()
    assert plan.status["bestTopologyTrial"] == "chat-trial-7"
    # With it written, the service runs the topology: the tuner runs no colocated canary against it.
    body["status"].update(bestTopology=plan.status["bestTopology"], bestTopologyTrial="chat-trial-7")
    snap = snapshot(body, (*INFEASIBLE, done))
    assert snap.isvc.spec.disaggregated and snap.isvc.spec.pool("prefill").max_num_batched_tokens == 4096
    after = decide(snap, SETTINGS)
    found = condition(after, "Tuning")
    assert found is not None and found[:2] == ("False", "Disaggregated")
    assert "the pools keep the knobs topology trial chat-trial-7 promoted" in found[2]
    assert not of_type(after, CreateTrial)


# --------------------------------------------------------------------------- the judgement


def test_the_topology_is_judged_as_its_clients_see_it() -> None:
    slo = SLOTargets(35.0, 600.0, 0.99, 0.95)
    decision, reason = topotrial.judge(
        window(prefill_ttft=400.0, decode_itl=30.0, decode_ttft=150.0), slo, 100
    )
    assert decision is Decision.PROMOTE, reason
    assert "TTFT p95 550 ms = prefill 400 ms + decode 150 ms (target 600 ms)" in reason
    decision, reason = topotrial.judge(window(prefill_ttft=100.0, decode_itl=36.0), slo, 100)
    assert decision is Decision.DISCARD and "misses ITL" in reason
    decision, _ = topotrial.judge(window(100.0, 20.0), slo, 1000)
    assert decision is Decision.INCONCLUSIVE


def test_an_installation_without_disaggregation_tries_no_topology() -> None:
    plan = decide(snapshot(service_body(), INFEASIBLE), replace(SETTINGS, disaggregation=False))
    assert not of_type(plan, CreateTrial)
    found = condition(plan, "TopologyChange")
    assert found is not None and found[1] == "TopologyUnsupported" and "disaggregation.enabled" in found[2]


# --------------------------------------------------------------------------- the gate's evidence


def refused(body: dict[str, Any], **fields: Any) -> tuple[str, str, str]:
    plan = decide(snapshot(body, INFEASIBLE, **fields), SETTINGS)
    assert not of_type(plan, CreateTrial)
    found = condition(plan, "TopologyChange")
    assert found is not None and found[0] == "False"
    return found


def test_a_recommendation_of_an_older_twin_fit_is_not_tried() -> None:
    found = refused(service_body(), twin=TwinReading(key="fresh"))
    assert found[1] == "TopologyRecommendationStale" and "(k, now fresh)" in found[2]
    same = decide(snapshot(service_body(), INFEASIBLE, twin=TwinReading(key="k")), SETTINGS)
    assert of_type(same, CreateTrial)


def test_a_recommendation_of_fewer_replicas_than_the_service_has_now_is_not_tried() -> None:
    found = refused(service_body(replicas=3))  # 1 + 1 was evaluated before spec.replicas went to 3
    assert found[1] == "TopologyRecommendationStale"
    assert "it was evaluated for 2 replicas, the service has 3" in found[2] and "raise" not in found[2]
    # Its capacity is the old count's: not compared with the live rate before it is evaluated again.
    body = service_body(replicas=3)
    body["status"]["recommendation"] = {**RECOMMENDATION, "capacityReqS": 0.5}
    assert refused(body)[1] == "TopologyRecommendationStale"


def test_a_recommendation_of_more_replicas_than_the_service_has_now_is_not_tried() -> None:
    body = service_body(replicas=3)  # 1 + 3 was evaluated before spec.replicas went from 4 to 3
    body["status"]["recommendation"] = {**RECOMMENDATION, "decodeReplicas": 3, "capacityReqS": 9.0}
    found = refused(body)
    assert found[1] == "TopologyRecommendationStale", found
    assert "it was evaluated for 4 replicas, the service has 3" in found[2] and "raise" not in found[2]


def test_a_recommendation_whose_capacity_is_below_the_live_rate_is_not_tried() -> None:
    body = service_body()
    body["status"]["recommendation"] = {
        **RECOMMENDATION,
        "capacityReqS": 0.01,
        "colocatedCapacityReqS": 0.005,
    }
    found = refused(body)
    assert found[1] == "TopologyCapacityShort"
    assert "up to 0.01 req/s, short of the live 1 req/s with the 5% margin" in found[2]
    # Just at the live rate is not enough either: the margin applies.
    body["status"]["recommendation"] = {**RECOMMENDATION, "capacityReqS": 1.04, "colocatedCapacityReqS": 0.5}
    assert refused(body)[1] == "TopologyCapacityShort"


def test_a_recommendation_that_does_not_beat_colocated_is_not_tried() -> None:
    body = service_body()
    body["status"]["recommendation"] = {**RECOMMENDATION, "capacityReqS": 2.1, "colocatedCapacityReqS": 2.05}
    found = refused(body)
    assert found[1] == "TopologyDoesNotPay" and "colocated's 2.05 req/s" in found[2]


def test_an_interrupted_promotion_is_completed_whatever_stopped_tuning() -> None:
    body = service_body()
    body["status"]["conditions"] = []  # no longer SLOInfeasible (e.g. the twin's fit changed)
    done = topology_trial(body, TrialPhase.PROMOTED, verdict=TrialVerdict.PROMOTED, reason="meets both SLOs")
    plan = decide(snapshot(body, (done,)), SETTINGS)
    assert done.spec.topology is not None
    assert plan.status["bestTopology"] == done.spec.topology.to_k8s()
    assert not of_type(plan, CreateTrial)  # the next step sees a disaggregated service


def test_an_aborted_topology_trial_keeps_its_twin_block_unwritten() -> None:
    body = service_body(allow=False)
    trial = topology_trial(body, TrialPhase.MEASURING, MEASURING)
    plan = decide(snapshot(body, (*INFEASIBLE, trial), topology_canary=canary_parts(body)), SETTINGS)
    status = trial_status(plan)
    assert status["verdict"] == "Aborted" and "twin" not in status


# --------------------------------------------------------------------------- a load-aware verdict

SLO = SLOTargets(35.0, 600.0, 0.99, 0.95)


def test_a_canary_topology_judged_at_a_lighter_load_than_the_stables_is_not_promoted() -> None:
    # One router endpoint among three: the two canary replicas carry 1/3 req/s, the stable 1/3 each.
    light = TopologyWindow(
        prefill=measurement("canary", 5.0, 300.0, rate=1 / 3),
        decode=measurement("canary", 20.0, 60.0, rate=1 / 3),
        stable=measurement("stable", 68.0, 512.0, rate=2 / 3, replicas=2),
    )
    decision, reason = topotrial.judge(light, SLO, 100, topotrial.Prediction(2.1, 2))
    assert decision is Decision.INCONCLUSIVE, reason  # not judged on it: the window widens
    assert "lighter than it would carry promoted" in reason
    assert "0.167 req/s per replica, the stable 0.333 per replica" in reason
    assert "all read from the engine's own histograms" in reason
    fair = replace(light, stable=measurement("stable", 68.0, 512.0, rate=1 / 3, replicas=2))
    decision, reason = topotrial.judge(fair, SLO, 100, topotrial.Prediction(2.1, 2))
    assert decision is Decision.PROMOTE and "at the stable's load per replica" in reason
    parts = (fair.prefill, fair.decode, fair.stable)
    fine = TopologyWindow(*(replace(m, itl_source=ItlSource.FINE) for m in parts))
    decision, reason = topotrial.judge(fine, SLO, 100, topotrial.Prediction(2.1, 2))
    assert decision is Decision.PROMOTE and "all read from Chunkpilot's fine histograms" in reason
    stock = replace(fine, stable=fair.stable)  # the stable had too few fine samples of its own
    decision, reason = topotrial.judge(stock, SLO, 100, topotrial.Prediction(2.1, 2))
    assert "TTFT 512 ms (the stable read from the engine's own histograms)" in reason, reason
    assert "the pools read from Chunkpilot's fine histograms" in reason and "all read" not in reason


def test_a_measurement_that_contradicts_the_twin_promotes_nothing_and_the_reason_says_so() -> None:
    # At 0.5 req/s per replica the topology runs 1 req/s; the twin said it misses beyond 0.5 req/s.
    decision, reason = topotrial.judge(window(300.0, 20.0), SLO, 100, topotrial.Prediction(0.5, 2))
    assert decision is Decision.DISCARD, reason
    assert "contradicts the twin" in reason and "up to 0.5 req/s, this load is 1 req/s" in reason
    # A miss where the twin predicted both SLOs met: discarded, and the reason names the contradiction.
    decision, reason = topotrial.judge(window(300.0, 50.0), SLO, 100, topotrial.Prediction(2.1, 2))
    assert decision is Decision.DISCARD and "misses ITL" in reason
    assert "contradicts the twin" in reason and "missed by 43%" in reason
    decision, reason = topotrial.judge(window(300.0, 36.0), SLO, 100, topotrial.Prediction(2.1, 2))
    assert decision is Decision.DISCARD and "contradicts" not in reason  # 3% over: within the tolerance


def pools_refitted(capacity_req_s: float, trial: str = "chat-trial-7") -> TwinReading:
    """Observing refitted the twin on the pools' own steps (the decode pool stepping 1.62x the
    stable's model) and predicted the layout up to ``capacity_req_s``."""
    fits = (PoolFit("prefill", 900.0, True, 1.02, 0.01), PoolFit("decode", 4000.0, True, 1.62, 0.01))
    return TwinReading(pools=PoolCheck(trial, capacity_req_s, 30.0, 500.0, fits))


def test_the_verdict_judges_the_prediction_refitted_on_the_pools_own_steps() -> None:
    body = service_body()
    meets = window(prefill_ttft=300.0, decode_itl=20.0)  # both SLOs met at 1 req/s
    # The refit says the pools meet both SLOs only up to 0.6 req/s: the measurement contradicts it.
    status = trial_status(measured(body, meets, twin=pools_refitted(0.6)))
    assert (status["phase"], status["verdict"]) == ("RolledBack", "Discarded"), status["reason"]
    assert "contradicts the twin" in status["reason"]
    assert "refitted on each pool's own steps" in status["reason"]
    assert "decode: 4,000 steps at 1.62x the stable's model" in status["reason"]
    twin = status["twin"]
    assert twin["capacityReqS"] == 0.6
    assert "up to 2.1 req/s (whole service) on the stable's step model" in twin["message"]
    assert "up to 0.6 req/s" in twin["message"]
    # The refit agrees with the measurement: promoted on it.
    status = trial_status(measured(body, meets, twin=pools_refitted(1.8)))
    assert (status["phase"], status["verdict"]) == ("Promoted", "Promoted"), status["reason"]
    assert status["twin"]["capacityReqS"] == 1.8
    # Another trial's refit is not this one's: the recommendation (2.1 req/s) stands.
    status = trial_status(measured(body, meets, twin=pools_refitted(0.6, trial="chat-trial-6")))
    assert status["verdict"] == "Promoted" and status["twin"]["capacityReqS"] == 2.1


def step_vectors(telemetry: Mapping[str, StepTotals]) -> dict[str, list[dict[str, Any]]]:
    """What Prometheus answers to :func:`step_queries` over steps ``telemetry``, by metric name."""
    return {
        metric: [
            {"metric": {LABEL_SCHEDULED_TOKENS: label}, "value": [0, str(getattr(totals, key))]}
            for label, totals in telemetry.items()
        ]
        for key, metric in STEP_FIELDS.items()
    }


def test_at_the_end_of_its_window_observing_refits_the_twin_on_each_pools_own_steps(
    sim_twin: Callable[[int], tuple[TwinFit, Twin]],
) -> None:
    fit, twin = sim_twin(128)
    scheduler = SchedulerConfig(max_num_batched_tokens=1024, max_num_seqs=128)
    telemetry = {"prefill": StepTelemetry(), "decode": StepTelemetry()}
    simulate(twin.config(scheduler), twin.workload, telemetry=telemetry["prefill"])
    simulate(twin.slowed(1.5).config(scheduler), twin.workload, telemetry=telemetry["decode"])
    answers = {role: step_vectors(t.totals()) for role, t in telemetry.items()}
    asked: list[str] = []

    def vector(query: str, at: datetime) -> list[dict[str, Any]]:
        asked.append(query)
        role = next(r for r in answers if f'role="{r}"' in query)
        metric = next(m for m in answers[role] if f"({m}{{" in query)
        return answers[role][metric]

    body = service_body()
    trial = topology_trial(body, TrialPhase.MEASURING, MEASURING)
    snap = snapshot(
        body, (*INFEASIBLE, trial), topology_window=Reading(window(prefill_ttft=300.0, decode_itl=20.0))
    )
    observer = TwinObserver(vector, inline=True)
    observer._fits[(snap.namespace, snap.name)] = Calibration("k", fit, twin, (20.0, 300.0), 0.05)
    check = asyncio.run(observer._pools(snap))
    assert check is not None and check.key == "chat-trial-7"
    # Over the window the pools were measured on: since the warm-up, widened up to now (70 s).
    assert asked and all('track="canary"' in q and "[70s]" in q for q in asked), asked[:1]
    prefill, decode = check.pools
    assert prefill.own and decode.own
    assert prefill.stable_ratio == pytest.approx(1.0, abs=0.05)
    assert decode.stable_ratio == pytest.approx(1.5, rel=0.05)
    assert check.capacity_req_s > 0
    # Computed once a trial: the next step asks Prometheus nothing more.
    asked.clear()
    assert asyncio.run(observer._pools(snap)) is check and not asked
    # No topology trial active: nothing, and the check is forgotten.
    assert asyncio.run(observer._pools(snapshot(body, INFEASIBLE))) is None


def test_the_verdict_records_the_load_per_replica_beside_the_stables() -> None:
    plan = measured(service_body(), window(prefill_ttft=300.0, decode_itl=20.0))
    status = trial_status(plan)
    assert "0.5 req/s per replica, the stable 0.5 per replica" in status["twin"]["message"]
    assert "0.5 req/s per replica, the stable 0.5 per replica" in status["reason"]


def test_a_canary_topology_breaching_an_slo_by_the_abort_factor_is_rolled_back_before_its_window_ends() -> (
    None
):
    body = service_body()
    early = TrialProgress(ready_at=NOW - timedelta(seconds=40), measure_from=NOW - timedelta(seconds=30))
    breach = measured(body, window(prefill_ttft=300.0, decode_itl=80.0), early)  # ITL over 2 x 35 ms
    status = trial_status(breach)
    assert (status["phase"], status["verdict"]) == ("RolledBack", "Discarded")
    assert "the canary topology: canary ITL 80ms exceeds 2x the 35ms target" in status["reason"]
    assert of_type(breach, DeleteCanaryTopology)
    # A miss, but not by the factor: wait.
    within = measured(body, window(prefill_ttft=300.0, decode_itl=50.0), early)
    assert "verdict" not in trial_status(within) and not of_type(within, DeleteCanaryTopology)


def test_a_thin_or_silent_prefill_pool_is_inconclusive() -> None:
    thin = replace(window(300.0, 20.0), prefill=measurement("canary", 5.0, 300.0, samples=0))
    decision, reason = topotrial.judge(thin, SLO, 100)
    assert decision is Decision.INCONCLUSIVE and "served 0 and 200 requests" in reason
    silent = replace(window(300.0, 20.0), prefill=replace(measurement("canary", 5.0, 300.0), ttft_ms=None))
    decision, reason = topotrial.judge(silent, SLO, 100)
    assert decision is Decision.INCONCLUSIVE, reason


def test_the_tuner_sees_the_topology_the_operator_runs() -> None:
    """With the installation's liveAdjust off, a service asking for it runs its promoted pools."""
    body = service_body()
    body["spec"]["autotune"]["liveAdjust"] = True
    body["status"]["bestTopology"] = the_topology(service_body()).to_k8s()
    body["status"]["bestTopologyTrial"] = "chat-trial-7"
    off = OperatorConfig.from_env({"CHUNKPILOT_LIVE_ADJUST": "off"})  # the tuner's settings share it
    isvc = parse_service(body, live_adjust=off.live_adjust)
    assert isvc is not None
    config = OperatorConfig(live_adjust=False)
    assert isvc.spec == with_best_topology(config.served(isvc), body["status"]).spec
    assert isvc.spec.disaggregated and isvc.spec.pool("prefill").max_num_batched_tokens == 4096
    on = OperatorConfig.from_env({"CHUNKPILOT_LIVE_ADJUST": "on"})  # then the spec cannot run it: colocated
    colocated = parse_service(body, live_adjust=on.live_adjust)
    assert colocated is not None and not colocated.spec.disaggregated


# --------------------------------------------------------------------------- observing a topology trial


class Recorder:
    """A Prometheus that answers every query and remembers it: 2 for each pool, 5 for stable."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def __call__(self, query: str, at: datetime) -> float | None:
        self.asked.append(query)
        return 2.0 if 'track="canary"' in query else 5.0


def observe(
    objects: Mapping[str, dict[str, Any]], pods: list[dict[str, Any]]
) -> tuple[Snapshot | None, Recorder, MemoryKube]:
    query, kube = Recorder(), MemoryKube(objects, pods)
    snap = asyncio.run(Observer(kube, query, inline=True).observe("default", "chat", NOW))
    return snap, query, kube


def test_a_measuring_topology_trial_is_observed_with_its_parts_pods_and_each_pools_window() -> None:
    body = service_body()
    trial = topology_trial(body, TrialPhase.MEASURING, MEASURING)
    parts = canary_parts(body)
    objects: dict[str, dict[str, Any]] = {
        isvc_path("default", "chat"): body,
        trial_path("default", trial.metadata.name): trial.to_manifest(),
        **{canary_topology_deployment_path("default", "chat", p): parts[p] for p in TOPOLOGY_PARTS},
    }
    pod = {"metadata": {"name": "chat-decode-canary-abc", "labels": {}}}
    snap, query, kube = observe(objects, [pod])
    assert snap is not None
    assert {p: m["metadata"]["name"] for p, m in snap.topology_canary.items()} == {
        "prefill": "chat-prefill-canary",
        "decode": "chat-decode-canary",
        "router": "chat-router-canary",
    }
    assert snap.topology_pods == (pod,)
    assert any(s and "track=canary" in s for _, s in kube.listed)
    window = snap.topology_window.value
    assert window is not None and window.prefill.request_rate == 2.0 and window.stable.request_rate == 5.0
    prefill = [q for q in query.asked if 'role="prefill"' in q]
    decode = [q for q in query.asked if 'role="decode"' in q]
    assert prefill and decode and all('track="canary"' in q for q in prefill + decode)
    stable = snap.incumbent.config_hash()
    assert any(
        'track="stable"' in q and f'config_hash="{stable}"' in q and "role" not in q for q in query.asked
    )


def test_a_topology_trial_not_measuring_yet_reads_its_parts_but_no_window() -> None:
    body = service_body()
    trial = topology_trial(body, TrialPhase.ROLLING_OUT)
    objects = {
        isvc_path("default", "chat"): body,
        trial_path("default", trial.metadata.name): trial.to_manifest(),
    }
    snap, query, _ = observe(objects, [])
    assert snap is not None and snap.topology_canary == dict.fromkeys(TOPOLOGY_PARTS)
    assert snap.topology_window.value is None and snap.topology_window.error is None
    assert not [q for q in query.asked if "role=" in q]


def test_measure_topology_selects_each_pool_by_track_and_role() -> None:
    asked: list[str] = []

    def query(text: str, at: datetime) -> float | None:
        asked.append(text)
        return 1.0

    measure_topology(query, "chat", "default", "60s", NOW, 0.99, 0.95, "abc", min_samples=100)
    roles = {r for r in ("prefill", "decode") for q in asked if f'track="canary",role="{r}"' in q}
    assert roles == {"prefill", "decode"}
    assert any('{service="chat",namespace="default",track="stable",config_hash="abc"}' in q for q in asked)


# --------------------------------------------------------------------------- carrying out the teardown


def test_the_actor_deletes_the_router_before_the_pools_and_takes_a_404_as_gone() -> None:
    """The real API client against a recording server: DELETE order, objects already gone, and one
    of a canary's name that is not the service's, which is never deleted."""
    deleted: list[str] = []
    present = {canary_topology_deployment_path("default", "chat", p) for p in TOPOLOGY_PARTS}
    foreign: set[str] = set()
    uid = service_body()["metadata"]["uid"]

    async def get(request: web.Request) -> web.Response:
        owners = [] if request.path in foreign else [{"kind": "InferenceService", "uid": uid}]
        found = {"kind": "Deployment", "metadata": {"name": request.path.rsplit("/", 1)[-1]}}
        if request.path in present | foreign:
            return web.json_response({**found, "metadata": {**found["metadata"], "ownerReferences": owners}})
        return web.json_response({"kind": "Status", "code": 404, "reason": "NotFound"}, status=404)

    async def delete(request: web.Request) -> web.Response:
        deleted.append(request.path)
        if request.path in present:
            return web.json_response({"kind": "Status", "status": "Success"})
        return web.json_response({"kind": "Status", "code": 404, "reason": "NotFound"}, status=404)

    async def scenario(action: DeleteCanaryTopology) -> list[str]:
        deleted.clear()
        app = web.Application()
        app.router.add_route("DELETE", "/{tail:.*}", delete)
        app.router.add_route("GET", "/{tail:.*}", get)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        configuration = kubernetes.client.Configuration()
        configuration.verify_ssl = False
        kube = KubeClient(_Credentials(f"http://127.0.0.1:{port}", configuration), field_manager="test")
        try:
            plan = Plan(snapshot(service_body(), INFEASIBLE))
            await Actor(kube).run(plan, [action])
        finally:
            await kube.close()
            await runner.cleanup()
        return list(deleted)

    router_first = asyncio.run(scenario(DeleteCanaryTopology(pools=False)))
    assert router_first[0].endswith("/deployments/chat-router-canary")
    assert [p.rsplit("/", 2)[-2] for p in router_first[1:]] == ["rolebindings", "roles", "serviceaccounts"]
    assert not [p for p in router_first if "prefill" in p or "decode" in p]  # the pools stay
    everything = asyncio.run(scenario(DeleteCanaryTopology()))  # the RBAC objects answer 404: gone
    assert everything[:4] == router_first
    assert everything[4:] == [
        canary_topology_deployment_path("default", "chat", "prefill"),
        canary_topology_deployment_path("default", "chat", "decode"),
    ]
    # A RoleBinding of the canary router's name that the service does not own stays.
    binding = "/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings/chat-router-canary"
    foreign.add(binding)
    assert binding not in asyncio.run(scenario(DeleteCanaryTopology(pools=False)))
    present.add(binding)
    foreign.clear()
    assert binding in asyncio.run(scenario(DeleteCanaryTopology(pools=False)))


@pytest.mark.cluster
def test_the_actors_teardown_removes_a_canary_topology_from_the_real_api_server(control_plane: Any) -> None:
    """The real paths, and the real API server's 404 for what is already gone (a wrong path would
    read as gone too: the objects are checked to exist before and to be gone after)."""
    namespace = f"topology-teardown-{uuid.uuid4().hex[:8]}"
    control_plane.kubectl("create", "namespace", namespace)
    body = service_body()
    body["metadata"]["namespace"] = namespace
    isvc = parse_service(body)
    assert isvc is not None
    manifests = build_canary_topology(isvc, the_topology(body))
    paths = canary_topology_paths(namespace, "chat")

    async def scenario() -> list[dict[str, bool]]:
        kube = KubeClient.from_environment(
            field_manager="topology-test", kubeconfig=str(control_plane.kubeconfig)
        )
        seen: list[dict[str, bool]] = []

        async def present() -> None:
            seen.append(
                {
                    path.rsplit("/", 2)[-2] + "/" + path.rsplit("/", 1)[1]: await kube.get(path) is not None
                    for path in paths
                }
            )

        try:
            for manifest in manifests:
                await kube.apply(manifest)
            await present()
            plan = Plan(snapshot(body, INFEASIBLE))
            await Actor(kube).run(plan, [DeleteCanaryTopology(pools=False)])
            await present()
            await Actor(kube).run(plan, [DeleteCanaryTopology()])  # the router and its RBAC answer 404
            await present()
        finally:
            await kube.close()
        return seen

    try:
        before, router_gone, all_gone = asyncio.run(scenario())
    finally:
        control_plane.kubectl("delete", "namespace", namespace, "--wait=false")
    assert all(before.values()), before
    assert router_gone == {
        "deployments/chat-router-canary": False,
        "rolebindings/chat-router-canary": False,
        "roles/chat-router-canary": False,
        "serviceaccounts/chat-router-canary": False,
        "deployments/chat-prefill-canary": True,
        "deployments/chat-decode-canary": True,
    }
    assert not any(all_gone.values()), all_gone


@pytest.mark.cluster
def test_the_actor_leaves_a_canary_named_object_it_does_not_own_on_the_real_api_server(
    control_plane: Any,
) -> None:
    """A Deployment ``chat-canary`` and a RoleBinding ``chat-router-canary`` that are someone else's:
    neither the orphan clean-up nor a canary apply touches them."""
    namespace = f"canary-conflict-{uuid.uuid4().hex[:8]}"
    control_plane.kubectl("create", "namespace", namespace)
    body = service_body()
    body["metadata"]["namespace"] = namespace
    theirs = {"app": "someone-else"}
    foreign = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "chat-canary", "namespace": namespace, "labels": theirs},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": theirs},
            "template": {
                "metadata": {"labels": theirs},
                "spec": {"containers": [{"name": "web", "image": "registry.example/web:1"}]},
            },
        },
    }
    binding = someone_elses_role_binding("chat-router-canary", namespace, role="reader")
    ours = {**foreign, "metadata": {**foreign["metadata"], "labels": {"chunkpilot.io/service": "chat"}}}
    deployment = deployment_path(namespace, "chat", Track.CANARY)
    binding_path = (
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings/chat-router-canary"
    )

    async def scenario() -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        kube = KubeClient.from_environment(
            field_manager="conflict-test", kubeconfig=str(control_plane.kubeconfig)
        )
        try:
            await kube.apply(foreign)
            await kube.apply(binding)
            plan = Plan(snapshot(body, INFEASIBLE))
            await Actor(kube).run(
                plan, [DeleteCanary(), ApplyCanary(ours), DeleteCanaryTopology(pools=False)]
            )
            return await kube.get(deployment), await kube.get(binding_path)
        finally:
            await kube.close()

    try:
        kept, kept_binding = asyncio.run(scenario())
    finally:
        control_plane.kubectl("delete", "namespace", namespace, "--wait=false")
    assert kept is not None and kept["metadata"]["labels"] == theirs, kept
    assert kept["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example/web:1"
    assert kept_binding is not None and kept_binding["roleRef"]["name"] == "reader"


# --------------------------------------------------------------------------- the spec changing under it


def started(body: dict[str, Any]) -> TuningTrial:
    """The topology trial a step creates for ``body``, measuring since a while (its annotations kept)."""
    (created,) = of_type(decide(snapshot(body, INFEASIBLE), SETTINGS), CreateTrial)
    trial = TuningTrial.from_manifest(created.manifest)
    return trial.model_copy(
        update={"status": TuningTrialStatus(phase=TrialPhase.MEASURING, started_at=NOW, progress=MEASURING)}
    )


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        (lambda spec: spec.update(replicas=3), "spec.replicas changed to 3 mid-trial"),
        (lambda spec: spec["engine"].update(maxNumBatchedTokens=768), "spec.engine changed mid-trial"),
        (lambda spec: spec["engine"].update(extraArgs=["--enforce-eager"]), "spec.engine changed mid-trial"),
        (lambda spec: spec["model"].update(servedName="chat-v2"), "spec.model changed mid-trial"),
        (lambda spec: spec["resources"].update(accelerator="h200"), "spec.resources changed mid-trial"),
    ],
    ids=["replicas", "engine knob", "engine args", "model", "resources"],
)
def test_a_spec_change_under_a_running_topology_trial_aborts_it(edit: Any, why: str) -> None:
    body = service_body()
    trial = started(body)
    steady = decide(
        snapshot(body, (*INFEASIBLE, trial), topology_canary=canary_parts(body), topology_window=Reading()),
        SETTINGS,
    )
    assert "verdict" not in trial_status(steady)  # the same spec: it runs on
    edit(body["spec"])
    plan = decide(snapshot(body, (*INFEASIBLE, trial), topology_canary=canary_parts(body)), SETTINGS)
    status = trial_status(plan)
    assert status["verdict"] == "Aborted" and why in status["reason"], status
    assert of_type(plan, DeleteCanaryTopology) and "bestTopology" not in plan.status
    found = condition(plan, "TopologyChange")
    assert found is not None and found[:2] == ("False", "TopologyTrialAborted") and why in found[2]


def test_fields_at_their_defaults_stay_out_of_the_trials_basis() -> None:
    # An operator upgrade whose CRD adds a defaulted field makes the API server write it into the
    # stored spec; the pools render the same, so it must not read as an edit mid-trial.
    body = service_body()
    body["spec"]["engine"]["enableChunkedPrefill"] = True  # written out at its default
    documents = topotrial.basis_documents(InferenceService.from_manifest(body))
    assert "enableChunkedPrefill" not in documents["engine"], documents
    assert documents["engine"]["maxNumBatchedTokens"] == body["spec"]["engine"]["maxNumBatchedTokens"]
    trial = started(service_body())
    plan = decide(snapshot(body, (*INFEASIBLE, trial), topology_canary=canary_parts(body)), SETTINGS)
    assert "verdict" not in trial_status(plan), trial_status(plan)
    # A trial started by a release that digested the defaults too runs on as well.
    isvc = InferenceService.from_manifest(body)
    annotations = {**trial.metadata.annotations, **topotrial.basis(isvc, defaults=True)}
    assert annotations != {**trial.metadata.annotations, **topotrial.basis(isvc)}
    legacy = trial.model_copy(
        update={"metadata": trial.metadata.model_copy(update={"annotations": annotations})}
    )
    plan = decide(snapshot(body, (*INFEASIBLE, legacy), topology_canary=canary_parts(body)), SETTINGS)
    assert "verdict" not in trial_status(plan), trial_status(plan)


def test_a_promoted_topology_on_other_replicas_than_spec_replicas_is_said_not_to_run() -> None:
    body = service_body(replicas=3)
    done = topology_trial(body, TrialPhase.PROMOTED, verdict=TrialVerdict.PROMOTED, reason="meets both SLOs")
    assert done.spec.topology is not None
    body["status"].update(bestTopology=done.spec.topology.to_k8s(), bestTopologyTrial="chat-trial-7")
    snap = snapshot(body, (*INFEASIBLE, done))
    assert not snap.isvc.spec.disaggregated  # 1 + 1 is two replicas: colocated on three
    plan = decide(snap, SETTINGS)
    found = condition(plan, "TopologyChange")
    assert found is not None and found[:2] == ("False", "TopologyPromotedNotRunning"), found
    assert "promoted by chat-trial-7 (1 prefill + 1 decode" in found[2]
    assert "has 2 replicas and spec.replicas is 3" in found[2] and "again at spec.replicas 2" in found[2]
    assert not of_type(plan, CreateTrial)
    # Said also while tuning goes on colocated (no infeasibility: the topology trial's gate is not asked).
    body["status"]["conditions"] = []
    tuning = decide(snapshot(body, (done,)), SETTINGS)
    assert of_type(tuning, CreateTrial)  # a colocated trial on the three replicas
    found = condition(tuning, "TopologyChange")
    assert found is not None and found[1] == "TopologyPromotedNotRunning", found


# --------------------------------------------------------------------------- the planner's proposal (Auto)

#: The planner's proposal: 1 + 1 pools would serve the rate where colocated takes 4 replicas.
PROPOSAL = {
    "topology": "disaggregated",
    "replicas": 2,
    "prefillReplicas": 1,
    "decodeReplicas": 1,
    "currentReplicas": 4,
    "message": "prefill/decode pools would serve 3.3 req/s on 1 + 1 replicas where colocated takes 4",
}
#: Six colocated trials that met both SLOs: tuning stopped at maxTrials, feasible.
MET = missed_trials([(b, 20.0, 300.0) for b in (128, 256, 384, 512, 768, 1024)])


def proposing_body(mode: str = "Auto", allow: bool = True, **status: Any) -> dict[str, Any]:
    """The chat service, sized by the planner in ``mode`` on 4 replicas, told pools would take 2."""
    scaling = {"mode": mode, "topology": "colocated", "desiredReplicas": 4, "proposal": PROPOSAL}
    return a_service_body(
        replicas=2,
        engine={"maxNumBatchedTokens": 512},
        itl_ms=35,
        ttft_ms=600,
        spec={"scaling": {"mode": mode, "minReplicas": 1, "maxReplicas": 8}},
        autotune={"maxTrials": 6, "allowTopologyChange": allow},
        status={"scaling": scaling, **status},
    )


def test_in_auto_the_planners_proposed_pools_are_tried_as_a_topology_trial_once_tuning_stopped() -> None:
    plan = decide(snapshot(proposing_body(), MET), SETTINGS)
    (created,) = of_type(plan, CreateTrial)
    topology = created.manifest["spec"]["topology"]
    assert (topology["prefill"]["replicas"], topology["decode"]["replicas"]) == (1, 1)
    assert topology["decode"]["maxNumBatchedTokens"] == 512 and topology["decode"]["maxNumSeqs"] == 128
    found = condition(plan, "TopologyChange")
    assert found is not None and found[:2] == ("True", "TopologyTrialRunning")
    assert found[2].startswith("trying the proposed 1 prefill + 1 decode") and PROPOSAL["message"] in found[2]
    # Fewer replicas than run colocated (4) or are declared (2 is a coincidence: 3 changes nothing).
    three = proposing_body()
    three["spec"]["replicas"] = 3
    assert of_type(decide(snapshot(three, MET), SETTINGS), CreateTrial)


@pytest.mark.parametrize(
    ("body", "trials", "stable"),
    [
        (proposing_body("Advise"), MET, READY),  # Advise acts on nothing: the replicas stay the user's
        (proposing_body(allow=False), MET, READY),
        (proposing_body(), MET[:3], READY),  # tuning goes on: one trial at a time, knobs first
        (proposing_body(), MET, None),  # the stable track is not rolled out
    ],
    ids=["advise", "not-allowed", "tuning", "no-stable"],
)
def test_the_proposal_is_not_tried_outside_auto_without_the_flag_or_while_tuning(
    body: dict[str, Any], trials: Sequence[TuningTrial], stable: Any
) -> None:
    plan = decide(snapshot(body, trials, stable=stable), SETTINGS)
    assert not [c for c in of_type(plan, CreateTrial) if c.manifest["spec"].get("topology")]
    found = condition(plan, "TopologyChange")
    assert found is None or found[1] != "TopologyTrialRunning"


def test_the_proposal_tried_is_the_one_this_step_left_not_a_withdrawn_one() -> None:
    plan = Plan(snapshot(proposing_body(), MET))
    recorded = topotrial.current_proposal(plan)
    assert recorded is not None and recorded.prefill_replicas == 1  # nothing written yet: the status's
    plan.status["scaling"] = {"proposal": None, "reason": "..."}  # the planner withdrew it this step
    assert topotrial.current_proposal(plan) is None and topotrial.proposal_gate(plan, 0) is None
    plan.status["scaling"] = None  # scaling turned off
    assert topotrial.current_proposal(plan) is None


def test_a_proposal_is_tried_once_a_round_and_judged_without_an_unrelated_recommendation() -> None:
    body = proposing_body(recommendation={**RECOMMENDATION, "prefillMaxNumBatchedTokens": 2048})
    (created,) = of_type(decide(snapshot(body, MET), SETTINGS), CreateTrial)
    trial = TuningTrial.model_validate(created.manifest).model_copy(
        update={"status": TuningTrialStatus(phase=TrialPhase.ROLLED_BACK, verdict=TrialVerdict.DISCARDED)}
    )
    assert not of_type(decide(snapshot(body, (*MET, trial)), SETTINGS), CreateTrial)
    plan = Plan(snapshot(body, (*MET, trial)))
    assert created.manifest["metadata"]["annotations"][topotrial.ANNOTATION_PROPOSED] == "true"
    assert topotrial.recommended(plan, trial) is None  # 2048 tokens recommended, 8192 proposed
    assert topotrial.prediction(plan, trial).capacity_req_s is None
    # A trial of the recommendation is judged on it, as it stands (refreshed or not).
    tried = topology_trial(service_body(), TrialPhase.MEASURING)
    found = topotrial.recommended(Plan(snapshot(body, (*MET, tried))), tried)
    assert found is not None and found.prefill_max_num_batched_tokens == 2048


def test_in_auto_a_promotion_hands_the_pools_to_the_planner_and_they_run_whatever_ran_colocated() -> None:
    body = proposing_body()
    (created,) = of_type(decide(snapshot(body, MET), SETTINGS), CreateTrial)
    trial = TuningTrial.model_validate(created.manifest).model_copy(
        update={"status": TuningTrialStatus(phase=TrialPhase.PROMOTED, verdict=TrialVerdict.PROMOTED)}
    )
    plan = decide(snapshot(body, (*MET, trial)), SETTINGS)  # the verdict recorded, the status not yet
    assert trial.spec.topology is not None and plan.status["bestTopology"] == trial.spec.topology.to_k8s()
    scaling = plan.status["scaling"]  # the planner's decision is the promoted pools'
    assert (scaling["topology"], scaling["desiredReplicas"], scaling["decision"]) == (
        "disaggregated",
        2,
        "prefill 1 + decode 1",
    )
    assert scaling["proposal"] is None and scaling["capacityLowReqS"] is None  # the colocated ones go
    body["status"].update(bestTopology=plan.status["bestTopology"], bestTopologyTrial=trial.metadata.name)
    body["status"]["scaling"] = {k: v for k, v in scaling.items() if v is not None}
    isvc = with_best_topology(parse_service(body) or pytest.fail("invalid"), body["status"])
    assert isvc.spec.disaggregated  # 2 replicas promoted, 4 colocated were running, 2 declared
    assert [isvc.running_pool_replicas(r) for r in ("prefill", "decode")] == [1, 1]
    after = decide(snapshot(body, (*MET, trial)), SETTINGS)
    found = condition(after, "TopologyChange")
    assert found is None or found[1] != "TopologyPromotedNotRunning"
    waiting = after.status["scaling"]  # the planner goes on from the pools (no window of them yet)
    assert waiting["reason"].startswith("waiting: ") and waiting["decision"] == "prefill 1 + decode 1"
    # Promoted before (or outside Auto), a topology of other replicas runs only at its own count.
    earlier = proposing_body(bestTopology=plan.status["bestTopology"], bestTopologyTrial="chat-trial-7")
    assert not with_best_topology(
        parse_service(earlier) or pytest.fail("invalid"), earlier["status"]
    ).spec.disaggregated


def test_in_auto_a_change_of_spec_replicas_does_not_abort_a_topology_trial() -> None:
    body = proposing_body()
    (created,) = of_type(decide(snapshot(body, MET), SETTINGS), CreateTrial)
    trial = TuningTrial.model_validate(created.manifest)
    isvc = parse_service(body)
    assert isvc is not None and topotrial.spec_changed(trial, isvc) is None
    body["spec"]["replicas"] = 5
    edited = parse_service(body)
    assert edited is not None and topotrial.spec_changed(trial, edited) is None
    body["spec"]["scaling"]["mode"] = "Off"
    off = parse_service(body)
    assert off is not None and "spec.replicas changed to 5" in (topotrial.spec_changed(trial, off) or "")
