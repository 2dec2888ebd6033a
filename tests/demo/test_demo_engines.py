"""``chunkpilot demo --fast --engine sglang|trtllm`` with one trial: the engine's service runs on the
simulator in that engine's dialect, its metrics reach Prometheus at the engine's own path, and the
tuner measures both tracks in that engine's metric names and judges the trial on the measurements.

One trial keeps this at about two minutes per engine; whether a promotion follows is the default
demo's test (``test_demo_e2e.py``), whose four trials and load surge cost about twelve minutes.
"""

from __future__ import annotations

import csv

import pytest

from chunkpilot.testing.demo import DemoRun

pytestmark = [pytest.mark.e2e, pytest.mark.cluster, pytest.mark.prometheus, pytest.mark.slow]

#: Verdicts reached on measurements of both tracks (not an aborted or inconclusive trial).
JUDGED = {"Promoted", "Discarded", "Pruned"}


@pytest.mark.parametrize("engine", ["sglang", "trtllm"])
def test_one_trial_is_measured_and_judged_in_the_engines_own_metrics(engine: str, demo: DemoRun) -> None:
    result = demo.run("--engine", engine, "--max-trials", "1", "--max-replicas", "1", timeout=900)
    output = result.stdout + result.stderr
    assert result.returncode in (0, 1), output[-6000:]  # 1: the one trial promoted nothing
    with (demo.reports / "code-assist" / "trials.csv").open() as handle:
        trials = list(csv.DictReader(handle))
    assert len(trials) == 1, output[-6000:]
    trial = trials[0]
    assert trial["verdict"] in JUDGED, f"{trial['verdict']}: {trial['reason']}"
    for measured in ("itl_ms", "ttft_ms", "stable_itl_ms", "stable_ttft_ms", "throughput_tok_s"):
        assert trial[measured] and float(trial[measured]) > 0, (measured, trial)
    assert float(trial["samples"]) >= 100
    assert "ITL judged from TPOT" not in trial["reason"]  # the simulator exports per-token ITL
    assert not demo.leftovers(), "the demo left processes running"
