"""``chunkpilot bench disagg``: colocated chunked prefill vs prefill/decode disaggregation, same GPUs.

The workload is bimodal: short chat requests (``azure_conv_2023``) mixed with long summarisation
prompts (``arxiv_summarization_lengths``), Poisson arrivals. The engine's hardware is a hidden
**truth profile** (one of the perturbed H100 profiles of :mod:`chunkpilot.bench.twin_truth`); every
capacity called *true* is the simulator's capacity search on that truth:

* **colocated**: the best per-replica capacity at SLO over a grid of budgets, times the GPUs
  (requests spread evenly over the replicas);
* **disaggregated**: the best layout of the same GPUs (every P:D split, then each pool's knobs:
  :func:`chunkpilot.tuner.topology.layouts.search_topologies`), the KV cache shipped at the bandwidth given;
* the **target load** is 80 % of the best disaggregated capacity: the colocated optimum's
  quantiles there show what it misses.

The **recommendation** is the tuner's: a twin fitted to the truth's step telemetry under one
window of the stable config (the datasheet as its prior, never the truth), the captured workload,
and :func:`chunkpilot.tuner.decide.recommendation.recommend`; its predicted capacity is compared with the true
capacity of the layout it recommends. The **bandwidth sweep** re-evaluates every split with the best
pool knobs on the truth at each KV bandwidth (where disaggregation stops paying), and the **low
volume** rows repeat the comparison on fewer GPUs. Truth and twin use the same requests per replica,
so the short horizon's optimism cancels.

The capacity searches on the truth live in :mod:`chunkpilot.bench.disagg_truth`, the results
and their tables in :mod:`chunkpilot.bench.disagg_report`.
"""

from __future__ import annotations

import math
import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from chunkpilot.bench.command import given_options, run_bench_command
from chunkpilot.bench.disagg_report import (
    TARGET_SHARE,
    Comparison,
    DisaggResult,
    finite_or_none,
    format_disagg_markdown,
    format_disagg_table,
)
from chunkpilot.bench.disagg_settings import DISAGG_FULL, DISAGG_QUICK, DisaggSettings
from chunkpilot.bench.disagg_truth import (
    MAX_MODEL_LEN,
    MODEL,
    CapacityJob,
    JobPool,
    LayoutsOnTruth,
    best_colocated,
    compare,
    comparison,
    evaluate_layouts,
    fit_twin,
    scheduler_with,
    split_layouts,
    truth_path,
)
from chunkpilot.bench.twin_truth import truth_engine
from chunkpilot.engine.sim.capacity import retime
from chunkpilot.engine.sim.disagg import KVTransfer, simulate_disaggregated
from chunkpilot.engine.sim.offline import simulate
from chunkpilot.engine.sim.profiles.loader import load_model
from chunkpilot.engine.sim.scheduler import SchedulerConfig
from chunkpilot.engine.sim.workload import Workload, load_trace
from chunkpilot.tuner.space import TunedConfig
from chunkpilot.tuner.topology.layouts import (
    PREFILL_BUDGETS,
    Layout,
    LayoutCapacity,
    Pool,
    search_topologies,
    splits,
)
from chunkpilot.tuner.topology.recommend import RecommendRequest, recommend
from chunkpilot.tuner.topology.simulate import tiled, topology_of

__all__ = [
    "DISAGG_FULL",
    "DISAGG_QUICK",
    "DisaggResult",
    "DisaggSettings",
    "bimodal_workload",
    "format_disagg_markdown",
    "format_disagg_table",
    "run_disagg_benchmark",
]


def bimodal_workload(count: int, long_share: float, seed: int = 0) -> Workload:
    """``count`` requests: chat lengths, a ``long_share`` of them summarisation prompts, in random order."""
    chat = load_trace("azure_conv_2023", rate=1.0, limit=count).requests
    long = load_trace("arxiv_summarization_lengths", rate=1.0, limit=count).requests
    rng = random.Random(seed)
    picked = []
    c = s = 0
    for _ in range(count):
        if rng.random() < long_share:
            picked.append(long[s])
            s += 1
        else:
            picked.append(chat[c])
            c += 1
    return retime(Workload("bimodal", tuple(picked)), 1.0, seed)


