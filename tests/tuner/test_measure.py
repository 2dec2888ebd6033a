"""PromQL built per track; instant answers parsed; no data stays no data."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, TypeVar

import pytest
from chunkpilot.engine.metrics_names import (
    tuner_metrics,
)
from chunkpilot.operator.config import PrometheusAuth, redacted_url
from chunkpilot.operator.testing import wait_for
from chunkpilot.tuner.measure import (
    TPOT_ITL_FACTOR,
    FineSamples,
    ItlSource,
    LabelScheme,
    MetricsUnavailableError,
    PoolsMeasurement,
    PrometheusClient,
    QueryFn,
    Selector,
    TopologyWindow,
    WindowMeasurement,
    count_query,
    fine_latency_queries,
    measure_colocated_trial,
    measure_topology,
    measure_track,
    measure_track_batched,
    measure_window,
    parse_instant_result,
    quantile_query,
    rate_query,
    track_queries,
    window_source,
)

from chunkpilot.api import Track
from chunkpilot.devcluster.certs import generate_ca, issue_serving_cert
from chunkpilot.devcluster.prometheus import PrometheusServer, TargetGroup
from chunkpilot.testing.metrics import ExpositionServer, LatencyExporter, histogram_lines
from chunkpilot.testing.tuner import a_measurement

SEL = Selector("chat", "default", Track.CANARY)
T = TypeVar("T")
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_quantile_query_aggregates_bucket_rates_by_le() -> None:
    assert quantile_query("vllm:inter_token_latency_seconds", 0.99, SEL, "5m") == (
        "histogram_quantile(0.99, sum by (le) (rate(vllm:inter_token_latency_seconds_bucket"
        '{service="chat",namespace="default",track="canary"}[5m])))'
    )


def test_sample_and_rate_queries() -> None:
    assert count_query("vllm:time_to_first_token_seconds", SEL, "90s") == (
        'sum(increase(vllm:time_to_first_token_seconds_count{service="chat",namespace="default",track="canary"}[90s]))'
    )
    assert rate_query("vllm:generation_tokens_total", SEL, "5m") == (
        'sum(rate(vllm:generation_tokens_total{service="chat",namespace="default",track="canary"}[5m]))'
    )


def test_label_scheme_and_escaping() -> None:
    sel = Selector(
        'a"b', None, "stable", LabelScheme(service="chunkpilot_io_service", track="chunkpilot_io_track")
    )
    assert sel.render() == '{chunkpilot_io_service="a\\"b",chunkpilot_io_track="stable"}'


def test_quantile_must_be_a_fraction() -> None:
    with pytest.raises(ValueError, match="quantile"):
        quantile_query("h", 99, SEL, "5m")


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ([], None),
        ([{"metric": {}, "value": [1.0, "NaN"]}], None),
        ([{"metric": {}, "value": [1.0, "+Inf"]}], None),
        ([{"metric": {}, "value": [1.0, "0.042"]}], 0.042),
    ],
)
def test_parse_instant_result(answer: list[dict[str, object]], expected: float | None) -> None:
    assert parse_instant_result(answer) == expected


def test_parse_rejects_unaggregated_answers() -> None:
    with pytest.raises(MetricsUnavailableError, match="2 series"):
        parse_instant_result([{"value": [1, "1"]}, {"value": [1, "2"]}])


def test_both_tracks_are_measured_at_the_same_instant() -> None:
    seen: list[tuple[str, datetime]] = []
    values = {"inter_token": 0.04, "time_to_first": 0.8, "_count": 500.0, "generation": 100.0, "up{": 2.0}

    def query(promql: str, at: datetime) -> float | None:
        seen.append((promql, at))
        if 'track="canary"' in promql and "prompt" in promql:
            return None
        for key, value in values.items():
            if key in promql and ("_count" in promql) == (key == "_count"):
                return value
        return None

    w = measure_window(query, "chat", "default", "2m", T0, 0.99, 0.95, min_samples=100)
    assert {at for _, at in seen} == {T0}
    assert w.canary.itl_ms == pytest.approx(40.0)
    assert w.canary.ttft_ms == pytest.approx(800.0)
    assert w.canary.replicas == 2 and w.canary.ttft_samples == 500.0
    assert w.canary.prompt_tok_s is None and w.canary.throughput_tok_s == 100.0
    assert w.canary.enough_samples(100) and not w.canary.enough_samples(501)
    assert w.canary.itl_source is w.stable.itl_source is ItlSource.FINE
    # Per track: its fine sample counts (to choose the family), then the fine family's four
    # latency queries in place of the engine's, and the change of the requests in its engines.
    assert len(seen) == 2 * (2 + len(track_queries(SEL, "2m", 0.99, 0.95).__dict__) + 1)


@pytest.mark.parametrize(
    ("prompt", "generation", "requests", "expected"),
    [
        (3000.0, 600.0, 5.0, (600.0, 120.0)),
        (3000.0, None, 5.0, (600.0, None)),
        (3000.0, 600.0, None, (None, None)),  # no request counter: no mix, never a division by zero
        (3000.0, 600.0, 0.0, (None, None)),
        (None, None, 5.0, (None, None)),
    ],
)
def test_token_mix_is_tokens_per_request_of_the_same_selector_and_window(
    prompt: float | None, generation: float | None, requests: float | None, expected: tuple[float | None, ...]
) -> None:
    seen: list[str] = []
    stable = Selector("chat", "default", Track.STABLE, config_hash="abc")

    def query(promql: str, at: datetime) -> float | None:
        seen.append(promql)
        for counter, value in (
            ("prompt_tokens", prompt),
            ("generation", generation),
            ("request_success", requests),
        ):
            if counter in promql:
                return value
        return None

    m = measure_track(query, stable, "5m", T0, 0.99, 0.95)
    assert (m.mean_prompt_tokens, m.mean_output_tokens) == expected
    assert (
        'sum(rate(vllm:prompt_tokens_total{service="chat",namespace="default",track="stable",config_hash="abc"}[5m]))'
        in seen
    )
    assert (
        'sum(rate(vllm:request_success_total{service="chat",namespace="default",track="stable",config_hash="abc"}[5m]))'
        in seen
    )


def _answers(values: dict[str, float]) -> tuple[list[str], QueryFn]:
    """A query function answering by metric family (quantiles and counts alike) and recording the queries."""
    seen: list[str] = []

    def query(promql: str, at: datetime) -> float | None:
        seen.append(promql)
        for family, value in values.items():
            if f"{family}_bucket" in promql:
                return value
            if f"{family}_count" in promql:
                return 300.0
        return None

    return seen, query


def test_vllm_reads_the_fine_histograms_first_and_falls_back_to_its_own() -> None:
    fine = {
        "chunkpilot:inter_token_latency_seconds": 0.032,
        "chunkpilot:time_to_first_token_seconds": 0.46,
        "vllm:inter_token_latency_seconds": 0.04975,  # tokens of 26-28 ms in its 25 -> 50 ms bucket
        "vllm:time_to_first_token_seconds": 0.5,
    }
    seen, query = _answers(fine)
    m = measure_track(query, SEL, "1m", T0, 0.99, 0.95)
    assert (m.itl_ms, m.ttft_ms) == (pytest.approx(32.0), pytest.approx(460.0))
    assert m.itl_source is ItlSource.FINE and m.itl_note is None
    assert fine_latency_queries(SEL, "1m", 0.99, 0.95) is not None
    assert not any("vllm:inter_token" in q or "vllm:time_to_first" in q for q in seen)
    own = {k: v for k, v in fine.items() if k.startswith("vllm:")}  # stock vLLM, no plugin
    _, query = _answers(own)
    m = measure_track(query, SEL, "1m", T0, 0.99, 0.95)
    assert (m.itl_ms, m.ttft_ms) == (pytest.approx(49.75), pytest.approx(500.0))
    assert m.itl_source is ItlSource.ENGINE and m.itl_note is None


def test_sglang_reads_the_fine_histograms_first_and_falls_back_to_its_own() -> None:
    fine = {
        "chunkpilot:inter_token_latency_seconds": 0.058,
        "chunkpilot:time_to_first_token_seconds": 0.61,
        "sglang:inter_token_latency_seconds": 0.045,  # its 40 -> 60 ms bucket, interpolated
        "sglang:time_to_first_token_seconds": 0.7,
    }
    _, query = _answers(fine)
    m = measure_track(query, SEL, "1m", T0, 0.99, 0.95, "sglang")
    assert (m.itl_ms, m.ttft_ms) == (pytest.approx(58.0), pytest.approx(610.0))
    assert m.itl_source is ItlSource.FINE and m.itl_samples == 300.0
    own = {k: v for k, v in fine.items() if k.startswith("sglang:")}
    _, query = _answers(own)
    m = measure_track(query, SEL, "1m", T0, 0.99, 0.95, "sglang")
    assert (m.itl_ms, m.ttft_ms) == (pytest.approx(45.0), pytest.approx(700.0))
    assert m.itl_source is ItlSource.ENGINE and m.itl_note is None


def _rates(values: dict[str, float]) -> tuple[list[str], QueryFn]:
    """A query function answering a counter's rate or a gauge's change over the window by the name
    it contains (recording the queries). As in PromQL, ``sum(delta(g[w])) + sum(delta(h[w]))`` adds
    both, and is empty when either side is."""
    seen: list[str] = []

    def query(promql: str, at: datetime) -> float | None:
        seen.append(promql)
        parts = promql.split(" + ")
        found = [values.get(name) for part in parts for name in values if f"({name}{{" in part]
        if len(found) != len(parts) or not found or any(v is None for v in found):
            return None
        return sum(v for v in found if v is not None)

    return seen, query


@pytest.mark.parametrize(
    ("engine", "gauges"),
    [
        ("vllm", ("vllm:num_requests_running", "vllm:num_requests_waiting")),
        ("sglang", ("sglang:num_running_reqs", "sglang:num_queue_reqs")),
    ],
)
def test_the_offered_rate_adds_the_growth_of_requests_in_the_engines_to_the_completions(
    engine: str, gauges: tuple[str, ...]
) -> None:
    """Overloaded, a track completes 2 req/s while 120 more requests pile up over a minute: it was
    offered 4 req/s. A fall is not subtracted: a drained backlog, or requests a restart dropped."""
    success = tuner_metrics(engine).request_success
    seen, query = _rates({success: 2.0, gauges[0]: 40.0, gauges[1]: 80.0})
    m = measure_track(query, SEL, "1m", T0, 0.99, 0.95, engine)
    assert m.request_rate == 2.0 and m.in_flight_change == 120.0
    assert m.offered_rate == pytest.approx(4.0)
    assert any(gauges[0] in q and gauges[1] in q and "[1m]" in q for q in seen)
    _, query = _rates({success: 5.0, gauges[0]: 0.0, gauges[1]: -120.0})  # draining a backlog
    assert measure_track(query, SEL, "1m", T0, 0.99, 0.95, engine).offered_rate == 5.0
    _, query = _rates({success: 0.5, gauges[0]: -16.0, gauges[1]: -600.0})  # a restart dropped them
    assert measure_track(query, SEL, "1m", T0, 0.99, 0.95, engine).offered_rate == 0.5
    _, query = _rates({success: 2.0, gauges[1]: 80.0})  # one gauge unscraped: completions stand
    m = measure_track(query, SEL, "1m", T0, 0.99, 0.95, engine)
    assert m.in_flight_change is None and m.offered_rate == 2.0


def test_without_running_and_waiting_gauges_the_offered_rate_is_the_completion_rate() -> None:
    """TensorRT-LLM's Prometheus endpoint has no such gauges: nothing is asked, completions stand."""
    success = tuner_metrics("trtllm").request_success
    seen, query = _rates({success: 2.0})
    m = measure_track(query, SEL, "1m", T0, 0.99, 0.95, "trtllm")
    assert m.in_flight_change is None and m.offered_rate == 2.0
    assert not any("delta(" in q for q in seen)
    _, query = _rates({})  # nothing scraped: no rate either way
    assert measure_track(query, SEL, "1m", T0, 0.99, 0.95).offered_rate is None


