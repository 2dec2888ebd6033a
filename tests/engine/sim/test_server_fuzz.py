"""Property-based fuzzing of the simulator's HTTP API: whatever the body, content type, method or
route, the answer is never a 5xx, errors keep OpenAI's shape, and the server stays healthy with
no request left running."""

from __future__ import annotations

import http.client
import json
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

SimServer = Any  # the conftest's running server
MAX_MODEL_LEN = 512

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
TEXT = st.text(max_size=60)  # lone surrogates included
IDS = st.lists(st.integers(min_value=-3, max_value=2**70) | st.integers(0, 1000), max_size=8)
PART = st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]) | JSON, "text": TEXT | JSON})
MESSAGE = st.fixed_dictionaries(
    {},
    optional={
        "role": st.sampled_from(["user", "system", "assistant"]) | JSON,
        "content": TEXT | st.lists(PART, max_size=3) | JSON,
    },
)
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "model": st.sampled_from(["llama-8b", "llama-3.1-8b", "gpt-4"]) | JSON,
    "prompt": TEXT | IDS | st.lists(TEXT, max_size=3) | st.lists(IDS, max_size=3) | JSON,
    "messages": st.lists(MESSAGE, max_size=3) | JSON,
    "max_tokens": st.integers(-2, MAX_MODEL_LEN + 8) | JSON,
    "max_completion_tokens": st.integers(-2, 64) | JSON,
    "n": st.integers(-1, 4) | st.integers(100, 200) | JSON,
    "best_of": st.integers(-1, 6) | JSON,
    "temperature": st.floats() | st.integers(-3, 3) | JSON,
    "top_p": st.floats() | JSON,
    "top_k": st.integers(-3, 50) | JSON,
    "min_p": st.floats() | JSON,
    "presence_penalty": st.floats() | JSON,
    "repetition_penalty": st.floats() | JSON,
    "seed": st.integers() | JSON,
    "stop": TEXT | st.lists(TEXT, max_size=3) | JSON,
    "stop_token_ids": IDS | JSON,
    "include_stop_str_in_output": st.booleans() | JSON,
    "ignore_eos": st.booleans() | JSON,
    "min_tokens": st.integers(-1, 40) | JSON,
    "stream": st.booleans() | JSON,
    "stream_options": st.fixed_dictionaries(
        {}, optional={"include_usage": st.booleans() | JSON, "continuous_usage_stats": st.booleans() | JSON}
    )
    | JSON,
    "logprobs": st.integers(-1, 25) | st.booleans() | JSON,
    "top_logprobs": st.integers(-1, 25) | JSON,
    "echo": st.booleans() | JSON,
    "tokens": IDS | JSON,
    "return_token_strs": st.booleans() | JSON,
}
BODY = st.fixed_dictionaries({}, optional=FIELDS)
CONTENT_TYPES = st.sampled_from(
    ["application/json", "application/json; charset=utf-8", "application/json; charset=latin-1",
     "application/json; charset=utf-16", "application/json; charset=bogus", "text/plain", None]
)  # fmt: skip
KNOWN_PATHS = ["/health", "/v1/models", "/version", "/ping", "/metrics", "/openapi.json", "/docs",
               "/v1/completions", "/v1/embeddings", "/tokenize"]  # fmt: skip
KNOWN_PATHS = ["/health", "/v1/models", "/version", "/ping", "/metrics", "/openapi.json", "/docs",
               "/v1/completions", "/v1/embeddings", "/tokenize"]  # fmt: skip
ROUTES = st.sampled_from(["/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"])


def _raw(body: Any) -> bytes:
    return json.dumps(body).encode("utf-8", "surrogatepass")


PAYLOAD = st.one_of(
    BODY.map(_raw),
    BODY.map(_raw),
    JSON.map(_raw),
    st.binary(max_size=64),
    st.integers(1, 3000).map(lambda depth: b'{"prompt": ' + b"[" * depth + b"]" * depth + b"}"),
)


@pytest.fixture(scope="module")
def fuzz_server(fast_sim_server: SimServer) -> SimServer:
    """The conftest's small fast server (512-token context at 1000x real time)."""
    return fast_sim_server


class _Statuses:
    seen: list[int] = []


def _send(server: SimServer, method: str, path: str, body: bytes | None, content_type: str | None) -> int:
    connection = http.client.HTTPConnection(server.host, server.port, timeout=60)
    try:
        connection.request(
            method, path, body=body, headers={"Content-Type": content_type} if content_type else {}
        )
        response = connection.getresponse()
        payload = response.read()
    finally:
        connection.close()
    status = response.status
    _Statuses.seen.append(status)
    assert status < 500, (status, payload[:500])
    if status >= 400 and path != "/health":
        error = json.loads(payload)["error"]
        assert isinstance(error["message"], str) and error["code"] == status
    return status


