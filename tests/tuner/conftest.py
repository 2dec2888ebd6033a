"""Fixtures the tuner's tests share; the builders behind them are in :mod:`chunkpilot.testing`."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from chunkpilot.tuner.twin import Twin, TwinFit, online

from chunkpilot.bench import twin_jobs
from chunkpilot.bench.exhaustive import FULL, BenchSettings, SLOPair
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


@pytest.fixture(scope="session")
def ranking_request() -> online.Request:
    """A ranking request from a simulated engine's telemetry, ended by a count of evaluations."""
    return twin_jobs.ranking_request("abc-0")
