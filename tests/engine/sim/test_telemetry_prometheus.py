"""A real Prometheus scrapes the simulator's step telemetry; the twin's PromQL reads it back."""

from __future__ import annotations

import time
import urllib.request
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import openai
import pytest
from chunkpilot.engine import metrics_names as names
from chunkpilot.tuner.measure import Selector
from chunkpilot.tuner.twin.capture import (
    parse_exposition,
    segment_queries,
    segments_from_results,
    step_queries,
    steps_from_vectors,
    workload_from_vectors,
    workload_queries,
)
from chunkpilot.tuner.twin.online import pods_changed

from chunkpilot.api import Track
from chunkpilot.devcluster.prometheus import PrometheusServer, TargetGroup

pytestmark = pytest.mark.prometheus

MODEL = "sim-twin"


def test_step_queries_give_the_mean_step_time_per_bucket(
    prometheus: PrometheusServer, tmp_path: Path, sim_server_runner: Any
) -> None:
    # A label of its own: the session's Prometheus keeps what earlier tests scraped (the e2e twin
    # test's engines belong to a service named "twin"), and this window must see only this engine.
    service = f"telemetry-{uuid.uuid4().hex[:8]}"
    selector = f'service="{service}"'
    args = ("llama-3.1-8b", "--gpu", "h100", "--served-model-name", MODEL, "--max-num-batched-tokens", "512")
    with sim_server_runner(tmp_path, *args, time_scale=0.5) as server:
        prometheus.set_targets([server.address], labels={"service": service, "track": "stable"})
        prometheus.wait_for_target_up(server.address, timeout=30)
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)
        for length in (300, 1500):
            client.completions.create(
                model=MODEL, prompt=[5] * length, max_tokens=6, extra_body={"ignore_eos": True}
            )
        with urllib.request.urlopen(f"{server.url}/metrics", timeout=10) as response:
            direct = parse_exposition(response.read().decode()).steps
        queries = step_queries(selector, "10m")
        expected_steps = sum(t.steps for t in direct.values())
        raw = f"sum({names.STEP_DURATION}_count{{{selector}}})"
        deadline = time.monotonic() + 20
        while True:  # wait for a scrape taken after the last step
            seen = prometheus.query(raw)
            if seen and float(seen[0]["value"][1]) == expected_steps:
                break
            assert time.monotonic() < deadline, f"Prometheus never saw {expected_steps} steps: {seen}"
            time.sleep(0.5)
        # Every windowed query at one evaluation time, as the tuner reads them: increase() at another
        # time (a scrape later) extrapolates differently, and the ratios below moved by over 1 %.
        at = time.time()
        windowed = steps_from_vectors({key: prometheus.query(q, at) for key, q in queries.items()})
        workload = workload_from_vectors(
            {key: prometheus.query(q, at) for key, q in workload_queries(selector, "10m").items()}, 600.0
        )
        # The same requests minute by minute, as the replica planner's sample reads them: the
        # subqueries' points fall on whole minutes, so they are asked at the next one.
        minute = (int(at) // 60 + 1) * 60.0
        matrices = segment_queries(selector, "10m", fine=True)
        segments = segments_from_results({key: prometheus.query(q, minute) for key, q in matrices.items()})
    # The request lengths: Chunkpilot's fine histograms, whose mean is the two prompts' mean.
    assert workload.prompt_tokens.bounds == names.FINE_REQUEST_TOKENS_BUCKETS
    assert workload.prompt_tokens.mean == pytest.approx((300 + 1500) / 2, rel=0.01)
    assert workload.generation_tokens.mean == pytest.approx(6, rel=0.01)
    assert [i for i, c in enumerate(workload.prompt_tokens.counts) if c > 0] == [
        names.FINE_REQUEST_TOKENS_BUCKETS.index(300),
        names.FINE_REQUEST_TOKENS_BUCKETS.index(1500),
    ]
    # Every minute with requests has its own histograms, and together they hold both prompts.
    assert segments and all(s.duration_s == 60.0 for s in segments)
    assert {i for s in segments for i, c in enumerate(s.prompt_tokens.counts) if c > 0} == {
        names.FINE_REQUEST_TOKENS_BUCKETS.index(300),
        names.FINE_REQUEST_TOKENS_BUCKETS.index(1500),
    }
    assert sum(s.generation_tokens.total for s in segments) / sum(
        s.generation_tokens.count for s in segments
    ) == pytest.approx(6, rel=0.01)
    assert set(windowed) == set(direct)
    for label, totals in direct.items():
        # increase() extrapolates each series to the window's edges; a bucket's sum and count are
        # scraped together, so their ratio — the mean — holds (within 1 %: the zero-clamp of the
        # extrapolation differs slightly when the first scrape caught a request midway).
        assert windowed[label].duration_s / windowed[label].steps == pytest.approx(
            totals.duration_s / totals.steps, rel=0.01
        ), label
        assert windowed[label].mean_tokens == pytest.approx(totals.mean_tokens, rel=0.01), label


def test_pods_that_came_or_went_inside_the_window_are_counted_until_a_whole_window_has_passed(
    prometheus: PrometheusServer, tmp_path: Path, sim_server_runner: Any
) -> None:
    # The twin waits for a window of steady traffic (a promotion rolls the stable pods, a canary's
    # start or end moves half the load); the counts come from Prometheus's record of each target.
    service = f"pods-{uuid.uuid4().hex[:8]}"
    stable = Selector(service, None, Track.STABLE, config_hash="abc")

    def vector(query: str, at: datetime) -> list[dict[str, Any]]:
        return prometheus.query(query, at.timestamp())

    def changed() -> tuple[int, int]:
        return pods_changed(vector, stable, "6s", datetime.now(UTC))

    def settle(expected: tuple[int, int]) -> None:
        deadline = time.monotonic() + 30
        while (seen := changed()) != expected:
            assert time.monotonic() < deadline, f"pods changed {seen}, expected {expected}"
            time.sleep(0.5)

    args = ("llama-3.1-8b", "--gpu", "h100", "--served-model-name", MODEL)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with (
        sim_server_runner(tmp_path / "a", *args, time_scale=0.5) as first,
        sim_server_runner(tmp_path / "b", *args, time_scale=0.5) as second,
    ):
        labels = {"service": service, "track": "stable", "config_hash": "abc"}
        prometheus.set_targets([first.address], labels=labels)
        prometheus.wait_for_target_up(first.address, timeout=30)
        settle((1, 0))  # seen once its first sample is queryable (a target is up on its scrape)
        settle((0, 0))
        # A canary of another config and track still changes the service's traffic split.
        canary = labels | {"track": "canary", "config_hash": "def"}
        prometheus.set_target_groups(
            [TargetGroup([first.address], labels), TargetGroup([second.address], canary)]
        )
        prometheus.wait_for_target_up(second.address, timeout=30)
        settle((1, 0))
        settle((0, 0))
        prometheus.set_targets([first.address], labels=labels)  # the canary ends
        settle((0, 1))
        settle((0, 0))
