"""Workload capture: histograms and rates in, a synthetic workload with the same distributions out."""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import replace
from typing import Any

import pytest
from chunkpilot.engine import metrics_names as names
from chunkpilot.engine.sim.engine import SimConfig
from chunkpilot.engine.sim.metrics import StepTelemetry, StepTotals
from chunkpilot.engine.sim.offline import simulate
from chunkpilot.engine.sim.scheduler import SchedulerConfig
from chunkpilot.engine.sim.workload import Workload, load_trace
from chunkpilot.tuner.twin.capture import (
    STEP_FIELDS,
    CaptureError,
    HistogramWindow,
    WorkloadWindow,
    durations_between,
    durations_from_vector,
    histogram_of,
    parse_exposition,
    segment_queries,
    segments_from_results,
    step_duration_query,
    step_queries,
    steps_from_results,
    steps_from_vectors,
    synthesize,
    window_between,
    workload_from_vectors,
    workload_queries,
)

from chunkpilot.testing.tuner import a_workload_window

MAX_LEN = 8192
BOUNDS = names.request_tokens_buckets(MAX_LEN)


def _window(prompts: list[int], outputs: list[int], rate: float, hit_rate: float = 0.0) -> WorkloadWindow:
    return a_workload_window(prompts, outputs, rate, hit_rate, MAX_LEN)


def test_synthetic_workload_reproduces_bucket_shares_means_and_rate() -> None:
    trace = load_trace("azure_code_2023", rate=5.0, limit=600)
    prompts = [r.prompt_tokens for r in trace.requests]
    outputs = [r.output_tokens for r in trace.requests]
    window = _window(prompts, outputs, rate=5.0)
    workload = synthesize(window, 600, max_model_len=MAX_LEN, seed=1)
    for source, drawn in ((prompts, [r.prompt_tokens for r in workload.requests]),
                          (outputs, [r.output_tokens for r in workload.requests])):  # fmt: skip
        assert histogram_of(drawn, BOUNDS).counts == histogram_of(source, BOUNDS).counts
        assert sum(drawn) / len(drawn) == pytest.approx(sum(source) / len(source), rel=0.01)
    arrivals = [r.arrival_s for r in workload.requests]
    rate = (len(arrivals) - 1) / (arrivals[-1] - arrivals[0])
    assert rate == pytest.approx(5.0, rel=0.15)  # Poisson: 600 gaps, sd of the mean gap ~4 %


def test_histogram_from_prometheus_cumulative_buckets() -> None:
    hist = HistogramWindow.from_cumulative({1.0: 0, 10.0: 3, 100.0: 5, math.inf: 6}, total=400.0, count=6)
    assert hist.bounds == (1.0, 10.0, 100.0)
    assert hist.counts == (0, 3, 2, 1)
    assert hist.mean == pytest.approx(400 / 6)


def test_prefix_hit_rate_is_reproduced_through_the_simulator() -> None:
    trace = load_trace("azure_conv_2023", rate=2.0, limit=300)
    prompts = [r.prompt_tokens for r in trace.requests]
    outputs = [min(64, r.output_tokens) for r in trace.requests]
    window = _window(prompts, outputs, rate=2.0, hit_rate=0.4)
    workload = synthesize(window, 300, max_model_len=MAX_LEN)
    summary = simulate(SimConfig(scheduler=SchedulerConfig(max_model_len=MAX_LEN)), workload)
    assert summary.prefix_cache_hit_rate == pytest.approx(0.4, abs=0.05)


def test_too_few_requests_or_no_histogram_is_a_clear_error() -> None:
    window = _window([100] * 5, [10] * 5, rate=1.0)
    with pytest.raises(CaptureError, match="5 finished requests in the window, 20 needed"):
        synthesize(window, 100, max_model_len=MAX_LEN)


