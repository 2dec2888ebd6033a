"""``chunkpilot bench pool-sizing``: the planner's prefill and decode pools against a hidden truth.

A disaggregated service runs one prefill and one decode replica on a hidden **truth profile**
(as in ``chunkpilot bench disagg``: Llama-3.1-8B on a perturbed H100, ITL p99 <= 20 ms, TTFT p95
<= 400 ms, KV at 25 GB/s + 1 ms) and serves one workload mix (:data:`MIXES`). Its pools
serve one window at 70% of that layout's true capacity, and what their ``/metrics`` would show
(each pool's step telemetry, the decode pool's request lengths) is all the tuner is given: it
fits the pools' twin on that (the datasheet H100 as its prior, never the truth) and reads one
replica's capacity of each pool (:func:`chunkpilot.tuner.topology.sizing.pool_capacities`), then
sizes each pool for rates of 0.25, 0.75, 1.5 and 3 times that layout's true capacity with the
operator's planner (:func:`chunkpilot.tuner.planner.needed_replicas`, its 10% headroom, and each
pool's error as the operator reads it: the prefill pool's own TTFT and the decode pool's ITL on the
twin against the observed window's). Each sizing is judged on the truth: a simulation of the sized
layout at that rate, both SLO quantiles; beside it, found on the truth with the same 10% headroom
(at 1.1 times the rate):

* the **truth's fewest**: the fewest replicas of any P:D split that meets both SLOs (every split
  of 2, 3, ... replicas simulated), and
* a **fixed ratio**: the fewest ``m`` prefill + ``m`` decode replicas that meet them (a service
  scaled as a whole, its declared 1:1 ratio kept).

The mixes (chat, chat with 30% summarisation prompts, code completion) ask whether the P:D ratio
follows the workload. For the **proposal** of the other topology, the truth's best colocated budget
(sustained capacity per replica, three minutes of arrivals) is given to the twin as the service's
colocated knobs; the colocated replicas the twin would plan are set beside those the truth needs,
and the proposal the planner makes (colocated instead of the pools, or none) is reported.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from chunkpilot.api import ScalingMode, ScalingSpec
from chunkpilot.bench.command import given_options, run_bench_command
from chunkpilot.bench.disagg import bimodal_workload
from chunkpilot.bench.disagg_truth import DATASHEET, MAX_MODEL_LEN, MODEL, scheduler_with, truth_path
from chunkpilot.bench.exhaustive import BenchError
from chunkpilot.bench.twin_truth import family, truth_engine
from chunkpilot.bench.twin_validate import observe_window
from chunkpilot.engine.sim.capacity import find_capacity, retime
from chunkpilot.engine.sim.disagg import KVTransfer, simulate_disaggregated
from chunkpilot.engine.sim.engine import SimConfig
from chunkpilot.engine.sim.metrics import StepTelemetry
from chunkpilot.engine.sim.offline import SLO
from chunkpilot.engine.sim.scheduler import SchedulerConfig
from chunkpilot.engine.sim.workload import Workload, load_trace
from chunkpilot.tuner.decide.scaling import PROPOSE_AT, colocated_proposal
from chunkpilot.tuner.planner import DEFAULT_ERROR, Capacity, capacity_of, needed_replicas, replicas_for
from chunkpilot.tuner.space import TunedConfig
from chunkpilot.tuner.topology.layouts import Layout, Pool
from chunkpilot.tuner.topology.simulate import sim_evaluator, tiled, topology_of
from chunkpilot.tuner.topology.sizing import MeasuredPools, PoolSizingRequest, pool_capacities
from chunkpilot.tuner.twin.search import SUSTAINED_S

__all__ = ["POOL_SIZING_FULL", "POOL_SIZING_QUICK", "PoolSizingSettings", "run_pool_sizing_benchmark"]


@dataclass(frozen=True)
class PoolSizingSettings:
    """Sizes of one run."""

    truth: str = "h100-c075-m085-o2"
    mixes: tuple[str, ...] = ("chat", "chat+summaries", "code")
    #: Rates sized for, in multiples of the running 1 + 1 layout's true capacity.
    loads: tuple[float, ...] = (0.25, 0.75, 1.5, 3.0)
    itl_ms: float = 20.0
    ttft_ms: float = 400.0
    prefill_budget: int = 8192
    decode_budget: int = 2048
    max_num_seqs: int = 128
    bandwidth_gbps: float = 25.0
    latency_ms: float = 1.0
    #: Requests of every simulation on the truth (the same stretch of the mix at every rate, so a
    #: larger layout is not judged over a longer horizon); the twin probes as the operator does.
    requests: int = 2000
    #: The observed window: this share of the running layout's true capacity, this many requests.
    observed_load: float = 0.7
    observed_requests: int = 600
    headroom: float = 0.1
    max_replicas: int = 12
    #: The colocated budgets the truth's best is searched over (``max_num_seqs`` as the pools'):
    #: the service's colocated knobs, which the twin reads too, for the proposal.
    colocated_budgets: tuple[int, ...] = (256, 320, 384, 512, 768)
    tolerance: float = 0.05
    jobs: int = 2
    seed: int = 0

    def __post_init__(self) -> None:
        unknown = [m for m in self.mixes if m not in MIXES]
        if not self.mixes or unknown:
            raise BenchError(f"--mix: one of {', '.join(MIXES)} (got {', '.join(unknown) or 'none'})")
        if not self.loads or any(not x > 0 for x in self.loads):
            raise BenchError("--load: each load must be a positive multiple of the running layout's capacity")
        if self.requests < 100:
            raise BenchError("--requests: at least 100 requests a simulation")
        if self.truth not in family() and not Path(self.truth).is_file():
            raise BenchError(f"--truth-gpu: {self.truth} is neither a shipped truth nor a file")

    @property
    def slo(self) -> SLO:
        return SLO(self.itl_ms, 0.99, self.ttft_ms, 0.95)

    @property
    def kv(self) -> KVTransfer:
        return KVTransfer(self.bandwidth_gbps, self.latency_ms)

    def layout(self, prefill: int, decode: int) -> Layout:
        """The pools with this run's knobs."""
        seqs = self.max_num_seqs
        return Layout(Pool(prefill, self.prefill_budget, seqs), Pool(decode, self.decode_budget, seqs))