@settings(max_examples=1000, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(route=ROUTES, payload=PAYLOAD, content_type=CONTENT_TYPES)
def test_no_body_gets_a_5xx(
    fuzz_server: SimServer, route: str, payload: bytes, content_type: str | None
) -> None:
    _send(fuzz_server, "POST", route, payload, content_type)


GOOD_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40)
GOOD_IDS = st.lists(st.integers(0, 128_000), min_size=1, max_size=20)
GOOD_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "max_tokens": st.integers(1, 48),
    "n": st.integers(1, 3),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0.01, 1),
    "seed": st.integers(0, 2**31),
    "stop": GOOD_TEXT | st.lists(st.sampled_from([" the", "e", ".", "ch", "xyz"]), max_size=3),
    "stop_token_ids": st.lists(st.integers(0, 2000), max_size=4),
    "include_stop_str_in_output": st.booleans(),
    "ignore_eos": st.booleans(),
    "min_tokens": st.integers(0, 8),
    "logprobs": st.integers(0, 5),
    "echo": st.booleans(),
}
STREAMING = st.sampled_from([{}, {"stream": True}, {"stream": False}]).flatmap(
    lambda s: (
        st.just(s)
        if not s.get("stream")
        else st.fixed_dictionaries(
            {"stream": st.just(True)},
            optional={
                "stream_options": st.fixed_dictionaries(
                    {}, optional={"include_usage": st.booleans(), "continuous_usage_stats": st.booleans()}
                )
            },
        )
    )
)
PROMPTS = (
    GOOD_TEXT
    | GOOD_IDS
    | st.lists(GOOD_TEXT, min_size=1, max_size=3)
    | st.lists(GOOD_IDS, min_size=1, max_size=3)
)


def _sse(payload: bytes) -> list[dict[str, Any]]:
    events = [line[6:] for line in payload.decode().split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(event) for event in events[:-1]]


@settings(max_examples=250, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(
    prompt=PROMPTS,
    fields=st.fixed_dictionaries({}, optional=GOOD_FIELDS),
    streaming=STREAMING,
)
def test_valid_completions_succeed_consistently(
    fuzz_server: SimServer, prompt: Any, fields: dict[str, Any], streaming: dict[str, Any]
) -> None:
    body = {"model": "llama-8b", "prompt": prompt, **fields, **streaming}
    connection = http.client.HTTPConnection(fuzz_server.host, fuzz_server.port, timeout=60)
    try:
        connection.request(
            "POST", "/v1/completions", body=_raw(body), headers={"Content-Type": "application/json"}
        )
        response = connection.getresponse()
        payload = response.read()
    finally:
        connection.close()
    _Statuses.seen.append(response.status)
    if response.status == 400:  # only for the combinations vLLM refuses too
        assert json.loads(payload)["error"]["param"] in {"min_tokens", "max_tokens"}, payload
        return
    assert response.status == 200, payload[:500]
    prompts = 1 if isinstance(prompt, str) or isinstance(prompt[0], int) else len(prompt)
    choices = prompts * fields.get("n", 1)
    if streaming.get("stream"):
        chunks = _sse(payload)
        finished = [c for chunk in chunks for c in chunk["choices"] if c["finish_reason"]]
        assert sorted(c["index"] for c in finished) == list(range(choices))
    else:
        result = json.loads(payload)
        assert [c["index"] for c in result["choices"]] == list(range(choices))
        usage = result["usage"]
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        assert all(c["finish_reason"] in {"stop", "length"} for c in result["choices"])


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(
    method=st.sampled_from(["GET", "PUT", "DELETE", "PATCH", "POST"]),
    path=st.sampled_from(KNOWN_PATHS) | st.text(alphabet="/abcv1%.?=&", max_size=20).map(lambda p: "/" + p),
)
def test_no_route_or_method_gets_a_5xx(fuzz_server: SimServer, method: str, path: str) -> None:
    _send(fuzz_server, method, path, b"{}" if method != "GET" else None, "application/json")


def test_healthy_and_idle_after_the_fuzzing(fuzz_server: SimServer, tmp_path: Path) -> None:
    assert fuzz_server.get("/health")[0] == 200
    deadline = time.monotonic() + 10
    while True:
        _, body = fuzz_server.get("/metrics")
        families = {f.name: f for f in text_string_to_metric_families(body.decode())}
        if families["vllm:num_requests_running"].samples[0].value == 0:
            break
        assert time.monotonic() < deadline, "requests left running after the fuzzing"
        time.sleep(0.1)
    assert _Statuses.seen, "the fuzz tests did not run first"
    counts = {status: _Statuses.seen.count(status) for status in sorted(set(_Statuses.seen))}
    print(
        f"\n{len(_Statuses.seen)} fuzzed requests, highest status {max(_Statuses.seen)}; by status {counts}"
    )
    assert max(_Statuses.seen) < 500
