"""The ``aiperf`` tier: NVIDIA's aiperf benchmark client, from its cached environment
(:mod:`chunkpilot.engine.sim.aiperf_env`), against ``chunkpilot sim serve`` offline
(``HF_HUB_OFFLINE=1``) with the tokenizer ``chunkpilot sim tokenizer`` exports. Its token counts
must equal the server's counters and its TTFT/ITL must agree with the server's histograms."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from chunkpilot.engine.sim import aiperf_env
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.aiperf

SimServer = Any  # the conftest's running server
MODEL = "llama-8b"
SERVER_ARGS = ("llama-3.1-8b", "--gpu", "h100", "--served-model-name", MODEL, "--max-model-len", "4096")
#: The latency comparison runs in slow motion (a simulated millisecond lasts two of wall time) and
#: compares in simulated time: the client's own overhead, which grows on a busy machine (10 ms of
#: TTFT when quiet, 20 ms beside an e2e test), then weighs half as much against the server's figures.
LATENCY_TIME_SCALE = 0.5


@pytest.fixture(scope="session")
def aiperf() -> aiperf_env.AiperfEnv:
    """The cached aiperf environment (built when missing)."""
    started = time.monotonic()
    env = aiperf_env.ensure()
    print(f"\naiperf environment ready in {time.monotonic() - started:.1f}s "
          f"(built in {env.manifest()['build_seconds']}s)")  # fmt: skip
    return env


@pytest.fixture(scope="session")
def hub_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Hugging Face hub cache holding the exported tokenizer as repository ``llama-8b``."""
    cache = tmp_path_factory.mktemp("hub")
    argv = [sys.executable, "-m", "chunkpilot.cli", "sim", "tokenizer", "--model", "llama-3.1-8b"]
    subprocess.run([*argv, "--hub-cache", str(cache), "--name", MODEL], check=True, timeout=120)
    return cache


class _Load(NamedTuple):
    """aiperf's synthetic load: prompt and output lengths as (mean, stddev) tokens, the requests, and
    how many run at once."""

    prompt: tuple[int, int]
    output: tuple[int, int]
    requests: int
    concurrency: int


def _run_aiperf(
    env: aiperf_env.AiperfEnv, server: SimServer, hub: Path, out: Path, endpoint: str, load: _Load
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``load`` on ``endpoint``: aiperf's export, then the server's metric families."""
    (prompt_mean, prompt_sd), (output_mean, output_sd) = load.prompt, load.output
    args = (
        "--endpoint-type", endpoint,
        "--synthetic-input-tokens-mean", str(prompt_mean), "--synthetic-input-tokens-stddev", str(prompt_sd),
        "--output-tokens-mean", str(output_mean), "--output-tokens-stddev", str(output_sd),
        "--request-count", str(load.requests), "--concurrency", str(load.concurrency),
    )  # fmt: skip
    argv = [
        str(env.aiperf), "profile", "--model", MODEL, "--url", server.url, "--streaming",
        "--extra-inputs", "ignore_eos:true", "--ui-type", "none", "--no-server-metrics",
        "--no-gpu-telemetry", "--random-seed", "7", "--output-artifact-dir", str(out), *args,
    ]  # fmt: skip
    offline = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub), "HF_HOME": str(out / "hf-home")}
    started = time.monotonic()
    result = subprocess.run(
        argv, env={**os.environ, **offline}, capture_output=True, text=True, timeout=170, check=False
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    print(f"\naiperf {' '.join(args)}: {time.monotonic() - started:.1f}s")
    export: dict[str, Any] = json.loads((out / "profile_export_aiperf.json").read_text())
    assert export["error_summary"] == [] or not export["error_summary"]
    return export, _server_metrics(server)


def _server_metrics(server: SimServer) -> dict[str, Any]:
    status, body = server.get("/metrics")
    assert status == 200
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def _value(families: dict[str, Any], name: str, sample: str | None = None) -> float:
    family = families[name.removesuffix("_total")]
    return sum(s.value for s in family.samples if s.name == (sample or name))


def _mean_ms(families: dict[str, Any], histogram: str) -> float:
    total = _value(families, histogram, f"{histogram}_sum")
    count = _value(families, histogram, f"{histogram}_count")
    assert count > 0
    return 1000 * total / count


def test_completions_counts_equal_and_latencies_agree(
    aiperf: aiperf_env.AiperfEnv, hub_cache: Path, sim_server_runner: Any, tmp_path: Path
) -> None:
    with sim_server_runner(tmp_path, *SERVER_ARGS, time_scale=LATENCY_TIME_SCALE) as server:
        export, families = _run_aiperf(
            aiperf, server, hub_cache, tmp_path / "completions", "completions",
            _Load(prompt=(300, 80), output=(32, 8), requests=24, concurrency=4),
        )  # fmt: skip
    requests = export["request_count"]["avg"]
    prompt, generated = (
        _value(families, "vllm:prompt_tokens_total"),
        _value(families, "vllm:generation_tokens_total"),
    )
    print(f"aiperf ISL {export['total_isl']['avg']} / OSL {export['total_osl']['avg']} tokens; "
          f"server {prompt} / {generated}")  # fmt: skip
    assert requests == 24
    assert _value(families, "vllm:request_success_total") == requests
    # aiperf counts the prompts it sent and the text it received with the exported tokenizer.
    assert export["total_isl"]["avg"] == _value(families, "vllm:prompt_tokens_total")
    assert export["total_osl"]["avg"] == _value(families, "vllm:generation_tokens_total")
    assert export["usage_prompt_tokens"]["sum"] == export["input_sequence_length"]["sum"]
    # Latencies: the client adds HTTP and parsing time on top of the engine's figures. The client
    # measures wall time; in simulated time its figures are LATENCY_TIME_SCALE as large.
    ttft_client, ttft_server = (
        export["time_to_first_token"]["avg"] * LATENCY_TIME_SCALE,
        _mean_ms(families, "vllm:time_to_first_token_seconds"),
    )
    itl_client, itl_server = (
        export["inter_token_latency"]["avg"] * LATENCY_TIME_SCALE,
        _mean_ms(families, "vllm:inter_token_latency_seconds"),
    )
    print(f"simulated TTFT aiperf {ttft_client:.2f} ms vs server {ttft_server:.2f} ms; "
          f"ITL aiperf {itl_client:.2f} ms vs server {itl_server:.2f} ms")  # fmt: skip
    assert ttft_server * 0.9 <= ttft_client <= ttft_server * 1.3 + 25
    assert itl_server * 0.85 <= itl_client <= itl_server * 1.2 + 2


def test_chat_counts_equal_the_servers_less_the_template(
    aiperf: aiperf_env.AiperfEnv, hub_cache: Path, sim_server_runner: Any, tmp_path: Path
) -> None:
    with sim_server_runner(tmp_path, *SERVER_ARGS) as server:
        export, families = _run_aiperf(
            aiperf, server, hub_cache, tmp_path / "chat", "chat",
            _Load(prompt=(120, 30), output=(16, 4), requests=10, concurrency=2),
        )  # fmt: skip
    requests = export["request_count"]["avg"]
    assert export["total_osl"]["avg"] == _value(families, "vllm:generation_tokens_total")
    # aiperf 0.13 counts the message text only; the server adds the chat template's tokens
    # (4 for the one message, 3 for the reply), as the exported chat template does.
    assert export["total_isl"]["avg"] + 7 * requests == _value(families, "vllm:prompt_tokens_total")
    assert export["usage_prompt_tokens"]["sum"] == _value(families, "vllm:prompt_tokens_total")