#: The workload mixes: a trace, and the share of summarisation prompts mixed into it.
MIXES: dict[str, tuple[str, float]] = {
    "chat": ("azure_conv_2023", 0.0),
    "chat+summaries": ("azure_conv_2023", 0.3),
    "code": ("azure_code_2023", 0.0),
}


def mix_workload(name: str, count: int, seed: int = 0) -> Workload:
    """``count`` requests of the mix ``name`` (:data:`MIXES`), in the trace's order, one a second."""
    trace, share = MIXES[name]
    if share > 0:
        return bimodal_workload(count, share, seed)
    return retime(load_trace(trace, rate=1.0, limit=count), 1.0, seed)


POOL_SIZING_FULL = PoolSizingSettings()
POOL_SIZING_QUICK = PoolSizingSettings(
    mixes=("chat", "code"), loads=(1.5,), requests=600, observed_requests=300, colocated_budgets=(320,)
)


@dataclass(frozen=True)
class Sizing:
    """One rate: the planner's pools on the twin, judged on the truth, beside the truth's answers."""

    load: float
    rate_req_s: float
    prefill: int
    decode: int
    met: bool
    itl_ms: float
    ttft_ms: float
    #: The fewest replicas of any split meeting both SLOs on the truth, and the splits that do.
    fewest: int | None
    fewest_splits: tuple[tuple[int, int], ...]
    #: The fewest m + m replicas meeting both SLOs on the truth.
    fixed_ratio: int | None
    #: Colocated replicas of the best budget: as the twin sizes them, and as the truth needs them
    #: (at 1.1 times the rate, each sustaining the truth's capacity); the topology the planner
    #: proposes instead of the pools ("": none).
    colocated_twin: int | None = None
    colocated_truth: int | None = None
    proposed: str = ""

    @property
    def replicas(self) -> int:
        return self.prefill + self.decode

    @property
    def colocated_wins(self) -> bool:
        """The truth's colocated replicas are as far below its fewest pools as a proposal asks."""
        truth, pools = self.colocated_truth, self.fewest
        return truth is not None and pools is not None and truth <= pools * PROPOSE_AT and truth < pools

    @property
    def twin_fixed_ratio(self) -> int:
        """What the same planner on the same twin sizes when the declared 1:1 ratio is kept (the
        service scaled as a whole): as many of each pool as the scarcer one needs."""
        return 2 * max(self.prefill, self.decode)


