"""The planner in the tuning loop: ``status.scaling``, its Events and gauges, in Advise and Auto."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from chunkpilot.operator.builders import build_deployment
from chunkpilot.tuner.decide.lifecycle import TunerSettings
from chunkpilot.tuner.decide.plan import Log, Plan, ScalingGauges
from chunkpilot.tuner.decide.scaling import RECORD_EVERY_S, colocated_proposal
from chunkpilot.tuner.decide.step import decide
from chunkpilot.tuner.measure import PoolsMeasurement
from chunkpilot.tuner.observe import twin as observe_twin
from chunkpilot.tuner.observe.snapshot import Reading, TwinReading
from chunkpilot.tuner.observe.twin import TwinObserver
from chunkpilot.tuner.topology.pools import PoolCheckRequest
from chunkpilot.tuner.topology.sizing import PoolCapacities
from chunkpilot.tuner.twin import Twin, TwinFit
from chunkpilot.tuner.twin.online import Calibration

from chunkpilot.testing.deployments import a_ready_state
from chunkpilot.testing.kube import merge_into
from chunkpilot.testing.services import NOW, a_service, a_service_body
from chunkpilot.testing.tuner import a_measurement, a_snapshot, events, of_type

SETTINGS = TunerSettings(rollout_timeout_s=120)
#: The twin's word on the stable config: 2 req/s per replica, within 10%.
TWIN = {"state": "Fitted", "capacityReqS": 2.0, "error": 0.1}


def body(mode: str = "Advise", replicas: int = 2, **status: Any) -> dict[str, Any]:
    """The chat service on ``replicas`` (ITL p99 50 ms, TTFT p95 600 ms), sized by the planner."""
    scaling = {"mode": mode, "minReplicas": 1, "maxReplicas": 6}
    return a_service_body(
        replicas=replicas,
        itl_ms=50,
        ttft_ms=600,
        spec={"scaling": scaling},
        status={"twin": TWIN, **status},
    )


def said(plan: Plan) -> list[tuple[str, str]]:
    """The planner's Events of the step (the tuner's own, a trial starting, left out)."""
    return [(r, m) for r, m in events(plan) if r in ("ScalingAdvised", "ScaledUp", "ScaledDown")]


def step(
    service: dict[str, Any],
    rate: float = 8.0,
    itl_ms: float = 30.0,
    now: Any = NOW,
    replicas: int = 2,
    twin: TwinReading | None = None,
    canary_pods: tuple[dict[str, Any], ...] = (),
    stable_pods: tuple[dict[str, Any], ...] = (),
    in_flight_change: float | None = None,
) -> Plan:
    """A step at ``rate`` req/s over the ``replicas`` stable replicas running, ITL p99 ``itl_ms``
    (``in_flight_change``: the growth of the requests in their engines over the minute's window)."""
    stable = a_measurement("stable", itl_ms, 300.0, request_rate=rate, replicas=replicas, time=now)
    stable = replace(stable, in_flight_change=in_flight_change)
    snap = a_snapshot(
        service,
        stable=a_ready_state(replicas),
        prometheus=True,
        stable_reading=Reading(stable),
        now=now,
        twin=twin or TwinReading(),
        canary_pods=canary_pods,
        stable_pods=stable_pods,
    )
    return decide(snap, SETTINGS)


def test_advise_publishes_the_replicas_the_live_load_needs_and_says_it_would_scale() -> None:
    plan = step(body())
    scaling = plan.status["scaling"]
    # 8 req/s plus 10% headroom over 1.8 req/s per replica (2 less its 10% error): 5 replicas.
    assert scaling["mode"] == "Advise" and scaling["desiredReplicas"] == 5
    assert scaling["liveRateReqS"] == 8.0 and scaling["plannedRateReqS"] == 8.8
    assert (scaling["capacityLowReqS"], scaling["capacityPerReplicaReqS"], scaling["capacityHighReqS"]) == (
        1.8,
        2.0,
        2.2,
    )
    assert [(r, m[:21]) for r, m in said(plan)] == [("ScalingAdvised", "would scale 2 -> 5: 5")]
    assert of_type(plan, ScalingGauges) == [ScalingGauges(5, 1.8)]
    assert len(scaling["recommendations"]) == 1 and scaling["lastScaleTime"] is not None


def test_a_burst_piling_up_in_the_engines_is_planned_for_as_it_arrived_not_as_it_completed() -> None:
    """Two replicas complete what they serve, 4 req/s, while 240 more requests pile up over the
    minute: 8 req/s arrived, so 5 replicas as at 8 req/s, not 3."""
    plan = step(body(), rate=4.0, in_flight_change=240.0)
    scaling = plan.status["scaling"]
    assert scaling["liveRateReqS"] == 8.0 and scaling["desiredReplicas"] == 5
    assert step(body(), rate=4.0).status["scaling"]["desiredReplicas"] == 3  # on completions alone


def test_the_event_and_status_carry_the_twins_quantiles_at_both_counts() -> None:
    forecast = {2: (71.0, 900.0), 5: (38.0, 420.0)}
    plan = step(body(), twin=TwinReading(forecast=forecast))
    assert said(plan) == [
        (
            "ScalingAdvised",
            "would scale 2 -> 5: predicted ITL p99 71 ms and TTFT p95 900 ms at 2 replicas, 38 ms and 420 ms"
            " at 5 (targets 50 and 600 ms)",
        )
    ]
    scaling = plan.status["scaling"]
    assert (scaling["predictedItlMs"], scaling["predictedTtftMs"]) == (38.0, 420.0)


def test_a_canary_pods_start_up_is_recorded_and_counts_its_share_of_the_traffic() -> None:
    started = {
        "status": {
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-12-05T10:00:00Z"},
                {"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-05T10:02:30Z"},
            ]
        }
    }
    scaling = step(body(), canary_pods=(started,)).status["scaling"]
    assert scaling["startupSeconds"] == 150.0
    assert scaling["liveRateReqS"] == 12.0  # 4 req/s per stable replica over the two and the canary


