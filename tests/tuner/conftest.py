"""Fixtures the tuner's tests share; the builders behind them are in :mod:`chunkpilot.testing`."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from chunkpilot.engine.sim.capacity import retime
from chunkpilot.engine.sim.engine import SimConfig
from chunkpilot.engine.sim.metrics import StepTelemetry
from chunkpilot.engine.sim.offline import SLO, simulate
from chunkpilot.engine.sim.scheduler import SchedulerConfig
from chunkpilot.engine.sim.workload import load_trace
from chunkpilot.tuner.space import Knob, KnobRange, SearchSpace, TunedConfig
from chunkpilot.tuner.twin import Twin, TwinFit, online

from chunkpilot.api import Objective
from chunkpilot.bench.exhaustive import FULL, BenchSettings, SLOPair
from chunkpilot.bench.twin_validate import observe_window
from chunkpilot.testing.tuner import a_sim_twin

#: A benchmark small enough for a unit test: one workload, one loose SLO pair, a 2 x 2 grid, one job.
TINY_BENCH: dict[str, Any] = {
    "requests": 10,
    "trials": 3,
    "repeats": 1,
    "tolerance": 0.3,
    "budget_points": 2,
    "seq_values": (64, 256),
    "long_prefill_values": (),
    "autotune_seqs": (64,),
    "workloads": ("azure_code",),
    "slo_pairs": (SLOPair("loose", itl_ms=150.0, ttft_ms=300.0),),
    "jobs": 1,
}


@pytest.fixture(scope="module")
def sim_twin(tmp_path_factory: pytest.TempPathFactory) -> Callable[[int], tuple[TwinFit, Twin]]:
    """:func:`~chunkpilot.testing.tuner.a_sim_twin` at a ``max_num_seqs``: fitted once a module for each."""

    @functools.cache
    def fitted(max_num_seqs: int) -> tuple[TwinFit, Twin]:
        return a_sim_twin(tmp_path_factory.mktemp("twin"), max_num_seqs=max_num_seqs)

    return fitted


@pytest.fixture
def tiny_bench() -> Callable[..., BenchSettings]:
    """The full benchmark's settings cut down to :data:`TINY_BENCH`, ``overrides`` replacing any of them."""

    def settings(**overrides: Any) -> BenchSettings:
        return replace(FULL, **{**TINY_BENCH, **overrides})

    return settings


RANKING_SLO = SLO(itl_ms=50.0, ttft_ms=2000.0)
RANKING_INCUMBENT = TunedConfig(512, 128)


@pytest.fixture(scope="session")
def ranking_request() -> online.Request:
    """A ranking request from a simulated engine's telemetry, ended by a count of evaluations."""
    workload = load_trace("azure_conv_2023", rate=1.0, limit=200)
    engine = SimConfig(scheduler=SchedulerConfig(**RANKING_INCUMBENT.as_dict(), max_model_len=8192))  # type: ignore[arg-type]
    telemetry = StepTelemetry()
    observed = simulate(engine, retime(workload, 3.0, 1), RANKING_SLO, keep_records=True, telemetry=telemetry)
    return online.Request(
        key="abc-0",
        model="llama-3.1-8b",
        accelerator="h100",
        tensor_parallel_size=1,
        max_model_len=8192,
        gpu_memory_utilization=0.92,
        steps=telemetry.totals(),
        workload=observe_window(observed, 8192),
        slo=RANKING_SLO,
        space=SearchSpace(
            ranges={Knob.MAX_NUM_BATCHED_TOKENS: KnobRange(256, 4096, log=True)}, fixed=RANKING_INCUMBENT
        ),
        incumbent=RANKING_INCUMBENT,
        stable_rate_req_s=3.0,
        measured_ms=(observed.itl_at_slo_quantile_ms, observed.ttft_at_slo_quantile_ms),
        objective=Objective.GOODPUT,
        seed=7,
        rank=True,
        cpu_budget_s=600.0,
        max_evaluations=4,
    )
