"""Prefill/decode disaggregation online: two real ``sim serve --kv-transfer-config`` processes driven
over HTTP with the two-step protocol vllm-router's ``--vllm-pd-disaggregation`` mode uses (and, in the
slow test, the router itself in front of them)."""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chunkpilot.engine.sim.disagg import Topology, simulate_disaggregated
from chunkpilot.engine.sim.flags import add_flags_for, config_for, kv_transfer_from_args
from chunkpilot.engine.sim.workload import RequestSpec, Workload

from chunkpilot.cli import main
from chunkpilot.devcluster.ports import LOOPBACK, free_port
from chunkpilot.devcluster.processes import terminate_group
from chunkpilot.testing.simserver import run_sim_server

SimServer = Any  # the conftest's running server
KV_CONFIG = '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'
ENGINE = ("llama-3.1-8b", "--served-model-name", "llama-8b", "--max-model-len", "4096")
PROMPT = "Summarise the following text. " * 40
#: What the router adds to the prefill request (``build_prefill_kv_transfer_params``, NIXL).
PREFILL_PARAMS = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


def _post(url: str, body: dict[str, Any], timeout: float = 30.0) -> tuple[int, Any]:
    data = json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
            status = response.status
    except urllib.error.HTTPError as error:
        raw, status = error.read(), error.code
    text = raw.decode()
    if text.startswith("data:"):
        events = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
        return status, [json.loads(e) for e in events if e != "[DONE]"]
    return status, json.loads(text)


def _until(check: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout:g} s: {what}")
        time.sleep(0.05)


def _prefill_body(**extra: Any) -> dict[str, Any]:
    return {"model": "llama-8b", "prompt": PROMPT, "max_tokens": 1, "stream": False,
            "kv_transfer_params": dict(PREFILL_PARAMS), **extra}  # fmt: skip


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SimServer, SimServer]]:
    """A prefill and a decode engine, both ``kv_both``; the link is 2 GB/s + 5 ms."""
    logs = tmp_path_factory.mktemp("sim-pd")
    kv = ("--kv-transfer-config", KV_CONFIG, "--kv-bandwidth-gbps", "2", "--kv-latency-ms", "5")
    with (
        run_sim_server(logs, *ENGINE, *kv, time_scale=10.0) as prefill,
        run_sim_server(logs, *ENGINE, *kv, time_scale=10.0) as decode,
    ):
        yield prefill, decode


def _prefill(prefill: SimServer) -> dict[str, Any]:
    status, body = _post(f"{prefill.url}/v1/completions", _prefill_body())
    assert status == 200, body
    params: dict[str, Any] = body["kv_transfer_params"]
    return params


