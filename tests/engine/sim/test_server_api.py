"""vLLM's OpenAI server features the simulator serves: stop strings and ids, logprobs, echo, n,
batch prompts, continuous usage, stop_reason, system_fingerprint and the auxiliary routes."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import openai
from chunkpilot.engine.sim import tokenizer

SimServer = Any  # the conftest's running server
VOCAB = 128256  # llama-3.1-8b


def _client(server: SimServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=30)


def _post(server: SimServer, path: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        f"{server.url}{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def _completion(server: SimServer, **body: Any) -> Any:
    return _post(server, "/v1/completions", {"model": "llama-8b", "prompt": "Tell me a story", **body})


def test_seeded_output_is_reproducible_and_tokenizes_to_its_length(sim_server: SimServer) -> None:
    first = _completion(sim_server, max_tokens=60, ignore_eos=True, seed=7)
    again = _completion(sim_server, max_tokens=60, ignore_eos=True, seed=7)
    text = first["choices"][0]["text"]
    assert text == again["choices"][0]["text"]
    assert tokenizer.count_tokens(text) == first["usage"]["completion_tokens"] == 60
    assert first["system_fingerprint"] and first["choices"][0]["stop_reason"] is None


def test_stop_string_ends_the_output_where_it_completes(sim_server: SimServer) -> None:
    full = _completion(sim_server, max_tokens=80, ignore_eos=True, seed=3)["choices"][0]["text"]
    stop = full[30:36]
    cut = full.index(stop)
    result = _completion(sim_server, max_tokens=80, ignore_eos=True, seed=3, stop=["zzzz", stop])
    choice = result["choices"][0]
    assert choice["text"] == full[:cut]
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", stop)
    tokens = tokenizer.pieces(full)
    ends = [sum(len(t) for t in tokens[: i + 1]) for i in range(len(tokens))]
    completing = next(i for i, end in enumerate(ends) if end >= cut + len(stop))
    assert result["usage"]["completion_tokens"] == completing + 1
    kept = _completion(sim_server, max_tokens=80, ignore_eos=True, seed=3, stop=stop,
                       include_stop_str_in_output=True)  # fmt: skip
    assert kept["choices"][0]["text"] == full[: cut + len(stop)]


def test_stop_token_id_ends_the_output_at_that_token(sim_server: SimServer) -> None:
    full = _completion(sim_server, max_tokens=50, ignore_eos=True, seed=5)["choices"][0]["text"]
    ids = _post(sim_server, "/tokenize", {"prompt": full})["tokens"]
    assert len(ids) == 50
    position = 20
    stop_id = ids[position]
    first = ids.index(stop_id)
    result = _completion(sim_server, max_tokens=50, ignore_eos=True, seed=5, stop_token_ids=[stop_id])
    choice = result["choices"][0]
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", stop_id)
    assert result["usage"]["completion_tokens"] == first + 1
    assert choice["text"] == "".join(tokenizer.pieces(full)[:first])


def test_completion_logprobs_and_echo_are_well_formed(sim_server: SimServer) -> None:
    prompt = "Hello there"
    result = _completion(sim_server, prompt=prompt, max_tokens=6, ignore_eos=True, logprobs=3, echo=True)
    choice = result["choices"][0]
    assert choice["text"].startswith(prompt)
    logprobs = choice["logprobs"]
    prompt_tokens = tokenizer.pieces(prompt)
    assert logprobs["tokens"][: len(prompt_tokens)] == prompt_tokens
    assert len(logprobs["tokens"]) == len(prompt_tokens) + 6 == len(logprobs["token_logprobs"])
    assert "".join(logprobs["tokens"]) == choice["text"]
    assert logprobs["text_offset"] == [
        len("".join(logprobs["tokens"][:i])) for i in range(len(logprobs["tokens"]))
    ]
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    values, tops = logprobs["token_logprobs"], logprobs["top_logprobs"]
    for token, value, top in zip(logprobs["tokens"][1:], values[1:], tops[1:], strict=True):
        assert value <= 0 and len(top) == 3 and top[token] == value == max(top.values())


def test_chat_logprobs_through_the_openai_client(sim_server: SimServer) -> None:
    result = _client(sim_server).chat.completions.create(
        model="llama-8b",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        logprobs=True,
        top_logprobs=2,
        extra_body={"ignore_eos": True},
    )
    content = result.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == 4
    assert "".join(t.token for t in content) == result.choices[0].message.content
    for token in content:
        assert token.logprob <= 0 and len(token.top_logprobs) == 2
        assert token.top_logprobs[0].token == token.token
        assert token.top_logprobs[1].logprob <= token.top_logprobs[0].logprob
        assert bytes(token.bytes or []) == token.token.encode()


def test_n_choices_and_batch_prompts(sim_server: SimServer) -> None:
    result = _completion(
        sim_server, prompt=["one two", "three four five"], n=3, max_tokens=5, ignore_eos=True
    )
    assert [c["index"] for c in result["choices"]] == list(range(6))
    prompts = tokenizer.count_tokens("one two") + tokenizer.count_tokens("three four five")
    assert result["usage"] == {
        "prompt_tokens": prompts,
        "completion_tokens": 30,
        "total_tokens": prompts + 30,
    }
    ids = _completion(sim_server, prompt=[[1, 2, 3], [4, 5]], max_tokens=2, ignore_eos=True)
    assert len(ids["choices"]) == 2 and ids["usage"]["prompt_tokens"] == 5
    chat = _client(sim_server).chat.completions.create(
        model="llama-8b", messages=[{"role": "user", "content": "hi"}], n=2, max_tokens=3,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert sorted(c.index for c in chat.choices) == [0, 1]
    assert chat.usage is not None and chat.usage.completion_tokens == 6


def test_streaming_n_with_continuous_usage(sim_server: SimServer) -> None:
    stream = _client(sim_server).completions.create(
        model="llama-8b",
        prompt="stream me",
        n=2,
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},  # type: ignore[typeddict-unknown-key]
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    content = [c for c in chunks if c.choices]
    assert all(c.usage is not None for c in chunks)
    done = [c.usage.completion_tokens for c in content if c.usage is not None]
    assert done == sorted(done) and done[-1] == 10
    texts = {0: "", 1: ""}
    for chunk in content:
        texts[chunk.choices[0].index] += chunk.choices[0].text
    assert all(tokenizer.count_tokens(t) == 5 for t in texts.values())
    finishes = [c.choices[0].finish_reason for c in content if c.choices[0].finish_reason]
    assert finishes == ["length", "length"]
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 10 + tokenizer.count_tokens(
        "stream me"
    )


def test_tokenize_and_detokenize(sim_server: SimServer) -> None:
    text = "the cat sat on 123 mats."
    result = _post(sim_server, "/tokenize", {"prompt": text, "return_token_strs": True})
    assert result["tokens"] == tokenizer.encode(text, VOCAB) and result["count"] == tokenizer.count_tokens(
        text
    )
    assert "".join(result["token_strs"]) == text and result["max_model_len"] == 4096
    assert _post(sim_server, "/detokenize", {"tokens": result["tokens"]})["prompt"] == text
    chat = _post(sim_server, "/tokenize", {"messages": [{"role": "user", "content": text}]})
    assert chat["count"] == len(tokenizer.encode_chat([("user", text)]))


def test_version_ping_openapi_and_docs(sim_server: SimServer) -> None:
    status, body = sim_server.get("/version")
    assert status == 200 and json.loads(body)["version"].startswith("0.33")
    assert sim_server.get("/ping")[0] == 200
    status, body = sim_server.get("/openapi.json")
    document = json.loads(body)
    assert status == 200 and document["openapi"].startswith("3.1")
    assert {"/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize", "/v1/models"} <= set(
        document["paths"]
    )
    status, page = sim_server.get("/docs")
    assert status == 200 and b"/v1/chat/completions" in page and b"<script" not in page