def test_a_disaggregated_service_is_offered_its_decode_completions_plus_both_pools_backlog() -> None:
    """A request arrives at the prefill pool and completes at the decode pool: 3 req/s complete while
    60 more wait in the prefill pool and 60 more decode, over a minute: 5 req/s arrived."""
    prefill = replace(a_measurement("stable", None, request_rate=3.0), in_flight_change=60.0)
    decode = replace(a_measurement("stable", 30.0, request_rate=3.0), in_flight_change=60.0)
    assert PoolsMeasurement(prefill, decode).combined().offered_rate == pytest.approx(5.0)
    unknown = replace(prefill, in_flight_change=None)  # one pool's gauges unread: completions stand
    assert PoolsMeasurement(unknown, decode).combined().offered_rate == 3.0


def test_trtllm_judges_itl_per_token_where_the_fine_histogram_is_exported() -> None:
    _, query = _answers(
        {
            "chunkpilot:inter_token_latency_seconds": 0.0737,
            "chunkpilot:time_to_first_token_seconds": 0.28,
            "trtllm_time_per_output_token_seconds": 0.0375,
            "trtllm_time_to_first_token_seconds": 0.3,
        }
    )
    m = measure_track(query, SEL, "1m", T0, 0.99, 0.95, "trtllm")
    assert m.itl_ms == pytest.approx(73.7) and m.itl_source is ItlSource.FINE
    assert m.ttft_ms == pytest.approx(280.0)  # TTFT from the same family as ITL
    assert m.tpot_ms is None and m.itl_note is None


