"""Fixtures the tuner's tests share; the builders behind them are in :mod:`chunkpilot.testing`."""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest
from chunkpilot.tuner.twin import Twin, TwinFit

from chunkpilot.testing.tuner import a_sim_twin


@pytest.fixture(scope="module")
def sim_twin(tmp_path_factory: pytest.TempPathFactory) -> Callable[[int], tuple[TwinFit, Twin]]:
    """:func:`~chunkpilot.testing.tuner.a_sim_twin` at a ``max_num_seqs``: fitted once a module for each."""

    @functools.cache
    def fitted(max_num_seqs: int) -> tuple[TwinFit, Twin]:
        return a_sim_twin(tmp_path_factory.mktemp("twin"), max_num_seqs=max_num_seqs)

    return fitted
