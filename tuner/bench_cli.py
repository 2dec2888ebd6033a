"""``chunkpilot bench tuner``: the offline tuner benchmark (see :mod:`chunkpilot.tuner.bench`)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from typing import Any

from chunkpilot.tuner.bench import FULL, QUICK, BenchError, format_table, run_benchmark


def register(subparsers: Any) -> None:
    """Add the ``bench`` command group with its ``tuner`` sub-command."""
    bench = subparsers.add_parser("bench", help="benchmarks that print figures")
    inner = bench.add_subparsers(dest="bench_command", metavar="BENCHMARK")
    bench.set_defaults(func=lambda _args: _usage(bench))
    tuner = inner.add_parser(
        "tuner",
        help="tuner vs exhaustive search, vLLM defaults, random search and an auto_tune-style grid",
        description=(
            "Capacity at SLO (simulated) of the tuner's configuration after 1..N trials versus the "
            "exhaustive optimum over the same grid, vLLM's default configuration and two baselines, "
            "for three bundled traces x two SLO pairs."
        ),
    )
    tuner.add_argument(
        "--quick",
        action="store_true",
        help="short trace slices, a coarser grid and capacity search, 12 trials (a minute or two on 2 cores)",
    )
    tuner.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    tuner.add_argument("--jobs", type=int, default=None, help="simulator processes (default 2)")
    tuner.add_argument(
        "--trials", type=int, default=None, help="trials per method (default 12 quick / 20 full)"
    )
    tuner.add_argument(
        "--repeats", type=int, default=None, help="seeds for tpe and random (default 3 quick / 5 full)"
    )
    tuner.add_argument(
        "--requests", type=int, default=None, help="requests per trace slice (default 160 quick / 300 full)"
    )
    tuner.add_argument(
        "--workload",
        action="append",
        default=None,
        help="azure_conv, azure_code or arxiv (repeatable; default all three)",
    )
    tuner.set_defaults(func=run_tuner_bench)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def run_tuner_bench(args: argparse.Namespace) -> int:
    """Run the benchmark and print the tables (or JSON)."""
    settings = QUICK if args.quick else FULL
    overrides: dict[str, Any] = {
        key: value
        for key, value in (
            ("jobs", args.jobs),
            ("trials", args.trials),
            ("repeats", args.repeats),
            ("requests", args.requests),
            ("workloads", tuple(args.workload) if args.workload else None),
        )
        if value is not None
    }
    try:
        settings = replace(settings, **overrides)
        result = run_benchmark(settings, progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    except BenchError as exc:
        print(f"chunkpilot bench tuner: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(format_table(result))
    return 0
