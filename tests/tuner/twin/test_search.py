"""Search on the twin: seeded TPE over the space, each evaluation one capacity prediction."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
from chunkpilot.engine.sim.capacity import retime
from chunkpilot.engine.sim.engine import SimConfig
from chunkpilot.engine.sim.metrics import StepTelemetry
from chunkpilot.engine.sim.offline import SLO, simulate
from chunkpilot.engine.sim.scheduler import SchedulerConfig
from chunkpilot.engine.sim.workload import Workload, load_trace
from chunkpilot.tuner.space import Knob, KnobRange, SearchSpace, TunedConfig
from chunkpilot.tuner.twin import Twin, fit_steps, synthesize
from chunkpilot.tuner.twin.search import (
    REFINE_DRAWS,
    Candidate,
    evaluate_on_twin,
    refine_on_draws,
    scheduler_of,
    search_on_twin,
    twin_objective,
)
from chunkpilot.tuner.twin.validate import observe_window

from chunkpilot.api import Objective

SLO_ = SLO(itl_ms=50.0, ttft_ms=2000.0)
SPACE = SearchSpace(
    ranges={
        Knob.MAX_NUM_BATCHED_TOKENS: KnobRange(256, 4096),
        Knob.MAX_NUM_SEQS: KnobRange(16, 512),
    },
    fixed=TunedConfig(2048, 256),
)


def _observed() -> tuple[StepTelemetry, list[Workload]]:
    """The simulator's steps at one load and three draws of the workload captured from it."""
    lengths = load_trace("azure_conv_2023", rate=1.0, limit=120)
    scheduler = SchedulerConfig(max_num_batched_tokens=1024, max_num_seqs=256)
    engine = SimConfig(model="llama-3.1-8b", accelerator="h100", scheduler=scheduler)
    telemetry = StepTelemetry()
    observed = simulate(engine, retime(lengths, 3.0), SLO_, keep_records=True, telemetry=telemetry)
    window = observe_window(observed, 8192)
    return telemetry, [synthesize(window, 120, max_model_len=8192, seed=i) for i in range(REFINE_DRAWS)]


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> Twin:
    telemetry, (workload, *_draws) = _observed()
    fit = fit_steps(telemetry.totals(), "llama-3.1-8b", "h100")
    directory: Path = tmp_path_factory.mktemp("twin")
    return Twin.build(fit, workload, directory)


@pytest.fixture(scope="module")
def draws() -> list[Workload]:
    """Further draws of the twin's captured workload."""
    return _observed()[1][1:]


def test_ranking_is_distinct_best_first_and_inside_the_space(twin: Twin) -> None:
    result = search_on_twin(twin, SPACE, SLO_, seed=3, max_evaluations=12, requests=120, tolerance=0.1)
    configs = [c.config for c in result.ranked]
    assert result.evaluations == 12 == len(configs) == len(set(configs))
    assert all(SPACE.contains(c) for c in configs)
    rates = [c.capacity_req_s for c in result.ranked]
    assert rates == sorted(rates, reverse=True) and rates[0] > 0
    assert result.cpu_seconds > 0
    assert result.best is result.ranked[0]


def test_seeded_search_is_deterministic_and_honours_warm_and_exclude(twin: Twin) -> None:
    warm = TunedConfig(512, 64)
    first = search_on_twin(twin, SPACE, SLO_, seed=5, warm=[warm], max_evaluations=8, requests=120)
    again = search_on_twin(twin, SPACE, SLO_, seed=5, warm=[warm], max_evaluations=8, requests=120)
    assert first.ranked == again.ranked and first.evaluations == again.evaluations
    assert warm in {c.config for c in first.ranked}
    excluded = search_on_twin(
        twin, SPACE, SLO_, seed=5, warm=[warm], exclude=[warm], max_evaluations=8, requests=120
    )
    assert warm not in {c.config for c in excluded.ranked}
    assert excluded.evaluations == 8 and len(excluded.ranked) == 7


def test_cpu_budget_stops_the_search(twin: Twin) -> None:
    result = search_on_twin(twin, SPACE, SLO_, seed=1, cpu_budget_s=0.0, requests=120)
    assert result.evaluations == 0 and result.ranked == () and result.best is None


def test_objective_per_gpu() -> None:
    candidate = Candidate(TunedConfig(1024, 128), capacity_req_s=6.0, tokens_s=1200.0)
    assert twin_objective(candidate, Objective.GOODPUT, 2) == 3.0
    assert twin_objective(candidate, Objective.THROUGHPUT, 4) == 300.0
    assert math.isnan(Candidate(TunedConfig(1024, 128), 0.0).itl_ms)


def test_scheduler_of_carries_every_knob() -> None:
    config = TunedConfig(2048, 128, long_prefill_token_threshold=512)
    scheduler = scheduler_of(config, 4096)
    assert scheduler.max_num_batched_tokens == 2048 and scheduler.max_num_seqs == 128
    assert scheduler.long_prefill_token_threshold == 512 and scheduler.max_model_len == 4096


def test_refinement_ranks_the_candidates_near_the_best_on_the_mean_over_the_draws(
    twin: Twin, draws: list[Workload]
) -> None:
    near, close, far = TunedConfig(2048, 256), TunedConfig(1024, 128), TunedConfig(256, 16)
    ranked = [Candidate(near, 10.0), Candidate(close, 9.8), Candidate(far, 5.0)]
    out, refined = refine_on_draws(twin, ranked, draws, SLO_, requests=120, tolerance=0.1)
    assert {c.config for c in refined} == {near, close}  # far is 50% below the best: not refined

    def mean(candidate: Candidate) -> float:
        runs = [
            evaluate_on_twin(replace(twin, workload=w), candidate.config, SLO_, requests=120, tolerance=0.1)
            for w in draws
        ]
        return (candidate.capacity_req_s + sum(r.capacity_req_s for r in runs)) / (1 + len(runs))

    got = {c.config: c.capacity_req_s for c in out}
    assert got[near] == pytest.approx(mean(ranked[0])) and got[close] == pytest.approx(mean(ranked[1]))
    assert got[far] == 5.0
    assert [c.capacity_req_s for c in out] == sorted(got.values(), reverse=True)
    # Nothing to separate (one candidate in the band), or no CPU left: the ranking is kept as it is.
    alone = [ranked[0], ranked[2]]
    assert refine_on_draws(twin, alone, draws, SLO_, requests=120, tolerance=0.1) == (alone, [])
    spent = refine_on_draws(twin, ranked, draws, SLO_, requests=120, tolerance=0.1, cpu_budget_s=0.0)
    assert spent == (ranked, [])


def test_a_search_with_draws_refines_its_top_and_stays_seeded(twin: Twin, draws: list[Workload]) -> None:
    first = search_on_twin(
        twin, SPACE, SLO_, seed=3, max_evaluations=10, requests=120, tolerance=0.1, draws=draws
    )
    again = search_on_twin(
        twin, SPACE, SLO_, seed=3, max_evaluations=10, requests=120, tolerance=0.1, draws=draws
    )
    assert first.ranked == again.ranked and first.refined == again.refined
    plain = search_on_twin(twin, SPACE, SLO_, seed=3, max_evaluations=10, requests=120, tolerance=0.1)
    assert first.evaluations == plain.evaluations == 10 and plain.refined == 0
    assert {c.config for c in first.ranked} == {c.config for c in plain.ranked}
    rates = [c.capacity_req_s for c in first.ranked]
    assert rates == sorted(rates, reverse=True)
