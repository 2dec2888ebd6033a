"""``chunkpilot report --prometheus-url``: the service's timeline read from Prometheus alone."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from chunkpilot.operator.testing import wait_for
from chunkpilot.tuner.measure import PrometheusClient

from chunkpilot.api import InferenceService
from chunkpilot.demo.scenario import DemoScenario, build_inferenceservice
from chunkpilot.devcluster.prometheus import PrometheusServer, TargetGroup
from chunkpilot.report.cli import service_timeline
from chunkpilot.report.timeline import replica_queries, replica_samples
from chunkpilot.testing.metrics import LatencyExporter

NOW = 1_000_000.0


def a_service(name: str = "chat", created: float | None = None) -> InferenceService:
    manifest = build_inferenceservice(DemoScenario(name=name))
    if created is not None:
        stamp = datetime.fromtimestamp(created, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        manifest["metadata"]["creationTimestamp"] = stamp
    return InferenceService.from_manifest(manifest)


class Answers:
    """A range query that records what it was asked and answers every step with ``value``."""

    def __init__(self, value: str = "2") -> None:
        self.asked: list[tuple[str, float, float, float]] = []
        self.value = value

    def __call__(self, promql: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        self.asked.append((promql, start, end, step))
        values = [[start + k * step, self.value] for k in range(int((end - start) // step) + 1)]
        return [{"metric": {}, "values": values}]


def test_the_timeline_reaches_back_to_since_but_not_before_the_service_was_created() -> None:
    answers = Answers()
    timeline = service_timeline(a_service(), answers, 3600.0, NOW)
    assert {start for _, start, _, _ in answers.asked} == {NOW - 3600.0}
    assert len(timeline.points) == 361 and timeline.points[-1].replicas == 2
    answers = Answers()
    timeline = service_timeline(a_service(created=NOW - 600.0), answers, 3600.0, NOW)
    assert {start for _, start, _, _ in answers.asked} == {NOW - 600.0}
    assert len(timeline.points) == 61


def test_replicas_and_desired_come_from_the_scraped_engines_and_the_operators_gauge() -> None:
    queries = replica_queries("chat", "team")
    assert queries["replicas"].startswith('count(up{service="chat",namespace="team",track="stable"} == 1)')
    assert 'exported_namespace="team"' in queries["desired"] and 'namespace="team"' in queries["desired"]

    def answers(promql: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        if promql == queries["replicas"]:
            return [{"metric": {}, "values": [[start, "1"], [start + 20, "3"]]}]
        return []  # no planner (or no operator scraped): desired unknown

    samples = replica_samples(answers, queries, NOW, NOW + 30)
    assert [(s.at - NOW, s.replicas, s.desired) for s in samples] == [(0.0, 1, None), (20.0, 3, None)]


def test_a_bad_since_or_a_service_without_slos_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match="--since must be a positive duration"):
        service_timeline(a_service(), Answers(), 0.0, NOW)
    service = a_service()
    without = service.model_copy(update={"spec": service.spec.model_copy(update={"slo": None})})
    with pytest.raises(ValueError, match=r"has no spec\.slo"):
        service_timeline(without, Answers(), 60.0, NOW)


@pytest.mark.prometheus
def test_a_timeline_is_read_from_a_real_prometheus_scraping_a_stable_engine(
    prometheus: PrometheusServer,
) -> None:
    name = f"report-{uuid.uuid4().hex[:8]}"  # the session's Prometheus is shared: a label of its own
    exporter = LatencyExporter()
    labels = {"service": name, "namespace": "default", "track": "stable"}
    prometheus.set_target_groups([TargetGroup([exporter.address], labels, "/plugin")])
    client = PrometheusClient(prometheus.url, timeout_s=5)
    service = a_service(name)

    def scraped() -> Any:
        timeline = service_timeline(service, client.matrix, 60.0, time.time())
        measured = [p for p in timeline.points if p.rate_req_s and p.itl_ms and p.ttft_ms]
        # rate() over a series younger than its 30 s window reads low: wait for a full window.
        settled = measured and (measured[-1].rate_req_s or 0) > 0.8 * exporter.REQUESTS_PER_S
        return timeline if len(measured) >= 2 and settled else None

    try:
        timeline = wait_for(
            scraped, timeout=90, interval=2.0, what="two measured steps, the last over a full window"
        )
    finally:
        exporter.close()
    measured = [p for p in timeline.points if p.rate_req_s and p.itl_ms and p.ttft_ms]
    assert measured[-1].rate_req_s == pytest.approx(exporter.REQUESTS_PER_S, rel=0.2)
    # The fine histograms' buckets around 27 ms and 290 ms, interpolated at p99 and p95.
    assert measured[-1].itl_ms is not None and 26 < measured[-1].itl_ms <= 28
    assert measured[-1].ttft_ms is not None and 250 < measured[-1].ttft_ms <= 300
    assert measured[-1].replicas == 1 and measured[-1].desired is None
