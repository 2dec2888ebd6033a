"""Colocated topology trials: a service that runs pools a topology trial promoted tries colocated again.

In ``scaling.mode: Auto`` with ``allowTopologyChange``, the planner's proposal of colocated replicas
(``status.scaling.proposal``, topology colocated) is tried as a canary: colocated engines of the
config the service ran before its pools, behind a canary router the Service sends its share of the
traffic, judged at the load each proposed replica would carry; promoted, the pools give way. Pure
like the other decide tests: snapshots from the API models, canaries from the builders.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from chunkpilot.operator.builders import as_declared, build_canary_colocated
from chunkpilot.operator.served import with_best_topology
from chunkpilot.tuner.decide import topology_trial as topotrial
from chunkpilot.tuner.decide.lifecycle import TunerSettings
from chunkpilot.tuner.decide.plan import ApplyCanary, CreateTrial, DeleteCanary, DeleteCanaryTopology, Log
from chunkpilot.tuner.decide.step import decide
from chunkpilot.tuner.decide.topology_verdict import judge_colocated
from chunkpilot.tuner.measure import PoolsMeasurement, WindowMeasurement
from chunkpilot.tuner.observe.observer import parse_service
from chunkpilot.tuner.observe.snapshot import Reading, Snapshot
from chunkpilot.tuner.policy import Decision, SLOTargets
from chunkpilot.tuner.twin.online import TOLERANCE

from chunkpilot.api import EngineConfig, TopologyMode, TopologySpec, TrialPhase, TrialProgress, TuningTrial
from chunkpilot.testing.deployments import after_rollout
from chunkpilot.testing.services import NOW, a_service_body
from chunkpilot.testing.trials import a_trial, missed_trials
from chunkpilot.testing.tuner import a_measurement, a_snapshot, condition, events, of_type, trial_status

SETTINGS = TunerSettings(rollout_timeout_s=120)
#: The config the service ran colocated before a topology trial promoted its pools.
BEST = EngineConfig(max_num_batched_tokens=512, max_num_seqs=128)
#: The pools topology trial 7 promoted: 2 prefill + 1 decode replicas.
POOLS = {
    "mode": "disaggregated",
    "prefill": {"replicas": 2, "maxNumBatchedTokens": 2048, "maxNumSeqs": 128},
    "decode": {"replicas": 1, "maxNumBatchedTokens": 512, "maxNumSeqs": 128},
}
#: The planner's proposal: 2 colocated replicas serve the rate the 2 + 1 pools serve.
PROPOSAL = {
    "topology": "colocated",
    "replicas": 2,
    "currentReplicas": 3,
    "message": "colocated replicas would serve 1.6 req/s on 2 where the pools take 3",
}
#: The colocated rounds before the pools: six trials that met both SLOs, and trial 7 (the pools).
MET = missed_trials([(b, 20.0, 300.0) for b in (128, 256, 384, 512, 768, 1024)])
PROMOTED_POOLS = a_trial(
    7, TrialPhase.PROMOTED, params=BEST, topology=TopologySpec.model_validate(POOLS), verdict="Promoted"
)
HISTORY = (*MET, PROMOTED_POOLS)
TRIAL = 8


def part(desired: int, ready: int | None = None) -> dict[str, int]:
    return {
        "desiredReplicas": desired,
        "replicas": desired,
        "readyReplicas": desired if ready is None else ready,
    }


def pools_body(
    mode: str = "Auto",
    allow: bool = True,
    routers: int = 1,
    proposal: dict[str, Any] | None = PROPOSAL,
    **status: Any,
) -> dict[str, Any]:
    """The chat service in ``mode``, running the pools trial 7 promoted, told 2 colocated would do."""
    scaling = {
        "mode": mode,
        "topology": "disaggregated",
        "desiredReplicas": 3,
        "pools": [{"role": "prefill", "desiredReplicas": 2}, {"role": "decode", "desiredReplicas": 1}],
        "proposal": proposal,
    }
    values: dict[str, Any] = {
        "bestConfig": BEST.to_k8s(),
        "bestTopology": POOLS,
        "bestTopologyTrial": "chat-trial-7",
        "scaling": scaling,
        "topology": {
            "mode": "disaggregated",
            "prefill": part(2),
            "decode": part(1),
            "router": part(routers),
        },
        **status,
    }
    return a_service_body(
        replicas=2,
        engine={"maxNumBatchedTokens": 512},
        itl_ms=35,
        ttft_ms=600,
        spec={
            "scaling": {"mode": mode, "minReplicas": 1, "maxReplicas": 8},
            # The router of pools a trial promotes is the one the manifest's topology declares.
            "topology": {"mode": "colocated", "router": {"replicas": routers}},
        },
        autotune={"maxTrials": 6, "allowTopologyChange": allow},
        status=values,
    )


def snapshot(body: dict[str, Any], trials: tuple[TuningTrial, ...] = HISTORY, **fields: Any) -> Snapshot:
    return a_snapshot(body, trials, prometheus=True, **fields)


def colocated_trial(phase: TrialPhase, progress: TrialProgress | None = None, **status: Any) -> TuningTrial:
    """Trial 8: 2 colocated replicas of :data:`BEST`."""
    topology = TopologySpec(mode=TopologyMode.COLOCATED)
    return a_trial(TRIAL, phase, params=BEST, topology=topology, replicas=2, progress=progress, **status)


def canary_objects(body: dict[str, Any], ready: bool = True) -> tuple[dict[str, Any], dict[str, Any]]:
    """The canary engines' and the canary router's Deployments as the API returns them."""
    isvc = parse_service(body)
    assert isvc is not None
    engines, *_rbac, router = build_canary_colocated(isvc, as_declared(isvc, body), BEST, 1, 1)
    engines["metadata"].setdefault("annotations", {})["chunkpilot.io/trial"] = f"chat-trial-{TRIAL}"
    return after_rollout(engines, ready), after_rollout(router, ready)


def window(canary_itl: float = 30.0, canary_rate: float = 0.8, pools_rate: float = 0.8) -> WindowMeasurement:
    """The canary (one replica) and the 2 + 1 pools over the trial's window."""
    canary = a_measurement("canary", canary_itl, 480.0, samples=200, request_rate=canary_rate, replicas=1)
    prefill = a_measurement("stable", 12.0, 300.0, samples=200, request_rate=pools_rate, replicas=2)
    decode = a_measurement("stable", 28.0, 120.0, samples=200, request_rate=pools_rate, replicas=1)
    return WindowMeasurement(canary=canary, stable=PoolsMeasurement(prefill, decode).combined())


