"""The simulator's server under bad input, abandoned clients, huge prompts and bad start-up flags,
through real HTTP against a ``chunkpilot sim serve`` process."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from chunkpilot.devcluster.ports import LOOPBACK, free_port

SimServer = Any  # the conftest's running server


def request(
    server: SimServer,
    path: str,
    body: bytes | None,
    content_type: str | None = "application/json",
    method: str = "POST",
    timeout: float = 30,
) -> tuple[int, dict[str, str], bytes]:
    """``(status, headers, body)`` of one plain HTTP request."""
    connection = http.client.HTTPConnection(server.host, server.port, timeout=timeout)
    headers = {"Content-Type": content_type} if content_type else {}
    try:
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def _error(body: bytes) -> dict[str, Any]:
    error: dict[str, Any] = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


DEEP = 100_000
#: JSON bodies for /v1/completions that must be a 400 naming the field (the key) they get wrong.
BAD_COMPLETION_FIELDS: dict[str, list[bytes]] = {
    "prompt": [
        b'{"prompt": "", "max_tokens": 2}', b'{"prompt": [""]}', b'{"prompt": [-1]}',
        b'{"prompt": [1000000000000]}', b'{"prompt": [1180591620717411303424]}',
        b'{"prompt": [[1, 2], [-5]]}',
    ],
    "temperature": [b'{"prompt": "x", "temperature": -5}', b'{"prompt": "x", "temperature": NaN}'],
    "top_p": [b'{"prompt": "x", "top_p": 7}', b'{"prompt": "x", "top_p": 0}'],
    "stop": [b'{"prompt": "x", "stop": 5}', b'{"prompt": "x", "stop": [{}]}'],
    "stop_token_ids": [b'{"prompt": "x", "stop_token_ids": ["a"]}'],
}  # fmt: skip
BAD_INPUT: list[tuple[str, str, bytes, int, str | None]] = [
    # (path, content type, body, status, offending field)
    ("/v1/completions", "application/json; charset=bogus", b'{"prompt": "x"}', 415, "Content-Type"),
    ("/v1/completions", "application/json", b"[" * DEEP + b"]" * DEEP, 400, None),
    ("/v1/completions", "application/json", b'{"prompt": ' + b"[" * DEEP + b"]" * DEEP + b"}", 400, None),
    ("/v1/completions", "application/json", b'{"prompt": "\\ud800x"}', 400, "prompt"),
    ("/v1/chat/completions", "application/json",
     b'{"messages": [{"role": "user", "content": "\\ud800x"}]}', 400, "messages[0].content"),
    ("/v1/chat/completions", "application/json",
     b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udfff"}]}]}', 400,
     "messages[0].content"),
    *[("/v1/completions", "application/json", body, 400, field)
      for field, bodies in BAD_COMPLETION_FIELDS.items() for body in bodies],
    ("/v1/completions", "text/plain", b'{"prompt": "x"}', 415, "Content-Type"),
    ("/v1/completions", None, b'{"prompt": "x"}', 415, "Content-Type"),
    ("/v1/completions", "application/json",
     b'{"prompt": "x", "stream_options": {"include_usage": true}}', 400, "stream_options"),
    ("/v1/completions", "application/json", b'{"prompt": "x", "logprobs": 21}', 400, "logprobs"),
    ("/v1/completions", "application/json", b'{"prompt": "x", "n": 1000}', 400, "n"),
    ("/v1/chat/completions", "application/json",
     b'{"messages": [{"role": "user", "content": "x"}], "top_logprobs": 3}', 400, "top_logprobs"),
    ("/tokenize", "application/json", b'{"prompt": 5}', 400, "prompt"),
    ("/detokenize", "application/json", b'{"tokens": [-1]}', 400, "tokens"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "content_type", "body", "status", "param"), BAD_INPUT)
def test_bad_input_is_a_4xx_naming_the_field(
    sim_server: SimServer, path: str, content_type: str | None, body: bytes, status: int, param: str | None
) -> None:
    got, _, payload = request(sim_server, path, body, content_type)
    assert got == status, payload[:300]
    error = _error(payload)
    assert error["code"] == status and error["param"] == param
    assert error["type"] == {400: "BadRequestError", 415: "UnsupportedMediaType"}[status]
    assert sim_server.get("/health")[0] == 200


def test_405_names_the_allowed_methods_and_413_is_typed(sim_server: SimServer) -> None:
    status, headers, payload = request(sim_server, "/v1/completions", None, None, method="GET")
    assert status == 405 and headers["Allow"] == "POST"
    assert _error(payload)["type"] == "MethodNotAllowed"
    status, _, payload = request(sim_server, "/v1/completions", b'{"prompt": "' + b"a" * (65 * 2**20) + b'"}')
    assert status == 413
    assert _error(payload)["type"] == "RequestEntityTooLarge"


def _health_latencies(server: SimServer, stop: threading.Event, out: list[float]) -> None:
    while not stop.is_set():
        started = time.monotonic()
        status, _, _ = request(server, "/health", None, None, method="GET", timeout=30)
        assert status == 200
        out.append(time.monotonic() - started)
        time.sleep(0.05)


def test_health_answers_while_a_60_mb_prompt_is_refused(sim_server: SimServer) -> None:
    body = json.dumps({"prompt": "hello world " * 5_000_000, "max_tokens": 4}).encode()
    assert len(body) > 60_000_000
    latencies: list[float] = []
    stop = threading.Event()
    prober = threading.Thread(target=_health_latencies, args=(sim_server, stop, latencies))
    prober.start()
    try:
        time.sleep(0.2)
        started = time.monotonic()
        status, _, payload = request(sim_server, "/v1/completions", body)
        refused_after = time.monotonic() - started
    finally:
        stop.set()
        prober.join()
    assert status == 400 and "maximum context length" in _error(payload)["message"]
    print(f"\n60 MB prompt refused after {refused_after:.2f} s; /health max {max(latencies):.3f} s "
          f"over {len(latencies)} probes")  # fmt: skip
    assert latencies and max(latencies) < 1.0  # the liveness bound of the issue, not a speed figure


def _metrics(server: SimServer) -> dict[str, Any]:
    status, body = server.get("/metrics")
    assert status == 200
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def _gauge(families: dict[str, Any], name: str) -> float:
    return float(families[name].samples[0].value)


def _successes(families: dict[str, Any]) -> dict[str, float]:
    return {
        s.labels["finished_reason"]: s.value
        for s in families["vllm:request_success"].samples
        if s.name == "vllm:request_success_total"
    }


def test_abandoned_non_streaming_requests_are_aborted(sim_server: SimServer) -> None:
    before = _successes(_metrics(sim_server))
    body = json.dumps({"prompt": "abandon me " * 20, "max_tokens": 3000, "ignore_eos": True}).encode()
    clients = []
    for _ in range(10):
        client = socket.create_connection((sim_server.host, sim_server.port))
        head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()  # fmt: skip
        client.sendall(head + body)
        clients.append(client)
    deadline = time.monotonic() + 30
    while _gauge(_metrics(sim_server), "vllm:num_requests_running") < 10:
        assert time.monotonic() < deadline, "the 10 requests never ran"
        time.sleep(0.05)
    for client in clients:
        client.close()
    closed = time.monotonic()
    while _gauge(_metrics(sim_server), "vllm:num_requests_running") > 0:
        assert time.monotonic() - closed < 5, "abandoned requests still running after 5 s"
        time.sleep(0.05)
    print(f"\nnum_requests_running back to 0 {time.monotonic() - closed:.3f} s after the clients left")
    after = _successes(_metrics(sim_server))
    assert after["abort"] - before.get("abort", 0) == 10
    assert after["length"] == before["length"] and after["stop"] == before["stop"]


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "chunkpilot.cli", "sim", "serve", "llama-3.1-8b", "--max-model-len", "4096"]
    return subprocess.run([*argv, *args], capture_output=True, text=True, timeout=120, check=False)


def test_port_in_use_is_one_line_and_exit_2() -> None:
    with socket.socket() as taken:
        taken.bind((LOOPBACK, 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _serve("--host", LOOPBACK, "--port", str(port))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"cannot listen on {LOOPBACK}:{port}" in lines[0]
    assert "address already in use" in lines[0] and "Traceback" not in result.stderr


def test_unresolvable_host_is_one_line_and_exit_2() -> None:
    result = _serve("--host", "no-such-host.invalid", "--port", str(free_port()))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "chunkpilot sim serve: error: cannot listen on no-such-host"
    )


def test_misspelt_flag_shows_sim_serve_usage(tmp_path: Path) -> None:
    result = _serve("--max-num-seq", "4")
    assert result.returncode == 2
    assert result.stderr.startswith("usage: chunkpilot sim serve ")
    assert "chunkpilot sim serve: error: unrecognized arguments: --max-num-seq 4" in result.stderr
