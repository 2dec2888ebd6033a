"""``sim serve --engine sglang|trtllm``: each engine's metric names, labels, buckets and paths."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from chunkpilot.engine import metrics_names as names
from prometheus_client.parser import text_string_to_metric_families

from chunkpilot.testing.simserver import run_sim_server

SimServer = Any


def _generate(server: SimServer, model: str, requests: int = 3) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)
    for _ in range(requests):
        stream = client.completions.create(
            model=model,
            prompt="chunked prefill " * 40,
            max_tokens=16,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        assert sum(1 for _ in stream) >= 1


def _families(text: str) -> dict[str, Any]:
    return {family.name: family for family in text_string_to_metric_families(text)}


def _scrape(server: SimServer, path: str) -> tuple[str, dict[str, Any]]:
    """The exposition text the server answers 200 with at ``path``, and its families by name."""
    status, body = server.get(path)
    assert status == 200
    text = body.decode()
    return text, _families(text)


@pytest.fixture(scope="module")
def sglang_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimServer]:
    args = ("--engine", "sglang", "--model-path", "llama-3.1-8b", "--served-model-name", "qwen")
    args += ("--context-length", "4096", "--chunked-prefill-size", "1024", "--enable-metrics")
    with run_sim_server(tmp_path_factory.mktemp("sglang"), *args, time_scale=50.0) as server:
        yield server


@pytest.fixture(scope="module")
def trtllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimServer]:
    folder = tmp_path_factory.mktemp("trtllm")
    options = folder / "llm-api.yaml"
    options.write_text(
        "enable_chunked_prefill: true\nreturn_perf_metrics: true\nenable_iter_perf_stats: true\n"
    )
    args = ("serve", "llama-3.1-8b", "--max_seq_len", "4096", "--max_num_tokens", "1024")
    args += ("--extra_llm_api_options", str(options))
    with run_sim_server(folder, *args, time_scale=50.0) as server:
        yield server


def test_sglang_serves_its_own_families_labels_and_buckets(sglang_server: SimServer) -> None:
    _generate(sglang_server, "qwen")
    text, families = _scrape(sglang_server, "/metrics")
    assert not [name for name in families if name.startswith("vllm:")]
    table = names.SGLANG_METRICS
    for family in table.families.values():
        base = family.name.removesuffix("_total")
        assert base in families, family.name
    ttft = families["sglang:time_to_first_token_seconds"]
    buckets = [s.labels["le"] for s in ttft.samples if s.name.endswith("_bucket")]
    assert [float(b) for b in buckets[:-1]] == list(names.SGLANG_TTFT_BUCKETS) and buckets[-1] == "+Inf"
    count = next(s for s in ttft.samples if s.name.endswith("_count"))
    assert count.value == 3
    assert count.labels == {"model_name": "qwen", "engine_type": "unified", "is_streaming": "true"}
    running = families["sglang:num_running_reqs"].samples[0]
    assert {"tp_rank", "pp_rank", "moe_ep_rank"} <= set(running.labels)
    itl = families["sglang:inter_token_latency_seconds"]
    assert next(s for s in itl.samples if s.name.endswith("_count")).value == 3 * 15
    assert next(s for s in families["sglang:num_requests"].samples).value == 3
    # The tuner's series and the step telemetry are there.
    for series in (table.tuner.itl_histogram + "_bucket", table.tuner.generation_tokens, names.STEP_DURATION):
        assert series in text


def test_sglang_without_enable_metrics_has_no_metrics_route(tmp_path: Path, sim_server_runner: Any) -> None:
    with sim_server_runner(tmp_path, "--model-path", "llama-3.1-8b", "--context-length", "2048") as server:
        assert server.get("/health")[0] == 200
        assert server.get("/metrics")[0] == 404


def test_trtllm_serves_prometheus_histograms_and_iteration_stats(trtllm_server: SimServer) -> None:
    _generate(trtllm_server, "llama-3.1-8b")
    _, families = _scrape(trtllm_server, "/prometheus/metrics")
    assert not [name for name in families if name.startswith(("vllm:", "sglang:"))]
    table = names.TRTLLM_METRICS
    for family in table.families.values():
        assert family.name.removesuffix("_total") in families, family.name
    tpot = families["trtllm_time_per_output_token_seconds"]
    count = next(s for s in tpot.samples if s.name.endswith("_count"))
    assert count.value == 3 and count.labels == {"model_name": "llama-3.1-8b", "engine_type": "trtllm"}
    assert "trtllm_inter_token_latency_seconds" not in families  # the engine has none
    assert table.tuner.generation_tokens.removesuffix("_sum") in families
    success = families["trtllm_request_success"]
    assert sum(s.value for s in success.samples) == 3
    status, body = trtllm_server.get("/metrics")
    stats = json.loads(body)
    assert status == 200 and stats and {"iter", "kvCacheStats", "inflightBatchingStats"} <= set(stats[-1])
    assert stats[-1]["maxNumTokensRuntime"] == 1024
    assert json.loads(trtllm_server.get("/metrics")[1]) == [], "iteration statistics are read once"


def test_trtllm_serves_the_per_token_itl_the_tuner_reads_instead_of_tpot(trtllm_server: SimServer) -> None:
    """TensorRT-LLM has no ITL histogram; the simulator exports Chunkpilot's per-token one, one
    observation per gap between streamed tokens, beside the per-request TPOT one."""
    from chunkpilot.tuner.measure import Selector, fine_latency_queries

    from chunkpilot.api import Track

    def counts() -> tuple[float, float]:
        families = _families(trtllm_server.get("/prometheus/metrics")[1].decode())
        fine, tpot = (
            families[names.FINE_INTER_TOKEN_LATENCY],
            families["trtllm_time_per_output_token_seconds"],
        )
        return tuple(  # type: ignore[return-value]
            next(s.value for s in f.samples if s.name.endswith("_count")) for f in (fine, tpot)
        )

    before = counts()
    _generate(trtllm_server, "llama-3.1-8b", requests=2)
    after = counts()
    assert (after[0] - before[0], after[1] - before[1]) == (2 * 15, 2)  # 16 tokens: 15 gaps each
    queries = fine_latency_queries(Selector("chat", "default", Track.CANARY), "5m", 0.99, 0.95, "trtllm")
    assert queries is not None and f"{names.FINE_INTER_TOKEN_LATENCY}_bucket{{" in queries.itl


def test_trtllm_before_1_2_names_its_families_without_a_prefix() -> None:
    old = names.trtllm_metrics("1.0.0")
    assert {f.name for f in old.families.values()} >= {"time_to_first_token_seconds", "request_success_total"}
    assert all(not f.name.startswith("trtllm_") for f in old.families.values())
    assert names.trtllm_metrics("1.2.1").tuner.ttft_histogram == "trtllm_time_to_first_token_seconds"


def test_every_engine_has_a_tuner_table() -> None:
    for kind in ("vllm", "sim", "sglang", "trtllm"):
        tuner = names.tuner_metrics(kind)
        assert tuner.itl_histogram and tuner.ttft_histogram and tuner.request_success
    assert names.tuner_metrics("sim") == names.tuner_metrics("vllm") == names.VLLM_TUNER
    with pytest.raises(ValueError, match="unknown engine"):
        names.engine_metrics("tgi")


@pytest.mark.parametrize("kind", ["vllm", "sglang", "trtllm"])
def test_the_tuner_queries_the_series_this_server_exports(kind: str) -> None:
    from chunkpilot.tuner.measure import Selector, track_queries

    from chunkpilot.api import Track

    queries = track_queries(Selector("chat", "default", Track.CANARY), "5m", 0.99, 0.95, kind)
    table = names.engine_metrics(kind)
    assert f"rate({table.tuner.itl_histogram}_bucket{{" in queries.itl
    assert f"increase({table.tuner.ttft_histogram}_count{{" in queries.ttft_samples
    assert f"rate({table.tuner.request_success}{{" in queries.request_rate
    exported = {f.name for f in table.families.values()} | {names.FINE_REQUEST_GENERATION_TOKENS + "_sum"}
    assert {table.tuner.itl_histogram, table.tuner.ttft_histogram, table.tuner.generation_tokens} <= exported