def test_two_step_protocol_moves_the_kv_and_counts_tokens_per_role(
    pair: tuple[SimServer, SimServer],
) -> None:
    prefill, decode = pair
    before_p, before_d = prefill.totals(), decode.totals()
    status, first = _post(f"{prefill.url}/v1/completions", _prefill_body())
    assert status == 200
    assert first["usage"]["completion_tokens"] == 1 and first["choices"][0]["finish_reason"] == "length"
    prompt_tokens = first["usage"]["prompt_tokens"]
    params = first["kv_transfer_params"]
    assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
    assert (params["remote_host"], params["remote_port"]) == (prefill.host, prefill.port)
    assert len(params["remote_block_ids"]) == -(-prompt_tokens // 16) and params["tp_size"] == 1
    assert isinstance(params["remote_engine_id"], str) and isinstance(params["remote_request_id"], str)
    held = prefill.totals()
    assert held["vllm:kv_cache_usage_perc"] > 0  # finished, and still holding the prompt's blocks
    assert held["vllm:num_requests_running"] == 0

    # The decode request is the client's request plus the prefill engine's kv_transfer_params.
    status, second = _post(
        f"{decode.url}/v1/completions",
        {
            "model": "llama-8b",
            "prompt": PROMPT,
            "max_tokens": 12,
            "ignore_eos": True,
            "kv_transfer_params": params,
        },
    )
    assert status == 200, second
    assert second["usage"] == {"prompt_tokens": prompt_tokens, "completion_tokens": 12,
                               "total_tokens": prompt_tokens + 12}  # fmt: skip
    assert second["kv_transfer_params"] is None
    _until(lambda: prefill.totals()["vllm:kv_cache_usage_perc"] == 0, "the prefill engine freed the KV")

    p = {k: v - before_p.get(k, 0.0) for k, v in prefill.totals().items()}
    d = {k: v - before_d.get(k, 0.0) for k, v in decode.totals().items()}
    assert p["vllm:prompt_tokens_total"] == prompt_tokens and p["vllm:generation_tokens_total"] == 1
    assert p["vllm:prompt_tokens_by_source_total:local_compute"] == prompt_tokens
    assert d["vllm:prompt_tokens_total"] == prompt_tokens and d["vllm:generation_tokens_total"] == 12
    assert d["vllm:prompt_tokens_by_source_total:external_kv_transfer"] == prompt_tokens
    assert d["vllm:prompt_tokens_by_source_total:local_compute"] == 1  # the recomputed last token
    assert d["vllm:prompt_tokens_recomputed_total"] == 1
    assert d["vllm:external_prefix_cache_queries_total"] == d["vllm:external_prefix_cache_hits_total"]
    assert d["vllm:external_prefix_cache_hits_total"] == prompt_tokens
    assert p["vllm:external_prefix_cache_queries_total"] == prompt_tokens
    assert p["vllm:external_prefix_cache_hits_total"] == 0
    assert d["vllm:nixl_xfer_time_seconds_count"] == 1
    assert d["vllm:nixl_bytes_transferred_sum"] == prompt_tokens * 131072  # Llama-3.1-8B, bf16
    # The decode engine's TTFT includes the transfer: 2 GB/s + 5 ms for the prompt's KV.
    transfer = prompt_tokens * 131072 / 2e9 + 0.005
    assert d["vllm:time_to_first_token_seconds_sum"] >= transfer
    assert d["vllm:request_success_total"] == p["vllm:request_success_total"] == 1


def test_streaming_chat_through_both_roles(pair: tuple[SimServer, SimServer]) -> None:
    prefill, decode = pair
    messages = [{"role": "user", "content": PROMPT}]
    status, first = _post(
        f"{prefill.url}/v1/chat/completions",
        {
            "model": "llama-8b",
            "messages": messages,
            "max_tokens": 1,
            "max_completion_tokens": 1,
            "stream": False,
            "kv_transfer_params": dict(PREFILL_PARAMS),
        },
    )
    assert status == 200, first
    status, chunks = _post(
        f"{decode.url}/v1/chat/completions",
        {
            "model": "llama-8b",
            "messages": messages,
            "max_tokens": 8,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
            "kv_transfer_params": first["kv_transfer_params"],
        },
    )
    assert status == 200
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text and chunks[-1]["usage"]["completion_tokens"] == 8
    assert chunks[-1]["usage"]["prompt_tokens"] == first["usage"]["prompt_tokens"]


def test_kv_is_read_once(pair: tuple[SimServer, SimServer]) -> None:
    prefill, decode = pair
    params = _prefill(prefill)
    body = {"model": "llama-8b", "prompt": PROMPT, "max_tokens": 2, "kv_transfer_params": params}
    assert _post(f"{decode.url}/v1/completions", body)[0] == 200
    _until(lambda: prefill.totals()["vllm:kv_cache_usage_perc"] == 0, "the prefill engine freed the KV")
    status, error = _post(f"{decode.url}/v1/completions", body)
    assert status == 400 and error["error"]["param"] == "kv_transfer_params"
    assert "holds no KV for remote_request_id" in error["error"]["message"]


def _with(params: dict[str, Any], **changes: Any) -> dict[str, Any]:
    out = {**params, **changes}
    return {k: v for k, v in out.items() if v != "DROP"}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"do_remote_prefill": "yes"}, "do_remote_prefill must be true or false"),
        ({"do_remote_decode": True}, "cannot both be true"),
        ({"remote_block_ids": "DROP"}, "needs remote_block_ids"),
        ({"remote_block_ids": [1, -2]}, "list of non-negative integers"),
        ({"remote_port": 70000}, "remote_port must be an integer"),
        ({"remote_host": ""}, "remote_host must be a non-empty string"),
        # Nothing of the client's choosing goes into the decode engine's URL but a host and a
        # quoted id: no metadata endpoint, no smuggled path or credentials, no other route.
        ({"remote_host": "169.254.169.254"}, "link-local, multicast or unspecified"),
        ({"remote_host": "attacker.example/steal?x="}, "must be a host name or an IP address"),
        ({"remote_host": "user@10.0.0.1"}, "must be a host name or an IP address"),
        ({"remote_request_id": "../../v1/models"}, "holds no KV"),
        ({"tp_size": 0}, "tp_size must be a positive integer"),
        ({"remote_block_ids": [1]}, "do not match this prompt"),
        ({"remote_engine_id": "another-engine"}, "holds no KV"),
        ({"remote_request_id": "unknown"}, "holds no KV"),
    ],
)
def test_bad_kv_transfer_params_are_400s(
    pair: tuple[SimServer, SimServer], change: dict[str, Any], message: str
) -> None:
    prefill, decode = pair
    params = _prefill(prefill)
    body = {
        "model": "llama-8b",
        "prompt": PROMPT,
        "max_tokens": 2,
        "kv_transfer_params": _with(params, **change),
    }
    status, error = _post(f"{decode.url}/v1/completions", body)
    assert status == 400, error
    assert message in error["error"]["message"] and error["error"]["param"] == "kv_transfer_params"
    # the prefill engine still holds the KV; a correct decode request reads and frees it
    assert _post(f"{decode.url}/v1/completions", {**body, "kv_transfer_params": params})[0] == 200


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": PROMPT, "kv_transfer_params": "remote"},
        {"prompt": [PROMPT, PROMPT], "kv_transfer_params": PREFILL_PARAMS},
        {"prompt": PROMPT, "n": 2, "kv_transfer_params": PREFILL_PARAMS},
    ],
)
def test_unusable_kv_requests_are_400s(pair: tuple[SimServer, SimServer], body: dict[str, Any]) -> None:
    status, error = _post(f"{pair[0].url}/v1/completions", {"model": "llama-8b", "max_tokens": 1, **body})
    assert status == 400 and error["error"]["param"] == "kv_transfer_params"


