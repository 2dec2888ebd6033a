"""The capacity planner: the fewest replicas for the live load, stabilised as an HPA's, no flapping."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from chunkpilot.tuner.planner import (
    DOWN_WINDOW_S,
    STARTUP_WATCH_S,
    Capacity,
    capacity_of,
    decide_replicas,
    learnt_cap,
    needed_replicas,
    remember,
    replicas_for,
    settled,
    sizing_capacity,
    stabilized,
    startup_seconds,
    trend_rate,
    watches_startup,
)

from chunkpilot.api import ScalingRecommendation, ScalingSpec
from chunkpilot.testing.services import NOW

#: Two requests/s per replica, known to 10%: 1.8 req/s planned per replica.
TWO = Capacity(2.0, 0.1)


def spec(**fields: Any) -> ScalingSpec:
    return ScalingSpec.model_validate({"mode": "Auto", "maxReplicas": 10, **fields})


def ago(seconds: float, replicas: int, rate: float | None = None) -> ScalingRecommendation:
    return ScalingRecommendation(time=NOW - timedelta(seconds=seconds), replicas=replicas, rate_req_s=rate)


def test_the_fewest_replicas_whose_capacity_less_its_error_covers_the_rate() -> None:
    assert needed_replicas(5.4, TWO, spec()) == 3  # 5.4 / 1.8 = 3 exactly
    assert needed_replicas(5.5, TWO, spec()) == 4
    assert needed_replicas(0.1, TWO, spec(minReplicas=2)) == 2
    assert needed_replicas(100.0, TWO, spec()) == 10  # maxReplicas
    assert needed_replicas(1.0, Capacity(0.0, 0.1), spec()) == 10  # one replica serves nothing
    assert replicas_for(100.0, TWO) == 56 and replicas_for(1.0, Capacity(0.0, 0.1)) is None  # unbounded


def test_the_twins_error_is_bounded_and_what_the_live_service_showed_caps_the_capacity() -> None:
    assert capacity_of(2.0, None).error == 0.15  # unmeasured: the tuner's tolerance
    assert capacity_of(2.0, 0.9).error == 0.5
    corrected = capacity_of(3.0, 0.1, cap_req_s=1.9)
    assert corrected.low == pytest.approx(1.9)
    assert "the live service showed 1.9 req/s per replica" in corrected.corrected
    assert capacity_of(3.0, 0.1, cap_req_s=4.0).corrected == ""  # no higher than the twin says


def test_what_the_live_service_showed_is_learnt_down_on_a_miss_and_up_when_met() -> None:
    assert learnt_cap(None, 3.0, 2.0, met=False) == pytest.approx(1.9)  # a miss at 2, less 5%
    assert learnt_cap(1.9, 3.0, 1.0, met=True) == 1.9  # met below it: nothing new
    assert learnt_cap(1.9, 3.0, 2.4, met=True) == 2.4  # met above it: at least that
    assert learnt_cap(2.4, 3.0, 3.5, met=True) is None  # up to the twin's: the twin again
    assert learnt_cap(None, 3.0, 1.0, met=False) is None  # too light a load to blame
    assert learnt_cap(1.9, 3.0, 2.0, met=None) == 1.9  # unsettled: kept as it is


def test_a_capacity_between_its_nominal_and_its_low_end() -> None:
    assert Capacity.between(2.0, 1.5) == Capacity(2.0, 0.25)
    assert Capacity.between(2.0, 0.2).error == 0.5  # at most MAX_ERROR below
    assert Capacity.between(2.0, 2.4).error == 0.0
    assert capacity_of(2.0, 0.01, low_req_s=1.6).low == pytest.approx(1.6)  # the low end wins


def test_the_capacity_sized_with_is_the_low_end_under_what_the_live_service_showed() -> None:
    cap, capacity = sizing_capacity(2.0, None, low_req_s=1.6, cap_req_s=None, per_replica_req_s=1.0, met=True)
    assert cap is None and capacity.low == pytest.approx(1.6)
    cap, capacity = sizing_capacity(
        2.0, None, low_req_s=1.6, cap_req_s=None, per_replica_req_s=1.2, met=False
    )
    assert cap == pytest.approx(1.14) and capacity.low == pytest.approx(1.14)  # a miss at 1.2, less 5%
    # Met below it: it stands (only a load above it that meets both SLOs raises it).
    cap, _ = sizing_capacity(2.0, None, low_req_s=1.6, cap_req_s=1.14, per_replica_req_s=0.8, met=True)
    assert cap == pytest.approx(1.14)


def test_a_miss_right_after_a_change_of_replicas_is_the_backlog_of_the_load_before() -> None:
    assert settled(None, NOW, None)
    assert not settled(NOW - timedelta(seconds=200), NOW, startup_s=120.0)  # 120 s + two windows
    assert settled(NOW - timedelta(seconds=240), NOW, startup_s=120.0)
    assert not settled(NOW - timedelta(seconds=200), NOW, startup_s=None)  # unmeasured: 120 s assumed


def test_a_rising_rate_is_planned_where_its_trend_will_be_once_a_replica_has_started() -> None:
    rising = [ago(240, 2, 2.0), ago(120, 2, 3.0)]
    assert trend_rate(rising, NOW, 4.0) == pytest.approx(4.0 + 1.0 / 120 * 120)  # +1 req/s a 2 minutes
    falling = [ago(240, 2, 6.0), ago(120, 2, 5.0)]
    assert trend_rate(falling, NOW, 4.0) == 4.0  # never below the live rate
    assert trend_rate([ago(120, 2, 3.0)], NOW, 4.0) == 4.0  # too few points for a trend


def test_up_at_once_down_no_lower_than_the_windows_highest_recommendation() -> None:
    history = [ago(200, 6), ago(100, 4)]
    assert stabilized(3, 7, history, NOW, spec()) == 7  # up: at once
    assert stabilized(6, 2, history, NOW, spec()) == 6  # down: 6 asked for 200 s ago
    assert stabilized(6, 2, [ago(DOWN_WINDOW_S + 1, 6), ago(100, 4)], NOW, spec()) == 4
    windowed = spec(behavior={"scaleDown": {"stabilizationWindowSeconds": 60}})
    assert stabilized(6, 2, history, NOW, windowed) == 2


def test_policies_limit_each_step_and_disabled_forbids_a_direction() -> None:
    pods = spec(behavior={"scaleUp": {"policies": [{"type": "Pods", "value": 2, "periodSeconds": 60}]}})
    assert stabilized(3, 9, [], NOW, pods) == 5
    both = spec(
        behavior={
            "scaleUp": {
                "policies": [
                    {"type": "Pods", "value": 1, "periodSeconds": 60},
                    {"type": "Percent", "value": 100, "periodSeconds": 60},
                ],
                "selectPolicy": "Min",
            }
        }
    )
    assert stabilized(3, 9, [], NOW, both) == 4
    never = spec(behavior={"scaleDown": {"policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}],
                                         "selectPolicy": "Disabled"}})  # fmt: skip
    assert stabilized(6, 2, [], NOW, never) == 6


def test_a_load_wavering_at_a_boundary_does_not_flap() -> None:
    for rates, expected, moves in (((5.3, 6.2), 4, 1), ((5.3, 5.6), 3, 0)):
        scaling, current, history = spec(headroom=0.0), 3, list[ScalingRecommendation]()
        changes = 0
        for step in range(40):  # 20 minutes, a decision every 30 s, the rate wavering
            now = NOW + timedelta(seconds=30 * step)
            rate = rates[step % 2]
            decision = decide_replicas(scaling, current, rate, TWO, history, now)
            changes += decision.desired != current
            current = decision.desired
            history = remember(history, now, decision.needed, rate)
        # 3 replicas serve 5.4 req/s: above its 10% tolerance (5.94) up once, then held by the
        # scale-down window; within it, never moved
        assert (current, changes) == (expected, moves), rates


def test_fewer_replicas_only_where_they_serve_the_rate_with_the_tolerance_to_spare() -> None:
    # 5.3 req/s on 4 replicas of 1.8 each: 3 serve it (5.4) but only just, so 4 stay; at 4.8 req/s
    # 3 serve it with 10% to spare (5.28 <= 5.4) and the count comes down.
    scaling = spec(headroom=0.0, behavior={"scaleDown": {"stabilizationWindowSeconds": 0}})
    assert decide_replicas(scaling, 4, 5.3, TWO, [], NOW).desired == 4
    assert decide_replicas(scaling, 4, 4.8, TWO, [], NOW).desired == 3
    assert decide_replicas(scaling, 4, 1.0, TWO, [], NOW).desired == 1  # far below: all the way


def test_the_reason_names_the_numbers_and_a_ceiling_short_of_the_load() -> None:
    decision = decide_replicas(spec(maxReplicas=3), 2, 9.0, TWO, [], NOW)
    assert decision.desired == 3 and decision.needed == 3
    assert "9.9 req/s (live 9 req/s, plus 10% headroom) at 1.8 req/s each" in decision.reason
    assert "maxReplicas 3 is short of the load" in decision.reason


def pod(scheduled: str, ready: str | None, status: str = "True") -> dict[str, Any]:
    conditions = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": scheduled}]
    if ready is not None:
        conditions.append({"type": "Ready", "status": status, "lastTransitionTime": ready})
    return {"status": {"conditions": conditions}}


def test_start_up_is_measured_on_the_services_own_pods_and_sets_the_look_ahead() -> None:
    pods = [
        pod("2026-12-05T10:00:00Z", "2026-12-05T10:01:30Z"),
        pod("2026-12-05T10:00:00Z", "2026-12-05T10:03:00Z"),
        pod("2026-12-05T10:00:00Z", None),  # not Ready yet
        pod("2026-12-05T10:00:00Z", "2026-12-05T10:09:00Z", status="False"),  # Ready, then lost
    ]
    assert startup_seconds(pods) == 180.0
    assert startup_seconds([pod("2026-12-05T10:00:00Z", None)]) is None
    # Only the pods a change of replicas started, when asked so: not the first ones' cold start.
    since = datetime(2026, 12, 5, 10, 0, 30, tzinfo=UTC)
    assert startup_seconds([*pods, pod("2026-12-05T10:01:00Z", "2026-12-05T10:01:45Z")], since) == 45.0
    assert startup_seconds(pods, since) is None
    rising = [ago(240, 2, 2.0), ago(120, 2, 3.0)]  # +1 req/s every 2 minutes
    quick = decide_replicas(spec(headroom=0.0), 2, 4.0, TWO, rising, NOW, startup_s=60.0)
    slow = decide_replicas(spec(headroom=0.0), 2, 4.0, TWO, rising, NOW, startup_s=600.0)
    assert quick.planned_req_s == pytest.approx(4.5) and slow.planned_req_s == pytest.approx(9.0)
    assert "its trend 9 req/s in 600 s" in slow.reason


def test_a_rate_averaged_over_a_window_is_projected_half_that_window_further() -> None:
    rising = [ago(240, 2, 2.0), ago(120, 2, 3.0)]  # +1 req/s every 2 minutes
    live = decide_replicas(spec(headroom=0.0), 2, 4.0, TWO, rising, NOW, startup_s=120.0)
    averaged = decide_replicas(spec(headroom=0.0), 2, 4.0, TWO, rising, NOW, startup_s=120.0, window_s=300.0)
    # Over five minutes the live value is the rate of 150 s ago: 120 s + 150 s ahead of it.
    assert live.planned_req_s == pytest.approx(5.0) and averaged.planned_req_s == pytest.approx(6.25)
    assert "its trend 6.25 req/s in 270 s" in averaged.reason and averaged.desired == 4
    falling = [ago(240, 2, 6.0), ago(120, 2, 5.0)]
    assert decide_replicas(spec(), 2, 4.0, TWO, falling, NOW, window_s=300.0).planned_req_s == pytest.approx(
        4.4
    )


def test_the_stable_pods_are_read_for_their_start_up_until_measured_and_after_an_auto_scale() -> None:
    assert watches_startup(None, None, acts=False, now=NOW)  # not measured yet
    assert not watches_startup(150.0, None, acts=True, now=NOW)
    recent = NOW - timedelta(seconds=STARTUP_WATCH_S - 1)
    assert watches_startup(150.0, recent, acts=True, now=NOW)
    assert not watches_startup(150.0, recent, acts=False, now=NOW)  # Advise starts no pods
    assert not watches_startup(150.0, NOW - timedelta(seconds=STARTUP_WATCH_S + 1), acts=True, now=NOW)
    slow = NOW - timedelta(seconds=STARTUP_WATCH_S + 600)  # engines that took 15 minutes last time
    assert watches_startup(900.0, slow, acts=True, now=NOW)
