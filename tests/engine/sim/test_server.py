"""Server mode through real HTTP: the ``openai`` client against a ``chunkpilot sim serve`` process."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest
from chunkpilot.engine import metrics_names as names
from chunkpilot.engine.sim import tokenizer
from chunkpilot.engine.sim.metrics import SCHEDULED_TOKENS_PER_STEP
from chunkpilot.engine.sim.profiles.loader import load_model
from prometheus_client.parser import text_string_to_metric_families

from chunkpilot.testing.processes import run_cli

SimServer = Any  # the conftest's running server (fixture ``sim_server``)


def _client(server: SimServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=30)


def _post(server: SimServer, path: str, body: bytes, method: str = "POST") -> tuple[int, Any]:
    request = urllib.request.Request(
        f"{server.url}{path}", data=body, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_health_and_models(sim_server: SimServer) -> None:
    assert sim_server.get("/health")[0] == 200
    models = _client(sim_server).models.list()
    assert [m.id for m in models.data] == ["llama-8b"]
    assert models.data[0].owned_by == "vllm"


def test_streaming_chat_completion_with_usage(sim_server: SimServer) -> None:
    messages = [{"role": "user", "content": "Explain chunked prefill in one paragraph."}]
    stream = _client(sim_server).chat.completions.create(
        model="llama-8b",
        messages=messages,  # type: ignore[arg-type]
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    content = [c for c in chunks if c.choices]
    assert content[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in content)
    assert text.strip()
    assert [c.choices[0].finish_reason for c in content if c.choices[0].finish_reason] == ["length"]
    assert sum(1 for c in content if c.choices[0].delta.content) == 12  # one chunk per token
    usage = chunks[-1].usage
    assert usage is not None and not chunks[-1].choices
    expected_prompt = len(tokenizer.encode_chat([("user", messages[0]["content"])]))
    assert (usage.prompt_tokens, usage.completion_tokens) == (expected_prompt, 12)
    assert usage.total_tokens == expected_prompt + 12


def test_streaming_completion(sim_server: SimServer) -> None:
    prompt = "The quick brown fox " * 50
    stream = _client(sim_server).completions.create(
        model="llama-8b",
        prompt=prompt,
        max_tokens=20,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    pieces = [c.choices[0].text for c in chunks if c.choices]
    assert len(pieces) == 20
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 20
    assert chunks[-1].usage.prompt_tokens == tokenizer.count_tokens(prompt)


def test_completion_without_ignore_eos_stops_naturally(sim_server: SimServer) -> None:
    prompt = "Summarise the design of a token budget."
    result = _client(sim_server).completions.create(model="llama-8b", prompt=prompt, max_tokens=300)
    vocab = load_model("llama-3.1-8b").vocab_size  # token ids (and so the stop position) depend on it
    natural = tokenizer.natural_length(tokenizer.encode(prompt, vocab))
    assert result.choices[0].finish_reason == "stop"
    assert result.usage is not None and result.usage.completion_tokens == natural < 300
    capped = _client(sim_server).completions.create(model="llama-8b", prompt=prompt, max_tokens=5)
    assert capped.choices[0].finish_reason == "length"
    assert capped.usage is not None and capped.usage.completion_tokens == 5


def test_chat_completion_non_streaming(sim_server: SimServer) -> None:
    result = _client(sim_server).chat.completions.create(
        model="llama-8b",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        max_tokens=7,
        extra_body={"ignore_eos": True},
    )
    assert result.choices[0].message.role == "assistant"
    assert result.choices[0].message.content
    assert result.usage is not None and result.usage.completion_tokens == 7


def test_openai_client_sees_errors_as_errors(sim_server: SimServer) -> None:
    client = _client(sim_server)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="gpt-4", prompt="x", max_tokens=1)
    with pytest.raises(openai.BadRequestError, match="maximum context length is 4096"):
        client.completions.create(model="llama-8b", prompt="word " * 3000, max_tokens=2000)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model="llama-8b", prompt="x", max_tokens=0)


BAD_REQUESTS: list[tuple[str, bytes, str]] = [
    ("/v1/completions", b"{not json", "not valid JSON"),
    ("/v1/completions", b"[1, 2]", "JSON object"),
    ("/v1/completions", b"{}", "prompt"),
    ("/v1/completions", b'{"prompt": 5}', "prompt"),
    ("/v1/completions", b'{"prompt": []}', "prompt"),
    ("/v1/completions", b'{"prompt": [true, false]}', "prompt"),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": "ten"}', "max_tokens"),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 1.5}', "max_tokens"),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": true}', "max_tokens"),
    ("/v1/completions", b'{"prompt": "x", "n": 0}', "'n'"),
    ("/v1/completions", b'{"prompt": "x", "stream": "yes"}', "stream"),
    ("/v1/completions", b'{"prompt": "x", "ignore_eos": 1}', "ignore_eos"),
    ("/v1/completions", b'{"prompt": "x", "model": 7}', "model"),
    ("/v1/chat/completions", b'{"messages": "hello"}', "messages"),
    ("/v1/chat/completions", b'{"messages": []}', "messages"),
    ("/v1/chat/completions", b'{"messages": [{"content": "no role"}]}', "role"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": 3}]}', "content"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}', "text"),
    ("/v1/chat/completions", b"\xff\xfe", "JSON"),
]


@pytest.mark.parametrize(("path", "body", "message"), BAD_REQUESTS)
def test_bad_requests_get_openai_style_errors(
    sim_server: SimServer, path: str, body: bytes, message: str
) -> None:
    status, payload = _post(sim_server, path, body)
    assert status == 400, payload
    error = payload["error"]
    assert message in error["message"]
    assert error["type"] == "BadRequestError" and error["code"] == 400


def test_unknown_routes_and_methods_are_json_errors_not_500(sim_server: SimServer) -> None:
    status, payload = _post(sim_server, "/v1/embeddings", b"{}")
    assert status == 404 and payload["error"]["code"] == 404
    status, payload = _post(sim_server, "/v1/completions", b"", method="GET")
    assert status == 405 and payload["error"]["code"] == 405


def _families(server: SimServer) -> dict[str, Any]:
    status, body = server.get("/metrics")
    assert status == 200
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def test_metrics_follow_the_vllm_v1_names_labels_types_and_buckets(sim_server: SimServer) -> None:
    _client(sim_server).completions.create(
        model="llama-8b", prompt="hello", max_tokens=3, extra_body={"ignore_eos": True}
    )
    families = _families(sim_server)
    labels = {names.LABEL_MODEL_NAME: "llama-8b", names.LABEL_ENGINE: names.ENGINE_LABEL_VALUE}
    for name, buckets in names.HISTOGRAM_BUCKETS.items():
        family = families[name]
        assert family.type == "histogram"
        assert {s.name for s in family.samples} == {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
        bounds = [float(s.labels["le"]) for s in family.samples if s.name == f"{name}_bucket"]
        assert bounds == [*buckets, float("inf")]
        assert all({k: v for k, v in s.labels.items() if k != "le"} == labels for s in family.samples)
    # DESIGN section 4, written out again so a change of the constants cannot go unnoticed.
    itl = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80]
    ttft = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80]
    assert list(names.ITL_BUCKETS) == itl
    assert list(names.TTFT_BUCKETS) == [*ttft, 160, 640, 2560]
    for name in names.COUNTERS:
        family = families[name.removesuffix("_total")]
        assert family.type == "counter"
        assert family.samples and all(s.name == name for s in family.samples)
        assert all(s.labels.items() >= labels.items() for s in family.samples)
    reasons = {s.labels[names.LABEL_FINISHED_REASON] for s in families["vllm:request_success"].samples
               if s.name == names.REQUEST_SUCCESS}  # fmt: skip
    assert {"stop", "length"} <= reasons
    for name in names.GAUGES:
        assert families[name].type == "gauge"
        assert families[name].samples[0].labels == labels
    assert names.REMOVED_TIME_PER_OUTPUT_TOKEN not in families
    generation = families["vllm:generation_tokens"].samples[0].value
    assert generation >= 3


def _histogram(families: dict[str, Any], name: str) -> tuple[dict[float, float], float, float]:
    """``({le: cumulative count}, count, sum)`` of one histogram with a single series."""
    samples = families[name].samples
    buckets = {float(s.labels["le"]): s.value for s in samples if s.name == f"{name}_bucket"}
    (count,) = (s.value for s in samples if s.name == f"{name}_count")
    (total,) = (s.value for s in samples if s.name == f"{name}_sum")
    return buckets, count, total


def test_iteration_tokens_count_whole_prompts_like_vllm_not_scheduled_tokens(
    sim_server_runner: Any, tmp_path: Path
) -> None:
    budget, prompt, output = 256, 1000, 3
    args = ("llama-3.1-8b", "--gpu", "h100", "--served-model-name", "llama-8b")
    with sim_server_runner(
        tmp_path, *args, "--max-model-len", "4096", "--max-num-batched-tokens", str(budget)
    ) as server:
        _client(server).completions.create(
            model="llama-8b", prompt=[7] * prompt, max_tokens=output, extra_body={"ignore_eos": True}
        )
        families = _families(server)
    # vLLM: one observation per iteration that emitted tokens, of the whole prompt of each request
    # emitting its first token plus the generated tokens, although no step scheduled more than the
    # budget; the chunk-only steps are not observed.
    buckets, count, total = _histogram(families, names.ITERATION_TOKENS)
    assert count == output
    assert total == prompt + output
    assert buckets[1024.0] - buckets[512.0] == 1  # the first-token iteration: 1000 + 1 tokens
    assert buckets[1.0] == output - 1  # the decode iterations: one token each
    assert families["vllm:prompt_tokens"].samples[0].value == prompt
    assert families["vllm:generation_tokens"].samples[0].value == output
    # The simulator's own per-step figure: every step, what it scheduled, never above the budget.
    steps, step_count, step_total = _histogram(families, SCHEDULED_TOKENS_PER_STEP)
    assert step_count >= -(-prompt // budget) + output - 1
    assert steps[float(budget)] == step_count
    assert step_total == prompt + output - 1  # the last sampled token is never fed back


def test_unknown_flag_is_rejected_like_vllm() -> None:
    result = run_cli("sim", "serve", "llama-3.1-8b", "--max-num-batched-tokenz", "64", timeout=120)
    assert result.returncode == 2
    assert "unrecognized arguments: --max-num-batched-tokenz" in result.stderr