MEASURING = TrialProgress(ready_at=NOW - timedelta(seconds=80), measure_from=NOW - timedelta(seconds=70))


# --------------------------------------------------------------------------- the gate


def test_the_planners_proposal_of_colocated_replicas_is_tried_beside_the_promoted_pools() -> None:
    plan = decide(snapshot(pools_body()), SETTINGS)
    (created,) = of_type(plan, CreateTrial)
    spec = created.manifest["spec"]
    assert spec["topology"] == {"mode": "colocated"} and spec["replicas"] == 2
    assert spec["params"]["maxNumBatchedTokens"] == 512  # the config the service ran before its pools
    labels, annotations = created.manifest["metadata"]["labels"], created.manifest["metadata"]["annotations"]
    assert labels["chunkpilot.io/tuning-round"] == "0"
    assert annotations[topotrial.ANNOTATION_PROPOSED] == "true"
    found = condition(plan, "TopologyChange")
    assert found is not None and found[:2] == ("True", "TopologyTrialRunning")
    assert found[2].startswith("trying the proposed 2 colocated x budget=512 seqs=128 as a canary")
    assert PROPOSAL["message"] in found[2]


@pytest.mark.parametrize(
    ("body", "trials"),
    [
        (pools_body("Advise"), HISTORY),  # Advise acts on nothing
        (pools_body(allow=False), HISTORY),
        (pools_body(proposal=None), HISTORY),  # nothing proposed
        (pools_body(topology={**pools_body()["status"]["topology"], "router": part(1, 0)}), HISTORY),
        (  # a colocated trial ended within the hour
            pools_body(),
            (*HISTORY, colocated_trial(TrialPhase.ROLLED_BACK, finished_at=NOW - timedelta(minutes=50))),
        ),
    ],
    ids=["advise", "not-allowed", "no-proposal", "router-not-ready", "tried-lately"],
)
def test_the_colocated_proposal_is_not_tried(body: dict[str, Any], trials: tuple[TuningTrial, ...]) -> None:
    plan = decide(snapshot(body, trials), SETTINGS)
    assert not of_type(plan, CreateTrial)
    found = condition(plan, "TopologyChange")
    assert found is None or found[1] != "TopologyTrialRunning"