# --------------------------------------------------------------------------- the run


def _quantiles(summary_itl: float, summary_ttft: float) -> dict[str, float]:
    return {"itl_ms": round(summary_itl, 1), "ttft_ms": round(summary_ttft, 1)}


def _workload(settings: DisaggSettings) -> tuple[Workload, float, float]:
    """The run's request lengths, their mean prompt (tokens) and its KV cache (MB per request)."""
    lengths = bimodal_workload(
        max(settings.requests * max((settings.gpus, *settings.low_gpus)), 400),
        settings.long_share,
        settings.seed,
    )
    prompts = [r.prompt_tokens for r in lengths.requests]
    mean_prompt = sum(prompts) / len(prompts)
    return lengths, mean_prompt, load_model(MODEL).kv_bytes_per_token * mean_prompt / 1e6


def _base_job(settings: DisaggSettings, lengths: Workload, root: Path) -> CapacityJob:
    """The capacity search every probe starts from: the truth engine (files under ``root``), the KV hop."""
    base_sched = SchedulerConfig(max_num_seqs=settings.max_num_seqs, max_model_len=MAX_MODEL_LEN)
    truth = truth_engine(truth_path(settings.truth), root / "truth", model=MODEL, scheduler=base_sched)
    return CapacityJob(
        truth,
        lengths,
        settings.slo,
        settings.tolerance,
        kv=KVTransfer(settings.bandwidth_gbps, settings.latency_ms),
        requests=settings.requests,
        colocated_requests=settings.colocated_requests,
    )


def _search_disaggregated(
    pool: JobPool, on_truth: LayoutsOnTruth, settings: DisaggSettings
) -> LayoutCapacity:
    """The best layout of the GPUs on the truth (its results stay in ``on_truth.known``)."""
    # The search's first stage (every split, default knobs) in parallel; the rest in order.
    seqs = settings.max_num_seqs
    first = [
        Layout(Pool(p, PREFILL_BUDGETS[0], seqs), Pool(d, max(settings.stable_budget, seqs), seqs))
        for p, d in splits(settings.gpus)
    ]
    on_truth.known.update((r.layout, r) for r in evaluate_layouts(pool, on_truth.base, first))
    search = search_topologies(
        on_truth,
        settings.gpus,
        decode_seqs=settings.max_num_seqs,
        decode_budget=settings.stable_budget,
        cpu_budget_s=math.inf,
        max_evaluations=100 if settings.truth_knobs else len(first),
    )
    best = search.best
    assert best is not None
    return best


def _at_target(
    base: CapacityJob, settings: DisaggSettings, best: LayoutCapacity, target: float
) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """At the target load: each colocated budget's quantiles, and the best layout's."""
    truth, slo, seed = base.truth, settings.slo, settings.seed
    per_replica = target / settings.gpus
    colocated = {
        budget: simulate(
            replace(truth, scheduler=scheduler_with(truth.scheduler, budget, settings.max_num_seqs)),
            retime(tiled(base.lengths, settings.colocated_requests), per_replica, seed),
            slo,
        )
        for budget in settings.budgets
    }
    disaggregated = simulate_disaggregated(
        topology_of(truth, best.layout, KVTransfer(settings.bandwidth_gbps, settings.latency_ms)),
        retime(tiled(base.lengths, settings.requests * best.layout.replicas), target, seed),
        slo,
    )
    return (
        {
            str(b): _quantiles(m.itl_at_slo_quantile_ms, m.ttft_at_slo_quantile_ms)
            for b, m in colocated.items()
        },
        _quantiles(disaggregated.itl_at_slo_quantile_ms, disaggregated.ttft_at_slo_quantile_ms),
    )