def test_trtllm_without_a_per_token_histogram_judges_itl_conservatively_from_tpot_and_says_so() -> None:
    """Budget 8192 on the code trace: TPOT p99 37.5 ms reads "met" against 50 ms where ITL p99 is 73.7."""
    _, query = _answers(
        {"trtllm_time_per_output_token_seconds": 0.0375, "trtllm_time_to_first_token_seconds": 0.3}
    )
    m = measure_track(query, SEL, "1m", T0, 0.99, 0.95, "trtllm")
    assert m.itl_source is ItlSource.TPOT and m.tpot_ms == pytest.approx(37.5)
    assert m.itl_ms == pytest.approx(37.5 * TPOT_ITL_FACTOR) and m.itl_ms > 73.7
    assert m.itl_note is not None
    assert "ITL judged from TPOT (TensorRT-LLM exports no ITL histogram)" in m.itl_note
    assert "p99" in m.itl_note and "37.5ms" in m.itl_note
    assert m.ttft_ms == pytest.approx(300.0) and m.enough_samples(100)


# --------------------------------------------------------------------------- one latency family per window


def test_window_source_is_fine_when_every_judgeable_track_has_enough_fine_samples() -> None:
    both = [FineSamples(5000.0, 120.0), FineSamples(4000.0, 100.0)]
    assert window_source(both, 100, "vllm") is ItlSource.FINE
    # A stable on stock vLLM (no plugin: no fine series) beside a plugin canary: engine for both.
    assert window_source([FineSamples(5000.0, 120.0), FineSamples(0.0, 0.0)], 100, "vllm") is ItlSource.ENGINE
    # An engine whose fine histograms are not read at all.
    assert window_source([FineSamples(5000.0, 120.0), None], 100, "sglang") is ItlSource.ENGINE
    # Below the judging threshold on one track (its TTFT, or its ITL): engine for both.
    assert window_source([FineSamples(5000.0, 99.0), both[1]], 100, "vllm") is ItlSource.ENGINE
    assert window_source([FineSamples(99.0, 120.0), both[1]], 100, "vllm") is ItlSource.ENGINE
    # TensorRT-LLM's own family: ITL from its TPOT histogram.
    assert window_source([FineSamples(0.0, 0.0), both[1]], 100, "trtllm") is ItlSource.TPOT
    assert window_source(both, 100, "trtllm") is ItlSource.FINE
    # A prefill pool's ITL is not compared; nothing to compare reads nothing fine.
    prefill = FineSamples(0.0, 120.0, judges_itl=False)
    assert window_source([prefill, *both], 100, "vllm") is ItlSource.FINE
    assert window_source([], 100, "vllm") is ItlSource.ENGINE
    assert window_source([FineSamples(0.0, 0.0)], 0, "vllm") is ItlSource.ENGINE
    # A track short of requests on the engine's own histogram too is judged on neither: it keeps
    # nobody off the fine family. Short of fine samples only (no plugin), it still does.
    quiet = FineSamples(900.0, 40.0, engine_ttft=41.0)
    assert quiet.short_on_both(100) and not FineSamples(0.0, 0.0, engine_ttft=150.0).short_on_both(100)
    assert window_source([both[0], quiet], 100, "trtllm") is ItlSource.FINE
    assert window_source([both[0], FineSamples(0.0, 0.0, engine_ttft=150.0)], 100, "vllm") is ItlSource.ENGINE
    assert window_source([quiet, quiet], 100, "vllm") is ItlSource.ENGINE


