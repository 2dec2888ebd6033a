"""Disaggregated layouts on hand-built evaluators: the splits, the search's order and budget, the messages."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
from chunkpilot.tuner.topology.layouts import (
    DECODE_SEQS,
    PREFILL_BUDGETS,
    Layout,
    LayoutCapacity,
    Pool,
    Recommendation,
    SLOText,
    TopologySearch,
    kv_bytes_per_request,
    recommendation_message,
    search_topologies,
    splits,
)

SLO = SLOText(0.99, 30.0, 0.95, 400.0)


class Recorder:
    """An evaluator from a capacity function of the layout, remembering what it was asked."""

    def __init__(self, capacity: Callable[[Layout], float]) -> None:
        self.capacity = capacity
        self.asked: list[Layout] = []

    def __call__(self, layout: Layout) -> LayoutCapacity:
        self.asked.append(layout)
        value = self.capacity(layout)
        return LayoutCapacity(layout, value, itl_ms=25.0 if value > 0 else 45.0, ttft_ms=300.0)


def peaked(best_prefill: int, best_budget: int, best_seqs: int) -> Callable[[Layout], float]:
    """Capacity highest at one split and one knob of each pool, lower the farther away."""

    def capacity(layout: Layout) -> float:
        value = 10.0 - 2.0 * abs(layout.prefill.replicas - best_prefill)
        value -= 0.5 * abs(math.log2(layout.prefill.max_num_batched_tokens / best_budget))
        value -= 0.25 * abs(math.log2(layout.decode.max_num_seqs / best_seqs))
        return max(0.0, value)

    return capacity


def test_splits_cover_every_ratio_with_one_replica_per_pool_at_least() -> None:
    assert splits(4) == [(1, 3), (2, 2), (3, 1)]
    assert splits(2) == [(1, 1)]
    assert splits(1) == [(1, 1)]  # one replica cannot be split: the smallest layout has two


def test_the_search_finds_the_best_split_then_each_pools_knobs() -> None:
    evaluate = Recorder(peaked(best_prefill=2, best_budget=4096, best_seqs=128))
    search = search_topologies(evaluate, 6, decode_seqs=256, decode_budget=2048, cpu_budget_s=1e9)
    best = search.best
    assert best is not None
    assert best.layout == Layout(Pool(2, 4096, 256), Pool(4, 2048, 128))
    assert best.capacity_req_s == pytest.approx(10.0)
    # Every split first (decode-heavy ones before prefill-heavy ones), each evaluated once.
    first = [(layout.prefill.replicas, layout.decode.replicas) for layout in evaluate.asked[:5]]
    assert sorted(first) == splits(6)
    assert first.index((1, 5)) < first.index((5, 1))
    assert len(evaluate.asked) == len(set(evaluate.asked)) == search.evaluations
    assert search.evaluations == 5 + (len(PREFILL_BUDGETS) - 1) + len(set(DECODE_SEQS) | {256}) - 1
    # Best first; a decode pool's budget is never below its maxNumSeqs.
    capacities = [r.capacity_req_s for r in search.ranked]
    assert capacities == sorted(capacities, reverse=True)
    assert all(r.layout.decode.max_num_batched_tokens >= r.layout.decode.max_num_seqs for r in search.ranked)


def test_the_search_stops_at_its_cpu_budget_but_always_evaluates_one_layout() -> None:
    ticks = iter(range(1000))
    evaluate = Recorder(lambda _layout: 5.0)
    search = search_topologies(
        evaluate, 4, decode_seqs=256, decode_budget=512, cpu_budget_s=2.5, clock=lambda: float(next(ticks))
    )
    assert 1 <= search.evaluations <= 3
    spent = search_topologies(
        Recorder(lambda _layout: 5.0), 4, decode_seqs=256, decode_budget=512, cpu_budget_s=0.0
    )
    assert spent.evaluations == 1
    capped = search_topologies(
        Recorder(lambda _layout: 5.0), 8, decode_seqs=256, decode_budget=512, max_evaluations=4
    )
    assert capped.evaluations == 4


def test_ties_go_to_the_lower_itl_then_to_the_first_evaluated() -> None:
    def evaluate(layout: Layout) -> LayoutCapacity:
        itl = 20.0 if layout.prefill.replicas == 2 else 28.0
        return LayoutCapacity(layout, 8.0, itl_ms=itl, ttft_ms=300.0)

    search = search_topologies(evaluate, 4, decode_seqs=256, decode_budget=512, max_evaluations=3)
    assert search.best is not None and search.best.layout.prefill.replicas == 2


def test_kv_bytes_per_request_is_the_prompts_kv_cache() -> None:
    # Llama-3.1-8B: 32 layers x 2 x 8 KV heads x 128 x 2 bytes = 131072 bytes per token
    assert kv_bytes_per_request(131072, 2700.0) == pytest.approx(353.9e6, rel=1e-3)
    assert kv_bytes_per_request(131072, -1.0) == 0.0


def recommendation(colocated: float, *results: LayoutCapacity, replicas: int = 4) -> Recommendation:
    search = TopologySearch(tuple(sorted(results, key=lambda r: -r.capacity_req_s)), len(results), 12.5)
    return Recommendation(replicas, colocated, search, 25.0, 1.0, 193.0)


LAYOUT = Layout(Pool(1, 8192, 256), Pool(3, 2048, 128))


def test_a_paying_layout_is_stated_with_both_capacities_and_the_kv_cost() -> None:
    found = recommendation(3.1, LayoutCapacity(LAYOUT, 12.4, 24.0, 350.0))
    assert found.meets and found.pays
    message = recommendation_message(found, SLO)
    assert message.startswith(
        "Disaggregation: 1 prefill + 3 decode replicas (prefill maxNumBatchedTokens 8192, decode "
        "maxNumSeqs 128) meet ITL p99 ≤ 30 ms and TTFT p95 ≤ 400 ms up to 12.4 req/s on the twin; "
        "colocated reaches 3.1 req/s on 4 replicas"
    )
    assert "1 topologies evaluated" in message and "193 MB per request at 25 GB/s + 1 ms" in message


def test_colocated_meeting_at_no_rate_is_said_so() -> None:
    message = recommendation_message(recommendation(0.0, LayoutCapacity(LAYOUT, 6.0)), SLO)
    assert "colocated meets them at no rate on 4 replicas" in message
    assert message.startswith("Disaggregation: 1 prefill + 3 decode replicas")


def test_no_layout_meeting_the_slos_says_disaggregation_would_not_help() -> None:
    found = recommendation(2.0, LayoutCapacity(LAYOUT, 0.0, 45.0, 900.0))
    assert found.best is not None and not found.meets and not found.pays
    message = recommendation_message(found, SLO)
    assert message.startswith(
        "Disaggregation would not help: no prefill/decode split of 4 replicas meets ITL p99 ≤ 30 ms "
        "and TTFT p95 ≤ 400 ms on the twin either"
    )
    assert message.endswith("colocated reaches 2 req/s on 4 replicas.")


def test_a_layout_below_colocated_does_not_pay() -> None:
    found = recommendation(9.0, LayoutCapacity(LAYOUT, 6.0, 25.0, 300.0))
    assert found.meets and not found.pays
    message = recommendation_message(found, SLO)
    assert message.startswith("Disaggregation does not pay here: 1 prefill + 3 decode replicas")
    assert "colocated reaches 9 req/s" in message and "more replicas help more" in message


def test_a_single_replica_service_is_told_the_split_needs_two() -> None:
    layout = Layout(Pool(1, 8192, 256), Pool(1, 2048, 256))
    message = recommendation_message(recommendation(0.0, LayoutCapacity(layout, 3.0), replicas=1), SLO)
    assert "(one replica per pool at least: 2 GPUs where the service has 1)" in message
    assert "colocated meets them at no rate on 1 replica " in message


def test_nothing_evaluated_is_said_so() -> None:
    empty = Recommendation(4, 2.0, TopologySearch((), 0, 0.0), 25.0, 1.0, 100.0)
    assert recommendation_message(empty, SLO) == (
        "Disaggregation: nothing evaluated on the twin; colocated reaches 2 req/s on 4 replicas."
    )