def started(at: Any, seconds: float) -> dict[str, Any]:
    """An engine pod scheduled at ``at`` and Ready ``seconds`` later."""
    ready = at + timedelta(seconds=seconds)
    return {
        "status": {
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": at.isoformat()},
                {"type": "Ready", "status": "True", "lastTransitionTime": ready.isoformat()},
            ]
        }
    }


def test_in_auto_the_start_up_of_the_stable_pods_the_last_scale_started_is_recorded() -> None:
    first = step(body("Auto"), stable_pods=(started(NOW - timedelta(hours=1), 600.0),))
    assert first.status["scaling"]["startupSeconds"] == 600.0  # the service's first pods: a cold start
    scaled = first.status["scaling"]  # 2 -> 5 at NOW
    later = NOW + timedelta(minutes=5)
    pods = (started(NOW - timedelta(hours=1), 600.0), started(NOW + timedelta(seconds=5), 95.0))
    scaling = step(body("Auto", scaling=scaled), now=later, stable_pods=pods).status["scaling"]
    assert scaling["startupSeconds"] == 95.0  # the pods the scale started, not the first ones
    advised = step(body("Advise", scaling=scaled), now=later, stable_pods=pods).status["scaling"]
    assert advised["startupSeconds"] == 600.0  # Advise starts none: every pod counts


def test_a_pools_start_up_is_measured_on_its_pods_and_sets_how_long_a_miss_is_not_held() -> None:
    pods = (started(NOW - timedelta(hours=1), 400.0),)
    first = pools_step(pools_body("Auto"), stable_pods=pods).status["scaling"]
    assert first["startupSeconds"] == 400.0
    # Five minutes after both pools scaled, a missed ITL is the backlog still: 400 s + two windows.
    later = pools_step(
        pools_body("Auto", prefill=2, decode=6, scaling=first),
        itl_ms=70.0,
        replicas=(2, 6),
        now=NOW + timedelta(minutes=5),
    ).status["scaling"]
    assert "capacityCapReqS" not in later["pools"][1]
    assert later["startupSeconds"] == 400.0