@dataclass(frozen=True)
class MixResult:
    """One workload mix: the twin's per-replica capacities and each rate's sizing."""

    mix: str
    mean_prompt_tokens: float
    mean_output_tokens: float
    running_true_req_s: float
    prefill_req_s: float
    decode_req_s: float
    fit: str
    sizings: tuple[Sizing, ...]
    cpu_s: float
    #: The best colocated budget on the truth, one replica's sustained capacity there and on the twin.
    colocated_budget: int = 0
    colocated_true_req_s: float = 0.0
    colocated_twin_req_s: float | None = None
    #: The twin's error on the running 1 + 1 pools' own quantiles (prefill TTFT, decode ITL), read
    #: as the operator reads it and planned with (None: nothing compared).
    prefill_error: float | None = None
    decode_error: float | None = None


@dataclass(frozen=True)
class PoolSizingResult:
    """The whole run."""

    settings: PoolSizingSettings
    mixes: tuple[MixResult, ...]
    wall_s: float
    cpu_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        mixes = []
        for mix in self.mixes:
            entry = asdict(mix)
            for sizing, out in zip(mix.sizings, entry["sizings"], strict=True):
                out["replicas"] = sizing.replicas
                out["twin_fixed_ratio"] = sizing.twin_fixed_ratio
                out["x_fewest"] = round(sizing.replicas / sizing.fewest, 3) if sizing.fewest else None
            mixes.append(entry)
        sizings = [s for m in self.mixes for s in m.sizings]
        return {
            "settings": asdict(self.settings),
            "mixes": mixes,
            "summary": {
                "sizings": len(sizings),
                "met": sum(s.met for s in sizings),
                "at_fewest": sum(s.fewest is not None and s.replicas <= s.fewest for s in sizings),
                "replicas": sum(s.replicas for s in sizings),
                "twin_fixed_ratio_replicas": sum(s.twin_fixed_ratio for s in sizings),
                "fewest_replicas": sum(s.fewest or 0 for s in sizings),
                "fixed_ratio_replicas": sum(s.fixed_ratio or 0 for s in sizings),
                "proposals": sum(bool(s.proposed) for s in sizings),
                "proposals_the_truth_agrees_with": sum(
                    bool(s.proposed) and s.colocated_wins for s in sizings
                ),
                "proposals_missed": sum(not s.proposed and s.colocated_wins for s in sizings),
            },
            "wall_s": round(self.wall_s, 1),
        }


def _meets(
    truth: SimConfig, lengths: Workload, settings: PoolSizingSettings, layout: Layout, rate: float
) -> tuple[bool, float, float]:
    """Both SLO quantiles of ``layout`` at ``rate`` on the truth (met, ITL ms, TTFT ms)."""
    arrivals = retime(tiled(lengths, settings.requests), rate, settings.seed)
    summary = simulate_disaggregated(topology_of(truth, layout, settings.kv), arrivals, settings.slo)
    itl, ttft = summary.itl_at_slo_quantile_ms, summary.ttft_at_slo_quantile_ms
    return itl <= settings.itl_ms and ttft <= settings.ttft_ms, itl, ttft


def _truth_fewest(
    truth: SimConfig, lengths: Workload, settings: PoolSizingSettings, rate: float, start: int
) -> tuple[int | None, tuple[tuple[int, int], ...]]:
    """The fewest replicas (from ``start``) of any split meeting both SLOs at ``rate`` on the truth."""
    for total in range(max(2, start), 2 * settings.max_replicas + 1):
        met = tuple(
            (p, total - p)
            for p in range(1, total)
            if p <= settings.max_replicas
            and total - p <= settings.max_replicas
            and _meets(truth, lengths, settings, settings.layout(p, total - p), rate)[0]
        )
        if met:
            return total, met
    return None, ()


