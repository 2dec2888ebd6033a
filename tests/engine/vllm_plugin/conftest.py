"""Fixtures for the ``vllm`` tier: the cached vLLM CPU environment and ONE server per session.

The environment (about 6 GB) is built on first use under ``~/.cache/chunkpilot/envs``
(:mod:`chunkpilot.engine.vllm_plugin.env`). The server runs the tiny Llama model
with dummy weights, the Chunkpilot scheduler (two partial-prefill lanes, one of
them for long prompts), a step log and the live-adjustment route; it is warmed
up once and stopped at the end of the session.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from chunkpilot.engine.live_adjust import LIVE_ADJUST_TOKEN_ENV
from chunkpilot.engine.sim.scheduler import SchedulerConfig
from chunkpilot.engine.vllm_plugin import env as engine_env
from chunkpilot.engine.vllm_plugin.client import prompt_ids, stream_completion
from chunkpilot.engine.vllm_plugin.launch import SERVED_MODEL_NAME, start_server, tiny_model
from chunkpilot.engine.vllm_plugin.render import ENDPOINT_PLUGIN, GENERAL_PLUGIN, SCHEDULER_CLS
from chunkpilot.engine.vllm_plugin.telemetry import MULTIPROC_ENV
from chunkpilot.engine.vllm_plugin.testing import (
    LANES,
    LONG_LANES,
    LONG_THRESHOLD,
    MAX_MODEL_LEN,
    MAX_NUM_SEQS,
    STARTUP_BUDGET,
    TOKEN,
    EngineServer,
)


@pytest.fixture(scope="session")
def vllm_env() -> engine_env.EngineEnv:
    """The cached vLLM CPU environment with this checkout installed (built when missing)."""
    started = time.monotonic()
    env = engine_env.ensure()
    build = env.manifest().get("build_seconds")
    print(f"\nvLLM CPU environment ready in {time.monotonic() - started:.1f}s (built in {build}s)")
    return env


@pytest.fixture(scope="session")
def tiny_model_dir(vllm_env: engine_env.EngineEnv) -> Path:
    return tiny_model(vllm_env, engine_env.cache_root().parent / "models" / "tiny-llama")


async def _warm_up(url: str) -> None:
    """Exercise the shapes the tests use (new shapes are several times slower the first time)."""
    async with aiohttp.ClientSession() as session:
        await stream_completion(session, url, SERVED_MODEL_NAME, prompt_ids(32), 8)
        await asyncio.gather(
            stream_completion(session, url, SERVED_MODEL_NAME, prompt_ids(6000, 11), 2),
            *(
                stream_completion(session, url, SERVED_MODEL_NAME, prompt_ids(300, i), 8, 0.2)
                for i in range(3)
            ),
        )


@pytest.fixture(scope="session")
def startup_scheduler() -> SchedulerConfig:
    """The scheduler settings :func:`vllm_server` starts its engine with."""
    return SchedulerConfig(
        max_num_batched_tokens=STARTUP_BUDGET,
        max_num_seqs=MAX_NUM_SEQS,
        max_model_len=MAX_MODEL_LEN,
        enable_chunked_prefill=True,
        long_prefill_token_threshold=LONG_THRESHOLD,
        max_num_partial_prefills=LANES,
        max_long_partial_prefills=LONG_LANES,
        enable_prefix_caching=False,
    )


@pytest.fixture(scope="session")
def vllm_server(
    vllm_env: engine_env.EngineEnv, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineServer]:
    """One warmed-up server with the Chunkpilot scheduler for the whole session."""
    work = tmp_path_factory.mktemp("vllm-server")
    step_log = work / "steps.jsonl"
    control_file = work / "limits.json"
    plugin = {
        "max_num_partial_prefills": LANES,
        "max_long_partial_prefills": LONG_LANES,
        "long_prefill_threshold": LONG_THRESHOLD,
        "step_log": str(step_log),
        "control_file": str(control_file),
    }
    args = [
        "--max-model-len", str(MAX_MODEL_LEN),
        "--max-num-batched-tokens", str(STARTUP_BUDGET),
        "--max-num-seqs", str(MAX_NUM_SEQS),
        "--enable-chunked-prefill",
        "--no-enable-prefix-caching",
        "--scheduler-cls", SCHEDULER_CLS,
        "--additional-config", json.dumps({"chunkpilot": plugin}),
    ]  # fmt: skip
    # The step telemetry reaches /metrics through prometheus_client's multiprocess directory.
    metrics_dir = work / "prometheus"
    metrics_dir.mkdir()
    environ = {
        "VLLM_PLUGINS": f"{GENERAL_PLUGIN},{ENDPOINT_PLUGIN}",
        LIVE_ADJUST_TOKEN_ENV: TOKEN,
        MULTIPROC_ENV: str(metrics_dir),
    }
    started = time.monotonic()
    server = start_server(vllm_env, tiny_model_dir, args, work / "server.log", environ)
    print(f"\nvLLM server healthy after {server.startup_s:.1f}s")
    try:
        warm = time.monotonic()
        asyncio.run(_warm_up(server.url))
        ready = time.monotonic() - started
        print(f"warm-up {time.monotonic() - warm:.1f}s; server ready {ready:.1f}s after launch")
        yield EngineServer(server, step_log, control_file, TOKEN)
    finally:
        server.stop()
        if os.environ.get("CHUNKPILOT_KEEP_VLLM_LOG"):
            print(server.log_tail(200))