def test_an_unreachable_prefill_engine_is_a_clear_502(pair: tuple[SimServer, SimServer]) -> None:
    prefill, decode = pair
    held = _prefill(prefill)
    body = {"model": "llama-8b", "prompt": PROMPT, "max_tokens": 2}
    started = time.monotonic()
    status, error = _post(
        f"{decode.url}/v1/completions", {**body, "kv_transfer_params": _with(held, remote_port=free_port())}
    )
    assert status == 502 and error["error"]["type"] == "BadGatewayError"
    assert "is unreachable for the remote prefill" in error["error"]["message"]
    assert time.monotonic() - started < 20  # nothing hangs
    assert decode.totals()["vllm:nixl_num_failed_transfers"] >= 1
    assert decode.get("/health")[0] == 200
    assert _post(f"{decode.url}/v1/completions", {**body, "kv_transfer_params": held})[0] == 200


def test_without_a_kv_connector_kv_transfer_params_are_ignored(fast_sim_server: SimServer) -> None:
    status, body = _post(f"{fast_sim_server.url}/v1/completions", _prefill_body(prompt="hello"))
    assert status == 200 and "kv_transfer_params" not in body
    assert "vllm:prompt_tokens_by_source_total" not in fast_sim_server.get("/metrics")[1].decode()


