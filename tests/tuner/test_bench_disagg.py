"""``chunkpilot bench disagg``: the crossover direction, the twin's recommendation, the JSON, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chunkpilot.bench.disagg import (
    DISAGG_QUICK,
    DisaggSettings,
    bimodal_workload,
    format_disagg_markdown,
    run_disagg_benchmark,
)
from chunkpilot.bench.exhaustive import BenchError
from chunkpilot.cli import main


def test_the_workload_is_bimodal_chat_and_long_summarisation_prompts() -> None:
    workload = bimodal_workload(400, 0.3)
    prompts = sorted(r.prompt_tokens for r in workload.requests)
    assert len(prompts) == 400
    long = [p for p in prompts if p >= 2000]
    assert 0.2 < len(long) / len(prompts) < 0.45  # the summarisation share (a few chat prompts are long too)
    assert prompts[len(prompts) // 2] < 1500  # the median request is a chat turn
    arrivals = [r.arrival_s for r in workload.requests]
    assert arrivals == sorted(arrivals)


def test_settings_reject_what_cannot_be_compared(tmp_path: Path) -> None:
    with pytest.raises(BenchError, match="--gpus"):
        DisaggSettings(gpus=1)
    with pytest.raises(BenchError, match="--bandwidth"):
        DisaggSettings(sweep_gbps=(25.0, 0.0))
    with pytest.raises(BenchError, match="--truth-gpu"):
        DisaggSettings(truth=str(tmp_path / "missing.json"))
    assert main(["bench", "disagg", "--quick", "--gpus", "1"]) == 2


@pytest.mark.slow
def test_quick_run_shows_the_crossover_and_the_recommendation() -> None:
    result = run_disagg_benchmark(DISAGG_QUICK)
    data = json.loads(json.dumps(result.to_dict()))
    head = data["headline"]
    # At 25 GB/s disaggregating the same 4 GPUs serves more within both SLOs than the best colocated budget.
    assert head["gpus"] == 4 and head["disaggregated_req_s"] > head["colocated_req_s"] > 0
    # At the target load every colocated budget misses an SLO; the disaggregated topology meets both.
    slo = data["settings"]["slo"]
    for quantiles in data["colocated_at_target"].values():
        assert quantiles["itl_ms"] > slo["itl_ms"] or quantiles["ttft_ms"] > slo["ttft_ms"]
    at = data["disaggregated_at_target"]
    assert at["itl_ms"] <= slo["itl_ms"] and at["ttft_ms"] <= slo["ttft_ms"]
    # The sweep: fast links pay, a slow one does not (the KV hop eats the TTFT target).
    sweep = {c["bandwidth_gbps"]: c for c in data["bandwidth_sweep"]}
    assert sweep[25.0]["disaggregated_req_s"] > sweep[25.0]["colocated_req_s"]
    assert sweep[0.5]["disaggregated_req_s"] < sweep[0.5]["colocated_req_s"]
    assert sweep[0.5]["kv_transfer_ms_p50"] > sweep[25.0]["kv_transfer_ms_p50"]
    # The twin's recommendation, predicted and true, and what it cost.
    advice = data["recommendation"]
    assert advice["pays"] is True and advice["topology"].endswith("decode replicas")
    assert advice["predicted_req_s"] > 0 and advice["true_req_s"] > 0
    assert advice["share_of_true_best"] > 0.8
    assert advice["cpu_s"] > 0 and advice["evaluations"] >= 1
    assert data["kv_mb_per_request"] == pytest.approx(data["mean_prompt_tokens"] * 131072 / 1e6)
    markdown = format_disagg_markdown(result)
    assert "| twin recommends |" in markdown and "KV-transfer bandwidth" in markdown
    assert markdown.count("| GPUs | KV GB/s |") == 2