def _recommendation(
    on_truth: LayoutsOnTruth,
    settings: DisaggSettings,
    rate: float,
    root: Path,
    best: LayoutCapacity,
    headline: Comparison,
) -> dict[str, Any]:
    """The twin's recommendation at the live per-replica ``rate``, against the truth."""
    base = on_truth.base
    twin = fit_twin(base.truth, base.lengths, settings, rate, root)
    job = RecommendRequest(
        key="bench",
        twin=twin,
        slo=settings.slo,
        replicas=settings.gpus,
        max_model_len=MAX_MODEL_LEN,
        decode_seqs=settings.max_num_seqs,
        decode_budget=settings.stable_budget,
        kv_bandwidth_gbps=settings.bandwidth_gbps,
        kv_latency_ms=settings.latency_ms,
        cpu_budget_s=settings.twin_cpu_s,
        colocated=tuple(TunedConfig(b, min(settings.max_num_seqs, b)) for b in settings.budgets),
        requests_per_replica=settings.requests,
        colocated_requests=settings.colocated_requests,
        tolerance=settings.tolerance,
    )
    twin_cpu = time.process_time()
    advice = recommend(job)
    twin_cpu = time.process_time() - twin_cpu
    advised = advice.best
    true_of_advised = on_truth(advised.layout).capacity_req_s if advised is not None else math.nan
    return {
        "topology": advised.layout.describe() if advised else None,
        "knobs": advised.layout.knobs() if advised else None,
        "predicted_req_s": advised.capacity_req_s if advised else None,
        "true_req_s": true_of_advised,
        "error": finite_or_none(advised.capacity_req_s / true_of_advised - 1)
        if advised and true_of_advised > 0
        else None,
        "share_of_true_best": finite_or_none(true_of_advised / best.capacity_req_s),
        "predicted_colocated_req_s": advice.colocated_req_s,
        "true_colocated_req_s": headline.colocated_req_s,
        "pays": advice.pays,
        "evaluations": advice.search.evaluations,
        "cpu_s": round(twin_cpu, 1),
        "fitted_scales": {
            "compute": round(twin.fit.scales.compute, 3),
            "memory": round(twin.fit.scales.memory, 3),
            "overhead": round(twin.fit.scales.step_overhead, 3),
        },
    }


def _sweeps(
    pool: JobPool,
    on_truth: LayoutsOnTruth,
    settings: DisaggSettings,
    colocated: tuple[float, int],
    template: Layout,
    progress: Callable[[str], None],
) -> tuple[tuple[Comparison, ...], tuple[Comparison, ...]]:
    """Every split with ``template``'s pool knobs at each KV bandwidth, then on fewer GPUs."""
    base, gpus = on_truth.base, settings.gpus
    progress(f"bandwidth sweep: {len(settings.sweep_gbps)} KV bandwidths x {len(splits(gpus))} splits")
    sweep = tuple(
        compare(pool, base, gpus, bw, colocated, split_layouts(template, gpus), on_truth.known)
        for bw in settings.sweep_gbps
    )
    low = []
    for fewer in settings.low_gpus:
        progress(f"low volume: {fewer} GPUs")
        low.append(
            compare(pool, base, fewer, settings.bandwidth_gbps, colocated, split_layouts(template, fewer))
        )
    return sweep, tuple(low)


