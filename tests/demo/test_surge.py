"""The demo's load surge, driven by the InferenceService's status (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from chunkpilot.api import InferenceService
from chunkpilot.demo.scenario import DemoScenario, build_inferenceservice
from chunkpilot.demo.surge import ExtraLoad, Surge, SurgePhase

SCENARIO = DemoScenario(rate=6.0, surge_s=120.0, calm_s=150.0)


FITTED = "2026-12-06T10:00:00Z"


def service(
    stable: int | None = 1,
    desired: int | None = None,
    capacity: float | None = None,
    twin_hash: str = "tuned",
    recommended: str = "2026-12-06T10:00:10Z",
) -> InferenceService:
    manifest = build_inferenceservice(SCENARIO)
    scaling: dict[str, Any] = {
        "mode": "Auto",
        "reason": "waiting: no capacity from the twin yet",
        "recommendations": [{"time": recommended, "replicas": desired or 1}],
    }
    if desired is not None:
        scaling["desiredReplicas"] = desired
    if capacity is not None:
        scaling["capacityLowReqS"] = capacity
    manifest["status"] = {
        "stableReplicas": stable,
        "appliedConfigHash": "tuned",
        "twin": {"state": "Fitted", "configHash": twin_hash, "fittedAt": FITTED},
        "scaling": scaling,
    }
    return InferenceService.from_manifest(manifest)


def test_it_waits_for_the_tuning_to_end_then_surges_to_two_and_a_half_replicas_worth() -> None:
    surge = Surge(SCENARIO)
    assert surge.step(0.0, service(), tuning_finished=False) is None
    assert surge.step(1.0, service(desired=3, capacity=2.0), tuning_finished=False) is None
    assert surge.phase is SurgePhase.WAITING and not surge.busy, "trials are judged beside fixed replicas"
    first = surge.step(5.0, service(desired=1, capacity=5.0), tuning_finished=True)
    # The demo's own load keeps running beside it; the extra rises in two steps.
    assert first == ExtraLoad(rate=pytest.approx((12.5 - 6.0) / 2), duration_s=120.0)
    assert surge.phase is SurgePhase.SURGING and surge.busy and surge.before == 1
    assert surge.step(24.0, service(desired=2, capacity=5.0), tuning_finished=True) is None
    second = surge.step(25.0, service(desired=2, capacity=5.0), tuning_finished=True)
    assert second == ExtraLoad(rate=pytest.approx((12.5 - 6.0) / 2), duration_s=100.0)
    assert surge.step(26.0, service(desired=3, capacity=5.0), tuning_finished=True) is None
    assert "12.5 req/s" in surge.describe(65.0) and "60/120 s" in surge.describe(65.0)


def test_after_the_surge_it_waits_for_the_replicas_to_come_back_down() -> None:
    surge = Surge(SCENARIO)
    surge.step(0.0, service(desired=1, capacity=5.0), tuning_finished=True)
    surge.step(60.0, service(stable=3, desired=3, capacity=5.0), tuning_finished=True)
    assert surge.phase is SurgePhase.SURGING
    surge.step(120.0, service(stable=3, desired=3, capacity=5.0), tuning_finished=True)
    assert surge.phase is SurgePhase.CALMING and surge.busy
    surge.step(150.0, service(stable=3, desired=1, capacity=5.0), tuning_finished=True)
    assert surge.phase is SurgePhase.CALMING
    surge.step(180.0, service(stable=1, desired=1, capacity=5.0), tuning_finished=True)
    surge.step(182.0, service(stable=2, desired=1, capacity=5.0), tuning_finished=True)
    surge.step(184.0, service(stable=1, desired=1, capacity=5.0), tuning_finished=True)
    assert surge.phase is SurgePhase.CALMING, "one reading back is not enough"
    surge.step(189.0, service(stable=1, desired=1, capacity=5.0), tuning_finished=True)
    assert surge.phase is SurgePhase.DONE and not surge.busy


def test_the_calm_is_bounded_when_the_replicas_stay_up() -> None:
    surge = Surge(SCENARIO)
    surge.step(0.0, service(desired=1, capacity=5.0), tuning_finished=True)
    surge.step(120.0, service(stable=2, desired=2, capacity=5.0), tuning_finished=True)
    surge.step(269.0, service(stable=2, desired=2, capacity=5.0), tuning_finished=True)
    assert surge.phase is SurgePhase.CALMING
    surge.step(270.0, service(stable=2, desired=2, capacity=5.0), tuning_finished=True)
    assert surge.phase is SurgePhase.DONE


def test_without_a_capacity_it_gives_up_a_calm_after_the_tuning_ended() -> None:
    surge = Surge(SCENARIO)
    surge.step(0.0, service(), tuning_finished=True)
    assert surge.busy, "the planner may state a capacity just after the last trial"
    surge.step(149.0, service(), tuning_finished=True)
    assert surge.phase is SurgePhase.WAITING
    surge.step(150.0, service(), tuning_finished=True)
    assert surge.phase is SurgePhase.SKIPPED and not surge.busy
    assert "no configuration met both SLOs" in surge.describe(150.0)


def test_a_capacity_of_the_configuration_before_the_promotion_is_not_surged_on() -> None:
    surge = Surge(SCENARIO)
    stale = service(desired=3, capacity=2.6, twin_hash="default")
    assert surge.step(0.0, stale, tuning_finished=True) is None
    before_the_fit = service(desired=3, capacity=2.6, recommended="2026-12-06T09:59:59Z")
    assert surge.step(5.0, before_the_fit, tuning_finished=True) is None
    assert surge.phase is SurgePhase.WAITING and surge.busy
    load = surge.step(30.0, service(desired=1, capacity=5.0), tuning_finished=True)
    assert load is not None and load.rate == pytest.approx(6.5 / 2)


def test_a_surge_the_running_replicas_would_absorb_waits_then_is_skipped() -> None:
    surge = Surge(SCENARIO)
    assert surge.step(0.0, service(desired=1, capacity=40.0), tuning_finished=True) is None
    assert surge.phase is SurgePhase.WAITING, "the capacity may still be the one before a promotion"
    surge.step(150.0, service(desired=1, capacity=40.0), tuning_finished=True)
    assert surge.phase is SurgePhase.SKIPPED
    assert "more than the surge may replay" in surge.describe(150.0)


def test_a_capacity_too_low_to_surge_above_the_demos_own_rate_replays_nothing_then_is_skipped() -> None:
    surge = Surge(SCENARIO)  # 6 req/s; 2.5 replicas of 2 req/s are 5: no extra load to replay
    assert surge.step(0.0, service(desired=3, capacity=2.0), tuning_finished=True) is None
    assert surge.phase is SurgePhase.WAITING
    surge.step(150.0, service(desired=3, capacity=2.0), tuning_finished=True)
    assert surge.phase is SurgePhase.SKIPPED
    assert "nothing to surge" in surge.describe(150.0)


def test_with_the_planner_off_there_is_no_surge() -> None:
    surge = Surge(DemoScenario(max_replicas=1))
    assert surge.phase is SurgePhase.SKIPPED and not surge.busy
    assert surge.step(0.0, service(desired=1, capacity=5.0), tuning_finished=False) is None
