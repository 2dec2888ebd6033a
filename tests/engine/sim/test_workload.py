"""Trace parsing and synthetic workloads."""

from __future__ import annotations

from pathlib import Path

import pytest
from chunkpilot.engine.sim.workload import (
    WorkloadError,
    load_trace,
    parse_workload_spec,
    poisson,
    resolve_trace,
)


def test_azure_trace_arrivals_are_relative_to_the_first_and_sorted(tmp_path: Path) -> None:
    trace = tmp_path / "azure.csv"
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 23:59:59.5000000,100,10\n"
        "2023-11-16 23:59:59.0000000,200,20\n"
        "2023-11-17 00:00:01.2500000,300,0\n"
    )
    workload = load_trace(str(trace))
    assert [r.arrival_s for r in workload.requests] == pytest.approx([0.0, 0.5, 2.25])
    assert [(r.prompt_tokens, r.output_tokens) for r in workload.requests] == [(200, 20), (100, 10), (300, 1)]
    assert workload.name == "azure"


def test_bundled_azure_conv_trace() -> None:
    workload = load_trace("azure_conv_2023")
    assert len(workload.requests) == 19_366
    assert workload.requests[0].arrival_s == 0.0
    arrivals = [r.arrival_s for r in workload.requests]
    assert arrivals == sorted(arrivals)
    assert 3000 < arrivals[-1] < 3700  # one hour
    assert load_trace("azure_conv_2023.csv", limit=10).requests == workload.requests[:10]


def test_length_only_trace_needs_a_rate(tmp_path: Path) -> None:
    trace = tmp_path / "lengths.csv"
    trace.write_text(
        "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n1000,100,1100,10\n50,5,55,10\n"
    )
    with pytest.raises(WorkloadError, match="--rate"):
        load_trace(str(trace))
    workload = load_trace(str(trace), rate=2.0, seed=1)
    assert [(r.prompt_tokens, r.output_tokens) for r in workload.requests] == [(1000, 100), (50, 5)]
    assert workload.requests[0].arrival_s == 0.0 < workload.requests[1].arrival_s


def test_rate_replaces_azure_arrivals_with_poisson() -> None:
    workload = load_trace("azure_code_2023", rate=10.0, limit=2000, seed=4)
    span = workload.requests[-1].arrival_s
    assert 2000 / span == pytest.approx(10.0, rel=0.1)


def test_unknown_header_and_missing_file_are_clear_errors(tmp_path: Path) -> None:
    trace = tmp_path / "bad.csv"
    trace.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(WorkloadError, match="unknown header"):
        load_trace(str(trace))
    with pytest.raises(WorkloadError, match="bundled traces: azure_conv_2023"):
        resolve_trace(str(tmp_path / "missing.csv"))


def test_bad_timestamp_is_named(tmp_path: Path) -> None:
    trace = tmp_path / "azure.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday 10:00:00,1,1\n")
    with pytest.raises(WorkloadError, match="TIMESTAMP"):
        load_trace(str(trace))


def test_poisson_rate_must_be_positive() -> None:
    with pytest.raises(WorkloadError, match="--rate"):
        poisson([(1, 1)], 0.0)


def test_workload_spec() -> None:
    workload = parse_workload_spec("n=50,rate=inf,prompt=100-200,output=8,prefix=64,groups=2,seed=5")
    assert len(workload.requests) == 50
    assert all(r.arrival_s == 0.0 for r in workload.requests)
    assert all(100 <= r.prompt_tokens <= 200 and r.output_tokens == 8 for r in workload.requests)
    first, second, third = workload.requests[:3]
    assert (
        first.block_hashes[:4] == third.block_hashes[:4] != second.block_hashes[:4]
    )  # groups share 4 blocks
    assert first.block_hashes[4:6] != third.block_hashes[4:6]


@pytest.mark.parametrize(
    ("spec", "message"),
    [("n=5,foo=1", "unknown key"), ("n=5,prompt=9-3", "prompt"), ("n", "key=value"), ("n=0", "n must be")],
)
def test_workload_spec_errors(spec: str, message: str) -> None:
    with pytest.raises(WorkloadError, match=message):
        parse_workload_spec(spec)
