"""``chunkpilot bench pool-sizing``: the planner's pools on a hidden truth, the ratio, the JSON, the CLI."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from chunkpilot.bench.exhaustive import BenchError
from chunkpilot.bench.pool_sizing import (
    POOL_SIZING_QUICK,
    PoolSizingResult,
    PoolSizingSettings,
    format_pool_sizing_table,
    run_pool_sizing_benchmark,
)
from chunkpilot.cli import main


@pytest.fixture(scope="module")
def quick() -> PoolSizingResult:
    """Chat and code completion at 1.5 times the running 1 + 1 layout's true capacity."""
    return run_pool_sizing_benchmark(replace(POOL_SIZING_QUICK, jobs=1))


def test_the_ratio_follows_the_mix_and_each_sizing_is_judged_on_the_truth(quick: PoolSizingResult) -> None:
    chat, code = quick.mixes
    assert (chat.mix, code.mix) == ("chat", "code")
    # Code completion: long prompts, a few dozen tokens out; one decode replica serves many prefill ones.
    assert code.decode_req_s > 5 * code.prefill_req_s
    assert chat.decode_req_s < 2 * chat.prefill_req_s
    [chat_sizing], [code_sizing] = chat.sizings, code.sizings
    assert code_sizing.prefill > code_sizing.decode
    assert code_sizing.prefill / code_sizing.decode > chat_sizing.prefill / chat_sizing.decode
    for sizing in (chat_sizing, code_sizing):
        assert sizing.rate_req_s == pytest.approx(
            1.5 * next(m for m in quick.mixes if sizing in m.sizings).running_true_req_s, rel=1e-3
        )
        assert sizing.itl_ms > 0 and sizing.ttft_ms > 0
        assert sizing.met == (sizing.itl_ms <= 20.0 and sizing.ttft_ms <= 400.0)
        assert sizing.fewest is not None and all(p + d == sizing.fewest for p, d in sizing.fewest_splits)
        assert sizing.fixed_ratio is not None and sizing.fixed_ratio >= sizing.fewest
    assert "decode:" in code.fit and "steps" in code.fit  # each pool fitted on what it ran


def test_at_a_quarter_of_one_pair_s_capacity_colocated_is_proposed_as_the_truth_agrees() -> None:
    light = run_pool_sizing_benchmark(replace(POOL_SIZING_QUICK, mixes=("chat",), loads=(0.25,), jobs=1))
    [mix] = light.mixes
    [sizing] = mix.sizings
    assert (sizing.prefill, sizing.decode) == (1, 1)  # a pool never has fewer than one replica
    assert mix.colocated_twin_req_s is not None and sizing.colocated_twin == 1 and sizing.colocated_truth == 1
    assert sizing.proposed == "colocated" and sizing.colocated_wins
    assert light.to_dict()["summary"]["proposals_the_truth_agrees_with"] == 1


def test_the_json_and_the_table_carry_every_sizing(quick: PoolSizingResult) -> None:
    data = json.loads(json.dumps(quick.to_dict()))
    assert [m["mix"] for m in data["mixes"]] == ["chat", "code"]
    sizing = data["mixes"][1]["sizings"][0]
    assert {"prefill", "decode", "met", "fewest", "fixed_ratio", "replicas", "twin_fixed_ratio"} <= set(
        sizing
    )
    assert data["summary"]["sizings"] == 2
    assert data["summary"]["replicas"] == sum(m["sizings"][0]["replicas"] for m in data["mixes"])
    table = format_pool_sizing_table(quick)
    assert "| code | 1.5 |" in table and "sizings meet both SLOs on the truth" in table


def test_settings_reject_what_cannot_be_sized(tmp_path: Path) -> None:
    with pytest.raises(BenchError, match="--mix"):
        PoolSizingSettings(mixes=("poetry",))
    with pytest.raises(BenchError, match="--load"):
        PoolSizingSettings(loads=(0.0,))
    with pytest.raises(BenchError, match="--truth-gpu"):
        PoolSizingSettings(truth=str(tmp_path / "missing.json"))
    assert main(["bench", "pool-sizing", "--quick", "--requests", "10"]) == 2
