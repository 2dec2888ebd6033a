"""The plugin's step telemetry as pure logic: batch composition and the exported series (no vLLM)."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from chunkpilot.engine import metrics_names as names
from chunkpilot.engine.vllm_plugin.telemetry import (
    MULTIPROC_ENV,
    StepTelemetry,
    step_shape,
    telemetry_problem,
)
from chunkpilot.tuner.twin.capture import parse_exposition
from prometheus_client import generate_latest


def _request(prompt: int, output: int, computed: int) -> Any:
    """A vLLM request after ``schedule()`` (``num_computed_tokens`` already advanced)."""
    return SimpleNamespace(num_prompt_tokens=prompt, num_tokens=prompt + output, num_computed_tokens=computed,
              arrival_time=time.time() - 0.5)  # fmt: skip


def _output(scheduled: dict[str, int], drafts: dict[str, list[int]] | None = None) -> Any:
    return SimpleNamespace(num_scheduled_tokens=scheduled, total_num_scheduled_tokens=sum(scheduled.values()),
              scheduled_spec_decode_tokens=drafts or {})  # fmt: skip


def test_step_shape_splits_prefill_chunks_from_decodes() -> None:
    requests = {
        "chunk": _request(1000, 0, 512),  # second chunk of 256 after 256 cached: not sampled yet
        "last": _request(300, 0, 300),  # last chunk: the prompt is complete, a token is sampled
        "decode": _request(100, 5, 105),  # one decode over 104 + 1 tokens
        "spec": _request(50, 10, 62),  # decode with two draft tokens
    }
    shape = step_shape(
        _output({"chunk": 256, "last": 44, "decode": 1, "spec": 3}, {"spec": [7, 8]}), requests
    )
    assert (shape.tokens, shape.prefill_tokens, shape.decode_tokens) == (304, 300, 4)
    assert (shape.sequences, shape.decode_sequences) == (4, 2)
    assert shape.sampled_sequences == 1 + 1 + 3  # last chunk, decode, spec (1 + 2 drafts)
    assert shape.prefill_attention_pairs == 256 * 512 + 44 * 300
    assert shape.prefill_context_tokens == 512 + 300
    assert shape.decode_context_tokens == 105 + 62


def test_a_step_and_its_tokens_become_the_twin_series() -> None:
    telemetry = StepTelemetry("m", precreate_tokens=512)
    requests = {"a": _request(400, 0, 400)}
    output = _output({"a": 400})
    telemetry.scheduled(time.perf_counter(), output, requests)
    telemetry.finished(
        output,
        {
            0: SimpleNamespace(
                outputs=[SimpleNamespace(request_id="a", new_token_ids=[1], finish_reason=None)]
            )
        },
    )
    requests["a"] = _request(400, 1, 401)
    decode = _output({"a": 1})
    telemetry.scheduled(time.perf_counter(), decode, requests)
    telemetry.finished(
        decode,
        {
            0: SimpleNamespace(
                outputs=[SimpleNamespace(request_id="a", new_token_ids=[2], finish_reason="length")]
            )
        },
    )

    text = generate_latest(telemetry.registry).decode()
    scrape = parse_exposition(text)
    # Every bucket up to the budget is there from the start, at zero until a step lands in it.
    assert set(scrape.steps) == {"1", "512"}
    assert text.count(f"{names.STEP_DURATION}_count{{") == len(names.STEP_TOKEN_BUCKETS[:18])
    assert (scrape.steps["512"].steps, scrape.steps["512"].prefill_tokens) == (1, 400)
    assert scrape.steps["512"].prefill_attention_pairs == 400 * 401 / 2
    assert (scrape.steps["1"].decode_tokens, scrape.steps["1"].decode_context_tokens) == (1, 401)
    prompts = scrape.histograms[names.FINE_REQUEST_PROMPT_TOKENS]
    generations = scrape.histograms[names.FINE_REQUEST_GENERATION_TOKENS]
    assert (prompts.count, prompts.total, generations.total) == (1, 400, 2)
    fine = {s.split(" ")[0]: float(s.split(" ")[1]) for s in text.splitlines() if s.startswith("chunkpilot:")}
    ttft = fine[f'{names.FINE_TIME_TO_FIRST_TOKEN}_sum{{engine="0",model_name="m"}}']
    assert 0.5 <= ttft < 5  # the arrival was half a second ago
    assert fine[f'{names.FINE_INTER_TOKEN_LATENCY}_count{{engine="0",model_name="m"}}'] == 1
    assert fine[f'{names.TELEMETRY_SECONDS}{{engine="0",model_name="m"}}'] > 0
    assert fine[f'{names.REQUEST_TOKENS_PRODUCT}{{engine="0",model_name="m"}}'] == 400 * 2


def test_without_a_multiprocess_directory_the_telemetry_says_why(tmp_path: Path) -> None:
    assert "is not set" in (telemetry_problem({}) or "")
    assert "is not a directory" in (telemetry_problem({MULTIPROC_ENV: str(tmp_path / "missing")}) or "")
    assert telemetry_problem({MULTIPROC_ENV: str(tmp_path)}) is None