def _fixed_ratio(
    truth: SimConfig, lengths: Workload, settings: PoolSizingSettings, rate: float, start: int
) -> int | None:
    """The fewest m + m replicas meeting both SLOs at ``rate`` on the truth (from ``start`` each)."""
    for m in range(max(1, start), settings.max_replicas + 1):
        if _meets(truth, lengths, settings, settings.layout(m, m), rate)[0]:
            return 2 * m
    return None


def _run_mix(settings: PoolSizingSettings, mix: str) -> MixResult:
    """Observe the running 1 + 1 pools on the truth, fit the twin, size each rate, judge on the truth."""
    started = time.process_time()
    lengths = mix_workload(mix, max(settings.observed_requests, settings.requests), settings.seed)
    with tempfile.TemporaryDirectory(prefix="bench-pool-sizing-") as tmp:
        root = Path(tmp)
        scheduler = SchedulerConfig(max_num_seqs=settings.max_num_seqs, max_model_len=MAX_MODEL_LEN)
        truth = truth_engine(truth_path(settings.truth), root / "truth", model=MODEL, scheduler=scheduler)
        running = settings.layout(1, 1)
        evaluate = sim_evaluator(
            truth,
            lengths,
            settings.slo,
            settings.kv,
            requests_per_replica=settings.requests // 2,
            tolerance=settings.tolerance,
        )
        unit = evaluate(running).capacity_req_s
        if not unit > 0:
            raise BenchError(f"the running 1 + 1 layout meets the SLOs at no rate on {settings.truth}")
        telemetry = {"prefill": StepTelemetry(), "decode": StepTelemetry()}
        window = retime(
            tiled(lengths, settings.observed_requests), settings.observed_load * unit, settings.seed + 1
        )
        observed = simulate_disaggregated(
            topology_of(truth, running, settings.kv),
            window,
            settings.slo,
            keep_records=True,
            telemetry=telemetry,
        )
        colocated = {
            budget: find_capacity(
                replace(truth, scheduler=scheduler_with(truth.scheduler, budget, settings.max_num_seqs)),
                lengths,
                settings.slo,
                tolerance=settings.tolerance,
                seed=settings.seed,
                min_duration_s=SUSTAINED_S,
            ).capacity_req_s
            for budget in settings.colocated_budgets
        }
        budget = max(colocated, key=lambda b: colocated[b])
        sizes = pool_capacities(
            PoolSizingRequest(
                key="bench",
                model=MODEL,
                accelerator=DATASHEET,
                tensor_parallel_size=1,
                max_model_len=MAX_MODEL_LEN,
                gpu_memory_utilization=truth.gpu_memory_utilization,
                steps_by_role={role: t.totals() for role, t in telemetry.items()},
                workload=observe_window(observed, MAX_MODEL_LEN),
                layout=running,
                slo=settings.slo,
                kv_bandwidth_gbps=settings.bandwidth_gbps,
                kv_latency_ms=settings.latency_ms,
                seed=settings.seed,
                directory=str(root / "twin"),
                colocated=TunedConfig(budget, min(settings.max_num_seqs, budget)),
                measured=MeasuredPools(
                    settings.observed_load * unit,
                    running.prefill.replicas,
                    running.decode.replicas,
                    observed.prefill_ttft_at_slo_quantile_ms,
                    observed.itl_at_slo_quantile_ms,
                ),
            )
        )
        errors = {role: sizes.error(role) for role in ("prefill", "decode")}
        spec = ScalingSpec(
            mode=ScalingMode.ADVISE, max_replicas=settings.max_replicas, headroom=settings.headroom
        )
        sizings = []
        for load in settings.loads:
            rate = load * unit
            planned = rate * (1 + settings.headroom)
            prefill = needed_replicas(planned, capacity_of(sizes.prefill_req_s, errors["prefill"]), spec)
            decode = needed_replicas(planned, capacity_of(sizes.decode_req_s, errors["decode"]), spec)
            met, itl, ttft = _meets(truth, lengths, settings, settings.layout(prefill, decode), rate)
            served = rate * (1 + settings.headroom)
            fewest, splits = _truth_fewest(truth, lengths, settings, served, max(2, math.ceil(load)))
            fixed = _fixed_ratio(truth, lengths, settings, served, max(1, (fewest or 2) // 2))
            twin_colocated = (
                replicas_for(planned, Capacity(sizes.colocated_req_s, DEFAULT_ERROR))
                if sizes.colocated_req_s
                else None
            )
            true_colocated = math.ceil(served / colocated[budget] - 1e-9) if colocated[budget] > 0 else None
            proposal = colocated_proposal(planned, prefill + decode, DEFAULT_ERROR, sizes.colocated_req_s)
            sizings.append(
                Sizing(
                    load,
                    round(rate, 3),
                    prefill,
                    decode,
                    met,
                    round(itl, 1),
                    round(ttft, 1),
                    fewest,
                    splits,
                    fixed,
                    twin_colocated,
                    true_colocated,
                    proposal.topology if proposal is not None else "",
                )
            )
    prompts = [r.prompt_tokens for r in lengths.requests]
    outputs = [r.output_tokens for r in lengths.requests]
    return MixResult(
        mix=mix,
        mean_prompt_tokens=round(sum(prompts) / len(prompts), 1),
        mean_output_tokens=round(sum(outputs) / len(outputs), 1),
        running_true_req_s=round(unit, 3),
        prefill_req_s=round(sizes.prefill_req_s, 3),
        decode_req_s=round(sizes.decode_req_s, 3),
        fit="; ".join(p.describe() for p in sizes.pools),
        sizings=tuple(sizings),
        cpu_s=round(time.process_time() - started, 1),
        colocated_budget=budget,
        colocated_true_req_s=round(colocated[budget], 3),
        colocated_twin_req_s=round(sizes.colocated_req_s, 3) if sizes.colocated_req_s else None,
        prefill_error=_rounded(errors["prefill"]),
        decode_error=_rounded(errors["decode"]),
    )


def _rounded(value: float | None) -> float | None:
    return round(value, 4) if value is not None else None


def run_pool_sizing_benchmark(
    settings: PoolSizingSettings = POOL_SIZING_FULL, progress: Callable[[str], None] = lambda _msg: None
) -> PoolSizingResult:
    """Every mix (in ``settings.jobs`` processes): the twin's pool sizing against the truth's."""
    started = time.perf_counter()
    progress(
        f"{len(settings.mixes)} mixes x {len(settings.loads)} rates on {settings.truth}, "
        f"{settings.jobs} process(es)"
    )
    names: Sequence[str] = settings.mixes
    if settings.jobs > 1:
        with ProcessPoolExecutor(max_workers=settings.jobs) as pool:
            mixes = list(pool.map(_run_mix, [settings] * len(names), names))
    else:
        mixes = [_run_mix(settings, name) for name in names]
    for mix in mixes:
        progress(f"{mix.mix}: done in {mix.cpu_s:.0f} CPU s")
    return PoolSizingResult(
        settings, tuple(mixes), time.perf_counter() - started, sum(m.cpu_s for m in mixes)
    )


def _number(value: float | None, spec: str = "g") -> str:
    return "none" if value is None else format(value, spec)


def format_pool_sizing_table(result: PoolSizingResult) -> str:
    """The Markdown tables docs/benchmarks.md shows."""
    lines = [
        "| mix | mean prompt / output | 1+1 true req/s | twin: one prefill / decode replica req/s | "
        "twin's error: prefill TTFT / decode ITL | colocated budget: one replica true / twin req/s |",
        "|---|---|---:|---|---|---|",
    ]
    for mix in result.mixes:
        lines.append(
            f"| {mix.mix} | {mix.mean_prompt_tokens:,.0f} / {mix.mean_output_tokens:,.0f} | "
            f"{mix.running_true_req_s:.2f} | {mix.prefill_req_s:.2f} / {mix.decode_req_s:.2f} | "
            f"{_number(mix.prefill_error, '.1%')} / {_number(mix.decode_error, '.1%')} | "
            f"{mix.colocated_budget}: {mix.colocated_true_req_s:.2f} / "
            f"{_number(mix.colocated_twin_req_s, '.2f')} |"
        )
    lines += [
        "",
        "| mix | rate (x 1+1) | req/s | twin sizes P + D | on the truth: ITL / TTFT ms | met | "
        "twin at 1:1 | truth's fewest (splits) | truth's fewest at 1:1 | colocated: twin / truth | "
        "proposed |",
        "|---|---:|---:|---|---|---|---:|---|---:|---|---|",
    ]
    for mix in result.mixes:
        for s in mix.sizings:
            splits = ", ".join(f"{p}+{d}" for p, d in s.fewest_splits) or "none"
            fewest = f"{s.fewest} ({splits})" if s.fewest is not None else "none within the bound"
            fixed = str(s.fixed_ratio) if s.fixed_ratio is not None else "none"
            lines.append(
                f"| {mix.mix} | {s.load:g} | {s.rate_req_s:.2f} | {s.prefill} + {s.decode} = "
                f"{s.replicas} | {s.itl_ms:.1f} / {s.ttft_ms:.0f} | {'yes' if s.met else 'no'} | "
                f"{s.twin_fixed_ratio} | {fewest} | {fixed} | {_number(s.colocated_twin)} / "
                f"{_number(s.colocated_truth)} | {s.proposed or '-'} |"
            )
    summary = result.to_dict()["summary"]
    lines += [
        "",
        f"{summary['met']} of {summary['sizings']} sizings meet both SLOs on the truth; "
        f"{summary['replicas']} replicas in all ({summary['twin_fixed_ratio_replicas']} with the ratio "
        f"kept at 1:1), against the truth's fewest {summary['fewest_replicas']} "
        f"({summary['fixed_ratio_replicas']} at 1:1); {summary['proposals']} colocated proposal(s), "
        f"{summary['proposals_the_truth_agrees_with']} of them where the truth's colocated replicas are "
        f"that far below its fewest pools, {summary['proposals_missed']} such sizing(s) without one "
        f"({result.wall_s:.0f} s wall, {result.cpu_s:.0f} CPU s).",
    ]
    return "\n".join(lines)


# --------------------------------------------------------------------------- command line


def register(benchmarks: Any) -> None:
    """Add ``chunkpilot bench pool-sizing`` to the ``bench`` sub-commands."""
    parser = benchmarks.add_parser(
        "pool-sizing",
        help="the planner's prefill and decode pools for a disaggregated service, against a hidden truth",
        description=(
            "Fit the pools' twin on what one prefill and one decode replica of a hidden truth show, size "
            "each pool for rates of 1-3 times their capacity with the operator's planner, and judge each "
            "sizing on the truth against the fewest replicas of any split and of a fixed 1:1 ratio."
        ),
    )
    parser.add_argument(
        "--truth-gpu", metavar="FILE", default=None, help="accelerator profile JSON of the truth"
    )
    parser.add_argument(
        "--mix",
        action="append",
        default=None,
        choices=sorted(MIXES),
        help="a workload mix (repeatable; default all three)",
    )
    parser.add_argument(
        "--load",
        type=float,
        action="append",
        default=None,
        help="a rate to size for, in multiples of the 1 + 1 layout's true capacity (repeatable; default "
        "0.25 0.75 1.5 3)",
    )
    parser.add_argument(
        "--requests", type=int, default=None, help="requests of each simulation on the truth (default 2000)"
    )
    parser.add_argument("--jobs", type=int, default=None, help="simulator processes (default 2)")
    parser.add_argument("--quick", action="store_true", help="two mixes, one rate, fewer requests")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    parser.set_defaults(func=run_pool_sizing_command)


def settings_from(args: Any) -> PoolSizingSettings:
    """The run's settings from the command line (raises :class:`BenchError` naming the option)."""
    base = POOL_SIZING_QUICK if args.quick else POOL_SIZING_FULL
    changes = given_options(
        truth=args.truth_gpu,
        mixes=tuple(args.mix) if args.mix else None,
        loads=tuple(args.load) if args.load else None,
        requests=args.requests,
        jobs=args.jobs,
    )
    return replace(base, **changes)


def run_pool_sizing_command(args: Any) -> int:
    """Run the benchmark and print its tables (or JSON)."""
    return run_bench_command(
        "pool-sizing", args, settings_from, run_pool_sizing_benchmark, format_pool_sizing_table
    )