def test_lengths_stay_within_the_model_length() -> None:
    window = _window([8000] * 30 + [100] * 30, [5000] * 60, rate=1.0)
    workload = synthesize(window, 200, max_model_len=MAX_LEN)
    assert all(r.prompt_tokens + r.output_tokens <= MAX_LEN for r in workload.requests)
    assert all(r.prompt_tokens >= 1 and r.output_tokens >= 1 for r in workload.requests)


def test_promql_queries_select_the_track_and_group_steps_by_bucket() -> None:
    queries = step_queries('pod=~"svc-canary-.*"', "5m")
    assert set(queries) == set(STEP_FIELDS)
    assert queries["steps"] == (
        "sum by (scheduled_tokens) "
        '(increase(chunkpilot:step_duration_seconds_count{pod=~"svc-canary-.*"}[5m]))'
    )
    workload = workload_queries('pod=~"svc-canary-.*"', "5m")
    assert workload["prompt_bucket"].startswith("sum by (le) (increase(vllm:request_prompt_tokens_bucket{")
    results = {"steps": {"64": 10.0, "1": 0.0}, "duration_s": {"64": 0.2}, "prefill_tokens": {"64": 500.0}}
    steps = steps_from_results(results)
    assert steps == {"64": StepTotals(steps=10.0, duration_s=0.2, prefill_tokens=500.0)}
    assert bisect.bisect_left(names.STEP_TOKEN_BUCKETS, 50) == names.STEP_TOKEN_BUCKETS.index(64)


def _sample(value: float, **labels: str) -> dict[str, object]:
    return {"metric": labels, "value": [1.0, str(value)]}


def test_prometheus_vectors_become_steps_and_a_workload_window() -> None:
    steps = steps_from_vectors(
        {
            "steps": [_sample(4, scheduled_tokens="512"), _sample(0, scheduled_tokens="1")],
            "duration_s": [_sample(0.1, scheduled_tokens="512")],
            "decode_context_tokens": [_sample(900, scheduled_tokens="512")],
        }
    )
    assert steps == {"512": StepTotals(steps=4, duration_s=0.1, decode_context_tokens=900)}
    buckets = [_sample(0, le="10"), _sample(3, le="100"), _sample(4, le="+Inf")]
    vectors = {
        "prompt_bucket": buckets, "prompt_sum": [_sample(250)], "prompt_count": [_sample(4)],
        "generation_bucket": buckets, "generation_sum": [_sample(200)], "generation_count": [_sample(4)],
        "fine_prompt_bucket": [], "fine_prompt_count": [_sample(float("nan"))],
        "prefix_cache_queries": [_sample(1000)], "prefix_cache_hits": [_sample(250)],
    }  # fmt: skip
    window = workload_from_vectors(vectors, duration_s=2.0)  # vLLM's histograms: no fine data here
    assert window.prompt_tokens.counts == (0, 3, 1)
    assert (window.arrival_rate, window.prefix_cache_hit_rate) == (2.0, 0.25)
    with pytest.raises(CaptureError, match="no finished requests"):
        workload_from_vectors({"prompt_count": [_sample(0)]}, duration_s=2.0)


def test_prompt_output_covariance_is_reproduced_when_the_engine_exports_it() -> None:
    trace = load_trace("azure_code_2023", rate=5.0, limit=600)
    prompts = [r.prompt_tokens for r in trace.requests]
    outputs = [r.output_tokens for r in trace.requests]
    product = float(sum(p * o for p, o in zip(prompts, outputs, strict=True)))
    window = replace(_window(prompts, outputs, rate=5.0), tokens_product=product)
    joint = synthesize(window, 600, max_model_len=MAX_LEN, seed=2)
    independent = synthesize(_window(prompts, outputs, rate=5.0), 600, max_model_len=MAX_LEN, seed=2)

    def mean_product(workload: Workload) -> float:
        return sum(r.prompt_tokens * r.output_tokens for r in workload.requests) / len(workload.requests)

    target = product / len(prompts)
    assert mean_product(joint) == pytest.approx(target, rel=0.02)
    assert abs(mean_product(independent) / target - 1) > 0.05  # the pairing is what made the difference