def _tracks(values: dict[str, dict[str, tuple[float, float]]]) -> QueryFn:
    """Answers per track (``track="..."`` in the query) and family: (quantile in s, observations)."""

    def query(promql: str, at: datetime) -> float | None:
        for track, families in values.items():
            if f'track="{track}"' not in promql and f'role="{track}"' not in promql:
                continue
            for family, (quantile, count) in families.items():
                if f"{family}_bucket" in promql:
                    return quantile
                if f"{family}_count" in promql:
                    return count
        return None

    return query


ENGINE_FAMILIES: Final = {
    "vllm:inter_token_latency_seconds": (0.04975, 6000.0),
    "vllm:time_to_first_token_seconds": (0.5, 200.0),
}
FINE_FAMILIES: Final = {
    "chunkpilot:inter_token_latency_seconds": (0.032, 6000.0),
    "chunkpilot:time_to_first_token_seconds": (0.46, 200.0),
}


@pytest.mark.parametrize(
    ("stable_fine", "canary_requests", "expected", "itl_ms"),
    [
        (True, 200.0, ItlSource.FINE, 32.0),  # both tracks run the plugin
        (False, 200.0, ItlSource.ENGINE, 49.75),  # stable on stock vLLM: engine histograms for both
        (True, 99.0, ItlSource.ENGINE, 49.75),  # the canary's fine TTFT below the threshold of 100
    ],
)
def test_a_window_judges_canary_and_stable_on_one_family(
    stable_fine: bool, canary_requests: float, expected: ItlSource, itl_ms: float
) -> None:
    canary_fine = {**FINE_FAMILIES, "chunkpilot:time_to_first_token_seconds": (0.46, canary_requests)}
    query = _tracks(
        {
            "canary": {**ENGINE_FAMILIES, **canary_fine},
            "stable": {**ENGINE_FAMILIES, **(FINE_FAMILIES if stable_fine else {})},
        }
    )
    w = measure_window(query, "chat", "default", "2m", T0, 0.99, 0.95, min_samples=100)
    assert w.canary.itl_source is w.stable.itl_source is expected
    assert w.canary.itl_ms == pytest.approx(itl_ms) and w.stable.itl_ms == pytest.approx(itl_ms)


