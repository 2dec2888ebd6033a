"""``chunkpilot load`` (replay a trace against a service's engines) and ``chunkpilot local``
(run the local stack, or only the pod runner, until Ctrl-C)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

from chunkpilot.devcluster.paths import cache_root
from chunkpilot.localrun.endpoints import (
    DEFAULT_ROUTING,
    ROUTINGS,
    Endpoint,
    EndpointSource,
    balancer_for,
    static_source,
)
from chunkpilot.localrun.loadgen import LoadOptions, run_load
from chunkpilot.localrun.targets import TargetsFileError, targets_file_source
from chunkpilot.localrun.traces import (
    TraceError,
    cap_lengths,
    iter_wall_schedule,
    read_rate_schedule,
    read_trace,
    scale_load,
    scheduled_arrivals,
)


def endpoint_from_url(url: str) -> Endpoint:
    """An endpoint for a direct engine URL such as ``http://127.0.0.1:8000``."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.hostname is None or parts.port is None:
        raise ValueError(f"--endpoint {url!r}: give host and port, e.g. http://127.0.0.1:8000")
    return Endpoint("", parts.netloc, "", "direct", "", parts.hostname, parts.port)


def cached_targets_source(
    path: Path, service: str, namespace: str | None, max_age_s: float = 0.5
) -> EndpointSource:
    """Endpoints of ``service`` from a file_sd file, re-read at most every ``max_age_s``."""
    cache: dict[str, tuple[float, list[Endpoint]]] = {}

    def source() -> list[Endpoint]:
        now = time.monotonic()
        hit = cache.get("endpoints")
        if hit is None or now - hit[0] > max_age_s:
            hit = (now, targets_file_source(path, service, namespace))
            cache["endpoints"] = hit
        return hit[1]

    return source


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``chunkpilot load`` and ``chunkpilot local``."""
    _register_load(subparsers)
    _register_local(subparsers)


def _register_local(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    local = subparsers.add_parser(
        "local",
        help="run Chunkpilot locally: control plane, Prometheus, operator and simulator engines",
        description="Run the local stack (or only the pod runner) in the foreground until Ctrl-C.",
    )
    commands = local.add_subparsers(dest="local_command", metavar="COMMAND", required=True)
    up = commands.add_parser("up", help="start the whole local stack and wait for Ctrl-C")
    up.add_argument(
        "--state-dir", type=Path, default=Path(".chunkpilot/local"), help="where state and logs go"
    )
    up.add_argument("--nodes", type=int, default=2, help="fake GPU nodes (default 2)")
    up.add_argument("--accelerator", default="h100", help="accelerator of the fake nodes (default h100)")
    up.add_argument("--time-scale", type=float, help="engines run this many times faster than real time")
    up.add_argument("--no-operator", action="store_true", help="do not start the operator")
    up.set_defaults(func=run_local_up)
    pods = commands.add_parser(
        "pods", help="run only the pod runner (simulator engines for engine pods) against a cluster"
    )
    pods.add_argument("--kubeconfig", type=Path, required=True, help="kubeconfig of the (local) cluster")
    pods.add_argument("--targets", type=Path, required=True, help="Prometheus file_sd file to maintain")
    pods.add_argument("--log-dir", type=Path, help="engine logs (default: ~/.cache/chunkpilot/engines)")
    pods.add_argument("--time-scale", type=float, help="engines run this many times faster than real time")
    pods.add_argument("--namespace", help="only this namespace (default: all)")
    pods.set_defaults(func=run_local_pods)


def _register_load(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "load",
        help="replay a request trace against a service's Ready engines",
        description=(
            "Replay a trace (Azure TIMESTAMP,ContextTokens,GeneratedTokens or length-only "
            "num_prefill_tokens,num_decode_tokens with Poisson arrivals) as streaming completions, "
            "spread over the service's Ready endpoints as kube-proxy does (at random by default), and "
            "print client-side TTFT/ITL."
        ),
    )
    parser.add_argument(
        "--trace", required=True, help="trace CSV file, or a bundled trace name such as azure_conv_2023"
    )
    parser.add_argument("--service", help="InferenceService name (endpoints from --targets)")
    parser.add_argument("--namespace", help="namespace of the service (default: any)")
    parser.add_argument(
        "--targets", type=Path, help="Prometheus file_sd file written by the local pod runner"
    )
    parser.add_argument(
        "--endpoint", action="append", default=[], help="engine URL to send to directly (repeatable)"
    )
    parser.add_argument(
        "--rate", type=float, help="Poisson arrivals at this many requests/s (needed for length-only traces)"
    )
    parser.add_argument(
        "--rate-schedule",
        type=Path,
        metavar="FILE",
        help="CSV t_s,rate: Poisson arrivals whose rate (requests/s) follows it, linear between rows, "
        "the trace's lengths in order; the schedule ends at its last row",
    )
    parser.add_argument(
        "--load-factor", type=float, default=1.0, help="offer F times the trace's load (arrivals / F)"
    )
    parser.add_argument("--time-scale", type=float, default=1.0, help="the engines' time scale (default 1)")
    parser.add_argument("--duration", type=float, default=60.0, help="wall seconds to send for (default 60)")
    parser.add_argument("--max-requests", type=int, default=1000, help="stop after this many requests")
    parser.add_argument("--repeat", action="store_true", help="replay the trace again when it runs out")
    parser.add_argument("--max-prompt-tokens", type=int, help="clip prompts (e.g. to the model's context)")
    parser.add_argument("--max-output-tokens", type=int, help="clip outputs")
    parser.add_argument("--concurrency", type=int, default=256, help="most requests in flight (default 256)")
    parser.add_argument("--model", help="model name to send (default: ask each endpoint's /v1/models)")
    parser.add_argument("--seed", type=int, default=0, help="seed for Poisson arrivals and prompts")
    parser.add_argument(
        "--routing",
        choices=tuple(ROUTINGS),
        default=DEFAULT_ROUTING,
        help="how requests are spread over the Ready endpoints: random (kube-proxy's iptables and "
        "nftables modes, the default) or round-robin (its IPVS mode)",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.set_defaults(func=run)


def _source(args: argparse.Namespace) -> EndpointSource:
    if args.endpoint:
        return static_source([endpoint_from_url(url) for url in args.endpoint])
    if args.targets is None or args.service is None:
        raise ValueError("give --service with --targets (the pod runner's file_sd file), or --endpoint URL")
    return cached_targets_source(args.targets, args.service, args.namespace)


def run(args: argparse.Namespace) -> int:
    """Handler of ``chunkpilot load``."""
    try:
        source = _source(args)
        lengths_only = args.rate_schedule is not None and args.rate is None
        requests = read_trace(args.trace, rate=1.0 if lengths_only else args.rate, seed=args.seed)
        if args.rate_schedule is not None:
            requests = scheduled_arrivals(requests, read_rate_schedule(args.rate_schedule), seed=args.seed)
        requests = scale_load(requests, args.load_factor)
        requests = cap_lengths(
            requests, max_prompt_tokens=args.max_prompt_tokens, max_output_tokens=args.max_output_tokens
        )
        schedule = iter_wall_schedule(
            requests,
            time_scale=args.time_scale,
            duration_s=args.duration,
            max_requests=args.max_requests,
            repeat=args.repeat,
        )
        options = LoadOptions(
            time_scale=args.time_scale,
            duration_s=args.duration,
            max_concurrency=args.concurrency,
            model=args.model,
            seed=args.seed,
        )
        summary = asyncio.run(run_load(schedule, balancer_for(args.routing, source, args.seed), options))
    except (TraceError, TargetsFileError, ValueError) as error:
        print(f"chunkpilot load: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("chunkpilot load: interrupted", file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps(summary.to_dict(), indent=2))
    else:
        print(summary.format())
    return 0 if summary.completed > 0 else 1


def run_local_up(args: argparse.Namespace) -> int:
    """Handler of ``chunkpilot local up``."""
    from chunkpilot.localrun.stack import LocalStack, StackOptions, print_progress, sigterm_as_interrupt

    try:
        options = StackOptions(
            state_dir=(args.state_dir or cache_root() / "local").resolve(),
            nodes=args.nodes,
            accelerator=args.accelerator,
            time_scale=args.time_scale,
            operator=not args.no_operator,
        )
    except ValueError as error:
        print(f"chunkpilot local up: {error}", file=sys.stderr)
        return 2
    progress = print_progress()
    try:
        with sigterm_as_interrupt(), LocalStack(options, progress=progress) as stack:
            assert stack.prometheus is not None
            targets = stack.prometheus.targets_file
            print(
                "\nThe local stack is up. From another shell:\n"
                f"  export KUBECONFIG={stack.kubeconfig}\n"
                "  kubectl apply -f examples/<service>.yaml\n"
                "  kubectl get inferenceservices,tuningtrials,pods -A\n"
                f"  chunkpilot load --service NAME --targets {targets} --trace azure_conv_2023"
                + (f" --time-scale {options.time_scale:g}" if options.time_scale else "")
                + f"\n  Prometheus: {stack.prometheus.url}\nPress Ctrl-C to stop everything.",
                flush=True,
            )
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        progress("stopped")
        return 0


def run_local_pods(args: argparse.Namespace) -> int:
    """Handler of ``chunkpilot local pods``."""
    import logging

    from chunkpilot.localrun.podrunner import RunnerSettings, run_pods
    from chunkpilot.localrun.stack import sigterm_as_interrupt

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    settings = RunnerSettings(
        time_scale=args.time_scale,
        log_dir=(args.log_dir or cache_root() / "engines").resolve(),
        namespace=args.namespace,
    )
    with sigterm_as_interrupt():
        runner = run_pods(args.kubeconfig, targets_path=args.targets, settings=settings)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            return 0
        finally:
            runner.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``chunkpilot load`` on its own (``python -m chunkpilot.localrun.cli``)."""
    parser = argparse.ArgumentParser(prog="chunkpilot")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["load", *(sys.argv[1:] if argv is None else argv)])
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
