"""The report's timeline: range answers and replica samples merged, summarised and plotted (pure)."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import pytest
from chunkpilot.engine.metrics_names import FINE_INTER_TOKEN_LATENCY

from chunkpilot.api import InferenceService
from chunkpilot.demo.scenario import DemoScenario, build_inferenceservice
from chunkpilot.report import write_report
from chunkpilot.report.timeline import ReplicaSample, read_timeline, timeline_queries

START = 1_000_000.0
#: The demo's service (ITL p99 <= 50 ms, TTFT p95 <= 1000 ms): what draws a timeline.
SERVICE = InferenceService.from_manifest(build_inferenceservice(DemoScenario()))


def _matrix(values: dict[int, str]) -> list[dict[str, Any]]:
    return [{"metric": {}, "values": [[START + 10 * k, v] for k, v in values.items()]}]


def _answers(promql: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
    assert (start, end, step) == (START, START + 40, 10)
    if "request_success" in promql:
        return _matrix({0: "6", 1: "6.2", 2: "15", 3: "15.5", 4: "6"})
    if "inter_token" in promql:
        return _matrix({0: "0.04", 1: "NaN", 2: "0.07", 3: "0.045", 4: "0.03"})
    return _matrix({0: "0.5", 1: "0.6", 2: "0.9", 3: "1.2", 4: "0.5"})


def _timeline() -> Any:
    queries = timeline_queries("chat", "default", "sim", 0.99, 0.95)
    samples = [
        ReplicaSample(START + 25, 3, 3),
        ReplicaSample(START - 5, 1, None),
        ReplicaSample(START + 15, 1, 3),
        ReplicaSample(START + 38, 2, 1),
    ]
    return read_timeline(_answers, queries, START, START + 40, samples)


def test_queries_read_every_pod_of_the_service_in_the_fine_histograms() -> None:
    queries = timeline_queries("chat", "default", "sim", 0.99, 0.95)
    assert set(queries) == {"rate", "itl", "ttft"}
    assert FINE_INTER_TOKEN_LATENCY in queries["itl"]
    assert 'service="chat"' in queries["rate"] and "track" not in queries["rate"]


def test_points_merge_the_series_with_the_last_replica_sample_before_them() -> None:
    timeline = _timeline()
    assert [p.t_s for p in timeline.points] == [0, 10, 20, 30, 40]
    assert [p.rate_req_s for p in timeline.points] == [6, 6.2, 15, 15.5, 6]
    assert [p.replicas for p in timeline.points] == [1, 1, 1, 3, 2]
    assert [p.desired for p in timeline.points] == [None, None, 3, 3, 1]
    first = timeline.points[0]
    assert first.itl_ms == pytest.approx(40.0) and first.ttft_ms == pytest.approx(500.0)
    assert timeline.points[1].itl_ms is None  # NaN: no tokens in the window


def test_samples_after_the_last_step_end_the_timeline_with_their_counts() -> None:
    def answers(promql: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        return _answers(promql, start, START + 40, step)

    samples = [ReplicaSample(START + 5, 2, 2), ReplicaSample(START + 44, 1, 1)]
    timeline = read_timeline(answers, {"rate": "rate"}, START, START + 46, samples)
    assert [p.t_s for p in timeline.points] == [0, 10, 20, 30, 40, 46]
    assert [p.replicas for p in timeline.points] == [None, 2, 2, 2, 2, 1]
    assert timeline.points[-1].rate_req_s is None
    # Without a sample after the last step, the steps are all there is.
    assert len(read_timeline(answers, {}, START, START + 46, samples[:1]).points) == 5


def test_summary_names_the_counts_in_order_and_how_often_each_slo_held() -> None:
    lines = "\n".join(_timeline().summary(SERVICE.spec.slo))
    assert "6.0 req/s at the start, 15.5 at the peak" in lines
    assert "Stable replicas: 1 -> 3 -> 2; desired: 3 -> 1" in lines
    assert "ITL p99 within 50 ms at 3 of 4" in lines
    assert "TTFT p95 within 1000 ms at 4 of 5" in lines


def test_an_empty_or_backwards_range_is_refused() -> None:
    with pytest.raises(ValueError, match="must come after its start"):
        read_timeline(_answers, {}, START, START, [])


def test_the_report_gets_the_timeline_plot_csv_and_section(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = write_report(SERVICE, [], tmp_path, _timeline())
    text = path.read_text()
    assert "## Load, replicas and latency over the run" in text
    assert "![timeline](timeline.png)" in text
    assert (tmp_path / "timeline.png").stat().st_size > 0
    with (tmp_path / "timeline.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 5 and float(rows[3]["rate_req_s"]) == 15.5
    assert math.isclose(float(rows[0]["itl_ms"]), 40.0)