def test_a_quiet_stable_leaves_a_tensorrt_canary_on_the_fine_family() -> None:
    """A stable with too few requests to judge is compared with nothing; the canary's ITL stays per token."""
    trtllm = {
        "trtllm_time_per_output_token_seconds": (0.0103, 200.0),
        "trtllm_time_to_first_token_seconds": (0.5, 200.0),
    }
    quiet = {
        "trtllm_time_per_output_token_seconds": (0.0103, 40.0),
        "trtllm_time_to_first_token_seconds": (0.5, 40.0),
        "chunkpilot:inter_token_latency_seconds": (0.032, 900.0),
        "chunkpilot:time_to_first_token_seconds": (0.46, 40.0),
    }
    query = _tracks({"canary": {**trtllm, **FINE_FAMILIES}, "stable": quiet})
    w = measure_window(query, "chat", "default", "2m", T0, 0.99, 0.95, engine="trtllm", min_samples=100)
    assert w.canary.itl_source is w.stable.itl_source is ItlSource.FINE
    assert w.canary.itl_note is None and w.canary.itl_ms == pytest.approx(32.0)
    assert w.canary.enough_samples(100) and not w.stable.enough_samples(100)
    # A stable as busy on TensorRT-LLM's own histograms but without fine ones sends both to TPOT.
    query = _tracks({"canary": {**trtllm, **FINE_FAMILIES}, "stable": trtllm})
    w = measure_window(query, "chat", "default", "2m", T0, 0.99, 0.95, engine="trtllm", min_samples=100)
    assert w.canary.itl_source is ItlSource.TPOT and w.canary.itl_ms == pytest.approx(41.2)


def test_a_topologys_pools_are_judged_on_one_family() -> None:
    """The prefill pool's ITL is not compared: its lack of fine ITL samples keeps the fine family."""
    prefill = {
        "chunkpilot:time_to_first_token_seconds": (0.4, 200.0),
        "vllm:time_to_first_token_seconds": (0.45, 200.0),
    }
    pools = {"prefill": prefill, "decode": {**ENGINE_FAMILIES, **FINE_FAMILIES}}
    query = _tracks({**pools, "stable": {**ENGINE_FAMILIES, **FINE_FAMILIES}})
    window = measure_topology(query, "chat", "default", "2m", T0, 0.99, 0.95, "abc", min_samples=100)
    parts = (window.prefill, window.decode, window.stable)
    assert all(p.itl_source is ItlSource.FINE for p in parts)
    assert window.combined().itl_ms == pytest.approx(32.0)
    assert window.combined().ttft_ms == pytest.approx(400.0 + 460.0)
    # The colocated stable on stock vLLM is only reported beside the pools: they stay on the fine
    # family (their SLOs are judged against the targets, not against the stable), it on vLLM's.
    query = _tracks({**pools, "stable": ENGINE_FAMILIES})
    window = measure_topology(query, "chat", "default", "2m", T0, 0.99, 0.95, "abc", min_samples=100)
    assert window.prefill.itl_source is window.decode.itl_source is ItlSource.FINE
    assert window.stable.itl_source is ItlSource.ENGINE and window.stable.itl_ms == pytest.approx(49.75)
    assert window.combined().itl_ms == pytest.approx(32.0)
    # A pool without fine samples (the decode pool on stock vLLM) puts both pools on vLLM's.
    query = _tracks(
        {"prefill": prefill, "decode": ENGINE_FAMILIES, "stable": {**ENGINE_FAMILIES, **FINE_FAMILIES}}
    )
    window = measure_topology(query, "chat", "default", "2m", T0, 0.99, 0.95, "abc", min_samples=100)
    assert all(p.itl_source is ItlSource.ENGINE for p in (window.prefill, window.decode, window.stable))
    assert window.combined().itl_ms == pytest.approx(49.75)
    assert window.combined().ttft_ms == pytest.approx(450.0 + 500.0)


# --------------------------------------------------------------------------- a topology on a real Prometheus


class _PoolExporter(ExpositionServer):
    """Three scrape paths (a prefill pool, a decode pool, the stable track): each a request counter
    growing at its own rate and a TTFT histogram whose every observation is in its own bucket."""

    PATHS: Final = {"/prefill": (2.0, "0.4"), "/decode": (6.0, "0.1"), "/stable": (1.0, "1.6")}
    BUCKETS: Final = ("0.1", "0.4", "1.6", "+Inf")

    def __init__(self) -> None:
        paths, buckets = self.PATHS, self.BUCKETS
        ttft = tuner_metrics("vllm").ttft_histogram
        success = tuner_metrics("vllm").request_success

        def render(path: str, elapsed: float) -> str | None:
            if path not in paths:
                return None
            rate, bucket = paths[path]
            done = rate * elapsed
            lines = [f"# TYPE {success} counter", f"{success} {done}"]
            lines += histogram_lines(ttft, buckets, float(bucket), done)
            return "\n".join(lines) + "\n"

        super().__init__(render)


def _instant(prometheus: Any) -> Callable[[str, datetime], float | None]:
    """The tuner's instant query on ``prometheus``."""

    def query(text: str, at: datetime) -> float | None:
        return parse_instant_result(prometheus.query(text, at.timestamp()))

    return query


def _scraped(exporter: ExpositionServer, measured: Callable[[], T | None], what: str) -> T:
    """``measured()`` once it answers (the scraped series cover the window), ``exporter`` closed
    either way."""
    try:
        return wait_for(measured, timeout=60, interval=1.0, what=what)
    finally:
        exporter.close()


