"""One replica's capacity of each pool of a running disaggregated service: what the planner sizes with."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from chunkpilot.engine.sim.offline import SLO
from chunkpilot.tuner.space import TunedConfig
from chunkpilot.tuner.topology import sizing
from chunkpilot.tuner.topology.layouts import Layout, LayoutCapacity, Pool
from chunkpilot.tuner.topology.pools import pool_twins, pools_latencies
from chunkpilot.tuner.topology.sizing import (
    MAX_AMPLE,
    MeasuredPools,
    PoolCapacities,
    PoolSizingRequest,
    pool_capacities,
    single_pool_capacities,
)
from chunkpilot.tuner.twin import Twin, TwinFit
from chunkpilot.tuner.twin.online import SUSTAINED_REQUESTS, build_twin
from chunkpilot.tuner.twin.predict import SUSTAINED_SAMPLES, arrival_seeds
from chunkpilot.tuner.twin.search import SUSTAINED_S

from chunkpilot.testing.tuner import pool_steps, window_of

SLO_ = SLO(25.0, 0.99, 600.0, 0.95)
LAYOUT = Layout(Pool(1, 4096, 64), Pool(1, 1024, 64))


def linear(prefill: float, decode: float) -> Callable[[Layout], LayoutCapacity]:
    """A layout serves what its scarcer pool serves, each replica of a pool as much as the next."""
    calls: list[Layout] = []

    def evaluate(layout: Layout) -> LayoutCapacity:
        calls.append(layout)
        served = min(layout.prefill.replicas * prefill, layout.decode.replicas * decode)
        return LayoutCapacity(layout, served)

    evaluate.calls = calls  # type: ignore[attr-defined]
    return evaluate


@pytest.mark.parametrize(("prefill", "decode"), [(10.0, 3.0), (2.0, 9.0), (4.0, 4.0), (20.0, 3.0)])
def test_each_pool_is_read_at_one_replica_beside_enough_of_the_other(prefill: float, decode: float) -> None:
    (found_prefill, found_decode), evaluations = single_pool_capacities(linear(prefill, decode), LAYOUT)
    assert (found_prefill, found_decode) == (pytest.approx(prefill), pytest.approx(decode))
    assert evaluations <= 6


def test_a_pool_no_rate_serves_reads_zero_and_the_other_is_not_chased() -> None:
    evaluate = linear(5.0, 0.0)
    (prefill, decode), evaluations = single_pool_capacities(evaluate, LAYOUT)
    assert (prefill, decode) == (0.0, 0.0)  # beside a decode pool that serves nothing, nothing is served
    assert evaluations == 2


def test_the_other_pool_is_never_grown_past_the_most_it_may_have() -> None:
    evaluate = linear(100.0, 1.0)
    (prefill, _), _ = single_pool_capacities(evaluate, LAYOUT)
    assert prefill == pytest.approx(MAX_AMPLE * 1.0)  # bounded by MAX_AMPLE decode replicas: a floor
    assert max(layout.decode.replicas for layout in evaluate.calls) == MAX_AMPLE  # type: ignore[attr-defined]


def request(twin: Twin, decode: Twin, outputs: float = 1.0) -> PoolSizingRequest:
    """The running 1 + 1 pools of ``twin``'s workload (its outputs ``outputs`` times as long), the
    prefill pool stepping as ``twin``, the decode pool as ``decode``."""
    workload = twin.workload
    if outputs != 1.0:
        longer = tuple(
            replace(r, output_tokens=max(1, round(r.output_tokens * outputs))) for r in workload.requests
        )
        workload = replace(workload, requests=longer)
    return PoolSizingRequest(
        key="chat-pools",
        model="llama-3.1-8b",
        accelerator="h100",
        tensor_parallel_size=1,
        max_model_len=8192,
        gpu_memory_utilization=0.9,
        steps_by_role={"prefill": pool_steps(twin), "decode": pool_steps(decode, decode_only=True)},
        workload=window_of(workload, 2.0),
        layout=LAYOUT,
        slo=SLO_,
        kv_bandwidth_gbps=25.0,
        kv_latency_ms=1.0,
        requests_per_replica=60,
        sustained_s=0.0,  # a burst of 60 requests a replica: the logic, not the horizon, is tested here
    )


@pytest.fixture(scope="module")
def twin(sim_twin: Callable[[int], tuple[TwinFit, Twin]]) -> Twin:
    return sim_twin(64)[1]


@pytest.fixture(scope="module")
def alike(twin: Twin) -> PoolCapacities:
    """Both pools stepping as the twin."""
    return pool_capacities(request(twin, twin))


def test_both_pools_fit_on_their_own_steps_and_serve_something(alike: PoolCapacities) -> None:
    assert [p.role for p in alike.pools] == ["prefill", "decode"]
    assert all(p.own for p in alike.pools)
    assert alike.prefill_req_s > 0 and alike.decode_req_s > 0
    assert alike.evaluations >= 2 and alike.cpu_seconds > 0
    assert "one prefill replica serves" in alike.describe()


def test_a_decode_pool_that_steps_slower_serves_less_per_replica(twin: Twin, alike: PoolCapacities) -> None:
    slow = pool_capacities(request(twin, twin.slowed(1.6)))
    assert slow.decode_req_s < 0.85 * alike.decode_req_s
    assert slow.pools[1].stable_ratio > 1.2  # the decode pool's steps against the joint fit


def test_longer_outputs_shift_the_ratio_towards_decode(twin: Twin, alike: PoolCapacities) -> None:
    longer = pool_capacities(request(twin, twin, outputs=3.0))
    # Each request holds a decode slot three times as long: a decode replica serves fewer of them,
    # while a prefill replica's work per request is the same prompt.
    assert longer.decode_req_s < 0.7 * alike.decode_req_s
    ratio_before = alike.prefill_req_s / alike.decode_req_s
    assert longer.prefill_req_s / longer.decode_req_s > 1.3 * ratio_before


def test_the_pools_are_read_on_the_sample_the_colocated_planner_sizes_on(
    twin: Twin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The larger synthesized sample (``Twin.for_planning``), not the ranking's: a capacity at a
    TTFT quantile rests on the few longest prompts. The colocated replica it is compared with is
    read on the same twin, over its arrival samples."""
    read_on: list[Twin] = []
    evaluator, planning = sizing.pools_evaluator, sizing.planning_capacity

    def recording(on: Twin, *args: Any) -> Any:
        read_on.append(on)
        return evaluator(on, *args)

    def colocated(on: Twin, *args: Any, **kwargs: Any) -> tuple[float, float]:
        read_on.append(on)
        return planning(on, *args, **kwargs)

    monkeypatch.setattr(sizing, "pools_evaluator", recording)
    monkeypatch.setattr(sizing, "planning_capacity", colocated)
    pool_capacities(replace(request(twin, twin), colocated=TunedConfig(1024, 64)))
    assert [len(t.workload.requests) for t in read_on] == [SUSTAINED_REQUESTS] * 2
    assert read_on[0] is read_on[1] and read_on[1].arrival_seeds == arrival_seeds(SUSTAINED_SAMPLES)


