"""What the twin predicts of one measurement window, beside the long run."""

from __future__ import annotations

from pathlib import Path

from chunkpilot.engine.sim.offline import SLO
from chunkpilot.engine.sim.scheduler import SchedulerConfig

from chunkpilot.testing.tuner import a_sim_twin

SLO_ = SLO(itl_ms=50.0, ttft_ms=2000.0)
SCHEDULER = SchedulerConfig(max_num_batched_tokens=1024, max_num_seqs=256)


def test_a_short_window_strays_further_from_the_long_run_than_a_long_one(tmp_path: Path) -> None:
    _, twin = a_sim_twin(tmp_path)
    short = twin.window_spread(SCHEDULER, 2.0, SLO_, 15.0)
    long = twin.window_spread(SCHEDULER, 2.0, SLO_, 120.0)
    for (short_low, short_high), (long_low, long_high) in zip(short, long, strict=True):
        assert short_low <= 1.0 <= short_high and long_low <= 1.0 <= long_high
        assert short_high - short_low > long_high - long_low
    itl_low, itl_high = short[0]
    assert itl_high / itl_low > 1.05  # a 15 s window's ITL p99 is not the long run's
    assert twin.window_spread(SCHEDULER, 2.0, SLO_, 120.0) == long  # one fixed arrival draw


def test_nothing_to_spread_without_a_load_or_a_window(tmp_path: Path) -> None:
    _, twin = a_sim_twin(tmp_path)
    assert twin.window_spread(SCHEDULER, 0.0, SLO_, 60.0) == ((1.0, 1.0), (1.0, 1.0))
    assert twin.window_spread(SCHEDULER, 2.0, SLO_, 0.0) == ((1.0, 1.0), (1.0, 1.0))
