"""``chunkpilot bench sim``: the simulator against its fastest peer, side by side, as whole processes.

Every method replays the same trace with the same arrivals (vLLM semantics, one replica, budget and
sequence limit as given, 16-token blocks, the KV cache of Llama-3.1-8B on an H100): Chunkpilot as
``chunkpilot sim run`` with its compiled core and with its Python core, and, given a Python that has
``ai-dynamo`` installed, NVIDIA Dynamo's mocker through its offline ``run_trace_replay`` (its Rust
core; the trace converted to the Mooncake JSONL it reads, every prompt block unique so neither side
finds a prefix hit). Runs alternate between the methods; each figure is the CPU time of the whole
process (user + system, from the operating system), so imports and start-up count. The latencies are
printed for orientation only: the two simulators model a GPU differently.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from chunkpilot.bench.command import given_options, run_bench_command
from chunkpilot.bench.exhaustive import BenchError
from chunkpilot.engine.sim import compiled
from chunkpilot.engine.sim.engine import SimConfig
from chunkpilot.engine.sim.workload import Workload, load_trace

BLOCK_SIZE = 16

#: The Dynamo side: its offline replay, configured like ``chunkpilot sim run`` below.
DYNAMO_REPLAY = """
import json, sys, time
from dynamo.replay import run_trace_replay
args = json.loads(sys.argv[1])
started = time.process_time()
report = run_trace_replay(
    [args["trace"]],
    extra_engine_args={"engine": {
        "backend": "vllm", "block_size": args["block_size"], "num_gpu_blocks": args["num_gpu_blocks"],
        "max_num_batched_tokens": args["budget"], "max_num_seqs": args["max_num_seqs"],
        "enable_chunked_prefill": True, "enable_prefix_caching": True}},
    num_workers=1, replay_mode="offline", router_mode="round_robin", trace_format="mooncake",
    trace_block_size=args["block_size"], arrival_speedup_ratio=1.0)
s = report.summary
print(json.dumps({"simulation_cpu_s": time.process_time() - started,
    "completed": s["completed_requests"], "ttft_p50_ms": s["median_ttft_ms"], "ttft_p99_ms": s["p99_ttft_ms"],
    "itl_p50_ms": s["median_itl_ms"], "itl_p99_ms": s["p99_itl_ms"]}))
"""


@dataclass(frozen=True, slots=True)
class SimPeerSettings:
    """What ``bench sim`` runs."""

    trace: str = "azure_conv_2023"
    budget: int = 2048
    max_num_seqs: int = 256
    repeat: int = 3
    limit: int | None = None
    dynamo_python: str | None = None


@dataclass(frozen=True, slots=True)
class MethodResult:
    """One method's runs: whole-process CPU seconds per run, and what the last run answered."""

    method: str
    process_cpu_s: tuple[float, ...]
    wall_s: tuple[float, ...]
    answers: dict[str, float]

    @property
    def median_cpu_s(self) -> float:
        """The median whole-process CPU time."""
        return statistics.median(self.process_cpu_s)