def test_an_unchanged_decision_is_recorded_every_half_minute_and_says_nothing() -> None:
    first = step(body())
    recorded = {"scaling": first.status["scaling"]}
    soon = step(body(**recorded), now=NOW + timedelta(seconds=RECORD_EVERY_S / 2))
    assert "scaling" not in soon.status and not said(soon)
    assert of_type(soon, ScalingGauges) == [ScalingGauges(5, 1.8)]  # the gauges stay current
    later = step(body(**recorded), now=NOW + timedelta(seconds=RECORD_EVERY_S))
    assert len(later.status["scaling"]["recommendations"]) == 2 and not said(later)


def test_a_rising_rate_is_projected_past_half_the_window_it_is_averaged_over() -> None:
    # Recorded at 4, then 6 req/s two minutes apart: +1 req/s a minute.
    first = step(body(), rate=4.0, now=NOW - timedelta(seconds=240))
    second = step(body(scaling=first.status["scaling"]), rate=6.0, now=NOW - timedelta(seconds=120))
    rising = step(body(scaling=second.status["scaling"]), rate=8.0)
    # The stable track's rate is averaged over a minute: the rate of 30 s ago, projected 120 s (the
    # start-up unmeasured) + 30 s ahead.
    assert "its trend 10.5 req/s in 150 s" in rising.status["scaling"]["reason"]
    assert rising.status["scaling"]["plannedRateReqS"] == pytest.approx(10.5 * 1.1)


def test_in_auto_a_lighter_load_scales_down_only_after_the_scale_down_window() -> None:
    up = step(body("Auto"))
    assert up.status["scaling"]["desiredReplicas"] == 5
    assert [r for r, _ in said(up)] == ["ScaledUp"]
    running = {"scaling": up.status["scaling"]}
    # Now on 5 replicas (the operator runs the decision) at 2 req/s: 2 replicas would do.
    light = step(body("Auto", **running), rate=2.0, now=NOW + timedelta(seconds=60), replicas=5)
    assert light.status["scaling"]["desiredReplicas"] == 5 and not said(light)
    assert "the highest recommendation of the scale-down window" in light.status["scaling"]["reason"]
    held = {"scaling": light.status["scaling"]}
    after = step(body("Auto", **held), rate=2.0, now=NOW + timedelta(seconds=400), replicas=5)
    assert after.status["scaling"]["desiredReplicas"] == 2
    assert [r for r, _ in said(after)] == ["ScaledDown"]


def test_turning_auto_on_after_advise_scales_from_what_ran_and_says_so() -> None:
    advised = step(body()).status["scaling"]
    assert advised["desiredReplicas"] == 5 and advised["mode"] == "Advise"
    auto = step(body("Auto", scaling=advised), now=NOW + timedelta(seconds=5))
    assert [(r, m[:18]) for r, m in said(auto)] == [("ScaledUp", "scaling 2 -> 5: 5 ")]
    assert auto.status["scaling"]["mode"] == "Auto" and auto.status["scaling"]["lastScaleTime"] is not None


