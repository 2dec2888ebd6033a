"""``chunkpilot bench tuner``: the tuner against a hidden truth (see :mod:`chunkpilot.bench.truth`)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import Any

from chunkpilot.bench import autoscale as bench_autoscale
from chunkpilot.bench import disagg as bench_disagg
from chunkpilot.bench import pool_sizing as bench_pool_sizing
from chunkpilot.bench import sim_peers, twin_jobs
from chunkpilot.bench.command import given_options, run_bench_command
from chunkpilot.bench.exhaustive import ENGINES, BenchError
from chunkpilot.bench.truth import (
    TRUTH_FULL,
    TRUTH_QUICK,
    Truth,
    TruthSettings,
    family_truths,
    format_truth_table,
    run_truth_benchmark,
    structural_family_truths,
)
from chunkpilot.tuner.twin.predict import ARRIVAL_SAMPLES, arrival_seeds


def register(subparsers: Any) -> None:
    """Add the ``bench`` command group with its ``tuner`` sub-command."""
    bench = subparsers.add_parser("bench", help="benchmarks that print figures")
    inner = bench.add_subparsers(dest="bench_command", metavar="BENCHMARK")
    bench.set_defaults(func=lambda _args: _usage(bench))
    tuner = inner.add_parser(
        "tuner",
        help="the tuner (twin) vs today's slack objective, random search and an auto_tune-style grid, "
        "against a hidden hardware truth",
        description=(
            "Each method tunes a simulated engine whose hardware (the truth profile) the tuner is not "
            "told, at an offered load below capacity, seeing only the engine's measurements and step "
            "telemetry; its promoted configuration after 1..N canary trials is scored by its true "
            "capacity at SLO as a share of the true optimum, for three bundled traces x two SLO pairs."
        ),
    )
    tuner.add_argument(
        "--truth-gpu",
        metavar="FILE",
        default=None,
        help="accelerator profile JSON of the engine's real hardware, used only by the simulated engine "
        'and the ground truth (optional "truth": {"overhead": X} scales the per-step overheads); '
        "default: the shipped h100-c075-m085-o2 profile",
    )
    tuner.add_argument(
        "--truth-step-profile",
        metavar="FILE",
        default=None,
        help="a truth of another structure: a chunkpilot.io/step-profile/v1 JSON (measured linear-layer "
        "times, efficiencies, overheads) used only by the simulated engine and the ground truth, on the "
        "--truth-gpu accelerator if given, else on the datasheet accelerator the tuner is told",
    )
    tuner.add_argument(
        "--truth-family",
        nargs="?",
        const="perturbed",
        choices=("perturbed", "structural"),
        default=None,
        help="run a shipped family of truths: perturbed (the default: every perturbed H100 profile, "
        "compute x0.6-1.0, HBM x0.7-1.0, overhead x1-3) or structural (every step profile built from "
        "measured A100 kernel curves rescaled to the H100, with attention, element-wise kernels and "
        "overheads unlike the roofline's)",
    )
    tuner.add_argument(
        "--load",
        metavar="FRACTION",
        type=float,
        action="append",
        default=None,
        help="offered load as a share of the true optimum's capacity (repeatable; default 0.3 0.6 0.9)",
    )
    tuner.add_argument(
        "--quick",
        action="store_true",
        help="one trace, one SLO pair, a coarse grid and 4 trials (well under a minute on 2 cores)",
    )
    tuner.add_argument(
        "--engine",
        choices=ENGINES,
        default="vllm",
        help="the engine tuned: the simulator in its scheduling semantics, its server defaults as the "
        "incumbent and its search space from the knob table (default vllm)",
    )
    tuner.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    tuner.add_argument("--jobs", type=int, default=None, help="simulator processes (default 2)")
    tuner.add_argument(
        "--trials", type=int, default=None, help="canary trials per method (default 4 quick / 12)"
    )
    tuner.add_argument(
        "--repeats", type=int, default=None, help="seeds for slack and random (default 1 quick / 2 full)"
    )
    tuner.add_argument(
        "--requests", type=int, default=None, help="requests per trace slice (default 120 quick / 200 full)"
    )
    tuner.add_argument(
        "--truth-arrivals",
        type=int,
        default=None,
        metavar="K",
        help="Poisson arrival samples the ground truth averages each capacity over (default 1 quick / 3)",
    )
    tuner.add_argument(
        "--twin-arrivals",
        type=int,
        default=None,
        metavar="K",
        help="Poisson arrival samples the twin averages each predicted capacity over (default "
        f"{ARRIVAL_SAMPLES}, as the operator ranks; on seeds of its own, none of the ground truth's)",
    )
    tuner.add_argument(
        "--workload",
        action="append",
        default=None,
        help="azure_conv, azure_code or arxiv (repeatable; default all three, azure_code with --quick)",
    )
    tuner.set_defaults(func=run_tuner_bench)
    bench_disagg.register(inner)
    bench_pool_sizing.register(inner)
    bench_autoscale.register(inner)
    sim_peers.register(inner)
    twin_jobs.register(inner)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def settings_from(args: argparse.Namespace) -> TruthSettings:
    """The run's settings from the command line (raises :class:`BenchError` naming the option)."""
    settings = TRUTH_QUICK if args.quick else TRUTH_FULL
    grid = given_options(
        jobs=args.jobs,
        requests=args.requests,
        engine=args.engine,
        workloads=tuple(args.workload) if args.workload else None,
    )
    top = given_options(
        trials=args.trials,
        repeats=args.repeats,
        loads=tuple(args.load) if args.load else None,
        truth_arrivals=args.truth_arrivals,
    )
    if args.twin_arrivals is not None:
        if args.twin_arrivals < 1:
            raise BenchError("--twin-arrivals must be >= 1")
        top["twin"] = replace(settings.twin, arrival_seeds=arrival_seeds(args.twin_arrivals))
    if args.truth_family and (args.truth_gpu or args.truth_step_profile):
        given = "--truth-gpu" if args.truth_gpu else "--truth-step-profile"
        raise BenchError(
            f"{given} and --truth-family: choose one (a family brings its own truths; to run one step "
            "profile on another accelerator give --truth-step-profile FILE with --truth-gpu FILE)"
        )
    if args.truth_gpu or args.truth_step_profile:
        top["truths"] = (Truth.of(args.truth_gpu, args.truth_step_profile),)
    elif args.truth_family == "structural":
        top["truths"] = structural_family_truths()
    elif args.truth_family:
        top["truths"] = family_truths()
    return replace(settings, grid=replace(settings.grid, **grid), **top)


def run_tuner_bench(args: argparse.Namespace) -> int:
    """Run the benchmark and print the tables (or JSON)."""
    return run_bench_command("tuner", args, settings_from, run_truth_benchmark, format_truth_table)
