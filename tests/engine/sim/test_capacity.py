"""The simulator's capacity search: bisection on the Poisson rate, from a start and a bracket growth."""

from __future__ import annotations

import pytest
from chunkpilot.engine.sim.capacity import find_capacity
from chunkpilot.engine.sim.engine import SimConfig
from chunkpilot.engine.sim.offline import SLO
from chunkpilot.engine.sim.scheduler import SchedulerConfig
from chunkpilot.engine.sim.workload import load_trace

ENGINE = SimConfig(
    model="llama-3.1-8b",
    accelerator="h100",
    scheduler=SchedulerConfig(max_num_batched_tokens=1024, max_num_seqs=128),
)
SLO_ = SLO(itl_ms=50.0, ttft_ms=2000.0)


def test_a_start_near_the_answer_with_a_small_growth_needs_fewer_probes() -> None:
    lengths = load_trace("azure_conv_2023", rate=1.0, limit=100)
    wide = find_capacity(ENGINE, lengths, SLO_, tolerance=0.03, start_rate=1.0)
    near = find_capacity(ENGINE, lengths, SLO_, tolerance=0.03, start_rate=wide.capacity_req_s, growth=1.1)
    assert wide.feasible and near.feasible
    assert near.capacity_req_s == pytest.approx(wide.capacity_req_s, rel=0.03)
    assert len(near.probes) < len(wide.probes)
    # Each step of the bracket is the growth: consecutive probes before bisection differ by 1.1x.
    assert near.probes[1].rate_req_s == pytest.approx(near.probes[0].rate_req_s * 1.1)


def test_growth_must_widen_the_bracket() -> None:
    lengths = load_trace("azure_conv_2023", rate=1.0, limit=20)
    with pytest.raises(ValueError, match="growth"):
        find_capacity(ENGINE, lengths, SLO_, growth=1.0)