def test_a_missed_slo_corrects_the_twins_capacity_at_once_and_until_it_refits() -> None:
    # ITL p99 70 ms against 50 at 4 req/s per replica: one replica serves at most 3.8.
    plan = step(body(), rate=8.0, itl_ms=70.0)
    scaling = plan.status["scaling"]
    assert "the live service showed" not in scaling["reason"]  # the twin says less: 1.8
    optimistic = {"state": "Fitted", "capacityReqS": 6.0, "error": 0.1, "configHash": "a"}
    plan = step(body(twin=optimistic), rate=8.0, itl_ms=70.0)
    scaling = plan.status["scaling"]
    assert scaling["capacityLowReqS"] == 3.8 and scaling["desiredReplicas"] == 3  # 8.8 / 3.8
    assert "the live service showed 3.8 req/s per replica" in scaling["reason"]
    assert scaling["capacityCapReqS"] == 3.8

    def later(minutes: int, twin: dict[str, Any], rate: float, replicas: int) -> dict[str, Any]:
        nxt = step(
            body(twin=twin, scaling=scaling),
            rate=rate,
            now=NOW + timedelta(minutes=minutes),
            replicas=replicas,
        )
        found: dict[str, Any] = nxt.status["scaling"]
        return found

    # Met at 2.7 req/s per replica: the cap stands (the twin alone would plan with 5.4 again).
    scaling = later(10, optimistic, 8.0, 3)
    assert scaling["capacityLowReqS"] == 3.8 and scaling["capacityCapReqS"] == 3.8
    # Met at 4.5 per replica: that much is shown, the cap rises.
    scaling = later(20, optimistic, 9.0, 2)
    assert scaling["capacityLowReqS"] == 4.5
    # A new fit starts from the twin again.
    scaling = later(30, {**optimistic, "configHash": "b"}, 8.0, 2)
    assert scaling["capacityLowReqS"] == 5.4 and scaling.get("capacityCapReqS") is None


def test_a_miss_while_new_replicas_catch_up_is_not_held_against_the_twin() -> None:
    twin_optimistic = {"state": "Fitted", "capacityReqS": 6.0, "error": 0.1}
    a_minute_ago = (NOW - timedelta(seconds=60)).isoformat()
    scaled = {"mode": "Advise", "desiredReplicas": 2, "lastScaleTime": a_minute_ago}
    plan = step(body(twin=twin_optimistic, scaling=scaled), rate=8.0, itl_ms=70.0)
    assert "the live service showed" not in plan.status["scaling"]["reason"]
    long_ago = {**scaled, "lastScaleTime": (NOW - timedelta(seconds=600)).isoformat()}
    plan = step(body(twin=twin_optimistic, scaling=long_ago), rate=8.0, itl_ms=70.0)
    assert "the live service showed 3.8 req/s per replica" in plan.status["scaling"]["reason"]


def test_the_sustained_capacity_and_its_low_end_are_planned_with_when_observed() -> None:
    plan = step(body(), twin=TwinReading(planning=(3.0, 2.0)))
    scaling = plan.status["scaling"]
    assert (scaling["capacityPerReplicaReqS"], scaling["capacityLowReqS"]) == (3.0, 2.0)
    assert scaling["desiredReplicas"] == 5  # 8.8 req/s over 2.0 each


def test_without_the_twins_capacity_it_waits_and_says_why_and_off_removes_the_decision() -> None:
    waiting = step(body(twin={"state": "Waiting", "message": "too few steps"}))
    assert waiting.status["scaling"]["reason"] == "waiting: no capacity from the twin yet"
    assert waiting.status["scaling"]["desiredReplicas"] is None and not said(waiting)
    off = step(body("Off", scaling={"mode": "Advise", "desiredReplicas": 5}))
    assert off.status["scaling"] is None and of_type(off, ScalingGauges) == [ScalingGauges(None, None)]


def test_observing_forecasts_the_quantiles_at_the_counts_the_planner_may_name(
    sim_twin: Callable[[int], tuple[TwinFit, Twin]],
) -> None:
    fit, twin = sim_twin(128)
    calibration = Calibration("k", fit, twin, (20.0, 300.0), 0.05)
    stable = a_measurement("stable", 30.0, 300.0, request_rate=8.0, replicas=2)
    snap = a_snapshot(body(), stable=a_ready_state(2), prometheus=True, stable_reading=Reading(stable))
    observer = TwinObserver(None, inline=True)
    forecast = asyncio.run(observer._forecast(snap, TwinReading(calibration=calibration)))
    assert set(forecast) == {2, 5}  # running, and what the twin's capacity needs for 8 req/s
    (itl_2, ttft_2), (itl_5, ttft_5) = forecast[2], forecast[5]
    assert 0 < itl_5 <= itl_2 and 0 < ttft_5 <= ttft_2  # 1.6 req/s per replica against 4
    # On the same fit the forecast stands; a count it lacks is added, the rest kept.
    later = replace(snap, now=NOW + timedelta(seconds=10))
    assert asyncio.run(observer._forecast(later, TwinReading(calibration=calibration))) is forecast
    decided = body(scaling={"mode": "Advise", "desiredReplicas": 3})
    asked = replace(later, isvc=a_snapshot(decided).isvc, status=a_snapshot(decided).status)
    more = asyncio.run(observer._forecast(asked, TwinReading(calibration=calibration)))
    assert set(more) == {2, 3, 5} and more[2] == forecast[2] and more[5] == forecast[5]


