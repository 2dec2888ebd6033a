"""``chunkpilot bench sim``: both cores as whole processes, the trace as the mocker reads it."""

from __future__ import annotations

import json

import pytest
from chunkpilot.engine.sim import compiled
from chunkpilot.engine.sim.workload import load_trace

from chunkpilot.bench.exhaustive import BenchError
from chunkpilot.bench.sim_peers import SimPeerSettings, format_sim_peers, mooncake_lines, run_sim_peers


def test_the_trace_becomes_mooncake_lines_with_unique_blocks() -> None:
    workload = load_trace("azure_conv_2023", limit=3)
    lines = [json.loads(line) for line in mooncake_lines(workload)]
    assert [r["input_length"] for r in lines] == [s.prompt_tokens for s in workload.requests]
    assert [r["output_length"] for r in lines] == [s.output_tokens for s in workload.requests]
    assert [r["timestamp"] for r in lines] == [round(s.arrival_s * 1e3, 3) for s in workload.requests]
    blocks = [b for r in lines for b in r["hash_ids"]]
    assert len(blocks) == len(set(blocks)), "a shared block id would give the mocker a prefix hit"
    assert [len(r["hash_ids"]) for r in lines] == [-(-s.prompt_tokens // 16) for s in workload.requests]


def test_both_cores_run_as_processes_and_answer_alike() -> None:
    settings = SimPeerSettings(limit=300, repeat=1)
    lines: list[str] = []
    result = run_sim_peers(settings, lines.append)
    names = [m.method for m in result.methods]
    assert "chunkpilot-python" in names
    assert "dynamo-mocker" in result.skipped
    if (compiled.build_dir() / compiled.MARKER).is_file():
        python, built = (
            next(m for m in result.methods if m.method == n)
            for n in ("chunkpilot-python", "chunkpilot-compiled")
        )
        answers = {k: v for k, v in python.answers.items() if k != "simulation_wall_s"}
        assert answers == {k: v for k, v in built.answers.items() if k != "simulation_wall_s"}
    assert all(m.process_cpu_s[0] > 0 and m.answers["completed"] == 300 for m in result.methods)
    assert len(lines) == len(result.methods)
    assert "chunkpilot-python" in format_sim_peers(result)


def test_a_repeat_below_one_is_refused() -> None:
    with pytest.raises(BenchError, match="--repeat"):
        run_sim_peers(SimPeerSettings(repeat=0), print)
