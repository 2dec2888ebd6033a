"""A disaggregated service's pools sized from what a real Prometheus scraped of two engines."""

from __future__ import annotations

import asyncio
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import openai
import pytest
from chunkpilot.engine import metrics_names as names
from chunkpilot.tuner.measure import measure_pools, parse_instant_result
from chunkpilot.tuner.observe.snapshot import Reading
from chunkpilot.tuner.observe.twin import TwinObserver, measured_pools

from chunkpilot.devcluster.prometheus import PrometheusServer, TargetGroup
from chunkpilot.testing.services import a_service, a_service_body
from chunkpilot.testing.simserver import run_sim_server
from chunkpilot.testing.tuner import a_snapshot

pytestmark = pytest.mark.prometheus

MODEL = "sim-pools"
#: Requests each pool serves: enough finished requests to capture and steps to fit.
REQUESTS = 40


def service_body(name: str) -> dict[str, Any]:
    body = a_service_body(
        itl_ms=50,
        ttft_ms=600,
        spec={
            "scaling": {"mode": "Advise", "maxReplicas": 8},
            "topology": {
                "mode": "disaggregated",
                "prefill": {"replicas": 1, "maxNumBatchedTokens": 4096},
                "decode": {"replicas": 1, "maxNumBatchedTokens": 1024, "maxNumSeqs": 64},
            },
        },
        autotune={"abort": {"minSamples": REQUESTS // 2}},  # the twin's error: on the requests served
        status={},
    )
    body["metadata"]["name"] = name
    return body


def test_the_pools_are_fitted_on_their_own_steps_and_the_decode_pools_workload(
    prometheus: PrometheusServer, tmp_path: Path
) -> None:
    # A service name of its own: the session's Prometheus keeps what earlier tests scraped.
    name = f"pools-{uuid.uuid4().hex[:8]}"
    args = ("llama-3.1-8b", "--gpu", "h100", "--served-model-name", MODEL, "--max-model-len", "4096")
    (tmp_path / "prefill").mkdir()
    (tmp_path / "decode").mkdir()
    with (
        run_sim_server(tmp_path / "prefill", *args, time_scale=0.5) as prefill,
        run_sim_server(tmp_path / "decode", *args, time_scale=0.5) as decode,
    ):
        labels = {"service": name, "namespace": "default", "track": "stable"}
        prometheus.set_target_groups(
            [
                TargetGroup([prefill.address], labels | {"role": "prefill"}),
                TargetGroup([decode.address], labels | {"role": "decode"}),
            ]
        )
        prometheus.wait_for_target_up(prefill.address, timeout=30)
        prometheus.wait_for_target_up(decode.address, timeout=30)

        def serve(url: str, number: int, prompt: int, output: int) -> None:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
            tokens = [(number * 7919 + j) % 30000 + 1 for j in range(prompt)]  # no prefix shared
            client.completions.create(
                model=MODEL, prompt=tokens, max_tokens=output, extra_body={"ignore_eos": True}
            )

        # As a disaggregated router sends them: the prompt to the prefill pool for one token, then
        # the whole request to the decode pool (which here prefills it again: steps either way).
        with ThreadPoolExecutor(8) as pool:
            lengths = [(i, 200 + 97 * i % 1500, 20 + 7 * i % 60) for i in range(REQUESTS)]
            list(pool.map(lambda n: serve(prefill.url, n[0], n[1], 1), lengths))
            list(pool.map(lambda n: serve(decode.url, *n), lengths))
        raw = f'sum({names.REQUEST_SUCCESS}{{service="{name}",role="decode"}})'
        deadline = time.monotonic() + 20
        while not (seen := prometheus.query(raw)) or float(seen[0]["value"][1]) < REQUESTS:
            assert time.monotonic() < deadline, f"Prometheus never saw {REQUESTS} decode requests: {seen}"
            time.sleep(0.5)
        # Read while the engines still run: a scrape of a stopped engine counts it down (``up``
        # 0), and the pools would read as no replicas.
        now = datetime.now(UTC)

    def vector(query: str, at: datetime) -> list[dict[str, Any]]:
        return prometheus.query(query, at.timestamp())

    def query(promql: str, at: datetime) -> float | None:
        return parse_instant_result(vector(promql, at))

    spec = a_service(service_body(name)).spec
    assert spec.slo is not None
    engine = str(spec.engine.kind)
    least = spec.autotune.abort.min_samples
    measured = measure_pools(
        query, name, "default", spec.slo.window, now, 0.99, 0.95, engine, min_samples=least
    )
    observer = TwinObserver(vector, inline=True)
    snap = a_snapshot(service_body(name), prometheus=True, now=now, pools_reading=Reading(measured))
    sizes = asyncio.run(observer._pool_sizing(snap))
    assert sizes is not None
    # The twin's error on each running pool's own quantile, at the rate they served: measured (on at
    # least the requests a trial is judged on: fewer read none).
    assert measured.prefill.ttft_ms and measured.decode.itl_ms, measured
    assert sizes.error("prefill") is not None and sizes.error("decode") is not None, sizes.describe()
    assert "the twin's error on the running pools: prefill TTFT" in sizes.describe()
    strict = service_body(name)
    strict["spec"]["autotune"]["abort"]["minSamples"] = 10 * REQUESTS  # far more than were served
    thin = a_snapshot(strict, prometheus=True, now=now, pools_reading=Reading(measured))
    assert measured_pools(thin) is None
    assert sizes.key == "pools-4096x128-1024x64"  # the pools' knobs (the unset maxNumSeqs: the spec's)
    assert [p.role for p in sizes.pools] == ["prefill", "decode"]
    assert sizes.pools[1].own and sizes.pools[1].steps >= 50  # the decode pool ran enough steps of its own
    assert sizes.prefill_req_s > 0 and sizes.decode_req_s > 0, sizes.describe()
    # Refitted only after a while or on new knobs: the next step reads the same sizes.
    assert asyncio.run(observer._pool_sizing(snap)) is sizes