def test_observing_computes_the_sustained_capacity_once_per_fit(
    sim_twin: Callable[[int], tuple[TwinFit, Twin]],
) -> None:
    fit, twin = sim_twin(128)
    calibration = Calibration("k", fit, twin, (20.0, 300.0), 0.2)
    snap = a_snapshot(body(), stable=a_ready_state(2), prometheus=True)
    observer = TwinObserver(None, inline=True)
    nominal, low = asyncio.run(observer._planning(snap, TwinReading(calibration=calibration))) or (0, 0)
    assert 0 < low < nominal  # latencies 20% longer would be met at a lower rate
    again = asyncio.run(observer._planning(snap, TwinReading(calibration=calibration)))
    assert again == (nominal, low)


# --------------------------------------------------------------------------- disaggregated pools

#: One prefill replica serves 6 req/s, one decode replica 2 (the twin's, unmeasured error: 15%).
SIZES = PoolCapacities("pools-8192x64-2048x64", 6.0, 2.0, ())


def pools_body(mode: str = "Advise", prefill: int = 1, decode: int = 1, **status: Any) -> dict[str, Any]:
    """The chat service on ``prefill`` + ``decode`` replicas, sized by the planner (at most 8 a pool)."""
    topology = {
        "mode": "disaggregated",
        "prefill": {"replicas": prefill, "maxNumBatchedTokens": 8192, "maxNumSeqs": 64},
        "decode": {"replicas": decode, "maxNumBatchedTokens": 2048, "maxNumSeqs": 64},
    }
    return a_service_body(
        itl_ms=50,
        ttft_ms=600,
        spec={"scaling": {"mode": mode, "minReplicas": 1, "maxReplicas": 8}, "topology": topology},
        status=status,
    )


def pools_step(
    service: dict[str, Any],
    rate: float = 8.0,
    *,
    itl_ms: float = 30.0,
    ttft_ms: float = 200.0,
    replicas: tuple[int, int] = (1, 1),
    now: Any = NOW,
    sizes: PoolCapacities | None = SIZES,
    stable_pods: tuple[dict[str, Any], ...] = (),
) -> Plan:
    """A step at ``rate`` req/s through the pools (ITL p99 ``itl_ms``; TTFT p95 ``ttft_ms`` in all,
    a quarter of it the decode pool's admission)."""
    prefill = a_measurement("stable", 5.0, ttft_ms * 0.75, request_rate=rate, replicas=replicas[0], time=now)
    decode = a_measurement(
        "stable", itl_ms, ttft_ms * 0.25, request_rate=rate, replicas=replicas[1], time=now
    )
    snap = a_snapshot(
        service,
        prometheus=True,
        pools_reading=Reading(PoolsMeasurement(prefill, decode)),
        now=now,
        twin=TwinReading(pool_capacities=sizes),
        stable_pods=stable_pods,
    )
    return decide(snap, SETTINGS)


