"""``chunkpilot sim``: run the engine simulator offline, search capacity, serve it, benchmark it."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable
from typing import Any

from chunkpilot.engine.live_adjust import LIVE_ADJUST_TOKEN_ENV
from chunkpilot.engine.sim import compiled
from chunkpilot.engine.sim.capacity import DEFAULT_TOLERANCE, search_capacity
from chunkpilot.engine.sim.disagg import (
    DisaggregatedSummary,
    RouterPolicy,
    Topology,
    simulate_colocated,
    simulate_disaggregated,
)
from chunkpilot.engine.sim.engine import SimConfig
from chunkpilot.engine.sim.flags import (
    ENGINE_NAMES,
    SGLANG_DEFAULT_PORT,
    add_flags_for,
    config_for,
    kv_transfer_from_args,
    profiles_help,
)
from chunkpilot.engine.sim.offline import SLO, Summary, simulate
from chunkpilot.engine.sim.workload import BUNDLED_TRACES, Workload, load_trace, parse_workload_spec

from chunkpilot.api.engines import ENGINES

__all__ = ["register"]

DEFAULT_CAPACITY_REQUESTS = 1000


class _CommandParser(argparse.ArgumentParser):
    """A sub-command parser that reports unknown arguments itself, with its own usage line
    (argparse otherwise hands them up to the top-level ``chunkpilot`` parser).

    A command with engine flags (``engine_flags`` set) adds those of the engine ``--engine`` names
    (default vllm) just before parsing: each engine has its own spelling of the same knobs.
    """

    engine_flags: Any = None

    def parse_known_args(  # type: ignore[override]
        self, args: Any = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if self.engine_flags is not None:
            args = list(sys.argv[1:] if args is None else args)
            engine = _peek_engine(args)
            hook, self.engine_flags = self.engine_flags, None
            hook(self, engine)
            self.set_defaults(engine=engine)
            first = (
                2 if args[:1] == ["--engine"] else 1 if args[:1] and args[0].startswith("--engine=") else 0
            )
            if engine == "trtllm" and args[first : first + 1] == ["serve"]:
                del args[first]  # ``trtllm-serve serve MODEL ...``: the sub-command of trtllm-serve
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras


#: Flags only one engine spells this way (the registry's ``simulator_markers``): ``sim serve`` without
#: ``--engine`` takes the dialect from them, so a pod's argument vector rendered for that engine runs on
#: the simulator as it is.
_MARKERS = tuple((e.dialect, frozenset(e.simulator_markers)) for e in ENGINES.values() if e.simulator_markers)


def _peek_engine(argv: list[str]) -> str:
    """The engine ``argv`` names with ``--engine``, else the one whose flag spelling it uses, else vllm."""
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        if arg == "--engine" and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith("--engine="):
            value = arg.partition("=")[2]
        else:
            continue
        return value if value in ENGINE_NAMES else "vllm"
    flags = {arg.partition("=")[0] for arg in argv if arg.startswith("--")}
    return next((dialect for dialect, markers in _MARKERS if flags & markers), "vllm")


def _add_engine_choice(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--engine",
        choices=ENGINE_NAMES,
        default="vllm",
        help="whose scheduling semantics, flag spelling and metric names to simulate (default vllm); "
        "give it first to see that engine's flags in --help",
    )


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``sim`` with its ``run``, ``capacity``, ``serve`` and ``bench`` sub-commands."""
    parser = subparsers.add_parser(
        "sim",
        help="CPU engine simulator: vLLM V1 chunked-prefill scheduling with a roofline step-time model",
        description="Simulate a vLLM engine offline (traces in, latency summaries out) or serve it live.",
    )
    commands = parser.add_subparsers(
        dest="sim_command", metavar="SUBCOMMAND", required=True, parser_class=_CommandParser
    )

    run = _add_offline_command(
        commands, "run", "simulate a trace or synthetic workload and summarise latencies"
    )
    run.add_argument("--limit", type=int, default=None, help="use only the first N requests of the trace")
    run.set_defaults(func=_run)

    capacity = _add_offline_command(
        commands,
        "capacity",
        "highest Poisson request rate whose ITL and TTFT quantiles meet the SLOs (bisection)",
    )
    capacity.add_argument(
        "--requests",
        type=int,
        default=DEFAULT_CAPACITY_REQUESTS,
        help="requests per probe, lengths taken in order from the trace "
        f"(default {DEFAULT_CAPACITY_REQUESTS})",
    )
    capacity.add_argument(
        "--tolerance",
        type=float,
        default=DEFAULT_TOLERANCE,
        help="relative bracket width to stop at (default 0.025)",
    )
    capacity.add_argument(
        "--start-rate", type=float, default=1.0, help="first rate probed, req/s (default 1)"
    )
    capacity.set_defaults(func=_capacity)

    _add_serve_command(commands)

    bench_parser = commands.add_parser(
        "bench",
        help="print the offline speed on a whole trace and the step-time calibration error",
        allow_abbrev=False,
    )
    bench_parser.add_argument("--trace", default="azure_conv_2023", help="trace name or CSV path")
    bench_parser.add_argument("--model", default="llama-3.1-8b")
    bench_parser.add_argument("--gpu", default="h100")
    bench_parser.add_argument("--repeat", type=int, default=3, help="runs; the fastest counts (default 3)")
    bench_parser.add_argument(
        "--step-by-step", action="store_true", help="also time the run without bulk decode advancing"
    )
    bench_parser.add_argument("--json", action="store_true", help="print one JSON object")
    bench_parser.set_defaults(func=_bench)

    _add_tokenizer_command(commands)

    build_core = commands.add_parser(
        "build-core",
        help="compile the simulator's hot modules with mypyc (2-3x faster; Python stays the fallback)",
        description="Compile the scheduler, KV cache, step-time model and offline drivers with mypyc into "
        "~/.cache/chunkpilot/sim-core/ (CHUNKPILOT_SIM_CORE_CACHE overrides). The build is used while the "
        "sources match it; CHUNKPILOT_SIM_CORE=python|compiled|auto picks the core.",
        allow_abbrev=False,
    )
    build_core.add_argument("--force", action="store_true", help="rebuild even when a build exists")
    build_core.set_defaults(func=_build_core)


