"""The simulator's capacity search: bisection on the Poisson rate, from a start and a bracket growth."""

from __future__ import annotations

import pytest
from chunkpilot.engine.sim.capacity import DEFAULT_GROWTH, NEAR_PROBES, find_capacity, retime
from chunkpilot.engine.sim.engine import SimConfig
from chunkpilot.engine.sim.offline import SLO, simulate
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


def test_a_start_far_from_the_answer_is_not_walked_off_in_small_steps() -> None:
    lengths = load_trace("azure_conv_2023", rate=1.0, limit=100)
    wide = find_capacity(ENGINE, lengths, SLO_, tolerance=0.03, start_rate=1.0)
    far = find_capacity(
        ENGINE, lengths, SLO_, tolerance=0.03, start_rate=wide.capacity_req_s * 200, growth=1.1
    )
    assert far.capacity_req_s == pytest.approx(wide.capacity_req_s, rel=0.03)
    rates = [p.rate_req_s for p in far.probes]
    # The first steps are the small growth's, then the bracket shrinks by the default growth: 1.1x
    # steps alone would take 56 probes to come down 200x.
    assert rates[1] == pytest.approx(rates[0] / 1.1)
    assert rates[NEAR_PROBES] == pytest.approx(rates[NEAR_PROBES - 1] / DEFAULT_GROWTH)
    assert len(rates) < 20


@pytest.mark.parametrize(
    ("slo", "missed"),
    [
        (SLO_, "ttft_at_slo_quantile_ms"),  # above its capacity the queue grows: first tokens late
        (SLO(itl_ms=30.0, ttft_ms=60_000.0), "itl_at_slo_quantile_ms"),  # long chunks slow the gaps
    ],
)
def test_a_probe_stops_once_its_slo_has_missed_and_the_search_finds_the_same_capacity(
    slo: SLO, missed: str
) -> None:
    lengths = load_trace("azure_conv_2023", rate=1.0, limit=300)
    full = find_capacity(ENGINE, lengths, slo, tolerance=0.03, start_rate=5.0)
    stopping = find_capacity(ENGINE, lengths, slo, tolerance=0.03, start_rate=5.0, stop_on_miss=True)
    assert full.feasible and stopping.capacity_req_s == full.capacity_req_s
    assert [(p.rate_req_s, p.slo_met) for p in stopping.probes] == [
        (p.rate_req_s, p.slo_met) for p in full.probes
    ]
    overloaded = retime(lengths, full.capacity_req_s * 1.5)
    whole, cut = simulate(ENGINE, overloaded, slo), simulate(ENGINE, overloaded, slo, stop_on_miss=True)
    target = slo.ttft_ms if missed.startswith("ttft") else slo.itl_ms
    assert not whole.slo_met and getattr(whole, missed) > target
    assert not cut.slo_met and cut.steps < whole.steps and cut.completed < cut.requests == whole.completed
    # Below the capacity nothing changes.
    served = retime(lengths, full.capacity_req_s * 0.8)
    assert simulate(ENGINE, served, slo, stop_on_miss=True).to_dict() | {"wall_s": 0} == simulate(
        ENGINE, served, slo
    ).to_dict() | {"wall_s": 0}


def test_growth_must_widen_the_bracket() -> None:
    lengths = load_trace("azure_conv_2023", rate=1.0, limit=20)
    with pytest.raises(ValueError, match="growth"):
        find_capacity(ENGINE, lengths, SLO_, growth=1.0)


def test_a_sustained_capacity_repeats_the_requests_and_is_no_higher_than_a_bursts() -> None:
    lengths = load_trace("azure_conv_2023", rate=1.0, limit=120)
    stretched = retime(lengths, 5.0, seed=1, min_duration_s=120.0)
    assert stretched.requests[-1].arrival_s > 110.0 and len(stretched.requests) > 2 * 120
    assert [r.prompt_tokens for r in stretched.requests[120:125]] == [
        r.prompt_tokens for r in lengths.requests[:5]
    ]
    assert retime(lengths, 5.0, seed=1).requests == stretched.requests[:120]  # the same draws at first
    burst = find_capacity(ENGINE, lengths, SLO_, tolerance=0.05, start_rate=4.0)
    sustained = find_capacity(ENGINE, lengths, SLO_, tolerance=0.05, start_rate=4.0, min_duration_s=120.0)
    assert 0 < sustained.capacity_req_s <= burst.capacity_req_s
