"""The simulator's live-adjustment route: the vLLM plugin's contract over real HTTP."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from chunkpilot.engine.live_adjust import LIVE_ADJUST_ROUTE, LIVE_ADJUST_TOKEN_ENV
from chunkpilot.engine.sim.metrics import SCHEDULED_TOKENS_PER_STEP
from prometheus_client.parser import text_string_to_metric_families

TOKEN = "s3cret-token"  # the conftest's LIVE_TOKEN


def _call(url: str, method: str, body: Any = None, token: str | None = TOKEN) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + LIVE_ADJUST_ROUTE, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _bucket_counts(server: Any) -> dict[float, float]:
    text = server.get("/metrics")[1].decode()
    for family in text_string_to_metric_families(text):
        if family.name == SCHEDULED_TOKENS_PER_STEP:
            return {float(s.labels["le"]): s.value for s in family.samples if s.name.endswith("_bucket")}
    raise AssertionError(f"{SCHEDULED_TOKENS_PER_STEP} not exported")


def _complete(server: Any, prompt_tokens: int) -> None:
    body = json.dumps({"prompt": [7] * prompt_tokens, "max_tokens": 2, "ignore_eos": True}).encode()
    request = urllib.request.Request(
        f"{server.url}/v1/completions", data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 200


def test_route_needs_the_bearer_token(live_sim_server: Any) -> None:
    status, body = _call(live_sim_server.url, "GET", token=None)
    assert status == 401 and "Bearer" in body["error"]
    assert _call(live_sim_server.url, "PUT", {"max_num_batched_tokens": 512}, token="wrong")[0] == 401


def test_lowering_applies_and_raising_is_refused(live_sim_server: Any) -> None:
    status, body = _call(live_sim_server.url, "GET")
    assert status == 200 and body["startup"]["max_num_batched_tokens"] == 2048
    before = _bucket_counts(live_sim_server)
    status, body = _call(live_sim_server.url, "PUT", {"max_num_batched_tokens": 512, "max_num_seqs": 64})
    assert status == 200, body
    assert body["applied"]["applied"]["max_num_batched_tokens"] == 512
    assert body["requested"]["limits"]["max_num_seqs"] == 64
    _complete(live_sim_server, 3000)  # a 3000-token prompt: chunks of at most 512 now
    after = _bucket_counts(live_sim_server)
    delta = {le: after[le] - before.get(le, 0.0) for le in after}
    assert delta[512.0] >= 6, delta  # six 512-token chunks at least
    assert delta[float("inf")] == delta[512.0], delta  # no step above the lowered budget
    status, body = _call(live_sim_server.url, "PUT", {"max_num_batched_tokens": 4096})
    assert status == 409 and "start-up value 2048" in body["error"]
    # Raising back up to the start-up value is allowed (lower-or-equal semantics).
    assert _call(live_sim_server.url, "PUT", {"max_num_batched_tokens": 2048})[0] == 200
    assert _call(live_sim_server.url, "PUT", {"nope": 1})[0] == 422


def test_route_is_off_without_the_token_env(sim_server: Any) -> None:
    status, body = _call(sim_server.url, "GET")
    assert status == 503 and LIVE_ADJUST_TOKEN_ENV in body["error"]