def _build_core(args: argparse.Namespace) -> int:
    try:
        compiled.build(force=args.force)
    except compiled.BuildError as exc:
        print(f"chunkpilot sim build-core: {exc}", file=sys.stderr)
        return 1
    return 0


def _add_serve_command(commands: argparse._SubParsersAction[_CommandParser]) -> None:
    serve = commands.add_parser(
        "serve",
        help="serve the simulated engine: OpenAI API, /metrics (vLLM V1 names), /health",
        description="Accepts the flags `vllm serve` takes; unknown flags are an error, as in vLLM.",
        epilog=profiles_help(),
        allow_abbrev=False,
    )
    _add_engine_choice(serve)
    serve.engine_flags = _serve_engine_flags
    serve.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="simulated seconds per wall second (default 1: real time)",
    )
    serve.set_defaults(func=_serve)


def _serve_engine_flags(serve: argparse.ArgumentParser, engine: str) -> None:
    model_help = "model profile name, Hugging Face id alias, or config.json path"
    if engine == "sglang":
        serve.add_argument("--model-path", dest="model", required=True, metavar="MODEL", help=model_help)
    else:
        serve.add_argument("model", metavar="MODEL", help=model_help)
    add_flags_for(serve, engine)
    port = SGLANG_DEFAULT_PORT if engine == "sglang" else 8000
    serve.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    serve.add_argument("--port", type=int, default=port, help=f"port to listen on (default {port})")