def test_declared_pools_are_never_tried_colocated_and_a_trial_is_tried_again_after_the_hour() -> None:
    declared = pools_body()
    declared["spec"]["topology"] = POOLS
    assert not of_type(decide(snapshot(declared), SETTINGS), CreateTrial)
    hour_ago = colocated_trial(TrialPhase.ROLLED_BACK, finished_at=NOW - timedelta(minutes=61))
    (created,) = of_type(decide(snapshot(pools_body(), (*HISTORY, hour_ago)), SETTINGS), CreateTrial)
    assert created.manifest["spec"]["number"] == TRIAL + 1


@pytest.mark.parametrize(
    ("replicas", "routers", "engines", "canary_routers"),
    [(2, 1, 1, 1), (3, 1, 2, 2), (4, 1, 2, 1), (5, 2, 3, 3), (8, 1, 4, 1), (5, 1, 3, 2)],
)
def test_each_canary_replica_carries_what_one_proposed_replica_would(
    replicas: int, routers: int, engines: int, canary_routers: int
) -> None:
    """On the fewest engines (eight proposed: four behind one router pod, half the traffic)."""
    canary = topotrial.colocated_canary(replicas, routers)
    assert canary is not None and (canary.engines, canary.routers) == (engines, canary_routers)
    assert 1 / replicas <= canary.share * (1 + 1e-9) and canary.share <= (1 + TOLERANCE) / replicas
    fewer = [
        topotrial.ColocatedCanary(replicas, e, r, routers)
        for e in range(1, engines)
        for r in range(1, topotrial.MAX_CANARY_ROUTERS + 1)
    ]
    assert not [c for c in fewer if 1 / replicas <= c.share * (1 + 1e-9) <= (1 + TOLERANCE) / replicas]


def test_a_canary_that_cannot_draw_its_share_is_refused_with_the_way_to_switch() -> None:
    # One replica beside a one-pod router would need nearly all the traffic: 8 pods draw 89%.
    assert topotrial.colocated_canary(1, 1) is None and topotrial.colocated_canary(1, 2) is None
    plan = decide(snapshot(pools_body(proposal={**PROPOSAL, "replicas": 1})), SETTINGS)
    assert not of_type(plan, CreateTrial)
    found = condition(plan, "TopologyChange")
    assert found is not None and found[:2] == ("False", "TopologyUnsupported")
    assert "cannot draw the share" in found[2] and "autotune.allowTopologyChange false" in found[2]


# --------------------------------------------------------------------------- the trial's phases


def test_the_canary_engines_roll_out_first_then_the_router_then_the_warm_up() -> None:
    body = pools_body()
    pending = decide(snapshot(body, (*HISTORY, colocated_trial(TrialPhase.PENDING))), SETTINGS)
    (engines,) = of_type(pending, ApplyCanary)
    meta = engines.manifest["metadata"]
    assert (meta["name"], engines.manifest["spec"]["replicas"]) == ("chat-canary", 1)
    assert meta["annotations"]["chunkpilot.io/trial"] == "chat-trial-8"
    assert meta["ownerReferences"][0]["uid"] == "uid-chat"
    assert trial_status(pending)["phase"] == "RollingOut"
    assert events(pending)[0][0] == "TopologyTrialStarted"

    ready_engines, ready_router = canary_objects(body)
    rolling = colocated_trial(TrialPhase.ROLLING_OUT)
    routed = decide(snapshot(body, (*HISTORY, rolling), canary=ready_engines), SETTINGS)
    kinds = [(a.manifest["kind"], a.manifest["metadata"]["name"]) for a in of_type(routed, ApplyCanary)]
    assert kinds == [
        ("ServiceAccount", "chat-router-canary"),
        ("Role", "chat-router-canary"),
        ("RoleBinding", "chat-router-canary"),
        ("Deployment", "chat-router-canary"),
    ]
    router = of_type(routed, ApplyCanary)[-1].manifest
    assert (
        router["spec"]["replicas"] == 1
        and "--selector" in router["spec"]["template"]["spec"]["containers"][0]["args"]
    )

    parts = {"router": ready_router}
    warm = decide(snapshot(body, (*HISTORY, rolling), canary=ready_engines, topology_canary=parts), SETTINGS)
    assert trial_status(warm)["phase"] == "Measuring"