@pytest.mark.slow
def test_unread_kv_is_freed_after_the_abort_timeout(tmp_path: Path, sim_server_runner: Any) -> None:
    env = {"VLLM_NIXL_ABORT_REQUEST_TIMEOUT": "20"}  # simulated seconds: 0.2 s at 100x
    args = (*ENGINE, "--kv-transfer-config", KV_CONFIG)
    with sim_server_runner(tmp_path, *args, time_scale=100.0, env=env) as prefill:
        params = _prefill(prefill)
        assert params["remote_port"] == prefill.port
        _until(lambda: prefill.totals()["vllm:kv_cache_usage_perc"] == 0, "the abort timeout freed the KV")
        status, _ = prefill.get(f"/chunkpilot/v1/kv_transfer/{params['remote_request_id']}")
        assert status == 404


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ('{"kv_connector":"NoSuchConnector","kv_role":"kv_both"}', "unknown kv_connector"),
        ('{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}', "is not simulated"),
        ('{"kv_connector":"NixlConnector","kv_role":"both"}', "kv_role must be one of"),
        ('{"kv_connector":"NixlConnector","kv_role":"kv_both","colour":1}', "unknown field"),
        ('{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_port":"x"}', "kv_port has the wrong type"),
        ("not json", "not valid JSON"),
    ],
)
def test_a_bad_kv_transfer_config_is_a_cli_error(
    capsys: pytest.CaptureFixture[str], config: str, message: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["sim", "serve", "llama-3.1-8b", "--kv-transfer-config", config])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "argument --kv-transfer-config" in err and message in err


# ---- the real router ------------------------------------------------------------------------------------
@contextlib.contextmanager
def _router(log: Path, prefill: SimServer, decode: SimServer) -> Iterator[str]:
    sibling = Path(sys.executable).with_name("vllm-router")  # the test extra installs it beside python
    binary = str(sibling) if sibling.exists() else shutil.which("vllm-router") or "vllm-router"
    port = free_port()
    argv = [binary, "--vllm-pd-disaggregation", "--host", LOOPBACK, "--port", str(port),
            "--prefill", prefill.url, "--decode", decode.url, "--kv-connector", "nixl"]  # fmt: skip
    with log.open("wb") as sink:
        process = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://{LOOPBACK}:{port}"
    try:

        def up() -> bool:
            assert process.poll() is None, log.read_text()[-2000:]
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                return bool(response.status == 200)
            return False

        _until(up, "vllm-router healthy", timeout=60)
        yield url
    finally:
        terminate_group(process.pid, popen=process)