def test_advise_sizes_each_pool_on_its_own_capacity_and_says_it_would_scale_both() -> None:
    plan = pools_step(pools_body())
    scaling = plan.status["scaling"]
    prefill, decode = scaling["pools"]
    # 8 req/s plus 10% headroom: 8.8 over 5.1 req/s per prefill replica (6 less 15%), 1.7 per decode one.
    assert (prefill["role"], prefill["desiredReplicas"], prefill["capacityLowReqS"]) == ("prefill", 2, 5.1)
    assert (decode["role"], decode["desiredReplicas"], decode["capacityLowReqS"]) == ("decode", 6, 1.7)
    assert (
        scaling["desiredReplicas"] == 8
        and scaling["liveRateReqS"] == 8.0
        and scaling["plannedRateReqS"] == 8.8
    )
    [(reason, message)] = said(plan)
    assert reason == "ScalingAdvised"
    assert message.startswith("would scale prefill 1 -> 2, decode 1 -> 6: one prefill replica serves 6")
    assert of_type(plan, ScalingGauges) == [ScalingGauges(8, None)]
    service = a_service(pools_body(scaling=scaling))
    assert [service.running_pool_replicas(r) for r in ("prefill", "decode")] == [
        1,
        1,
    ]  # Advise acts on nothing


def test_the_pd_ratio_follows_what_one_replica_of_each_pool_serves() -> None:
    prefill_bound = PoolCapacities("pools-8192x64-2048x64", 1.5, 6.0, ())
    prefill, decode = pools_step(pools_body(), sizes=prefill_bound).status["scaling"]["pools"]
    assert (prefill["desiredReplicas"], decode["desiredReplicas"]) == (7, 2)


def test_auto_runs_each_pools_decision_within_the_bounds_and_renders_it() -> None:
    scaling = pools_step(pools_body("Auto")).status["scaling"]
    service = a_service(pools_body("Auto", scaling=scaling))
    assert [service.running_pool_replicas(r) for r in ("prefill", "decode")] == [2, 6]
    assert build_deployment(service, "stable", role="decode")["spec"]["replicas"] == 6
    assert service.running_replicas() == service.spec.replicas  # the colocated count is not the pools' sum
    beyond = {**scaling, "pools": [{**scaling["pools"][1], "desiredReplicas": 12}]}
    capped = a_service(pools_body("Auto", scaling=beyond))
    assert capped.running_pool_replicas("decode") == 8 and capped.running_pool_replicas("prefill") == 1


def test_a_missed_itl_caps_the_decode_replicas_capacity_and_not_the_prefill_ones() -> None:
    plan = pools_step(pools_body(prefill=2, decode=6), rate=8.0, itl_ms=70.0, replicas=(2, 6))
    prefill, decode = plan.status["scaling"]["pools"]
    assert "capacityCapReqS" not in prefill and prefill["capacityLowReqS"] == 5.1
    # 8 req/s over 6 decode replicas missed ITL: 1.33 req/s each, less 5%, is what one serves.
    assert decode["capacityCapReqS"] == pytest.approx(8 / 6 * 0.95, abs=1e-3)
    assert decode["capacityCapFit"] == SIZES.key and decode["desiredReplicas"] == 7
    missed_ttft = pools_step(pools_body(prefill=2, decode=6), ttft_ms=900.0, replicas=(2, 6)).status[
        "scaling"
    ]
    assert missed_ttft["pools"][0]["capacityCapReqS"] == pytest.approx(4 * 0.95, abs=1e-3)
    assert "capacityCapReqS" not in missed_ttft["pools"][1]


def test_without_the_pools_capacities_it_waits_and_says_why() -> None:
    plan = pools_step(pools_body(), sizes=None)
    assert plan.status["scaling"]["reason"] == "waiting: no capacity of the pools from the twin yet"
    assert plan.status["scaling"]["pools"] == [] and said(plan) == []


def test_observing_pools_with_nothing_to_fit_tries_again_only_after_a_minute() -> None:
    asked: list[str] = []

    def vector(query: str, at: Any) -> list[dict[str, Any]]:
        asked.append(query)
        return []  # nothing scraped yet

    observer = TwinObserver(vector, inline=True)
    snap = a_snapshot(pools_body(), prometheus=True)
    assert asyncio.run(observer._pool_sizing(snap)) is None and asked
    tried = len(asked)
    assert asyncio.run(observer._pool_sizing(replace(snap, now=NOW + timedelta(seconds=30)))) is None
    assert len(asked) == tried  # no query within the minute
    assert asyncio.run(observer._pool_sizing(replace(snap, now=NOW + timedelta(seconds=61)))) is None
    assert len(asked) == 2 * tried


