"""Trace reading, Poisson arrivals and time scaling."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest

from chunkpilot.localrun.traces import (
    TraceError,
    TraceRequest,
    cap_lengths,
    iter_wall_schedule,
    mean_rate,
    read_rate_schedule,
    read_trace,
    rescale_to_rate,
    scale_load,
    scheduled_arrivals,
    wall_schedule,
)

SHARED_TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"

AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:48.6805900,396,109
2023-11-16 18:15:47.1805900,1200,12
"""

LENGTHS = """num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio
3772,54,3826,69.85
2015,156,2171,12.9
100,10,110,10.0
"""


def write(tmp_path: Path, text: str, name: str = "trace.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_azure_arrivals_are_relative_to_the_first_request_and_sorted(tmp_path: Path) -> None:
    requests = read_trace(write(tmp_path, AZURE))
    assert [r.arrival_s for r in requests] == pytest.approx([0.0, 0.5, 2.0])
    assert [(r.prompt_tokens, r.output_tokens) for r in requests] == [(374, 44), (1200, 12), (396, 109)]


def test_rate_on_an_azure_trace_draws_poisson_arrivals_like_the_simulator(tmp_path: Path) -> None:
    requests = read_trace(write(tmp_path, AZURE), rate=4.0, seed=1)
    assert requests[0].arrival_s == 0.0
    assert [(r.prompt_tokens, r.output_tokens) for r in requests] == [(374, 44), (396, 109), (1200, 12)]


def test_bundled_traces_are_found_by_name() -> None:
    requests = read_trace("azure_code_2023", limit=10)
    assert len(requests) == 10 and requests[0].arrival_s == 0.0


def test_length_only_trace_needs_a_rate(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="--rate"):
        read_trace(write(tmp_path, LENGTHS))


def test_length_only_trace_gets_seeded_poisson_arrivals(tmp_path: Path) -> None:
    path = write(tmp_path, LENGTHS)
    first = read_trace(path, rate=2.0, seed=7)
    again = read_trace(path, rate=2.0, seed=7)
    other = read_trace(path, rate=2.0, seed=8)
    assert first == again
    assert first != other
    assert first[0].arrival_s == 0.0
    assert all(b.arrival_s > a.arrival_s for a, b in itertools.pairwise(first))
    assert [(r.prompt_tokens, r.output_tokens) for r in first] == [(3772, 54), (2015, 156), (100, 10)]


def test_poisson_mean_rate_matches_on_a_long_trace(tmp_path: Path) -> None:
    rows = "\n".join("100,10,110,10" for _ in range(4000))
    requests = read_trace(write(tmp_path, f"num_prefill_tokens,num_decode_tokens,a,b\n{rows}\n"), rate=5.0)
    assert mean_rate(requests) == pytest.approx(5.0, rel=0.05)


def test_limit_keeps_the_first_requests(tmp_path: Path) -> None:
    assert len(read_trace(write(tmp_path, LENGTHS), rate=1.0, limit=2)) == 2


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a,b,c\n1,2,3\n", "unknown header"),
        ("", "unknown header"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n", "no requests"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday 10:00:00,1,2\n", "TIMESTAMP"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,x,2\n", "malformed row"),
        ("num_prefill_tokens,num_decode_tokens\n10\n", "malformed row"),
    ],
)
def test_bad_traces_are_refused_naming_the_problem(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        read_trace(write(tmp_path, text), rate=None if "TIMESTAMP" in text else 1.0)


def test_missing_file_is_a_trace_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no such file"):
        read_trace(tmp_path / "absent.csv")


def test_time_scale_compresses_arrivals() -> None:
    requests = [TraceRequest(t, 10, 5) for t in (0.0, 1.0, 4.0, 10.0)]
    scheduled = wall_schedule(requests, time_scale=2.0)
    assert [r.arrival_s for r in scheduled] == [0.0, 0.5, 2.0, 5.0]


def test_schedule_is_cut_by_duration_and_count() -> None:
    requests = [TraceRequest(float(t), 10, 5) for t in range(10)]
    assert len(wall_schedule(requests, time_scale=2.0, duration_s=2.0)) == 4  # 0, .5, 1, 1.5
    assert len(wall_schedule(requests, max_requests=3)) == 3


def test_repeat_replays_the_trace_after_one_mean_gap_until_a_bound() -> None:
    requests = [TraceRequest(t, 10, 5) for t in (0.0, 1.0, 2.0)]
    scheduled = wall_schedule(requests, repeat=True, max_requests=7)
    assert [r.arrival_s for r in scheduled] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    with pytest.raises(TraceError, match="needs a bound"):
        list(iter_wall_schedule(requests, repeat=True))


def test_bad_schedule_bounds_are_refused() -> None:
    with pytest.raises(TraceError, match="time_scale"):
        wall_schedule([], time_scale=0)
    with pytest.raises(TraceError, match="duration"):
        wall_schedule([], duration_s=-1)


def test_rescale_scale_and_cap() -> None:
    requests = [TraceRequest(t, 5000, 900) for t in (0.0, 2.0, 4.0)]
    assert mean_rate(rescale_to_rate(requests, 1.0)) == pytest.approx(1.0)
    assert [r.arrival_s for r in scale_load(requests, 2.0)] == [0.0, 1.0, 2.0]
    with pytest.raises(TraceError, match="load factor"):
        scale_load(requests, 0)
    assert math.isinf(mean_rate(requests[:1]))
    capped = cap_lengths(requests, max_prompt_tokens=4096, max_output_tokens=None)
    assert {(r.prompt_tokens, r.output_tokens) for r in capped} == {(4096, 900)}


@pytest.mark.skipif(not SHARED_TRACES.is_dir(), reason="shared traces are not present")
def test_the_real_azure_conversation_trace_reads_as_about_an_hour() -> None:
    requests = read_trace(SHARED_TRACES / "azure_conv_2023.csv")
    assert len(requests) == 19366
    assert 3000 < requests[-1].arrival_s < 4000
    assert 4.0 < mean_rate(requests) < 7.0


def test_a_rate_schedule_steps_the_arrivals_and_keeps_the_traces_lengths(tmp_path: Path) -> None:
    path = tmp_path / "steps.csv"
    path.write_text(
        "# one replica's worth, then three, then one\nt_s,rate\n0,2\n300,2\n301,6\n600,6\n601,2\n900,2\n"
    )
    schedule = read_rate_schedule(path)
    lengths = [TraceRequest(0.0, 100 + k, 10 + k) for k in range(7)]
    arrivals = scheduled_arrivals(lengths, schedule, seed=3)
    counts = [sum(1 for r in arrivals if lo <= r.arrival_s < lo + 300) for lo in (0, 300, 600)]
    for count, expected in zip(counts, (600, 1800, 600), strict=True):
        assert abs(count - expected) < 5 * math.sqrt(expected)
    assert [r.prompt_tokens for r in arrivals[:8]] == [100, 101, 102, 103, 104, 105, 106, 100]
    assert arrivals == scheduled_arrivals(lengths, schedule, seed=3) and arrivals[-1].arrival_s < 900


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("t,rate\n0,1\n10,1\n", "the header t_s,rate"),
        ("t_s,rate\n0,1\n10,x\n", "row 3: '10,x' is not two numbers"),
        ("t_s,rate\n0,1\n0,1\n", "row 3: times start at 0 and increase"),
        ("t_s,rate\n0,0\n10,0\n", "a rate above 0 somewhere"),
    ],
)
def test_a_bad_rate_schedule_is_refused_naming_the_row(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(TraceError, match=None) as caught:
        read_rate_schedule(path)
    assert message in str(caught.value)
