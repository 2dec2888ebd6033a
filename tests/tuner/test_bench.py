"""Tuner benchmark: grid and snapping, the three methods, and a tiny run end to end on the simulator."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import replace

import pytest
from chunkpilot.tuner.space import Knob, KnobRange, SearchSpace, TunedConfig, build_space

from chunkpilot.bench.exhaustive import (
    FULL,
    METHODS,
    QUICK,
    BenchError,
    BenchSettings,
    Capacity,
    Grid,
    SLOPair,
    autotune_order,
    best_so_far,
    run_benchmark,
    run_grid,
    run_random,
    run_tpe,
    scenario_facts,
    sim_config,
)
from chunkpilot.bench.report import format_table
from chunkpilot.cli import main

SPACE = SearchSpace(
    ranges={
        Knob.MAX_NUM_BATCHED_TOKENS: KnobRange(256, 8192),
        Knob.MAX_NUM_SEQS: KnobRange(16, 1024),
        Knob.LONG_PREFILL_TOKEN_THRESHOLD: KnobRange(64, 8192),
    },
    fixed=TunedConfig(8192, 1024),
)
SETTINGS = replace(FULL, budget_points=6, seq_values=(16, 64, 256, 1024), long_prefill_values=(512,))
GRID = Grid.over(SPACE, SETTINGS)


def peaked(config: TunedConfig) -> Capacity:
    """A smooth objective peaking at budget 2048, 256 sequences, long-prefill off."""
    budget, seqs = config.max_num_batched_tokens, config.max_num_seqs
    value = 40.0 - 6 * abs(math.log2(budget / 2048)) - 3 * abs(math.log2(seqs / 256))
    value -= 2.0 if config.long_prefill_token_threshold else 0.0
    rate = max(0.0, value)
    return Capacity(rate, {"itl": -0.1 if rate else 0.5, "ttft": -0.1}, 1)


def test_grid_covers_the_space_with_distinct_valid_configs() -> None:
    assert GRID.values[Knob.MAX_NUM_BATCHED_TOKENS][0] == 256
    assert GRID.values[Knob.MAX_NUM_BATCHED_TOKENS][-1] == 8192
    assert len(set(GRID.configs)) == len(GRID.configs)
    assert all(SPACE.contains(c) for c in GRID.configs)
    # A long-prefill threshold at or above the budget is "off": 512 survives only for larger budgets.
    assert {c.long_prefill_token_threshold for c in GRID.configs} == {0, 512}
    assert all(c.long_prefill_token_threshold < c.max_num_batched_tokens for c in GRID.configs)


def test_snap_lands_on_the_nearest_grid_point() -> None:
    snapped = GRID.snap(
        {"max_num_batched_tokens": 2000, "max_num_seqs": 200, "long_prefill_token_threshold": 9000}
    )
    assert snapped in GRID.configs
    assert snapped.max_num_seqs == 256
    assert snapped.long_prefill_token_threshold == 0
    assert snapped.max_num_batched_tokens in GRID.values[Knob.MAX_NUM_BATCHED_TOKENS]
    small = GRID.snap(
        {"max_num_batched_tokens": 300, "max_num_seqs": 1024, "long_prefill_token_threshold": 500}
    )
    assert small in GRID.configs and small.max_num_batched_tokens == 256 and small.max_num_seqs <= 256


def test_best_so_far_is_monotone_and_padded() -> None:
    history = [(GRID.configs[0], 3.0), (GRID.configs[1], 1.0), (GRID.configs[2], 5.0)]
    assert best_so_far(history, 5) == [3.0, 3.0, 5.0, 5.0, 5.0]


def test_autotune_sweep_is_seqs_outer_budget_inner_in_fixed_order() -> None:
    order = autotune_order(GRID, SETTINGS)
    assert len(order) == len(set(order))
    assert all(c in GRID.configs and c.long_prefill_token_threshold == 0 for c in order)
    # auto_tune's lists (128, 256, 512, 1024) snap to the grid's 64, 256, 1024: 64 comes first.
    first_block = [c.max_num_batched_tokens for c in order[:4]]
    assert {c.max_num_seqs for c in order[:4]} == {64}
    assert first_block == sorted(first_block)
    assert [c for c, _ in run_grid(GRID, peaked, 4, SETTINGS)] == order[:4]


def test_methods_pick_distinct_grid_configs() -> None:
    facts = scenario_facts(FULL, SLOPair("x", itl_ms=50.0, ttft_ms=2000.0))
    space = build_space(facts)
    grid = Grid.over(space, SETTINGS)
    tpe = run_tpe(grid, facts, peaked, 10, "t")
    rnd = run_random(grid, peaked, 10, 1)
    for history in (tpe, rnd):
        configs = [c for c, _ in history]
        assert len(configs) == 10 == len(set(configs))
        assert all(c in grid.configs for c in configs)
    assert run_tpe(grid, facts, peaked, 10, "t") == tpe  # seeded: reproducible


def test_tpe_stops_when_the_grid_is_exhausted() -> None:
    tiny = replace(SETTINGS, budget_points=2, seq_values=(64,), long_prefill_values=())
    grid = Grid.over(SPACE, tiny)
    facts = scenario_facts(FULL, SLOPair("x", itl_ms=50.0, ttft_ms=2000.0))
    history = run_tpe(grid, facts, peaked, 10, "t")
    assert len(grid.configs) < 10
    assert {c for c, _ in history} == set(grid.configs) and len(history) == len(grid.configs)


def test_settings_reject_bad_values() -> None:
    with pytest.raises(BenchError, match="--trials"):
        replace(QUICK, trials=0)
    with pytest.raises(BenchError, match="--workload"):
        replace(QUICK, workloads=("sharegpt",))


def test_tiny_benchmark_end_to_end_on_the_simulator(tiny_bench: Callable[..., BenchSettings]) -> None:
    settings = tiny_bench()
    result = run_benchmark(settings)
    assert result.simulations > 0
    [scenario] = result.scenarios
    assert scenario.optimum > 0 and scenario.default >= 0
    assert set(scenario.best_after) == {*METHODS, "tpe-cold"}
    assert max(rate for _, rate in scenario.landscape) == scenario.optimum
    for method in METHODS:
        curve = scenario.best_after[method]
        assert len(curve) == 3 and curve == sorted(curve)
        assert max(curve) <= scenario.optimum  # exhaustive over the same grid
    data = json.loads(json.dumps(result.to_dict()))
    assert data["scenarios"][0]["optimum_req_s"] == scenario.optimum
    assert set(data["scenarios"][0]["share_after_trials"]) == {*METHODS, "tpe-cold"}
    assert "azure_code / loose" in format_table(result)


def test_cli_rejects_bad_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "tuner", "--quick", "--jobs", "0"]) == 2
    assert "--jobs" in capsys.readouterr().err


def test_a_slice_too_short_to_load_the_engine_is_a_clear_error(
    tiny_bench: Callable[..., BenchSettings],
) -> None:
    settings = tiny_bench(
        requests=2,
        trials=1,
        seq_values=(64,),
        workloads=("azure_conv",),
        slo_pairs=(SLOPair("loose", itl_ms=1000.0, ttft_ms=60000.0),),
    )
    with pytest.raises(BenchError, match="--requests 2"):
        run_benchmark(settings)


def test_the_simulated_engine_runs_every_tuned_knob_of_the_config() -> None:
    config = TunedConfig(
        2048,
        128,
        max_num_active_seqs=64,
        long_prefill_token_threshold=512,
        max_num_partial_prefills=2,
        max_long_partial_prefills=1,
    )
    scheduler = sim_config(config, QUICK).scheduler
    assert {name: getattr(scheduler, name) for name in config.as_dict()} == config.as_dict()
    assert scheduler.max_model_len == QUICK.max_model_len