def test_a_colocated_service_is_told_once_when_prefill_and_decode_pools_would_take_far_fewer_replicas() -> (
    None
):
    # 8 req/s + 10%: 5 colocated replicas at 1.8 req/s each; one prefill replica serves 18, one decode 10.8.
    split = TwinReading(pool_capacities=PoolCapacities("k", 20.0, 12.0, ()))
    plan = step(body(), twin=split)
    proposal = plan.status["scaling"]["proposal"]
    assert (proposal["topology"], proposal["replicas"], proposal["currentReplicas"]) == (
        "disaggregated",
        2,
        5,
    )
    assert (proposal["prefillReplicas"], proposal["decodeReplicas"]) == (1, 1)
    [message] = [m for r, m in events(plan) if r == "TopologyProposed"]
    assert message.startswith(
        "prefill/decode pools would serve 8.8 req/s on 1 + 1 replicas where colocated takes 5"
    )
    again = step(body(scaling=plan.status["scaling"]), twin=split, now=NOW + timedelta(seconds=10))
    assert [r for r, _ in events(again) if r == "TopologyProposed"] == []  # said once
    close = TwinReading(pool_capacities=PoolCapacities("k", 6.0, 4.0, ()))  # 2 + 3: not far enough below 5
    assert step(body(), twin=close).status["scaling"]["proposal"] is None


def test_a_disaggregated_service_is_told_when_colocated_replicas_would_take_far_fewer() -> None:
    colocated = replace(SIZES, colocated_req_s=3.0)  # 2.55 req/s less its 15% error: 4 for 8.8 req/s
    plan = pools_step(pools_body(), sizes=colocated)
    proposal = plan.status["scaling"]["proposal"]
    assert (proposal["topology"], proposal["replicas"], proposal["currentReplicas"]) == ("colocated", 4, 8)
    assert [r for r, _ in events(plan)].count("TopologyProposed") == 1
    assert (
        pools_step(pools_body(), sizes=replace(SIZES, colocated_req_s=1.5)).status["scaling"]["proposal"]
        is None
    )


def test_observing_splits_a_sized_colocated_service_into_pools_once_per_fit(
    sim_twin: Callable[[int], tuple[TwinFit, Twin]],
) -> None:
    fit, twin = sim_twin(128)
    calibration = Calibration("k", fit, twin, (20.0, 300.0), 0.1)
    snap = a_snapshot(body(), stable=a_ready_state(2), prometheus=True)
    observer = TwinObserver(None, inline=True)
    split = asyncio.run(observer._split(snap, TwinReading(calibration=calibration)))
    assert split is not None and split.key == "k" and split.prefill_req_s > 0 and split.decode_req_s > 0
    assert split.describe().endswith("(on the service's twin)")
    assert asyncio.run(observer._split(snap, TwinReading(calibration=calibration))) is split
    unsized = a_snapshot(body("Off"), stable=a_ready_state(2), prometheus=True)
    assert asyncio.run(observer._split(unsized, TwinReading(calibration=calibration))) is None