def _scraped_pools(
    prometheus: Any, prefix: str, parts: Sequence[tuple[dict[str, str], str]]
) -> tuple[str, _PoolExporter]:
    """A service of its own (the session's Prometheus is shared) whose ``parts`` (labels, the
    exporter's path) ``prometheus`` scrapes; the exporter is the caller's to close."""
    service = f"{prefix}-{uuid.uuid4().hex[:8]}"
    exporter = _PoolExporter()
    common = {"service": service, "namespace": "default"}
    prometheus.set_target_groups(
        [TargetGroup([exporter.address], {**common, **labels}, path) for labels, path in parts]
    )
    return service, exporter


@pytest.mark.prometheus
def test_a_topology_is_measured_per_pool_by_its_role_on_a_real_prometheus(prometheus: Any) -> None:
    """Each pool's window reads its own pods only (track canary and its role), stable by its hash."""
    service, exporter = _scraped_pools(
        prometheus,
        "topo",
        [
            ({"track": "canary", "role": "prefill"}, "/prefill"),
            ({"track": "canary", "role": "decode"}, "/decode"),
            ({"track": "stable", "config_hash": "abc"}, "/stable"),
        ],
    )
    query = _instant(prometheus)

    def measured() -> TopologyWindow | None:
        found = measure_topology(
            query, service, "default", "10s", datetime.now(UTC), 0.99, 0.95, "abc", min_samples=9
        )
        # Nine tenths of the 10 s window covered at each part's rate (rate() of a younger series reads low).
        parts = ((found.prefill, 2.0), (found.decode, 6.0), (found.stable, 1.0))
        return found if all(p.request_rate and p.ttft_samples >= 9 * rate for p, rate in parts) else None

    window = _scraped(exporter, measured, "three scraped windows")
    assert window.prefill.request_rate == pytest.approx(2.0, rel=0.15)
    assert window.decode.request_rate == pytest.approx(6.0, rel=0.15)
    assert window.stable.request_rate == pytest.approx(1.0, rel=0.15)
    assert window.prefill.replicas == window.decode.replicas == window.stable.replicas == 1
    # TTFT p95 interpolated inside each part's own bucket: 0.1-0.4 s, 0-0.1 s, 0.4-1.6 s.
    assert window.prefill.ttft_ms is not None and 100 < window.prefill.ttft_ms <= 400
    assert window.decode.ttft_ms is not None and 0 < window.decode.ttft_ms <= 100
    assert window.stable.ttft_ms is not None and 400 < window.stable.ttft_ms <= 1600


@pytest.mark.prometheus
def test_a_colocated_canary_beside_pools_is_measured_on_its_own_pods_on_a_real_prometheus(
    prometheus: Any,
) -> None:
    """A colocated topology trial: its canary engines by track and config hash (no role), the stable
    pools by their roles, as their clients see them."""
    service, exporter = _scraped_pools(
        prometheus,
        "back",
        [
            ({"track": "canary", "config_hash": "def"}, "/stable"),
            ({"track": "stable", "role": "prefill"}, "/prefill"),
            ({"track": "stable", "role": "decode"}, "/decode"),
        ],
    )
    query = _instant(prometheus)

    def measured() -> WindowMeasurement | None:
        found = measure_colocated_trial(
            query, service, "default", "10s", datetime.now(UTC), 0.99, 0.95, "def", min_samples=9
        )
        parts = ((found.canary, 1.0), (found.stable, 2.0))  # the pools' TTFT samples: the prefill's
        covered = all(p.request_rate and p.ttft_samples >= 9 * rate for p, rate in parts)
        # The decode pool's rate too: rate() of a series younger than the window reads low.
        return found if covered and (found.stable.request_rate or 0.0) >= 0.9 * 6.0 else None

    window = _scraped(exporter, measured, "the canary's and the pools' windows")
    assert window.canary.request_rate == pytest.approx(1.0, rel=0.15)
    assert window.canary.replicas == 1
    assert window.stable.request_rate == pytest.approx(6.0, rel=0.15)  # the decode pool's
    assert window.stable.replicas == 2
    # The canary's TTFT p95 in its own 0.4-1.6 s bucket; the pools' the prefill's plus the decode's.
    assert window.canary.ttft_ms is not None and 400 < window.canary.ttft_ms <= 1600
    assert window.stable.ttft_ms is not None and 100 < window.stable.ttft_ms <= 500