def test_a_canary_that_never_becomes_ready_aborts_and_the_pools_serve_on() -> None:
    body = pools_body()
    engines, _router = canary_objects(body, ready=False)
    late = colocated_trial(TrialPhase.ROLLING_OUT, started_at=NOW - timedelta(seconds=300))
    plan = decide(snapshot(body, (*HISTORY, late), canary=engines), SETTINGS)
    assert trial_status(plan)["verdict"] == "Aborted"
    assert "bestTopology" not in plan.status  # the pools stay
    (deleted,) = of_type(plan, DeleteCanaryTopology)
    assert deleted.pools and of_type(plan, DeleteCanary)  # no router yet: the engines go at once


def measuring(body: dict[str, Any], measured: WindowMeasurement, **fields: Any) -> Snapshot:
    engines, router = canary_objects(body)
    trial = colocated_trial(TrialPhase.MEASURING, MEASURING)
    return snapshot(
        body,
        (*HISTORY, trial),
        canary=engines,
        topology_canary={"router": router},
        window=Reading(measured),
        **fields,
    )


def test_a_colocated_canary_that_meets_both_slos_at_its_load_replaces_the_pools() -> None:
    plan = decide(measuring(pools_body(), window()), SETTINGS)
    status = trial_status(plan)
    assert (status["phase"], status["verdict"]) == ("Promoted", "Promoted")
    assert (
        "at 0.8 req/s per replica where each of 2 colocated replicas would carry 0.8 req/s"
        in status["reason"]
    )
    assert plan.status["bestTopology"] is None and plan.status["bestTopologyTrial"] == "chat-trial-8"
    scaling = plan.status["scaling"]
    assert (scaling["topology"], scaling["desiredReplicas"], scaling["decision"]) == ("colocated", 2, "2")
    assert not scaling["pools"] and scaling["proposal"] is None
    (deleted,) = of_type(plan, DeleteCanaryTopology)
    assert not deleted.pools and not of_type(plan, DeleteCanary)  # the router first, the engines after
    found = condition(plan, "TopologyChange")
    assert found is not None and found[:2] == ("True", "TopologyPromoted")
    assert any(
        reason == "TopologyPromoted" and "replace the prefill/decode pools" in m for reason, m in events(plan)
    )
    # The operator then runs the service colocated on the 2 replicas (spec.replicas says 2 too).
    body = pools_body()
    body["status"].update(bestTopology=None, bestTopologyTrial="chat-trial-8")
    body["status"]["scaling"] = {k: v for k, v in scaling.items() if v is not None}
    isvc = with_best_topology(parse_service(body) or pytest.fail("invalid"), body["status"])
    assert not isvc.spec.disaggregated and isvc.running_replicas() == 2


@pytest.mark.parametrize(
    ("measured", "decision", "said"),
    [
        (window(canary_itl=41.0), Decision.DISCARD, "the colocated canary misses ITL"),
        (
            window(canary_rate=0.4, pools_rate=1.2),
            Decision.INCONCLUSIVE,
            "below what it would carry promoted",
        ),
        (
            window(canary_rate=1.3, pools_rate=0.3),
            Decision.PROMOTE,
            "meets both SLOs at the load it would carry",
        ),
    ],
    ids=["misses", "lighter", "heavier"],
)
def test_the_colocated_verdict(measured: WindowMeasurement, decision: Decision, said: str) -> None:
    slo = SLOTargets(itl_ms=35, ttft_ms=600)
    found, reason = judge_colocated(measured, slo, min_samples=50, replicas=2)
    assert found is decision and said in reason
    few = WindowMeasurement(
        a_measurement("canary", 20.0, 300.0, samples=10, request_rate=1.0), measured.stable
    )
    assert judge_colocated(few, slo, min_samples=50, replicas=2)[0] is Decision.INCONCLUSIVE


def test_a_colocated_canary_that_misses_is_rolled_back_and_the_pools_stay() -> None:
    plan = decide(measuring(pools_body(), window(canary_itl=41.0)), SETTINGS)
    status = trial_status(plan)
    assert (status["phase"], status["verdict"]) == ("RolledBack", "Discarded")
    assert "bestTopology" not in plan.status
    found = condition(plan, "TopologyChange")
    assert found is not None and found[:2] == ("False", "TopologyRolledBack")
    lighter = decide(measuring(pools_body(), window(canary_rate=0.4, pools_rate=1.2)), SETTINGS)
    assert "verdict" not in trial_status(lighter)  # widened until the loads compare, up to the deadline


