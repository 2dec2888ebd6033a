"""PromQL built per track; instant answers parsed; no data stays no data."""

from __future__ import annotations

import http.server
import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Any, Final

import pytest
from chunkpilot.engine.metrics_names import tuner_metrics
from chunkpilot.operator.testing import wait_for
from chunkpilot.tuner.measure import (
    TPOT_ITL_FACTOR,
    ItlSource,
    LabelScheme,
    MetricsUnavailableError,
    QueryFn,
    Selector,
    TopologyWindow,
    count_query,
    fine_latency_queries,
    measure_topology,
    measure_track,
    measure_window,
    parse_instant_result,
    quantile_query,
    rate_query,
    track_queries,
)

from chunkpilot.api import Track
from chunkpilot.devcluster.prometheus import TargetGroup

SEL = Selector("chat", "default", Track.CANARY)
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

    w = measure_window(query, "chat", "default", "2m", T0, 0.99, 0.95)
    assert {at for _, at in seen} == {T0}
    assert w.canary.itl_ms == pytest.approx(40.0)
    assert w.canary.ttft_ms == pytest.approx(800.0)
    assert w.canary.replicas == 2 and w.canary.ttft_samples == 500.0
    assert w.canary.prompt_tok_s is None and w.canary.throughput_tok_s == 100.0
    assert w.canary.enough_samples(100) and not w.canary.enough_samples(501)
    assert len(seen) == 2 * len(track_queries(SEL, "2m", 0.99, 0.95).__dict__)


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


def test_vllm_reads_its_own_latency_histograms_only() -> None:
    seen, query = _answers(
        {"vllm:inter_token_latency_seconds": 0.040, "vllm:time_to_first_token_seconds": 0.5}
    )
    m = measure_track(query, SEL, "1m", T0, 0.99, 0.95)
    assert m.itl_ms == pytest.approx(40.0) and m.itl_source is ItlSource.ENGINE and m.itl_note is None
    assert fine_latency_queries(SEL, "1m", 0.99, 0.95) is None
    assert not any("chunkpilot:" in q for q in seen)


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


def test_trtllm_judges_itl_per_token_where_the_fine_histogram_is_exported() -> None:
    _, query = _answers(
        {
            "chunkpilot:inter_token_latency_seconds": 0.0737,
            "trtllm_time_per_output_token_seconds": 0.0375,
            "trtllm_time_to_first_token_seconds": 0.3,
        }
    )
    m = measure_track(query, SEL, "1m", T0, 0.99, 0.95, "trtllm")
    assert m.itl_ms == pytest.approx(73.7) and m.itl_source is ItlSource.FINE
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


# --------------------------------------------------------------------------- a topology on a real Prometheus


class _PoolExporter:
    """Three scrape paths (a prefill pool, a decode pool, the stable track): each a request counter
    growing at its own rate and a TTFT histogram whose every observation is in its own bucket."""

    PATHS: Final = {"/prefill": (2.0, "0.4"), "/decode": (6.0, "0.1"), "/stable": (1.0, "1.6")}
    BUCKETS: Final = ("0.1", "0.4", "1.6", "+Inf")

    def __init__(self) -> None:
        start = time.monotonic()
        paths = self.PATHS
        buckets = self.BUCKETS
        ttft = tuner_metrics("vllm").ttft_histogram
        success = tuner_metrics("vllm").request_success

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path not in paths:
                    self.send_error(404)
                    return
                rate, bucket = paths[self.path]
                done = rate * (time.monotonic() - start)
                lines = [f"# TYPE {success} counter", f"{success} {done}", f"# TYPE {ttft} histogram"]
                for le in buckets:
                    count = done if float(le) >= float(bucket) else 0.0
                    lines.append(f'{ttft}_bucket{{le="{le}"}} {count}')
                lines += [f"{ttft}_count {done}", f"{ttft}_sum {done * float(bucket)}"]
                body = ("\n".join(lines) + "\n").encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.prometheus
def test_a_topology_is_measured_per_pool_by_its_role_on_a_real_prometheus(prometheus: Any) -> None:
    """Each pool's window reads its own pods only (track canary and its role), stable by its hash."""
    service = f"topo-{uuid.uuid4().hex[:8]}"  # the session's Prometheus is shared: a label of its own
    exporter = _PoolExporter()
    common = {"service": service, "namespace": "default"}
    prometheus.set_target_groups(
        [
            TargetGroup([exporter.address], {**common, "track": "canary", "role": "prefill"}, "/prefill"),
            TargetGroup([exporter.address], {**common, "track": "canary", "role": "decode"}, "/decode"),
            TargetGroup([exporter.address], {**common, "track": "stable", "config_hash": "abc"}, "/stable"),
        ]
    )

    def query(text: str, at: datetime) -> float | None:
        return parse_instant_result(prometheus.query(text, at.timestamp()))

    def measured() -> TopologyWindow | None:
        found = measure_topology(query, service, "default", "10s", datetime.now(UTC), 0.99, 0.95, "abc")
        # Nine tenths of the 10 s window covered at each part's rate (rate() of a younger series reads low).
        parts = ((found.prefill, 2.0), (found.decode, 6.0), (found.stable, 1.0))
        return found if all(p.request_rate and p.ttft_samples >= 9 * rate for p, rate in parts) else None

    try:
        window = wait_for(measured, timeout=60, interval=1.0, what="three scraped windows")
    finally:
        exporter.close()
    assert window.prefill.request_rate == pytest.approx(2.0, rel=0.15)
    assert window.decode.request_rate == pytest.approx(6.0, rel=0.15)
    assert window.stable.request_rate == pytest.approx(1.0, rel=0.15)
    assert window.prefill.replicas == window.decode.replicas == window.stable.replicas == 1
    # TTFT p95 interpolated inside each part's own bucket: 0.1-0.4 s, 0-0.1 s, 0.4-1.6 s.
    assert window.prefill.ttft_ms is not None and 100 < window.prefill.ttft_ms <= 400
    assert window.decode.ttft_ms is not None and 0 < window.decode.ttft_ms <= 100
    assert window.stable.ttft_ms is not None and 400 < window.stable.ttft_ms <= 1600