def _add_tokenizer_command(commands: argparse._SubParsersAction[_CommandParser]) -> None:
    export = commands.add_parser(
        "tokenizer",
        help="write the simulator's tokenizer as Hugging Face files for benchmark clients' --tokenizer",
        description="Write tokenizer.json and tokenizer_config.json whose token counts equal the "
        "simulator's (for aiperf, guidellm and other clients that count tokens with a Hugging Face "
        "tokenizer; no hub download needed).",
        allow_abbrev=False,
    )
    where = export.add_mutually_exclusive_group(required=True)
    where.add_argument("--out", help="folder to write (created if missing); give it to --tokenizer")
    where.add_argument(
        "--hub-cache",
        help="install into this Hugging Face hub cache (HF_HUB_CACHE) as repository --name, for "
        "clients that load tokenizers by name offline (HF_HUB_OFFLINE=1)",
    )
    export.add_argument(
        "--name",
        default=None,
        help="repository name in --hub-cache (default: the served model name, --model)",
    )
    export.add_argument("--model", default="llama-3.1-8b", help="model profile whose vocabulary size to use")
    export.add_argument(
        "--max-model-len", type=int, default=None, help="model_max_length to record (default: the model's)"
    )
    export.set_defaults(func=_tokenizer)


def _offline_engine_flags(parser: argparse.ArgumentParser, engine: str) -> None:
    names = ("--model", "--model-path") if engine == "sglang" else ("--model",)
    parser.add_argument(
        *names, dest="model", default="llama-3.1-8b", help="model profile, HF id alias, or config.json path"
    )
    add_flags_for(parser, engine)


def _add_offline_command(
    commands: argparse._SubParsersAction[_CommandParser], name: str, help_text: str
) -> _CommandParser:
    """A sub-command that simulates a workload offline: the engine, model, workload and SLO flags."""
    parser = commands.add_parser(name, help=help_text, epilog=profiles_help(), allow_abbrev=False)
    _add_offline_flags(parser)
    return parser


def _add_offline_flags(parser: argparse.ArgumentParser) -> None:
    _add_engine_choice(parser)
    parser.engine_flags = _offline_engine_flags  # type: ignore[attr-defined]
    source = parser.add_argument_group("workload").add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--trace",
        help="CSV trace (Azure TIMESTAMP,ContextTokens,GeneratedTokens or "
        f"num_prefill_tokens,num_decode_tokens,...) or a bundled one: {', '.join(BUNDLED_TRACES)}",
    )
    source.add_argument(
        "--workload",
        help="synthetic workload, e.g. n=500,rate=8,prompt=512-2048,output=64-256,prefix=1024,groups=4",
    )
    parser.add_argument(
        "--rate", type=float, default=None, help="Poisson arrivals at this rate (req/s) for --trace"
    )
    slo = parser.add_argument_group("service-level objectives")
    defaults = SLO()
    slo.add_argument("--slo-itl-ms", type=float, default=defaults.itl_ms)
    slo.add_argument("--slo-itl-quantile", type=float, default=defaults.itl_quantile, help="in (0, 1)")
    slo.add_argument("--slo-ttft-ms", type=float, default=defaults.ttft_ms)
    slo.add_argument("--slo-ttft-quantile", type=float, default=defaults.ttft_quantile, help="in (0, 1)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    _add_topology_flags(parser)


#: The knobs a disaggregated run sets per pool: flag suffix and what its help calls it.
_POOL_KNOBS = (
    ("max-num-batched-tokens", "token budget"),
    ("max-num-seqs", "max-num-seqs"),
    ("long-prefill-token-threshold", "long-prefill token threshold"),
)


def _add_topology_flags(parser: argparse.ArgumentParser) -> None:
    pd = parser.add_argument_group(
        "prefill/decode disaggregation (vLLM)",
        "with --topology (or --prefill-replicas/--decode-replicas) the workload runs on a prefill pool and a "
        "decode pool; the KV link is --kv-bandwidth-gbps and --kv-latency-ms",
    )
    pd.add_argument("--topology", default=None, help="<prefill>P<decode>D replicas, e.g. 1P3D")
    pd.add_argument(
        "--prefill-replicas", type=int, default=None, help="prefill replicas (with --decode-replicas)"
    )
    pd.add_argument(
        "--decode-replicas", type=int, default=None, help="decode replicas (with --prefill-replicas)"
    )
    for pool in ("prefill", "decode"):
        for knob, what in _POOL_KNOBS:
            pd.add_argument(f"--{pool}-{knob}", type=int, default=None, help=f"{what} of the {pool} pool")
    pd.add_argument(
        "--router-policy",
        choices=[p.value for p in RouterPolicy],
        default=RouterPolicy.LEAST_LOADED.value,
        help="how the router picks a replica of each pool (default least_loaded)",
    )
    pd.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="without --topology: colocated replicas behind the same router (default 1)",
    )