@dataclass(frozen=True, slots=True)
class SimPeerResult:
    """Everything ``bench sim`` reports."""

    settings: SimPeerSettings
    requests: int
    methods: tuple[MethodResult, ...]
    skipped: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready mapping."""
        return {
            "settings": asdict(self.settings),
            "requests": self.requests,
            "methods": {m.method: {**asdict(m), "median_cpu_s": m.median_cpu_s} for m in self.methods},
            "skipped": self.skipped,
        }


def mooncake_lines(workload: Workload) -> list[str]:
    """The workload as Mooncake JSONL: arrival in ms, lengths, and unique block ids per prompt."""
    lines: list[str] = []
    next_id = 0
    for spec in workload.requests:
        blocks = -(-spec.prompt_tokens // BLOCK_SIZE)
        record = {
            "timestamp": round(spec.arrival_s * 1e3, 3),
            "input_length": spec.prompt_tokens,
            "output_length": spec.output_tokens,
            "hash_ids": list(range(next_id, next_id + blocks)),
        }
        next_id += blocks
        lines.append(json.dumps(record))
    return lines


def _measure(command: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """Run ``command`` to completion: its CPU seconds (user + system), wall seconds and stdout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    run = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if run.returncode != 0:
        raise BenchError(f"{' '.join(command[:4])} ... failed (exit {run.returncode}): {run.stderr[-800:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, run.stdout


def _chunkpilot(settings: SimPeerSettings, core: str) -> tuple[list[str], dict[str, str]]:
    command = [
        sys.executable,
        "-m",
        "chunkpilot.cli",
        "sim",
        "run",
        "--trace",
        settings.trace,
        "--max-num-batched-tokens",
        str(settings.budget),
        "--max-num-seqs",
        str(settings.max_num_seqs),
        "--json",
    ]
    if settings.limit is not None:
        command += ["--limit", str(settings.limit)]
    return command, {**os.environ, compiled.MODE_ENV: core}


def _chunkpilot_answers(stdout: str) -> dict[str, float]:
    data = json.loads(stdout)
    return {
        "simulation_wall_s": data["wall_s"],
        "completed": data["completed"],
        "ttft_p50_ms": data["ttft_ms"]["p50"],
        "ttft_p99_ms": data["ttft_ms"]["p99"],
        "itl_p50_ms": data["itl_ms"]["p50"],
        "itl_p99_ms": data["itl_ms"]["p99"],
    }


def run_sim_peers(settings: SimPeerSettings, progress: Any) -> SimPeerResult:
    """Alternate the methods ``settings.repeat`` times and collect their figures."""
    if settings.repeat < 1:
        raise BenchError("--repeat must be >= 1")
    workload = load_trace(settings.trace, limit=settings.limit)
    blocks = SimConfig().build().capacity.num_blocks
    methods: dict[str, tuple[list[str], dict[str, str]]] = {}
    skipped: dict[str, str] = {}
    if (compiled.build_dir() / compiled.MARKER).is_file():
        methods["chunkpilot-compiled"] = _chunkpilot(settings, "compiled")
    else:
        skipped["chunkpilot-compiled"] = "not built: run `chunkpilot sim build-core`"
    methods["chunkpilot-python"] = _chunkpilot(settings, "python")
    with tempfile.TemporaryDirectory(prefix="chunkpilot-bench-sim-") as tmp:
        if settings.dynamo_python:
            trace = Path(tmp) / "trace.jsonl"
            trace.write_text("\n".join(mooncake_lines(workload)) + "\n", encoding="utf-8")
            arguments = {
                "trace": str(trace),
                "block_size": BLOCK_SIZE,
                "num_gpu_blocks": blocks,
                "budget": settings.budget,
                "max_num_seqs": settings.max_num_seqs,
            }
            methods["dynamo-mocker"] = (
                [settings.dynamo_python, "-c", DYNAMO_REPLAY, json.dumps(arguments)],
                dict(os.environ),
            )
        else:
            skipped["dynamo-mocker"] = "give --dynamo-python PYTHON (a Python with ai-dynamo installed)"
        cpu: dict[str, list[float]] = {name: [] for name in methods}
        wall: dict[str, list[float]] = {name: [] for name in methods}
        answers: dict[str, dict[str, float]] = {}
        for round_index in range(settings.repeat):
            for name, (command, env) in methods.items():
                seconds, elapsed, stdout = _measure(command, env)
                cpu[name].append(seconds)
                wall[name].append(elapsed)
                last = stdout.strip().splitlines()[-1]
                answers[name] = (
                    _chunkpilot_answers(stdout) if name.startswith("chunkpilot") else json.loads(last)
                )
                progress(f"round {round_index + 1}/{settings.repeat}: {name} {seconds:.2f} CPU-s")
    results = tuple(
        MethodResult(name, tuple(cpu[name]), tuple(wall[name]), answers[name]) for name in methods
    )
    return SimPeerResult(settings, len(workload.requests), results, skipped)


def format_sim_peers(result: SimPeerResult) -> str:
    """The side-by-side table."""
    s = result.settings
    lines = [
        f"{s.trace}: {result.requests} requests, budget {s.budget}, {s.max_num_seqs} sequences, "
        f"{s.repeat} alternating rounds (whole processes, CPU seconds = user + system)",
        f"{'method':<22}{'CPU-s median':>13}{'runs':>24}{'TTFT p50/p99 ms':>20}{'ITL p50/p99 ms':>18}",
    ]
    for m in result.methods:
        runs = " ".join(f"{c:.2f}" for c in m.process_cpu_s)
        a = m.answers
        lines.append(
            f"{m.method:<22}{m.median_cpu_s:>13.2f}{runs:>24}"
            f"{a['ttft_p50_ms']:>10.1f}/{a['ttft_p99_ms']:<9.1f}{a['itl_p50_ms']:>8.1f}/{a['itl_p99_ms']:<9.1f}"
        )
    lines += [f"{name}: skipped ({why})" for name, why in result.skipped.items()]
    return "\n".join(lines)


def register(inner: Any) -> None:
    """Add ``bench sim``."""
    parser = inner.add_parser(
        "sim",
        help="the simulator's CPU time on a whole trace, compiled and Python cores and Dynamo's mocker",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--trace", default=None, help="bundled trace name or CSV (default azure_conv_2023)")
    parser.add_argument("--budget", type=int, default=None, help="max_num_batched_tokens (default 2048)")
    parser.add_argument("--max-num-seqs", type=int, default=None, help="running limit (default 256)")
    parser.add_argument("--repeat", type=int, default=None, help="alternating rounds (default 3)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N requests of the trace")
    parser.add_argument(
        "--dynamo-python",
        default=None,
        metavar="PYTHON",
        help="a Python interpreter with ai-dynamo installed (pip install --no-deps ai-dynamo==1.6.1 "
        "ai-dynamo-runtime==1.6.1 typing_extensions); without it the mocker is skipped",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=_run)


def _settings(args: argparse.Namespace) -> SimPeerSettings:
    options = given_options(
        trace=args.trace,
        budget=args.budget,
        max_num_seqs=args.max_num_seqs,
        repeat=args.repeat,
        limit=args.limit,
        dynamo_python=args.dynamo_python,
    )
    return SimPeerSettings(**options)


def _run(args: argparse.Namespace) -> int:
    return run_bench_command("sim", args, _settings, run_sim_peers, format_sim_peers)
