"""``chunkpilot demo``: the whole product on this machine, on embedded defaults."""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields, replace
from pathlib import Path

from chunkpilot.demo.scenario import DEMO_ENGINES, DemoScenario

_DEFAULTS = DemoScenario()
_FAST = _DEFAULTS.fast()


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``chunkpilot demo``."""
    parser = subparsers.add_parser(
        "demo",
        help="run the control plane, Prometheus, operator and simulated engines locally; tune a service",
        description=(
            "Bring up a local Kubernetes control plane, a real Prometheus, the operator and simulator "
            "engines; apply an InferenceService whose default token budget misses its ITL SLO under a "
            "replayed real trace; watch the autotuner's canary trials; write a report; tear down."
        ),
    )
    parser.add_argument(
        "--fast",
        action="store_true",
        help="four 40-s trials, then a two-minute load surge: about twelve minutes",
    )
    workload = parser.add_argument_group("workload")
    workload.add_argument(
        "--trace", default=_DEFAULTS.trace, help=f"bundled trace or CSV (default {_DEFAULTS.trace})"
    )
    workload.add_argument(
        "--rate", type=float, default=_DEFAULTS.rate, help=f"requests per second (default {_DEFAULTS.rate:g})"
    )
    engine = parser.add_argument_group("engine")
    engine.add_argument(
        "--engine",
        choices=DEMO_ENGINES,
        default=_DEFAULTS.engine,
        help="engine kind of the service: sim (the simulator, vLLM flags), or sglang / trtllm run by the "
        "simulator with that engine's flags, scheduling and metrics (default sim)",
    )
    engine.add_argument(
        "--model", default=_DEFAULTS.model, help=f"simulated model (default {_DEFAULTS.model})"
    )
    engine.add_argument(
        "--accelerator",
        default=_DEFAULTS.accelerator,
        help=f"simulated GPU (default {_DEFAULTS.accelerator})",
    )
    engine.add_argument(
        "--budget",
        type=int,
        default=_DEFAULTS.budget,
        help=f"starting token budget (default {_DEFAULTS.budget})",
    )
    slo = parser.add_argument_group("SLOs")
    slo.add_argument(
        "--itl-ms", type=float, default=_DEFAULTS.itl_max_ms, help="ITL objective in ms (default 50)"
    )
    slo.add_argument("--itl-quantile", type=float, default=_DEFAULTS.itl_quantile, help="default 0.99")
    slo.add_argument(
        "--ttft-ms", type=float, default=_DEFAULTS.ttft_max_ms, help="TTFT objective in ms (default 1000)"
    )
    slo.add_argument("--ttft-quantile", type=float, default=_DEFAULTS.ttft_quantile, help="default 0.95")
    scaling = parser.add_argument_group("replicas")
    scaling.add_argument(
        "--max-replicas",
        type=int,
        default=_DEFAULTS.max_replicas,
        help=f"the replica planner's maxReplicas; 1 turns it and the load surge off "
        f"(default {_DEFAULTS.max_replicas})",
    )
    scaling.add_argument(
        "--surge-s",
        type=float,
        help=f"seconds the load surges once the tuning has ended (default {_DEFAULTS.surge_s:g})",
    )
    timing = parser.add_argument_group("duration")
    timing.add_argument(
        "--max-trials",
        type=int,
        help=f"trials to run (default {_DEFAULTS.max_trials}, --fast {_FAST.max_trials})",
    )
    timing.add_argument("--trial-window", help=f"wall-clock trial window (default {_DEFAULTS.trial_window})")
    timing.add_argument("--warmup", help=f"wall-clock warm-up per trial (default {_DEFAULTS.warmup})")
    timing.add_argument(
        "--time-scale",
        type=float,
        help="engines run this many times faster than real time (default 1; the twin then sees the load "
        "times this factor)",
    )
    timing.add_argument(
        "--timeout",
        type=float,
        help=f"give up after this many seconds (default {_DEFAULTS.timeout_s:g}, --fast {_FAST.timeout_s:g})",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=Path(".chunkpilot/demo"),
        help="state and logs (default .chunkpilot/demo)",
    )
    parser.add_argument(
        "--report-dir", type=Path, default=Path("reports"), help="reports go here (default reports)"
    )
    parser.set_defaults(func=run)


def scenario_from_args(args: argparse.Namespace) -> DemoScenario:
    """The scenario the options describe (``--fast`` first, then explicit options on top)."""
    base = replace(
        _DEFAULTS,
        trace=args.trace,
        rate=args.rate,
        model=args.model,
        accelerator=args.accelerator,
        budget=args.budget,
        itl_max_ms=args.itl_ms,
        itl_quantile=args.itl_quantile,
        ttft_max_ms=args.ttft_ms,
        ttft_quantile=args.ttft_quantile,
        engine=args.engine,
        max_replicas=args.max_replicas,
    )
    if args.fast:
        base = base.fast()
    overrides = {
        "max_trials": args.max_trials,
        "trial_window": args.trial_window,
        "warmup": args.warmup,
        "time_scale": args.time_scale,
        "timeout_s": args.timeout,
        "surge_s": args.surge_s,
    }
    known = {f.name for f in fields(DemoScenario)}
    return replace(base, **{k: v for k, v in overrides.items() if v is not None and k in known})


def run(args: argparse.Namespace) -> int:
    """Handler of ``chunkpilot demo``."""
    try:
        scenario = scenario_from_args(args)
    except ValueError as error:
        print(f"chunkpilot demo: {error}", file=sys.stderr)
        return 2
    from chunkpilot.demo.run import run_demo

    result = run_demo(scenario, state_dir=args.state_dir.resolve(), report_dir=args.report_dir.resolve())
    return result.exit_code