def _topology(args: argparse.Namespace, config: SimConfig) -> Topology | None:
    """The P:D topology the flags ask for; None for a colocated run."""
    spec = args.topology
    counts = (args.prefill_replicas, args.decode_replicas)
    if spec is not None and any(c is not None for c in counts):
        raise ValueError("give either --topology or --prefill-replicas/--decode-replicas, not both")
    if spec is None and any(c is not None for c in counts):
        if None in counts:
            raise ValueError("--prefill-replicas and --decode-replicas go together")
        spec = f"{counts[0]}P{counts[1]}D"
    overrides = {
        pool: {
            name: value
            for name in ("max_num_batched_tokens", "max_num_seqs", "long_prefill_token_threshold")
            if (value := getattr(args, f"{pool}_{name}")) is not None
        }
        for pool in ("prefill", "decode")
    }
    if spec is None:
        if any(overrides.values()):
            raise ValueError("the --prefill-*/--decode-* knobs need --topology")
        return None
    if args.replicas != 1:
        raise ValueError("--replicas is for colocated runs; with --topology give the pools' replicas")
    if config.engine.value != "vllm":
        raise ValueError("--topology simulates vLLM's KV connectors; use --engine vllm")
    router = RouterPolicy(args.router_policy)
    return Topology.of(
        spec, config, prefill=overrides["prefill"], decode=overrides["decode"],
        kv_transfer=kv_transfer_from_args(args), router=router,
    )  # fmt: skip


def _simulation(args: argparse.Namespace, config: SimConfig, slo: SLO) -> Callable[[Workload], Summary]:
    """How to simulate one workload: one engine (today's path), colocated replicas, or a P:D topology."""
    topology = _topology(args, config)
    if topology is not None:
        return lambda workload: simulate_disaggregated(topology, workload, slo)
    if args.replicas < 1:
        raise ValueError(f"--replicas must be >= 1, got {args.replicas}")
    if args.replicas > 1:
        replicas, router = args.replicas, RouterPolicy(args.router_policy)
        return lambda workload: simulate_colocated(config, replicas, workload, slo, router=router)
    return lambda workload: simulate(config, workload, slo)


def _error(args: argparse.Namespace, exc: Exception) -> int:
    print(f"chunkpilot sim {args.sim_command}: error: {exc}", file=sys.stderr)
    return 2


def _slo(args: argparse.Namespace) -> SLO:
    return SLO(args.slo_itl_ms, args.slo_itl_quantile, args.slo_ttft_ms, args.slo_ttft_quantile)


def _workload(args: argparse.Namespace, limit: int | None) -> Workload:
    if args.trace is not None:
        if limit is not None and limit < 1:
            raise ValueError("--limit/--requests must be >= 1")
        return load_trace(args.trace, rate=args.rate, seed=args.seed, limit=limit)
    if args.rate is not None:
        raise ValueError("--rate applies to --trace; put rate=R into the --workload specification instead")
    workload = parse_workload_spec(args.workload)
    if limit is not None:
        workload = Workload(workload.name, workload.requests[:limit])
    return workload


def _run(args: argparse.Namespace) -> int:
    try:
        config = config_for(args.model, args)
        slo = _slo(args)
        summary = _simulation(args, config, slo)(_workload(args, args.limit))
    except (ValueError, OSError) as exc:
        return _error(args, exc)
    print(_json(summary.to_dict()) if args.json else _format_summary(summary))
    return 0