def test_by_default_a_pool_is_read_at_what_it_sustains_not_what_it_absorbs_in_a_burst(
    twin: Twin, alike: PoolCapacities
) -> None:
    colocated = TunedConfig(1024, 64)  # the service's own knobs, read on the same twin
    sustained = pool_capacities(replace(request(twin, twin), sustained_s=SUSTAINED_S, colocated=colocated))
    assert alike.colocated_req_s is None and sustained.colocated_req_s is not None
    # One colocated GPU serves less than a prefill and a decode GPU together.
    assert 0 < sustained.colocated_req_s < sustained.prefill_req_s + sustained.decode_req_s
    assert PoolSizingRequest.__dataclass_fields__["sustained_s"].default == SUSTAINED_S
    # Three minutes of arrivals build the queues a burst of 60 requests a replica never does.
    assert sustained.decode_req_s <= alike.decode_req_s and sustained.prefill_req_s <= alike.prefill_req_s
    assert (
        sustained.decode_req_s < 0.95 * alike.decode_req_s
        or sustained.prefill_req_s < 0.95 * alike.prefill_req_s
    )


def test_the_twins_error_is_read_on_each_running_pools_own_quantile(
    twin: Twin, alike: PoolCapacities
) -> None:
    asked = request(twin, twin)
    rate = 0.5 * min(alike.prefill_req_s, alike.decode_req_s)
    # What the sizing's twin predicts for the running pools at that rate, as the sizing reads it.
    fitted = build_twin(asked, min_steps=asked.min_steps)
    pools, _ = pool_twins(fitted, asked.steps_by_role, asked.min_steps, "stable")
    predicted = pools_latencies(fitted, asked, pools, LAYOUT, rate)
    assert 0 < predicted.prefill_ttft_ms < predicted.ttft_ms  # the prefill pool's share of the client's
    # The prefill pool measured 25% slower than predicted, the decode pool as predicted.
    measured = MeasuredPools(rate, 1, 1, predicted.prefill_ttft_ms * 1.25, predicted.itl_ms)
    sizes = pool_capacities(replace(asked, measured=measured))
    assert sizes.error("prefill") == pytest.approx(0.2, abs=1e-6)  # |1 / 1.25 - 1|
    assert sizes.error("decode") == pytest.approx(0.0, abs=1e-6)
    assert "the twin's error on the running pools: prefill TTFT 20%, decode ITL 0%" in sizes.describe()
    unknown = pool_capacities(replace(asked, measured=MeasuredPools(rate, 1, 1, None, predicted.itl_ms)))
    assert unknown.error("prefill") is None and unknown.error("decode") == pytest.approx(0.0, abs=1e-6)
    assert alike.error("prefill") is None and alike.error("decode") is None  # nothing measured
