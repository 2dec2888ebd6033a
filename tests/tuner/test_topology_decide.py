"""The disaggregation recommendation in the loop: when it is due, what decide writes, a disaggregated service.

Pure like the other decide tests: snapshots are built from the API models; the twin is a real
(small) fit; the recommendation arrives in the snapshot as observing would deliver it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from chunkpilot.engine.sim.offline import SLO
from chunkpilot.tuner.decide.lifecycle import TunerSettings
from chunkpilot.tuner.decide.plan import CreateTrial, Plan
from chunkpilot.tuner.decide.step import decide
from chunkpilot.tuner.observe.recommendation import recommend_due, request
from chunkpilot.tuner.observe.snapshot import Reading, Snapshot, TwinReading
from chunkpilot.tuner.observe.twin import TwinObserver, refit_trials
from chunkpilot.tuner.policy import TWIN_INFEASIBLE_MIN_TRIALS
from chunkpilot.tuner.space import TunedConfig
from chunkpilot.tuner.topology.layouts import Layout, LayoutCapacity, Pool, Recommendation, TopologySearch
from chunkpilot.tuner.topology.recommend import RecommendationResult, RecommendRequest, recommend
from chunkpilot.tuner.topology.simulate import twin_evaluator
from chunkpilot.tuner.twin import Twin, TwinFit
from chunkpilot.tuner.twin.online import Calibration, TwinBudget
from chunkpilot.tuner.twin.search import Candidate

from chunkpilot.api import TopologySpec, TrialPhase, TrialTwin, TrialVerdict, TuningTrial, TwinState
from chunkpilot.testing.deployments import a_ready_state
from chunkpilot.testing.services import a_condition, a_service_body
from chunkpilot.testing.trials import missed_trials, with_status
from chunkpilot.testing.tuner import a_fitted_reading, a_measurement, a_snapshot, condition, events

SETTINGS = TunerSettings(rollout_timeout_s=120)
READY = a_ready_state()
BEST = Layout(Pool(1, 8192, 128), Pool(3, 2048, 128))
#: The stable track on its four replicas: 12 req/s, ITL and TTFT over their 30 and 400 ms targets.
STABLE_VIOLATING = Reading(a_measurement("stable", 40.0, 600.0, window="2m", request_rate=12.0, replicas=4))


def service_body(replicas: int = 4, **spec: Any) -> dict[str, Any]:
    """The chat service on ``replicas`` with ITL p99 30 ms and TTFT p95 400 ms, twelve trials at most."""
    return a_service_body(replicas=replicas, spec=spec, itl_ms=30, ttft_ms=400, autotune={"maxTrials": 12})


#: Six trials of a minute each: small budgets miss TTFT, large ones ITL.
INFEASIBLE = missed_trials(
    [
        (320, 26.0, 900.0),
        (512, 29.0, 610.0),
        (1024, 38.0, 450.0),
        (2048, 52.0, 380.0),
        (384, 27.0, 720.0),
        (768, 33.0, 520.0),
    ],
    ran=timedelta(minutes=1),
)


@pytest.fixture(scope="module")
def calibration(sim_twin: Callable[[int], tuple[TwinFit, Twin]]) -> Calibration:
    """A real fit (the simulator's steps on its datasheet H100)."""
    fit, twin = sim_twin(128)
    incumbent_ = Candidate(TunedConfig(2048, 128), 0.4, tokens_s=100.0)
    return Calibration("k", fit, twin, (40.0, 600.0), 0.05, (), incumbent_)


def snapshot(body: dict[str, Any], trials: tuple[TuningTrial, ...], twin: TwinReading) -> Snapshot:
    """A step of ``body``: stable ready and violating both SLOs, ``twin`` as observed."""
    return a_snapshot(body, trials, stable=READY, prometheus=True, stable_reading=STABLE_VIOLATING, twin=twin)


def fitted(calibration: Calibration, **fields: Any) -> TwinReading:
    """3 req/s live, stable measured at 40 and 600 ms."""
    values: dict[str, Any] = {"live_rate_req_s": 3.0, "measured_ms": (40.0, 600.0), **fields}
    return a_fitted_reading(calibration, **values)


def paying() -> RecommendationResult:
    search = TopologySearch(
        (
            LayoutCapacity(BEST, 12.4, itl_ms=24.0, ttft_ms=350.0),
            LayoutCapacity(Layout(Pool(2, 8192, 128), Pool(2, 2048, 128)), 7.0, 22.0, 390.0),
        ),
        evaluations=2,
        cpu_seconds=11.0,
    )
    return RecommendationResult("k", Recommendation(4, 1.6, search, 25.0, 1.0, 140.0))


#: How the service's condition and event word :func:`paying`'s recommendation.
PAYING_TEXT = (
    "1 prefill + 3 decode replicas (prefill maxNumBatchedTokens 8192, decode maxNumSeqs 128) meet "
    "ITL p99 ≤ 30 ms and TTFT p95 ≤ 400 ms up to 12.4 req/s on the twin; colocated reaches "
    "1.6 req/s on 4 replicas"
)


def infeasible(plan: Plan) -> tuple[str, str, str]:
    """The condition SLOInfeasible the plan sets (its status, reason and message): True, for reason
    SLOInfeasible."""
    found = condition(plan, "SLOInfeasible")
    assert found is not None and found[:2] == ("True", "SLOInfeasible"), found
    return found


def test_an_infeasible_service_gets_the_quantified_recommendation_in_its_condition_event_and_status(
    calibration: Calibration,
) -> None:
    body = service_body()
    plan = decide(snapshot(body, INFEASIBLE, fitted(calibration, recommendation=paying())), SETTINGS)
    found = infeasible(plan)
    assert "no configuration of 6 measured meets both SLOs" in found[2] and PAYING_TEXT in found[2]
    assert any(r == "TopologyRecommendation" and PAYING_TEXT in m for r, m in events(plan))
    status = plan.status["recommendation"]
    assert status["key"] == "k" and status["meetsSlo"] is True
    assert (status["prefillReplicas"], status["decodeReplicas"]) == (1, 3)
    assert status["prefillMaxNumBatchedTokens"] == 8192 and status["decodeMaxNumSeqs"] == 128
    assert status["capacityReqS"] == 12.4 and status["colocatedCapacityReqS"] == 1.6
    assert not [a for a in plan.actions if isinstance(a, CreateTrial)]
    # The next step (SLOInfeasible already True, the recommendation recorded for this fit): the same
    # message from the status, no new Event, nothing recomputed.
    body["status"] = {"recommendation": status, "conditions": [_condition(found)]}
    later_snap = snapshot(body, INFEASIBLE, fitted(calibration))
    later = decide(later_snap, SETTINGS)
    again = condition(later, "SLOInfeasible")
    assert again is not None and PAYING_TEXT in again[2]
    assert not [r for r, _ in events(later) if r in ("TopologyRecommendation", "SLOInfeasible")]
    assert not recommend_due(later_snap, "k")
    assert recommend_due(later_snap, "k2")  # refitted: evaluated again
    # spec.replicas edited since: the 1 + 3 layout is of four replicas, the service has six.
    body["spec"]["replicas"] = 6
    assert recommend_due(snapshot(body, INFEASIBLE, fitted(calibration)), "k")
    # A one-replica service's layout is 1 + 1: not evaluated again and again.
    one = {**status, "prefillReplicas": 1, "decodeReplicas": 1}
    body["spec"]["replicas"] = 1
    body["status"] = {"recommendation": one, "conditions": [_condition(found)]}
    assert not recommend_due(snapshot(body, INFEASIBLE, fitted(calibration)), "k")


def _condition(found: tuple[str, str, str]) -> dict[str, Any]:
    return a_condition("SLOInfeasible", *found)


def test_before_the_recommendation_the_condition_says_it_is_being_evaluated(
    calibration: Calibration,
) -> None:
    body = service_body()
    snap = snapshot(body, INFEASIBLE, fitted(calibration))
    assert not recommend_due(snap, "k")  # SLOInfeasible not True yet
    plan = decide(snap, SETTINGS)
    found = condition(plan, "SLOInfeasible")
    assert found is not None and found[0] == "True"
    assert found[2].endswith("Evaluating prefill/decode disaggregation on the twin.")
    assert "recommendation" not in plan.status
    body["status"] = {"conditions": [_condition(found)]}
    assert recommend_due(snapshot(body, INFEASIBLE, fitted(calibration)), "k")


def test_no_layout_meeting_the_slos_and_a_failed_evaluation_are_both_said(calibration: Calibration) -> None:
    none = TopologySearch((LayoutCapacity(BEST, 0.0, 41.0, 700.0),), 1, 3.0)
    result = RecommendationResult("k", Recommendation(4, 1.6, none, 25.0, 1.0, 140.0))
    plan = decide(snapshot(service_body(), INFEASIBLE, fitted(calibration, recommendation=result)), SETTINGS)
    found = condition(plan, "SLOInfeasible")
    assert found is not None and "Disaggregation would not help" in found[2]
    assert plan.status["recommendation"]["meetsSlo"] is False
    failed = RecommendationResult("k", error="the twin's worker process failed")
    plan = decide(snapshot(service_body(), INFEASIBLE, fitted(calibration, recommendation=failed)), SETTINGS)
    message = "no disaggregation recommendation: the twin's worker process failed"
    assert plan.status["recommendation"]["message"] == message
    assert ("TopologyRecommendation", message) in events(plan)


def test_recommend_evaluates_every_split_of_the_services_replicas_on_the_twin(
    calibration: Calibration,
) -> None:
    body = service_body()
    snap = snapshot(body, INFEASIBLE, fitted(calibration))
    job = request(snap, "k", calibration, SLO(30.0, 0.99, 400.0, 0.95))
    assert job.replicas == 4 and job.decode_seqs == 128 and job.decode_budget == 2048
    assert (job.kv_bandwidth_gbps, job.kv_latency_ms) == (25.0, 1.0)
    asked: list[Layout] = []

    def factory(_job: RecommendRequest) -> Any:
        def evaluate(layout: Layout) -> LayoutCapacity:
            asked.append(layout)
            return LayoutCapacity(layout, 3.0 * layout.decode.replicas)

        return evaluate

    found = recommend(RecommendRequest(**{**job.__dict__, "colocated_req_s": 0.5}), factory)
    assert found.colocated_req_s == 2.0  # 4 replicas x 0.5
    assert {(a.prefill.replicas, a.decode.replicas) for a in asked} == {(1, 3), (2, 2), (3, 1)}
    assert found.best is not None and found.best.layout.decode.replicas == 3 and found.pays
    prompts = [r.prompt_tokens for r in calibration.twin.workload.requests]
    assert found.kv_mb_per_request == pytest.approx(131072 * sum(prompts) / len(prompts) / 1e6)


def test_the_simulators_disaggregated_mode_evaluates_a_layout_on_the_twin(calibration: Calibration) -> None:
    slo = SLO(15.0, 0.99, 300.0, 0.95)
    evaluate = twin_evaluator(calibration.twin, slo, 25.0, 1.0, requests_per_replica=80)
    result = evaluate(Layout(Pool(1, 8192, 64), Pool(1, 1024, 64)))
    assert result.feasible and result.capacity_req_s > 0
    assert result.itl_ms <= 15.0 and result.ttft_ms <= 300.0
    assert result.kv_transfer_ms > 1.0  # the KV hop: bytes / bandwidth + the 1 ms latency


def test_a_disaggregated_service_runs_no_colocated_canary_and_says_why(calibration: Calibration) -> None:
    topology = {
        "mode": "disaggregated",
        "prefill": {"replicas": 1, "maxNumBatchedTokens": 8192},
        "decode": {"replicas": 3},
    }
    body = service_body(topology=topology)
    plan = decide(snapshot(body, (), fitted(calibration)), SETTINGS)
    found = condition(plan, "Tuning")
    assert found is not None and found[:2] == ("False", "Disaggregated")
    assert "(1 prefill + 3 decode replicas)" in found[2] and "no colocated canaries" in found[2]
    assert not [a for a in plan.actions if isinstance(a, CreateTrial)]
    assert not recommend_due(snapshot(body, INFEASIBLE, fitted(calibration)), "k")


@pytest.mark.slow
def test_the_observer_computes_it_in_the_twins_worker_process(calibration: Calibration) -> None:
    budget = TwinBudget(cpu_s=0.5)  # CHUNKPILOT_TWIN_CPU_SECONDS=0.5: one layout (the first always runs)
    body = service_body(replicas=2)
    body["status"] = {
        "conditions": [
            _condition(("True", "SLOInfeasible", "no configuration of 6 measured meets both SLOs"))
        ]
    }
    snap = snapshot(body, INFEASIBLE, fitted(calibration))
    assert recommend_due(snap, "k")
    # The worker process, as in the operator (the job must pickle).
    observer = TwinObserver(None, budget=budget)
    try:
        result = asyncio.run(observer.recommend(snap, "k", calibration))
    finally:
        observer.close()
    assert result.error is None and result.recommendation is not None
    found = result.recommendation
    assert found.replicas == 2 and found.search.evaluations >= 1
    assert found.best is not None and found.best.layout.replicas == 2
    assert found.colocated_req_s >= 0 and found.kv_bandwidth_gbps == 25.0
    plan = decide(snapshot(body, INFEASIBLE, fitted(calibration, recommendation=result)), SETTINGS)
    assert plan.status["recommendation"]["key"] == "k"
    infeasible = condition(plan, "SLOInfeasible")
    assert infeasible is not None and "1 prefill + 1 decode replicas" in infeasible[2]


def checked(trial: TuningTrial, error: float | None, predicted_ttft_ms: float = 700.0) -> TuningTrial:
    """``trial`` with the twin's check of its canary recorded at its verdict (measured TTFT 600 ms)."""
    twin = TrialTwin(
        capacity_req_s=0.1,
        error=error,
        tolerance=0.15,
        predicted_itl_ms=40.0,
        measured_itl_ms=40.0,
        predicted_ttft_ms=predicted_ttft_ms,
        measured_ttft_ms=600.0,
    )
    return with_status(trial, twin=twin)


def pruned_trial(trial: TuningTrial) -> TuningTrial:
    return with_status(trial, phase=TrialPhase.PRUNED, verdict=TrialVerdict.PRUNED)


#: Two canaries that missed (one the TTFT target, one the ITL target), both as the twin predicted.
CONFIRMED = (checked(INFEASIBLE[0], 0.05), checked(INFEASIBLE[3], 0.1))


def created(plan: Plan) -> list[CreateTrial]:
    return [a for a in plan.actions if isinstance(a, CreateTrial)]


def test_a_calibrated_twin_that_predicts_no_colocated_config_meets_the_slos_ends_tuning_after_two_canaries(
    calibration: Calibration,
) -> None:
    # The twin's best colocated capacity (the stable config's 0.4 req/s per replica; nothing ranked
    # higher) is below the live 3 req/s per replica, its error on stable is 5 %.
    assert len(CONFIRMED) == TWIN_INFEASIBLE_MIN_TRIALS
    body = service_body()
    plan = decide(snapshot(body, CONFIRMED, fitted(calibration, ranked=True)), SETTINGS)
    found = infeasible(plan)
    evidence = (
        "the twin predicts at most 0.4 req/s per replica within the SLOs for any colocated configuration, "
        "the live load is 3 req/s per replica; 2 canaries confirmed it (the twin's error 10% on trial 4's "
        "canary, 5% on the stable track; tolerance 15%)"
    )
    assert "no configuration of 2 measured meets both SLOs" in found[2] and evidence in found[2]
    assert found[2].endswith("Evaluating prefill/decode disaggregation on the twin.")
    assert [m for r, m in events(plan) if r == "SLOInfeasible"] == [found[2]]
    tuning = condition(plan, "Tuning")
    assert tuning is not None and tuning[:2] == ("False", "SLOInfeasible") and evidence in tuning[2]
    assert not created(plan)
    # The next step (the ranking recorded on the service): the recommendation is due (SLOInfeasible
    # is True), and arrives as today.
    body["status"] = {"conditions": [_condition(found)], "twin": plan.status["twin"]}
    later_snap = snapshot(body, CONFIRMED, fitted(calibration, recommendation=paying()))
    assert recommend_due(later_snap, "k")
    later = decide(later_snap, SETTINGS)
    again = condition(later, "SLOInfeasible")
    assert again is not None and again[0] == "True" and evidence in again[2]
    assert "1 prefill + 3 decode replicas" in again[2] and later.status["recommendation"]["meetsSlo"]
    assert [r for r, _ in events(later) if r == "SLOInfeasible"] == []  # already said
    assert any(r == "TopologyRecommendation" for r, _ in events(later)) and not created(later)


def test_without_a_calibrated_twin_two_missed_canaries_are_not_enough(calibration: Calibration) -> None:
    def stops(trials: tuple[TuningTrial, ...], twin: TwinReading) -> bool:
        plan = decide(snapshot(service_body(), trials, twin), SETTINGS)
        found = condition(plan, "SLOInfeasible")
        assert found is not None
        assert (found[0] == "True") == (not created(plan))
        return found[0] == "True"

    assert stops(CONFIRMED, fitted(calibration, ranked=True))
    unavailable = TwinReading(TwinState.UNAVAILABLE, "no step telemetry")
    assert not stops(CONFIRMED, unavailable)  # today's rule: six measured trials
    assert stops(INFEASIBLE, unavailable)
    contradicted = (CONFIRMED[0], checked(INFEASIBLE[3], 0.4))  # the twin predicted 700 ms, 600 measured
    assert not stops(contradicted, fitted(calibration, ranked=True))
    worse = (CONFIRMED[0], checked(INFEASIBLE[3], 0.4, predicted_ttft_ms=500.0))  # measured worse
    assert stops(worse, fitted(calibration, ranked=True))
    unchecked = (CONFIRMED[0], checked(INFEASIBLE[3], None))  # the newest it checked is trial 1's
    assert stops(unchecked, fitted(calibration, ranked=True))
    neither = (checked(INFEASIBLE[0], None), checked(INFEASIBLE[3], None))  # no canary checked
    assert not stops(neither, fitted(calibration, ranked=True))
    # A pruned canary's short window is no check of the twin: its error neither confirms nor contradicts.
    pruned = pruned_trial(checked(INFEASIBLE[3], 0.4))
    assert stops((CONFIRMED[0], pruned), fitted(calibration, ranked=True))
    assert not stops((checked(INFEASIBLE[0], 0.3), pruned), fitted(calibration, ranked=True))
    off = Calibration("k", calibration.fit, calibration.twin, (40.0, 600.0), 0.3, (), calibration.incumbent)
    assert stops(CONFIRMED, fitted(off, ranked=True))  # the stable track's error: reported only
    assert not stops(CONFIRMED, fitted(calibration, ranked=True, live_rate_req_s=0.3))  # 0.4 serves it
    assert not stops(CONFIRMED[:1], fitted(calibration, ranked=True))


def test_an_infeasibility_declared_on_the_twin_stands_through_a_step_without_its_ranking(
    calibration: Calibration,
) -> None:
    body = service_body()
    first = decide(snapshot(body, CONFIRMED, fitted(calibration, ranked=True)), SETTINGS)
    found = condition(first, "SLOInfeasible")
    assert found is not None and found[0] == "True"
    body["status"] = {"conditions": [_condition(found)]}
    gap = decide(snapshot(body, CONFIRMED, TwinReading()), SETTINGS)  # the twin was not read this step
    assert condition(gap, "SLOInfeasible") is None and not created(gap)  # unchanged, nothing started
    assert not [r for r, _ in events(gap) if r == "SLOInfeasible"]
    # A ranking that no longer predicts it (the live load fell below the twin's 0.4 req/s) lifts it.
    lifted = decide(
        snapshot(body, CONFIRMED, fitted(calibration, ranked=True, live_rate_req_s=0.3)), SETTINGS
    )
    again = condition(lifted, "SLOInfeasible")
    assert again is not None and again[:2] == ("False", "Feasible") and created(lifted)


def test_a_topology_trial_is_no_check_of_the_colocated_twin(calibration: Calibration) -> None:
    """Its twin block checks the recommendation: the colocated twin's bound ignores it, and so does
    the refit (its pools run other knobs and roles than the twin models)."""
    base = checked(INFEASIBLE[3], 0.5)  # would contradict the twin (predicted 700 ms, measured 600)
    assert base.status is not None
    pools = {"mode": "disaggregated", "prefill": {"replicas": 1}, "decode": {"replicas": 1}}
    spec = base.spec.model_copy(update={"number": 9, "topology": TopologySpec.model_validate(pools)})
    topology = base.model_copy(update={"spec": spec})
    plan = decide(
        snapshot(service_body(), (*CONFIRMED, topology), fitted(calibration, ranked=True)), SETTINGS
    )
    found = condition(plan, "SLOInfeasible")
    assert found is not None and found[0] == "True", found
    assert [t.spec.number for t in refit_trials((*CONFIRMED, topology))] == [4, 1]