def _capacity(args: argparse.Namespace) -> int:
    try:
        config = config_for(args.model, args)
        slo = _slo(args)
        workload = _workload(args, args.requests)
        result = search_capacity(
            _simulation(args, config, slo),
            workload,
            tolerance=args.tolerance,
            start_rate=args.start_rate,
            seed=args.seed,
        )
    except (ValueError, OSError) as exc:
        return _error(args, exc)
    if args.json:
        print(_json(result.to_dict()))
        return 0
    if not result.feasible:
        print(f"no rate meets the SLOs (tried down to {result.upper_req_s:g} req/s)")
        return 0
    print(
        f"capacity {result.capacity_req_s:.3f} req/s "
        f"(bracket {result.lower_req_s:.3f}-{result.upper_req_s:.3f}, "
        f"{len(result.probes)} probes of {result.requests} requests, {result.wall_s:.1f} s)"
    )
    if result.at_capacity is not None:
        print(_format_summary(result.at_capacity))
    return 0


def _serve(args: argparse.Namespace) -> int:
    from chunkpilot.engine.sim.server import ServerConfig, serve

    try:
        if not args.time_scale > 0:
            raise ValueError(f"--time-scale must be > 0, got {args.time_scale}")
        if not 0 <= args.port <= 65535:
            raise ValueError(f"--port must be in [0, 65535], got {args.port}")
        config = config_for(args.model, args)
        config.build()  # KV capacity and tensor-parallel checks, before the socket opens
        server_config = ServerConfig(
            sim=config,
            served_model_names=_served_names(args),
            time_scale=args.time_scale,
            host=args.host,
            port=args.port,
            shutdown_timeout=getattr(args, "shutdown_timeout", 0.0),
            live_adjust_token=os.environ.get(LIVE_ADJUST_TOKEN_ENV) or None,
            metrics_enabled=getattr(args, "enable_metrics", True),
            engine_version=getattr(args, "engine_version", None),
            kv_connector=getattr(args, "kv_transfer_config", None),
            kv_transfer=kv_transfer_from_args(args),
        )
    except (ValueError, OSError) as exc:
        return _error(args, exc)
    try:
        serve(server_config)
    except OSError as exc:  # address in use, unresolvable or foreign --host
        reason = exc.strerror or str(exc)
        return _error(args, ValueError(f"cannot listen on {args.host}:{args.port}: {reason}"))
    return 0


def _served_names(args: argparse.Namespace) -> tuple[str, ...]:
    names = getattr(args, "served_model_name", None)
    if isinstance(names, str):  # SGLang takes one name
        names = [names]
    return tuple(names or [args.model])


def _tokenizer(args: argparse.Namespace) -> int:
    from pathlib import Path

    from chunkpilot.engine.sim.hf_tokenizer import export, export_to_hub_cache
    from chunkpilot.engine.sim.profiles.loader import load_model

    try:
        model = load_model(args.model)
        max_len = args.max_model_len or model.max_position_embeddings
        if max_len < 1:
            raise ValueError(f"--max-model-len must be >= 1, got {max_len}")
        if args.out is not None:
            if args.name is not None:
                raise ValueError("--name applies to --hub-cache")
            written = export(Path(args.out), model.vocab_size, max_len)
        else:
            snapshot = export_to_hub_cache(
                Path(args.hub_cache), args.name or args.model, model.vocab_size, max_len
            )
            written = [snapshot]
    except (ValueError, OSError) as exc:
        return _error(args, exc)
    for path in written:
        print(path)
    return 0


def _bench(args: argparse.Namespace) -> int:
    from chunkpilot.engine.sim import bench  # numpy's linear algebra for the calibration: only here

    try:
        result = bench.run(bench.speed(args.trace, args.model, args.gpu, args.repeat, args.step_by_step))
    except (ValueError, OSError) as exc:
        return _error(args, exc)
    print(_json(result.to_dict()) if args.json else bench.format_result(result))
    return 0


def _json(data: dict[str, Any]) -> str:
    return json.dumps(_finite(data), indent=2)