def _run(short: int, long: int) -> list[tuple[int, int]]:
    """A trace-like mix: runs of short turns, then runs of long documents, 100 requests each."""
    return [(short, 20)] * 100 + [(long, 20)] * 100 + [(short, 20)] * 100 + [(long, 20)] * 100


def test_a_segmented_synthesis_keeps_the_runs_the_windows_minutes_show() -> None:
    lengths = _run(200, 3000)
    minutes = [lengths[i : i + 100] for i in range(0, len(lengths), 100)]
    segments = tuple(
        replace(_window([p for p, _ in m], [o for _, o in m], rate=100 / 60), duration_s=60.0)
        for m in minutes
    )
    whole = replace(
        _window([p for p, _ in lengths], [o for _, o in lengths], rate=400 / 240), segments=segments
    )

    def blocks(workload: Workload) -> list[float]:
        prompts = [r.prompt_tokens for r in workload.requests]
        return [sum(prompts[i : i + 50]) / 50 for i in range(0, len(prompts), 50)]

    runs = synthesize(whole, 400, max_model_len=MAX_LEN, seed=3, by_segment=True)
    mixed = synthesize(whole, 400, max_model_len=MAX_LEN, seed=3)
    # Block by block the segmented draw follows the minutes (short, long, short, long); the
    # window's histograms alone mix every block. Both keep the window's mean.
    assert ["long" if b > 2000 else "short" if b < 400 else b for b in blocks(runs)] == 2 * (
        ["short"] * 2 + ["long"] * 2
    )
    assert all(800 < b < 2500 for b in blocks(mixed))
    for workload in (runs, mixed):
        prompts = [r.prompt_tokens for r in workload.requests]
        assert sum(prompts) / len(prompts) == pytest.approx(1600, rel=0.02)
    # Half the requests: each minute gives its share, in order.
    half = synthesize(whole, 200, max_model_len=MAX_LEN, seed=3, by_segment=True)
    assert ["long" if b > 2000 else "short" if b < 400 else b for b in blocks(half)] == 2 * ["short", "long"]
    # One segment with requests is no order to keep: the window's histograms, as without segments.
    single = replace(whole, segments=segments[:1])
    assert synthesize(single, 400, max_model_len=MAX_LEN, seed=3, by_segment=True) == mixed


def test_a_segmented_synthesis_keeps_the_windows_prompt_output_product() -> None:
    """Short prompts with short outputs in some minutes, long with long in others: drawn minute by
    minute the sample carries that dependence already, and the pairing inside each minute adds
    only what the window's product holds beyond it."""
    rng = random.Random(5)
    short = [(rng.randint(50, 800), rng.randint(5, 100)) for _ in range(100)]
    long = [(rng.randint(1000, 6000), rng.randint(50, 600)) for _ in range(100)]
    minutes = [short, long, short, long]
    every = [pair for minute in minutes for pair in minute]
    product = float(sum(p * o for p, o in every))

    def window_of(pairs: list[tuple[int, int]], **fields: Any) -> WorkloadWindow:
        fine = names.FINE_REQUEST_TOKENS_BUCKETS  # what the engines export for the twin
        prompts = histogram_of([p for p, _ in pairs], fine)
        outputs = histogram_of([o for _, o in pairs], fine)
        return replace(WorkloadWindow(len(pairs) * 0.6, prompts, outputs), **fields)

    segments = tuple(window_of(m, duration_s=60.0) for m in minutes)
    whole = window_of(every, tokens_product=product, segments=segments)

    def mean_product(workload: Workload) -> float:
        return sum(r.prompt_tokens * r.output_tokens for r in workload.requests) / len(workload.requests)

    target = product / len(every)
    drawn = synthesize(whole, 400, max_model_len=MAX_LEN, seed=4, by_segment=True)
    assert mean_product(drawn) == pytest.approx(target, rel=0.04)
    # Paired on the window's dependence again inside each minute, it would count the minutes' part
    # twice (the window's product over the product of its means, 1.5 here).
    means = sum(p for p, _ in every) * sum(o for _, o in every) / len(every) ** 2
    assert target / means > 1.4
    # Segments that carry their own product are paired on it.
    own = tuple(
        replace(s, tokens_product=float(sum(p * o for p, o in m)))
        for s, m in zip(segments, minutes, strict=True)
    )
    drawn = synthesize(replace(whole, segments=own), 400, max_model_len=MAX_LEN, seed=4, by_segment=True)
    assert mean_product(drawn) == pytest.approx(target, rel=0.04)