def test_the_split_is_read_on_the_sample_the_colocated_replicas_are_planned_on(
    sim_twin: Callable[[int], tuple[TwinFit, Twin]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The proposal compares the planner's colocated count with the pools': both on one sample."""
    fit, twin = sim_twin(128)
    planned_on = replace(
        twin, sustained_workload=replace(twin.workload, requests=twin.workload.requests[:50])
    )
    calibration = Calibration("k", fit, planned_on, (20.0, 300.0), 0.1)
    jobs: list[PoolCheckRequest] = []
    monkeypatch.setattr(observe_twin, "layout_capacities", lambda job: jobs.append(job) or SIZES)
    snap = a_snapshot(body(), stable=a_ready_state(2), prometheus=True)
    asyncio.run(TwinObserver(None, inline=True)._split(snap, TwinReading(calibration=calibration)))
    assert [len(job.twin.workload.requests) for job in jobs] == [50]


def stored(before: dict[str, Any], plan: Plan) -> dict[str, Any]:
    """``status.scaling`` as the API server keeps it once the step's merge patch is applied to ``before``."""
    kept = copy.deepcopy(before)
    merge_into(kept, plan.status["scaling"])
    return kept


def test_a_switch_of_topology_starts_the_planner_afresh_and_runs_no_decision_of_the_other() -> None:
    # Colocated in Auto: 5 replicas decided, then the user declares pools (as a proposal says).
    colocated = stored({}, step(body("Auto")))
    assert colocated["topology"] == "colocated" and colocated["desiredReplicas"] == 5
    assert colocated["decision"] == "5"
    switched = a_service(pools_body("Auto", scaling=colocated))
    assert [switched.running_pool_replicas(r) for r in ("prefill", "decode")] == [1, 1]
    capped = {**colocated, "capacityCapReqS": 1.0, "capacityCapFit": "k"}
    plan = pools_step(pools_body("Auto", scaling=capped))
    pools = stored(capped, plan)  # merged into what the colocated planner left
    assert pools["topology"] == "disaggregated" and pools["desiredReplicas"] == 8
    assert pools["decision"] == "prefill 2 + decode 6"
    assert "capacityCapReqS" not in pools and "capacityLowReqS" not in pools
    assert not pools.get("recommendations")  # the colocated history is not the pools'
    assert any("planning the disaggregated one afresh" in a.message for a in of_type(plan, Log))
    # ... and back: the pools' sum is not run as colocated replicas, nor are their pools kept.
    back = a_service(body("Auto", scaling=pools))
    assert back.running_replicas() == back.spec.replicas == 2
    again = stored(pools, step(body("Auto", scaling=pools)))
    assert again["topology"] == "colocated" and again["desiredReplicas"] == 5 and not again.get("pools")
    assert [m for _, m in said(step(body("Auto", scaling=pools)))] == [
        m for _, m in said(step(body("Auto")))
    ]  # "scaling 2 -> 5", from what runs, as for a service never sized


def test_a_waiting_planner_after_a_switch_keeps_no_decision_of_the_other_topology() -> None:
    pools = stored({}, pools_step(pools_body("Auto")))
    service = {**body("Auto", scaling=pools), "status": {"scaling": pools}}  # no twin: it waits
    scaling = stored(pools, step(service))
    assert scaling["reason"] == "waiting: no capacity from the twin yet"
    assert scaling["topology"] == "colocated" and not scaling.get("pools")
    assert "desiredReplicas" not in scaling and "decision" not in scaling  # the pools' sum is gone
    assert a_service(body("Auto", scaling=scaling)).running_replicas() == 2


def test_each_pool_is_planned_with_the_twins_measured_error_on_its_own_quantile() -> None:
    measured = replace(SIZES, prefill_error=0.4, decode_error=0.05)
    prefill, decode = pools_step(pools_body(), sizes=measured).status["scaling"]["pools"]
    # 8.8 req/s over 6 x 0.6 = 3.6 per prefill replica, 2 x 0.95 = 1.9 per decode replica.
    assert (prefill["capacityLowReqS"], prefill["desiredReplicas"]) == (3.6, 3)
    assert (decode["capacityLowReqS"], decode["desiredReplicas"]) == (1.9, 5)


def test_colocated_replicas_are_proposed_no_fewer_than_min_replicas() -> None:
    """Pools of 3 at 1 req/s, where one colocated replica serves 2: 1 proposed, or minReplicas."""
    assert (colocated_proposal(1.0, 3, 0.15, 2.0) or pytest.fail("no proposal")).replicas == 1
    assert (colocated_proposal(1.0, 3, 0.15, 2.0, least=2) or pytest.fail("no proposal")).replicas == 2
    assert colocated_proposal(1.0, 3, 0.15, 2.0, least=3) is None  # as many as the pools: no gain