@pytest.mark.slow
def test_vllm_router_drives_both_roles(pair: tuple[SimServer, SimServer], tmp_path: Path) -> None:
    prefill, decode = pair
    before_p, before_d = prefill.totals(), decode.totals()
    with _router(tmp_path / "router.log", prefill, decode) as router:
        status, chunks = _post(
            f"{router}/v1/completions",
            {
                "model": "llama-8b",
                "prompt": PROMPT,
                "max_tokens": 6,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
        assert status == 200
        usage = chunks[-1]["usage"]
        assert usage["completion_tokens"] == 6
        status, body = _post(
            f"{router}/v1/chat/completions",
            {
                "model": "llama-8b",
                "messages": [{"role": "user", "content": PROMPT}],
                "max_tokens": 4,
                "ignore_eos": True,
            },
        )
        assert status == 200 and body["usage"]["completion_tokens"] == 4
    _until(lambda: prefill.totals()["vllm:kv_cache_usage_perc"] == 0, "the prefill engine freed the KV")
    p = {k: v - before_p.get(k, 0.0) for k, v in prefill.totals().items()}
    d = {k: v - before_d.get(k, 0.0) for k, v in decode.totals().items()}
    assert p["vllm:generation_tokens_total"] == 2 and d["vllm:generation_tokens_total"] == 10
    assert d["vllm:nixl_xfer_time_seconds_count"] == 2
    prompts = usage["prompt_tokens"] + body["usage"]["prompt_tokens"]
    assert p["vllm:prompt_tokens_total"] == d["vllm:prompt_tokens_total"] == prompts
    assert d["vllm:prompt_tokens_by_source_total:external_kv_transfer"] == prompts


# ---- the served decode role against the offline simulation ------------------------------------------------
def _histogram_sums(metrics: dict[str, float], before: dict[str, float], name: str) -> tuple[float, float]:
    """A histogram's sum and count since ``before``."""
    total, count = (metrics[f"{name}_{k}"] - before.get(f"{name}_{k}", 0.0) for k in ("sum", "count"))
    return total, count


def test_served_roles_keep_the_offline_simulations_clock(pair: tuple[SimServer, SimServer]) -> None:
    """Requests served one at a time through both roles over HTTP see exactly the latencies the offline
    disaggregated simulation gives the same requests: the event loop's lag between two steps (handlers,
    streaming, a busy CPU; multiplied by the time scale) is in none of them."""
    prefill, decode = pair
    before_p, before_d = prefill.totals(), decode.totals()
    lengths = [(40, 24), (150, 16), (400, 20)]
    prompts: list[int] = []
    for i, (words, max_tokens) in enumerate(lengths):
        prompt = " ".join(f"clock{i}x{w}" for w in range(words))  # no prefix shared with other prompts
        status, first = _post(f"{prefill.url}/v1/completions", {**_prefill_body(), "prompt": prompt})
        assert status == 200, first
        body = {"model": "llama-8b", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
                "stream": True, "stream_options": {"include_usage": True},
                "kv_transfer_params": first["kv_transfer_params"]}  # fmt: skip
        status, chunks = _post(f"{decode.url}/v1/completions", body)
        assert status == 200 and chunks[-1]["usage"]["completion_tokens"] == max_tokens, chunks
        prompts.append(first["usage"]["prompt_tokens"])
    p, d = prefill.totals(), decode.totals()

    # The same requests offline, far apart (each alone in both pools, as served one at a time).
    parser = argparse.ArgumentParser()
    add_flags_for(parser, "vllm")
    args = parser.parse_args([*ENGINE[1:], "--kv-bandwidth-gbps", "2", "--kv-latency-ms", "5"])
    topology = Topology.of("1P1D", config_for(ENGINE[0], args), kv_transfer=kv_transfer_from_args(args))
    arrivals = [
        RequestSpec(1000.0 * i, n, m) for i, (n, (_, m)) in enumerate(zip(prompts, lengths, strict=True))
    ]
    workload = Workload("one at a time", tuple(arrivals))
    offline = simulate_disaggregated(topology, workload, keep_records=True)
    assert offline.prefill_ttft_ms is not None and offline.records
    tokens = sum(m - 1 for _, m in lengths)
    itl_sum, itl_count = _histogram_sums(d, before_d, "vllm:inter_token_latency_seconds")
    assert itl_count == tokens
    assert itl_sum == pytest.approx(offline.itl_ms.mean * tokens / 1e3, rel=1e-9)
    # The prefill engine's TTFT is its step; the decode engine's E2E the transfer and every decode step.
    prefill_ttft = offline.prefill_ttft_ms.mean * len(lengths) / 1e3
    ttft_sum, _ = _histogram_sums(p, before_p, "vllm:time_to_first_token_seconds")
    assert ttft_sum == pytest.approx(prefill_ttft, rel=1e-9)
    e2e_sum, e2e_count = _histogram_sums(d, before_d, "vllm:e2e_request_latency_seconds")
    assert e2e_count == len(lengths)
    assert e2e_sum == pytest.approx(sum(r.e2e_s for r in offline.records) - prefill_ttft, rel=1e-9)