def test_segments_are_read_from_the_subqueries_matrices_oldest_first() -> None:
    queries = segment_queries('service="chat"', "5m", fine=False)
    assert queries["prompt_bucket"] == (
        f'sum by (le) (increase({names.REQUEST_PROMPT_TOKENS}_bucket{{service="chat"}}[1m]))[5m:1m]'
    )
    assert set(segment_queries("", "5m", fine=True)) == {
        f"fine_{k}_{part}" for k in ("prompt", "generation") for part in ("bucket", "sum", "count")
    }

    def series(points: list[tuple[float, float]], **labels: str) -> dict[str, Any]:
        return {"metric": labels, "values": [[t, str(v)] for t, v in points]}

    late, early = 1200.0, 1140.0  # answered newest first: the segments come out oldest first
    matrices = {
        "prompt_bucket": [
            series([(late, 0), (early, 2)], le="10"),
            series([(late, 3), (early, 2)], le="100"),
            series([(late, 3), (early, 2)], le="+Inf"),
        ],
        "prompt_sum": [series([(late, 150), (early, 10)])],
        "prompt_count": [series([(late, 3), (early, 2)])],
        "generation_bucket": [
            series([(late, 3), (early, 2)], le="+Inf"),
            series([(late, 3), (early, 2)], le="10"),
        ],
        "generation_sum": [series([(late, 9), (early, 8)])],
        "generation_count": [series([(late, 3), (early, 2)])],
    }
    first, second = segments_from_results(matrices)
    assert (first.prompt_tokens.counts, first.prompt_tokens.mean) == ((2, 0, 0), 5.0)
    assert (second.prompt_tokens.counts, second.prompt_tokens.mean) == ((0, 3, 0), 50.0)
    assert first.duration_s == second.duration_s == 60.0 and second.arrival_rate == 3 / 60
    # A minute without finished requests is left out; an instant vector (no matrix) gives none.
    quiet = {k: [series([(early, 0)], **s["metric"]) for s in v] for k, v in matrices.items()}
    assert segments_from_results(quiet) == ()
    assert segments_from_results({"prompt_count": [_sample(3)]}) == ()


# ------------------------------------------------------------------------- per engine kind


def test_prefix_cache_queries_are_the_engine_kinds() -> None:
    for kind in ("vllm", "sim"):
        queries = workload_queries('pod="p"', "5m", kind)
        assert queries["prefix_cache_hits"] == 'sum(increase(vllm:prefix_cache_hits_total{pod="p"}[5m]))'
        assert queries == workload_queries('pod="p"', "5m")
    sglang = workload_queries('pod="p"', "5m", "sglang")
    assert sglang["prefix_cache_queries"] == 'sum(increase(sglang:prompt_tokens_total{pod="p"}[5m]))'
    assert sglang["prefix_cache_hits"] == 'sum(increase(sglang:cached_tokens_total{pod="p"}[5m]))'
    trtllm = workload_queries('pod="p"', "5m", "trtllm")
    assert "prefix_cache_queries" not in trtllm and "prefix_cache_hits" not in trtllm
    assert not any("None" in query for query in trtllm.values())
    assert trtllm["fine_prompt_bucket"] == sglang["fine_prompt_bucket"]