@pytest.mark.prometheus
def test_canary_and_stable_are_judged_on_one_family_on_a_real_prometheus(prometheus: Any) -> None:
    """A plugin canary beside a stock-vLLM stable reads vLLM's histograms for both (tokens of 27 ms:
    p99 49.75 ms inside the 25-50 ms bucket); with the plugin on both, the fine ones (27.98 ms)."""
    suffix = uuid.uuid4().hex[:8]  # the session's Prometheus is shared: labels of its own
    mixed, plugin = f"mixed-{suffix}", f"plugin-{suffix}"
    exporter = LatencyExporter()
    groups = [
        TargetGroup([exporter.address], {"service": service, "namespace": "default", "track": track}, path)
        for service, track, path in (
            (mixed, "canary", "/plugin"),
            (mixed, "stable", "/stock"),
            (plugin, "canary", "/plugin"),
            (plugin, "stable", "/plugin"),
        )
    ]
    prometheus.set_target_groups(groups)
    query = _instant(prometheus)

    def measured() -> tuple[WindowMeasurement, WindowMeasurement] | None:
        at = datetime.now(UTC)
        found = tuple(
            measure_window(query, service, "default", "10s", at, 0.99, 0.95, min_samples=20)
            for service in (mixed, plugin)
        )
        tracks = [m for w in found for m in (w.canary, w.stable)]
        # Nine tenths of the 10 s window covered (rate() of a younger series reads low).
        return found if all(m.ttft_samples >= 0.9 * 10 * exporter.REQUESTS_PER_S for m in tracks) else None

    both_mixed, both_plugin = _scraped(exporter, measured, "two scraped windows")
    for m in (both_mixed.canary, both_mixed.stable):
        assert m.itl_source is ItlSource.ENGINE, m.track
        assert m.itl_ms == pytest.approx(25 + 0.99 * 25, abs=0.01)
        assert m.ttft_ms == pytest.approx(250 + 0.95 * 250, abs=0.1)
    for m in (both_plugin.canary, both_plugin.stable):
        assert m.itl_source is ItlSource.FINE, m.track
        assert m.itl_ms == pytest.approx(26 + 0.99 * 2, abs=0.01)
        assert m.ttft_ms == pytest.approx(250 + 0.95 * 50, abs=0.1)

    # Every query of a track in one request: the same measurement as one query at a time.
    at = both_plugin.stable.time
    for service in (mixed, plugin):
        for track in (Track.CANARY, Track.STABLE):
            selector = Selector(service, "default", track)
            asked: list[str] = []

            def vector(text: str, when: datetime, asked: list[str] = asked) -> list[dict[str, Any]]:
                asked.append(text)
                answer: list[dict[str, Any]] = prometheus.query(text, when.timestamp())
                return answer

            def unexpected(text: str, when: datetime) -> float | None:
                raise AssertionError(f"asked on its own: {text}")

            one_by_one = measure_track(query, selector, "10s", at, 0.99, 0.95)
            batched = measure_track_batched(vector, unexpected, selector, "10s", at, 0.99, 0.95)
            assert batched == one_by_one and len(asked) == 1, (service, track)


class _BacklogExporter(ExpositionServer):
    """Two scrape paths of vLLM's request counter and running and waiting gauges: ``/overloaded``
    completes 2 req/s while its queue grows by 2 a second (offered 4), ``/draining`` completes
    3 req/s while its queue shrinks by 1 a second (its completions stand)."""

    def __init__(self) -> None:
        names = tuner_metrics("vllm")
        success, (running, waiting) = names.request_success, names.in_flight

        def render(path: str, elapsed: float) -> str | None:
            if path == "/overloaded":
                done, queued = 2.0 * elapsed, 2.0 * elapsed
            elif path == "/draining":
                done, queued = 3.0 * elapsed, max(0.0, 1000.0 - elapsed)
            else:
                return None
            lines = [f"# TYPE {success} counter", f"{success} {done}"]
            lines += [
                f"# TYPE {running} gauge",
                f"{running} 16",
                f"# TYPE {waiting} gauge",
                f"{waiting} {queued}",
            ]
            return "\n".join(lines) + "\n"

        super().__init__(render)


@pytest.mark.prometheus
def test_the_offered_rate_is_read_from_the_engines_gauges_on_a_real_prometheus(prometheus: Any) -> None:
    """The completions and the requests piling up (or draining) in the engines, both scraped."""
    service = f"backlog-{uuid.uuid4().hex[:8]}"
    exporter = _BacklogExporter()
    prometheus.set_target_groups(
        [
            TargetGroup(
                [exporter.address], {"service": service, "namespace": "default", "track": track}, path
            )
            for track, path in (("canary", "/overloaded"), ("stable", "/draining"))
        ]
    )
    query = _instant(prometheus)

    def measured() -> WindowMeasurement | None:
        found = measure_window(query, service, "default", "10s", datetime.now(UTC), 0.99, 0.95, min_samples=1)
        # Nine tenths of the 10 s window covered on every series (rate() and delta() of a younger
        # series read low).
        parts = (
            (found.canary.request_rate, 2.0),
            (found.canary.in_flight_change, 20.0),
            (found.stable.request_rate, 3.0),
            (None if found.stable.in_flight_change is None else -found.stable.in_flight_change, 10.0),
        )
        return found if all(value is not None and value >= 0.9 * full for value, full in parts) else None

    window = _scraped(exporter, measured, "two scraped windows")
    assert window.canary.request_rate == pytest.approx(2.0, rel=0.15)
    assert window.canary.offered_rate == pytest.approx(4.0, rel=0.15)
    assert window.stable.request_rate == pytest.approx(3.0, rel=0.15)
    assert window.stable.in_flight_change == pytest.approx(-10.0, rel=0.2)  # 1 a second over 10 s
    assert window.stable.offered_rate == window.stable.request_rate


