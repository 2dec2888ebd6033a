"""A real Prometheus scraping a real /metrics endpoint."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from chunkpilot.devcluster.prometheus import PrometheusServer
from chunkpilot.testing.metrics import ExpositionServer

pytestmark = pytest.mark.prometheus

_METRICS = b"""# HELP devcluster_test_requests_total Requests served.
# TYPE devcluster_test_requests_total counter
devcluster_test_requests_total{route="/v1/completions"} 42
"""


@pytest.fixture
def metrics_endpoint() -> Iterator[str]:
    server = ExpositionServer(lambda path, _: _METRICS.decode() if path == "/metrics" else None)
    yield server.address
    server.close()


def test_prometheus_scrapes_a_real_endpoint_and_answers_queries(
    prometheus: PrometheusServer, metrics_endpoint: str
) -> None:
    prometheus.set_targets([metrics_endpoint], labels={"service": "chat"})
    prometheus.wait_for_target_up(metrics_endpoint, timeout=30)
    deadline = time.monotonic() + 30
    result: list[dict[str, object]] = []
    while not result and time.monotonic() < deadline:
        result = prometheus.query('devcluster_test_requests_total{service="chat"}')
        time.sleep(0.25)
    assert len(result) == 1
    sample = result[0]
    assert sample["metric"] == {  # type: ignore[comparison-overlap]
        "__name__": "devcluster_test_requests_total",
        "route": "/v1/completions",
        "service": "chat",
        "instance": metrics_endpoint,
        "job": "chunkpilot",
    }
    assert float(sample["value"][1]) == 42.0  # type: ignore[index]
    now = time.time()
    (series,) = prometheus.query_range('devcluster_test_requests_total{service="chat"}', now - 5, now, 1)
    values = series["values"]
    assert values and all(float(v) == 42.0 for _t, v in values)
    # Steps from the start; the start and end travel with millisecond precision.
    assert all(now - 5.001 <= float(t) <= now + 0.001 for t, _v in values)


def test_removed_targets_stop_being_scraped(prometheus: PrometheusServer, metrics_endpoint: str) -> None:
    prometheus.set_targets([metrics_endpoint])
    prometheus.wait_for_target_up(metrics_endpoint, timeout=30)
    prometheus.set_targets([])
    deadline = time.monotonic() + 30
    while prometheus.target_health(metrics_endpoint) is not None:
        if time.monotonic() > deadline:
            pytest.fail("the removed target is still active after 30s")
        time.sleep(0.25)
