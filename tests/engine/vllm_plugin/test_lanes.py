"""Partial-prefill lane selection and queue restoration (pure logic, no vLLM)."""

from __future__ import annotations

import pytest
from chunkpilot.engine.vllm_plugin.config import PartialPrefillLimits
from chunkpilot.engine.vllm_plugin.lanes import PrefillCandidate, plan_lanes, reinsert_in_order

# Two lanes, one of them for long prompts (above 1000 tokens).
LIMITS = PartialPrefillLimits(
    max_num_partial_prefills=2, max_long_partial_prefills=1, long_prefill_threshold=1000
)


def running(key: str, tokens: int) -> PrefillCandidate[str]:
    return PrefillCandidate(key, tokens, started=True)


def waiting(key: str, tokens: int) -> PrefillCandidate[str]:
    return PrefillCandidate(key, tokens, started=False)


def test_short_prompt_passes_a_queued_long_one_while_the_long_lane_is_busy() -> None:
    plan = plan_lanes(
        [running("doc-a", 200_000), waiting("doc-b", 50_000), waiting("chat", 300)], LIMITS, token_budget=512
    )
    assert plan.allowed == {"doc-a", "chat"}
    assert plan.held_back == ("doc-b",)
    assert plan.num_long == 1


def test_started_prefills_keep_their_lanes_before_waiting_requests() -> None:
    plan = plan_lanes(
        [waiting("w1", 10), running("r1", 20), waiting("w2", 30), running("r2", 40)], LIMITS, token_budget=100
    )
    assert plan.allowed == {"r1", "r2"}
    assert plan.held_back == ("w1", "w2")


def test_threshold_is_exclusive() -> None:
    assert not LIMITS.is_long(1000)
    assert LIMITS.is_long(1001)
    plan = plan_lanes([waiting("a", 1001), waiting("b", 1000)], LIMITS, token_budget=64)
    assert plan.allowed == {"a", "b"} and plan.num_long == 1


def test_no_long_lane_holds_back_every_long_prompt() -> None:
    limits = PartialPrefillLimits(3, 0, 100)
    plan = plan_lanes([waiting("long", 101), waiting("short", 5)], limits, token_budget=64)
    assert plan.allowed == {"short"}
    assert plan.held_back == ("long",)


def test_chunk_cap_shares_the_budget_only_between_several_prefills() -> None:
    single = plan_lanes([waiting("a", 5000)], LIMITS, token_budget=512)
    assert single.chunk_cap == 0  # one prefill takes the whole budget
    shared = plan_lanes([running("a", 5000), waiting("b", 300)], LIMITS, token_budget=512)
    assert shared.chunk_cap == 256
    tiny = plan_lanes([running("a", 5000), waiting("b", 300)], LIMITS, token_budget=1)
    assert tiny.chunk_cap == 1  # never 0 (which would mean "no cap")


def test_no_candidates() -> None:
    plan = plan_lanes([], LIMITS, token_budget=512)
    assert plan.allowed == frozenset() and plan.held_back == () and plan.chunk_cap == 0


@pytest.mark.parametrize("lanes", [1, 2, 4])
def test_never_more_prefills_than_lanes(lanes: int) -> None:
    limits = PartialPrefillLimits(lanes, 1, 100)
    candidates = [waiting(f"r{i}", 50 if i % 2 else 500) for i in range(10)]
    plan = plan_lanes(candidates, limits, token_budget=1024)
    assert len(plan.allowed) == lanes
    assert plan.num_long <= 1
    assert len(plan.allowed) + len(plan.held_back) == len(candidates)


def test_reinsert_running_restores_positions_and_appends_admitted() -> None:
    # r2 was hidden during the step; the step admitted w1 (appended to running).
    assert reinsert_in_order(["r1", "r2", "r3"], ["r1", "r3", "w1"], ["r2"], new_first=False) == [
        "r1",
        "r2",
        "r3",
        "w1",
    ]


def test_reinsert_drops_finished_and_puts_preempted_first() -> None:
    # r1 finished during the step; p joined the queue (preempted) and goes in front.
    assert reinsert_in_order(["r1", "r2", "r3"], ["p", "r3"], ["r2"], new_first=True) == ["p", "r2", "r3"]