def test_the_canary_engines_go_quietly_once_the_router_is_gone() -> None:
    body = pools_body()
    engines, router = canary_objects(body)
    done = colocated_trial(TrialPhase.ROLLED_BACK, verdict="Discarded", finished_at=NOW)
    waiting = decide(
        snapshot(body, (*HISTORY, done), canary=engines, topology_canary={"router": router}), SETTINGS
    )
    assert not of_type(waiting, DeleteCanary)  # the router first
    gone = decide(snapshot(body, (*HISTORY, done), canary=engines), SETTINGS)
    assert of_type(gone, DeleteCanary) and not [e for e in events(gone) if e[0] == "OrphanRemoved"]
    assert any(
        "canary engines of finished topology trial chat-trial-8" in a.message for a in of_type(gone, Log)
    )


def test_an_interrupted_colocated_promotion_is_completed_and_the_pools_are_not_tried_again_this_round() -> (
    None
):
    promoted = colocated_trial(TrialPhase.PROMOTED, verdict="Promoted", finished_at=NOW)
    plan = decide(snapshot(pools_body(), (*HISTORY, promoted)), SETTINGS)
    assert plan.status["bestTopology"] is None and plan.status["bestTopologyTrial"] == "chat-trial-8"
    assert plan.status["scaling"]["desiredReplicas"] == 2
    # Colocated again, in Auto, told pools would do: not tried again in the round that left them.
    body = pools_body(
        bestTopology=None,
        bestTopologyTrial="chat-trial-8",
        scaling={
            "mode": "Auto",
            "topology": "colocated",
            "desiredReplicas": 2,
            "proposal": {**PROPOSAL, "topology": "disaggregated", "prefillReplicas": 1, "decodeReplicas": 1},
        },
    )
    body["status"].pop("topology")
    again = decide(snapshot(body, (*HISTORY, promoted), stable=None), SETTINGS)
    assert not [c for c in of_type(again, CreateTrial) if c.manifest["spec"].get("topology")]
    assert topotrial.complete_promotion(topotrial.Plan(snapshot(body, (*HISTORY, promoted)))) is False


def test_the_pools_are_planned_on_the_whole_services_rate_while_a_canary_takes_its_share() -> None:
    pools = PoolsMeasurement(
        a_measurement("stable", 12.0, 300.0, request_rate=0.8, replicas=2),
        a_measurement("stable", 28.0, 120.0, request_rate=0.8, replicas=1),
    )
    trial = colocated_trial(TrialPhase.MEASURING, MEASURING)
    during = snapshot(pools_body(), (*HISTORY, trial), pools_reading=Reading(pools), canary_rate=0.7)
    assert during.pools_rate() == pytest.approx(1.5)  # what the canary's engines served besides
    assert snapshot(pools_body(), pools_reading=Reading(pools)).pools_rate() == pytest.approx(0.8)


def test_a_colocated_trial_whose_pools_stopped_running_aborts_cleanly() -> None:
    """allowTopologyChange turned off: the service runs colocated again, and the trial says why."""
    body = pools_body(allow=False)
    engines, router = canary_objects(body)
    trial = colocated_trial(TrialPhase.MEASURING, MEASURING)
    snap = snapshot(body, (*HISTORY, trial), canary=engines, topology_canary={"router": router}, stable=None)
    assert not snap.isvc.spec.disaggregated
    plan = decide(snap, SETTINGS)
    status = trial_status(plan)
    assert status["verdict"] == "Aborted" and "no longer runs the pools" in status["reason"]
    assert of_type(plan, DeleteCanaryTopology) and not of_type(plan, DeleteCanary)  # the router first
    assert not [e for e in events(plan) if e[0] == "OrphanRemoved"]
    assert not of_type(plan, CreateTrial)  # the next trial waits for the next step


def test_after_a_promotion_the_colocated_service_removes_the_canary_engines_after_their_router() -> None:
    promoted = colocated_trial(TrialPhase.PROMOTED, verdict="Promoted", finished_at=NOW)
    body = pools_body(bestTopology=None, bestTopologyTrial="chat-trial-8")
    body["status"]["scaling"] = {"mode": "Auto", "topology": "colocated", "desiredReplicas": 2}
    engines, router = canary_objects(pools_body())
    trials = (*HISTORY, promoted)
    waiting = decide(snapshot(body, trials, canary=engines, topology_canary={"router": router}), SETTINGS)
    assert not waiting.snap.isvc.spec.disaggregated and not of_type(waiting, DeleteCanary)
    gone = decide(snapshot(body, trials, canary=engines), SETTINGS)
    assert of_type(gone, DeleteCanary) and not [e for e in events(gone) if e[0] == "OrphanRemoved"]