def run_disagg_benchmark(
    settings: DisaggSettings = DISAGG_FULL, progress: Callable[[str], None] = lambda _msg: None
) -> DisaggResult:
    """Run the comparison, the twin's recommendation and the sweeps."""
    started_wall, started_cpu = time.perf_counter(), time.process_time()
    lengths, mean_prompt, kv_mb = _workload(settings)
    pool = JobPool(settings.jobs)
    with tempfile.TemporaryDirectory(prefix="bench-disagg-") as tmp:
        root = Path(tmp)
        on_truth = LayoutsOnTruth(_base_job(settings, lengths, root))
        try:
            progress(f"colocated: {len(settings.budgets)} budgets on the truth")
            colocated = best_colocated(pool, on_truth.base, settings.budgets)
            progress(f"disaggregated: layouts of {settings.gpus} GPUs on the truth")
            best = _search_disaggregated(pool, on_truth, settings)
            headline = comparison(settings.gpus, settings.bandwidth_gbps, colocated, best)
            target = TARGET_SHARE * best.capacity_req_s
            colocated_at, disaggregated_at = _at_target(on_truth.base, settings, best, target)
            progress("twin: fit on one window of the stable config, then its recommendation")
            recommendation = _recommendation(on_truth, settings, target / settings.gpus, root, best, headline)
            sweep, low = _sweeps(pool, on_truth, settings, colocated, best.layout, progress)
        finally:
            pool.close()
    return DisaggResult(
        settings=settings,
        mean_prompt_tokens=mean_prompt,
        kv_mb_per_request=kv_mb,
        headline=headline,
        target_req_s=target,
        colocated_at_target=colocated_at,
        disaggregated_at_target=disaggregated_at,
        recommendation=recommendation,
        sweep=sweep,
        low_volume=low,
        cpu_s=time.process_time() - started_cpu,
        wall_s=time.perf_counter() - started_wall,
    )


# --------------------------------------------------------------------------- command line


def register(benchmarks: Any) -> None:
    """Add ``chunkpilot bench disagg`` to the ``bench`` sub-commands."""
    parser = benchmarks.add_parser(
        "disagg",
        help="colocated chunked prefill vs prefill/decode disaggregation on the same GPUs, against a hidden "
        "hardware truth, with the twin's recommendation and a KV-bandwidth sweep",
        description=(
            "A bimodal workload (chat + long summarisation prompts): true capacity at SLO of the best "
            "colocated budget and of the best prefill/decode split of the same GPUs, measured by the "
            "simulator on a hidden truth profile; the twin's recommendation (predicted vs true); how the "
            "comparison changes with the KV-transfer bandwidth and with fewer GPUs."
        ),
    )
    parser.add_argument(
        "--truth-gpu", metavar="FILE", default=None, help="accelerator profile JSON of the truth"
    )
    parser.add_argument(
        "--gpus", type=int, default=None, help="GPUs (replicas) of both topologies (default 4)"
    )
    parser.add_argument(
        "--bandwidth",
        metavar="GBPS",
        type=float,
        action="append",
        default=None,
        help="KV-transfer bandwidth of the sweep, GB/s (repeatable; default 100 25 10 5 2 1 0.5)",
    )
    parser.add_argument("--itl-ms", type=float, default=None, help="ITL p99 target (default 20)")
    parser.add_argument("--ttft-ms", type=float, default=None, help="TTFT p95 target (default 400)")
    parser.add_argument(
        "--long-share", type=float, default=None, help="share of summarisation prompts (default 0.3)"
    )
    parser.add_argument(
        "--requests", type=int, default=None, help="requests per replica per probe (default 200 / 60 quick)"
    )
    parser.add_argument("--jobs", type=int, default=None, help="simulator processes (default 2)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="fewer requests, budgets and bandwidths (about a minute on 2 cores)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    parser.set_defaults(func=run_disagg_command)


def settings_from(args: Any) -> DisaggSettings:
    """The run's settings from the command line (raises :class:`BenchError` naming the option)."""
    base = DISAGG_QUICK if args.quick else DISAGG_FULL
    changes = given_options(
        truth=args.truth_gpu,
        gpus=args.gpus,
        sweep_gbps=tuple(args.bandwidth) if args.bandwidth else None,
        itl_ms=args.itl_ms,
        ttft_ms=args.ttft_ms,
        long_share=args.long_share,
        requests=args.requests,
        jobs=args.jobs,
    )
    return replace(base, **changes)


def run_disagg_command(args: Any) -> int:
    """Run the benchmark and print its tables (or JSON)."""
    return run_bench_command("disagg", args, settings_from, run_disagg_benchmark, format_disagg_table)
