"""A topology trial's pools refit on their own steps: the layout's capacity follows how they step."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
from chunkpilot.engine.sim.offline import SLO
from chunkpilot.tuner.topology.layouts import Layout, Pool
from chunkpilot.tuner.topology.pools import PoolCheckRequest, check_pools
from chunkpilot.tuner.topology.simulate import twin_evaluator
from chunkpilot.tuner.twin import Twin, TwinFit

from chunkpilot.testing.tuner import pool_steps

SLO_ = SLO(25.0, 0.99, 600.0, 0.95)
LAYOUT = Layout(Pool(1, 4096, 64), Pool(1, 1024, 64))
REQUESTS_PER_REPLICA = 60


def request(twin: Twin, prefill: Twin, decode: Twin, **fields: object) -> PoolCheckRequest:
    steps = {"prefill": pool_steps(prefill), "decode": pool_steps(decode, decode_only=True)}
    values: dict[str, object] = {
        "key": "chat-trial-3",
        "twin": twin,
        "layout": LAYOUT,
        "steps_by_role": steps,
        "slo": SLO_,
        "kv_bandwidth_gbps": 25.0,
        "kv_latency_ms": 1.0,
        "max_model_len": 8192,
        "requests_per_replica": REQUESTS_PER_REPLICA,
        **fields,
    }
    return PoolCheckRequest(**values)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def stable(sim_twin: Callable[[int], tuple[TwinFit, Twin]]) -> tuple[Twin, float]:
    """The stable's twin and the layout's capacity on it (what the recommendation predicted)."""
    twin = sim_twin(64)[1]
    before = twin_evaluator(twin, SLO_, 25.0, 1.0, requests_per_replica=REQUESTS_PER_REPLICA)(LAYOUT)
    assert before.capacity_req_s > 0
    return twin, before.capacity_req_s


def test_pools_that_step_as_the_stable_keep_its_prediction(stable: tuple[Twin, float]) -> None:
    twin, before = stable
    check = check_pools(request(twin, twin, twin))
    assert [p.role for p in check.pools] == ["prefill", "decode"]
    assert all(p.own for p in check.pools)
    for pool in check.pools:
        assert pool.stable_ratio == pytest.approx(1.0, abs=0.05)
    assert check.capacity_req_s == pytest.approx(before, rel=0.15)


def test_a_decode_pool_that_steps_slower_lowers_the_prediction_and_says_by_how_much(
    stable: tuple[Twin, float],
) -> None:
    twin, before = stable
    check = check_pools(request(twin, twin, twin.slowed(1.6)))
    prefill, decode = check.pools
    assert prefill.stable_ratio == pytest.approx(1.0, abs=0.05)
    assert decode.stable_ratio == pytest.approx(1.6, rel=0.05)
    assert check.capacity_req_s < 0.8 * before
    assert "decode: " in check.describe() and "1.6" in check.describe()


def test_a_pool_that_ran_too_few_steps_is_predicted_on_the_stables_model(stable: tuple[Twin, float]) -> None:
    twin, _before = stable
    few = request(twin, twin, twin.slowed(1.6))
    thin = {
        "prefill": few.steps_by_role["prefill"],
        "decode": pool_steps(twin.slowed(1.6), decode_only=True, requests=1),
    }
    check = check_pools(replace(few, steps_by_role=thin))
    assert check.pools[0].own and not check.pools[1].own
    assert "fewer than" in check.pools[1].describe()
