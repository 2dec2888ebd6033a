"""What-if on a service's twin: fitted on a real simulated engine's telemetry in a real Prometheus."""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import openai
import pytest
from chunkpilot.engine import metrics_names as names
from chunkpilot.operator.builders import incumbent
from chunkpilot.tuner import records as rec
from chunkpilot.tuner.measure import parse_instant_result
from chunkpilot.tuner.whatif import WhatIf, WhatIfError, what_if, with_knobs

from chunkpilot.devcluster.prometheus import PrometheusServer
from chunkpilot.testing.services import a_service, a_service_body
from chunkpilot.testing.simserver import run_sim_server

REQUESTS = 40


@pytest.fixture(scope="module")
def answers(prometheus_server: PrometheusServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The chat example (one H100 replica, budget 2048) served by a simulated engine for about 20 s,
    scraped as its stable track; then asked what-if at several rates, replicas and knobs."""
    name = f"whatif-{uuid.uuid4().hex[:6]}"
    body = a_service_body(replicas=1)
    body["metadata"]["name"] = name
    body["spec"]["slo"] = {
        "itl": {"quantile": 0.99, "maxMs": 50},
        "ttft": {"quantile": 0.95, "maxMs": 300},
        "window": "1m",
    }
    config_hash = incumbent(a_service(body)).config_hash()
    args = ("llama-3.1-8b", "--gpu", "h100", "--served-model-name", "llama-8b", "--max-model-len", "8192")
    args += ("--max-num-batched-tokens", "2048", "--max-num-seqs", "128")
    labels = {"service": name, "namespace": "default", "track": "stable", "config_hash": config_hash}
    with run_sim_server(tmp_path_factory.mktemp("whatif"), *args) as server:
        prometheus_server.set_targets([server.address], labels=labels)
        prometheus_server.wait_for_target_up(server.address, timeout=30)
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)

        def send(i: int) -> None:
            time.sleep(i * 0.5)  # 2 req/s
            prompt = [1000 + (i * 7919 + j * 104729) % 30000 for j in range(400 + 131 * (i % 9))]
            client.completions.create(
                model="llama-8b", prompt=prompt, max_tokens=64 + 8 * (i % 5), extra_body={"ignore_eos": True}
            )

        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(send, range(REQUESTS)))
        selector = f'{{service="{name}"}}'
        deadline = time.monotonic() + 20
        while True:  # a scrape after the last request
            done = prometheus_server.query(f"sum({names.REQUEST_SUCCESS}{selector})")
            if done and float(done[0]["value"][1]) >= REQUESTS:
                break
            assert time.monotonic() < deadline, done
            time.sleep(0.5)
        at = datetime.now(UTC)  # while the engine runs: a scrape of a stopped one reads it down

    def query(text: str, at: datetime) -> float | None:
        return parse_instant_result(prometheus_server.query(text, at.timestamp()))

    def vector(text: str, at: datetime) -> list[dict[str, Any]]:
        return prometheus_server.query(text, at.timestamp())

    def ask(rate: float, replicas: int | None = None, **settings: str) -> WhatIf:
        return what_if(body, query, vector, at, rate_req_s=rate, replicas=replicas, settings=settings)

    return {
        "light": ask(2.0),
        "heavy": ask(8.0),
        "spread": ask(8.0, replicas=4),
        "small_budget": ask(8.0, maxNumBatchedTokens="256"),
        "body": body,
        "ask": ask,
    }


pytestmark = pytest.mark.prometheus


def test_a_heavier_rate_on_the_same_replicas_is_predicted_slower_and_spread_out_as_fast_as_its_share(
    answers: dict[str, Any],
) -> None:
    light, heavy, spread = answers["light"], answers["heavy"], answers["spread"]
    assert light.steps >= 50 and light.capacity_req_s is not None and light.capacity_req_s > 0
    assert 0 < light.itl_ms <= heavy.itl_ms and 0 < light.ttft_ms <= heavy.ttft_ms
    # 8 req/s over 4 replicas is 2 req/s each: the light answer again.
    assert spread.itl_ms == pytest.approx(light.itl_ms, rel=0.02)
    assert spread.ttft_ms == pytest.approx(light.ttft_ms, rel=0.02)
    # One configuration, one capacity; the replicas a rate needs grow with it.
    assert heavy.capacity_req_s == light.capacity_req_s and heavy.needed >= light.needed >= 1
    assert "ITL p99 (target 50 ms)" in heavy.text() and "the twin's error on the stable track" in heavy.text()
    # What the planner sizes with: sustained, and its low end should the latencies be longer.
    assert light.capacity_low_req_s is not None and 0 < light.capacity_low_req_s <= light.capacity_req_s
    assert "req/s sustained" in heavy.text()


def test_another_budget_is_simulated_and_a_bad_knob_is_refused_with_the_fix(answers: dict[str, Any]) -> None:
    small = answers["small_budget"]
    assert small.config.max_num_batched_tokens == 256 and "budget=256" in small.text()
    assert small.capacity_req_s is not None and small.capacity_req_s != answers["heavy"].capacity_req_s
    config = rec.tuned_config(incumbent(a_service(answers["body"])))
    with pytest.raises(WhatIfError, match=r"unknown knob 'budget': one of .*maxNumBatchedTokens"):
        with_knobs(config, {"budget": "4096"})
    with pytest.raises(WhatIfError, match="a whole number is needed"):
        with_knobs(config, {"maxNumSeqs": "many"})
    with pytest.raises(WhatIfError, match="--rate must be above 0"):
        answers["ask"](0.0)