def _finite(value: Any) -> Any:
    """NaN and infinities become null (strict JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _row(name: str, p: Any) -> str:
    return f"  {name:<6} p50 {p.p50:9.1f}  p90 {p.p90:9.1f}  p99 {p.p99:9.1f}  max {p.max:9.1f} ms"


def _format_summary(s: Summary) -> str:
    row = _row
    if isinstance(s, DisaggregatedSummary):
        return _format_pools(s)
    cfg = s.config
    return "\n".join(
        [
            f"{cfg.get('engine', 'vllm')}: {cfg.get('model')} on {cfg.get('tensor_parallel_size')} x "
            f"{cfg.get('accelerator')}, budget "
            f"{cfg.get('max_num_batched_tokens')}, max-num-seqs {cfg.get('max_num_seqs')}",
            f"  {s.completed}/{s.requests} requests over {s.duration_s:.1f} s simulated, {s.steps} steps, "
            f"{s.preemptions} preemptions, {s.decode_stall_steps} decode-stalled steps, "
            f"wall {s.wall_s:.2f} s",
            row("TTFT", s.ttft_ms),
            row("ITL", s.itl_ms),
            row("E2E", s.e2e_ms),
            f"  throughput {s.throughput_tok_s:.0f} output tok/s, "
            f"{s.request_throughput_req_s:.2f} req/s; goodput {s.goodput_req_s:.2f} req/s; "
            f"SLO attainment {s.slo_attainment:.1%}",
            f"  SLO (ITL p{s.slo.itl_quantile * 100:g} <= {s.slo.itl_ms:g} ms, "
            f"TTFT p{s.slo.ttft_quantile * 100:g} <= {s.slo.ttft_ms:g} ms): "
            f"ITL {s.itl_at_slo_quantile_ms:.1f} ms, TTFT {s.ttft_at_slo_quantile_ms:.1f} "
            f"ms -> {'met' if s.slo_met else 'MISSED'}",
        ]
    )


def _format_pools(s: DisaggregatedSummary) -> str:
    topo = s.topology
    lines = [f"{topo.get('topology')} on {topo.get('gpus')} GPUs"]
    if s.transfer_ms is not None and not math.isnan(s.transfer_ms.p50):
        link = topo.get("kv_transfer", {})
        lines[0] += (
            f", KV link {link.get('bandwidth_gbps'):g} GB/s + {link.get('latency_ms'):g} ms, "
            f"{s.kv_bytes_per_request / 2**20:.1f} MiB KV per request"
        )
    for pool in s.pools:
        knobs = topo.get(pool.role, {})
        lines.append(
            f"  {pool.role:<9} {pool.replicas} x budget {knobs.get('max_num_batched_tokens')}, max-num-seqs "
            f"{knobs.get('max_num_seqs')}: busy {pool.busy_fraction:.0%}, "
            f"{pool.tokens_per_step:.0f} tokens/step, KV mean {pool.kv_usage_mean:.1%} "
            f"peak {pool.kv_usage_peak:.1%}, {pool.steps} steps, {pool.preemptions} preemptions"
        )
    lines += [
        f"  {s.completed}/{s.requests} requests over {s.duration_s:.1f} s simulated, wall {s.wall_s:.2f} s",
        _row("TTFT", s.ttft_ms),
    ]
    if s.transfer_ms is not None and not math.isnan(s.transfer_ms.p50):
        lines += [_row("P-TTFT", s.prefill_ttft_ms), _row("KV", s.transfer_ms)]
    lines += [
        _row("ITL", s.itl_ms),
        _row("E2E", s.e2e_ms),
        f"  throughput {s.throughput_tok_s:.0f} output tok/s, {s.request_throughput_req_s:.2f} req/s; "
        f"goodput {s.goodput_req_s:.2f} req/s; SLO attainment {s.slo_attainment:.1%}",
        f"  SLO (ITL p{s.slo.itl_quantile * 100:g} <= {s.slo.itl_ms:g} ms, "
        f"TTFT p{s.slo.ttft_quantile * 100:g} <= {s.slo.ttft_ms:g} ms): "
        f"ITL {s.itl_at_slo_quantile_ms:.1f} ms, TTFT {s.ttft_at_slo_quantile_ms:.1f} "
        f"ms -> {'met' if s.slo_met else 'MISSED'}",
    ]
    return "\n".join(lines)