def test_a_missing_prefix_cache_series_is_a_hit_rate_of_zero() -> None:
    buckets = [_sample(0, le="10"), _sample(3, le="100"), _sample(4, le="+Inf")]
    vectors = {
        "fine_prompt_bucket": buckets, "fine_prompt_sum": [_sample(250)], "fine_prompt_count": [_sample(4)],
        "fine_generation_bucket": buckets, "fine_generation_sum": [_sample(200)],
        "fine_generation_count": [_sample(4)],
    }  # fmt: skip
    window = workload_from_vectors(vectors, duration_s=2.0)
    assert (window.arrival_rate, window.prefix_cache_hit_rate) == (2.0, 0.0)
    assert synthesize(window, 20, max_model_len=MAX_LEN, seed=1, min_requests=4).requests


def _exposition(counters: dict[str, float], requests: int) -> str:
    lines = []
    for family in (names.FINE_REQUEST_PROMPT_TOKENS, names.FINE_REQUEST_GENERATION_TOKENS):
        lines += [
            f"# TYPE {family} histogram",
            f'{family}_bucket{{le="100.0"}} {requests}',
            f'{family}_bucket{{le="+Inf"}} {requests}',
            f"{family}_sum {50 * requests}",
            f"{family}_count {requests}",
        ]
    for name, value in counters.items():
        family = name.removesuffix("_total")
        lines += [f"# TYPE {family} counter", f"{name} {value}"]
    return "\n".join(lines) + "\n"


def test_scrapes_read_each_engines_prefix_cache_counters() -> None:
    sglang = {"sglang:prompt_tokens_total": 1000.0, "sglang:cached_tokens_total": 400.0}
    before = parse_exposition(_exposition(sglang, 2), "sglang")
    after = parse_exposition(
        _exposition({"sglang:prompt_tokens_total": 3000.0, "sglang:cached_tokens_total": 1900.0}, 6), "sglang"
    )
    workload, _ = window_between(before, after, 2.0)
    assert (workload.prefix_cache_queries, workload.prefix_cache_hits) == (2000.0, 1500.0)
    assert workload.prefix_cache_hit_rate == 0.75
    # vLLM's reading of the same text finds no prefix-cache series: hit rate 0, no failure.
    workload, _ = window_between(
        parse_exposition(_exposition(sglang, 2)), parse_exposition(_exposition(sglang, 6)), 2.0
    )
    assert (workload.arrival_rate, workload.prefix_cache_hit_rate) == (2.0, 0.0)
    vllm = {names.PREFIX_CACHE_QUERIES: 100.0, names.PREFIX_CACHE_HITS: 30.0}
    trtllm = parse_exposition(_exposition(vllm, 2), "trtllm")
    assert names.PREFIX_CACHE_QUERIES not in trtllm.counters
    assert parse_exposition(_exposition(vllm, 2)).counters == vllm


def test_step_durations_read_alike_from_a_scrape_and_from_prometheus() -> None:
    telemetry = StepTelemetry()
    workload = load_trace("azure_conv_2023", rate=2.0, limit=60)
    config = SimConfig(model="llama-3.1-8b", accelerator="h100", scheduler=SchedulerConfig(1024, 64))
    simulate(config, workload, telemetry=telemetry)
    exposition = "\n".join(telemetry.render('model_name="m"')) + "\n"
    empty = parse_exposition("")
    scraped = durations_between(empty.durations, parse_exposition(exposition).durations)
    counts = {label: tuple(map(float, c)) for label, c in telemetry.duration_counts().items()}
    assert scraped == {label: c for label, c in counts.items() if sum(c)}
    # The same histograms as Prometheus answers step_duration_query: cumulative by (bucket, le).
    vector = []
    for label, slots in telemetry.duration_counts().items():
        running = 0
        for bound, count in zip((*names.STEP_DURATION_BUCKETS, math.inf), slots, strict=True):
            running += count
            le = "+Inf" if math.isinf(bound) else repr(bound)
            metric = {names.LABEL_SCHEDULED_TOKENS: label, "le": le}
            vector.append({"metric": metric, "value": [0, str(running)]})
    assert durations_from_vector(vector) == counts
    assert "scheduled_tokens, le" in step_duration_query('service="s"', "5m")