# --------------------------------------------------------------------------- credentials

#: A bcrypt hash of "scrape-secret" (cost 10), as Prometheus's web config wants it.
SCRAPE_SECRET_HASH: Final = "$2b$10$QnRKaI9d8jY.kdQLUDs3buf2RKo2lrDxyYBaeuAnFLrvgrOgXrBem"


@pytest.mark.prometheus
def test_a_prometheus_that_requires_basic_auth_is_queried_with_the_password_from_its_file(
    tmp_path: Path, prometheus_server: PrometheusServer
) -> None:
    with PrometheusServer(
        tmp_path / "prometheus",
        binary=prometheus_server.binary,
        basic_auth=("tuner", "scrape-secret", SCRAPE_SECRET_HASH),
    ) as server:
        password = tmp_path / "password"
        password.write_text("scrape-secret\n")
        authorised = PrometheusClient(
            server.url, timeout_s=5, auth=PrometheusAuth(username="tuner", password_file=str(password))
        )
        assert authorised.query("vector(2)") == 2.0
        with pytest.raises(MetricsUnavailableError, match="401"):
            PrometheusClient(server.url, timeout_s=5).query("vector(2)")
        # Credentials in the URL work too, but never show: the message carries the URL redacted.
        wrong = server.url.replace("http://", "http://tuner:not-the-password@")
        with pytest.raises(MetricsUnavailableError) as refused:
            PrometheusClient(wrong, timeout_s=5).query("vector(2)")
        assert "not-the-password" not in str(refused.value) and "***@" in str(refused.value)
        inline = server.url.replace("http://", "http://tuner:scrape-secret@")
        assert PrometheusClient(inline, timeout_s=5).query("vector(3)") == 3.0


@pytest.mark.prometheus
def test_a_prometheus_behind_tls_is_trusted_through_the_ca_bundle_file(
    tmp_path: Path, prometheus_server: PrometheusServer
) -> None:
    ca = generate_ca("prometheus-test-ca")
    serving = issue_serving_cert(ca, ["127.0.0.1", "localhost"], common_name="prometheus")
    certificate, key, bundle = tmp_path / "tls.crt", tmp_path / "tls.key", tmp_path / "ca.crt"
    certificate.write_bytes(serving.cert_pem)
    key.write_bytes(serving.key_pem)
    bundle.write_bytes(ca.cert_pem)
    with PrometheusServer(
        tmp_path / "prometheus", binary=prometheus_server.binary, tls=(certificate, key)
    ) as server:
        assert server.url.startswith("https://")
        trusted = PrometheusClient(server.url, timeout_s=5, auth=PrometheusAuth(ca_file=str(bundle)))
        assert trusted.query("vector(4)") == 4.0
        # Without the bundle the server's certificate is not trusted: no answer, a clear reason.
        with pytest.raises(MetricsUnavailableError, match=r"(?i)certificate|ssl"):
            PrometheusClient(server.url, timeout_s=5).query("vector(4)")
        other = tmp_path / "other-ca.crt"
        other.write_bytes(generate_ca("someone-else").cert_pem)
        with pytest.raises(MetricsUnavailableError, match=r"(?i)certificate|ssl"):
            PrometheusClient(server.url, timeout_s=5, auth=PrometheusAuth(ca_file=str(other))).query(
                "vector(4)"
            )


def test_a_bearer_token_is_read_from_its_file_at_each_use(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    auth = PrometheusAuth.from_env({"CHUNKPILOT_PROMETHEUS_BEARER_TOKEN_FILE": str(token)})
    assert auth.headers() == {"Authorization": "Bearer first"} and auth.basic() is None
    token.write_text("rotated")
    assert auth.headers() == {"Authorization": "Bearer rotated"}
    assert "first" not in auth.describe() and "rotated" not in auth.describe()
    with pytest.raises(ValueError, match="go together"):
        PrometheusAuth.from_env({"CHUNKPILOT_PROMETHEUS_USERNAME": "tuner"})
    with pytest.raises(ValueError, match="exclude each other"):
        PrometheusAuth(bearer_token_file=str(token), username="u", password_file=str(token))
    with pytest.raises(ValueError, match="cannot read the Prometheus credential file"):
        PrometheusAuth(bearer_token_file=str(tmp_path / "missing")).headers()


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://prometheus:9090", "http://prometheus:9090"),
        ("https://user:pass@prometheus.example:9443/prefix", "https://***@prometheus.example:9443/prefix"),
        ("http://user@prometheus", "http://***@prometheus"),
    ],
)
def test_a_url_is_shown_without_its_credentials(url: str, shown: str) -> None:
    assert redacted_url(url) == shown
