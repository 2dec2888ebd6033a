"""``chunkpilot bench disagg``: colocated chunked prefill vs prefill/decode disaggregation, same GPUs.

The workload is bimodal: short chat requests (``azure_conv_2023``) mixed with long summarisation
prompts (``arxiv_summarization_lengths``), Poisson arrivals. The engine's hardware is a hidden
**truth profile** (one of the perturbed H100 profiles of :mod:`chunkpilot.tuner.twin.truth`); every
capacity called *true* is the simulator's capacity search on that truth:

* **colocated**: the best per-replica capacity at SLO over a grid of budgets, times the GPUs
  (requests spread evenly over the replicas);
* **disaggregated**: the best layout of the same GPUs (every P:D split, then each pool's knobs:
  :func:`chunkpilot.tuner.topology.search_topologies`), the KV cache shipped at the bandwidth given;
* the **target load** is 80 % of the best disaggregated capacity: the colocated optimum's
  quantiles there show what it misses.

The **recommendation** is the tuner's: a twin fitted to the truth's step telemetry under one
window of the stable config (the datasheet as its prior, never the truth), the captured workload,
and :func:`chunkpilot.tuner.disaggplan.recommend`; its predicted capacity is compared with the true
capacity of the layout it recommends. The **bandwidth sweep** re-evaluates every split with the best
pool knobs on the truth at each KV bandwidth (where disaggregation stops paying), and the **low
volume** rows repeat the comparison on fewer GPUs. Truth and twin use the same requests per replica,
so the short horizon's optimism cancels.
"""

from __future__ import annotations

import math
import random
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from chunkpilot.engine.sim.capacity import find_capacity, retime
from chunkpilot.engine.sim.disagg import KVTransfer, simulate_disaggregated
from chunkpilot.engine.sim.engine import SimConfig
from chunkpilot.engine.sim.metrics import StepTelemetry
from chunkpilot.engine.sim.offline import SLO, simulate
from chunkpilot.engine.sim.profiles.loader import load_model
from chunkpilot.engine.sim.scheduler import SchedulerConfig
from chunkpilot.engine.sim.workload import Workload, load_trace
from chunkpilot.tuner.bench import BenchError
from chunkpilot.tuner.disaggplan import RecommendRequest, recommend
from chunkpilot.tuner.space import TunedConfig
from chunkpilot.tuner.topology import PREFILL_BUDGETS, Layout, LayoutCapacity, Pool, search_topologies, splits
from chunkpilot.tuner.topology_sim import sim_evaluator, tiled, topology_of
from chunkpilot.tuner.twin.capture import synthesize
from chunkpilot.tuner.twin.fit import fit_steps
from chunkpilot.tuner.twin.online import WORKLOAD_REQUESTS
from chunkpilot.tuner.twin.predict import Twin
from chunkpilot.tuner.twin.truth import family, read_perturbation, truth_engine
from chunkpilot.tuner.twin.validate import observe_window

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

MODEL = "llama-3.1-8b"
DATASHEET = "h100"
MAX_MODEL_LEN = 8192
#: The target load as a share of the best disaggregated capacity.
TARGET_SHARE = 0.8


@dataclass(frozen=True)
class DisaggSettings:
    """Sizes of one run (``requests`` per replica of every capacity probe, truth and twin alike)."""

    truth: str = "h100-c075-m085-o2"
    gpus: int = 4
    low_gpus: tuple[int, ...] = (2,)
    long_share: float = 0.3
    itl_ms: float = 20.0
    ttft_ms: float = 400.0
    itl_quantile: float = 0.99
    ttft_quantile: float = 0.95
    #: Requests per replica of a disaggregated probe, and of a colocated one (whose queue settles
    #: more slowly: :data:`chunkpilot.tuner.topology_sim.COLOCATED_REQUESTS`).
    requests: int = 300
    colocated_requests: int = 1000
    tolerance: float = 0.04
    budgets: tuple[int, ...] = (192, 256, 320, 384, 448, 512, 768, 1024, 2048)
    #: Search each pool's knobs on the truth after the splits (else the splits only).
    truth_knobs: bool = True
    max_num_seqs: int = 128
    bandwidth_gbps: float = 25.0
    latency_ms: float = 1.0
    sweep_gbps: tuple[float, ...] = (100.0, 25.0, 10.0, 5.0, 2.0, 1.0, 0.5)
    #: CPU seconds the twin's recommendation may spend (the tuner's default: 60).
    twin_cpu_s: float = 60.0
    stable_budget: int = 2048
    jobs: int = 2
    seed: int = 0

    def __post_init__(self) -> None:
        if self.gpus < 2:
            raise BenchError("--gpus: disaggregation needs at least 2 GPUs (one per pool)")
        if not 0 < self.long_share < 1:
            raise BenchError("--long-share must be in (0, 1)")
        if self.requests < 20:
            raise BenchError("--requests: at least 20 requests per replica")
        if not self.sweep_gbps or any(not b > 0 for b in self.sweep_gbps):
            raise BenchError("--bandwidth: each KV bandwidth must be a positive number of GB/s")
        if self.truth not in family():
            try:
                read_perturbation(Path(self.truth))
            except ValueError as exc:
                raise BenchError(f"--truth-gpu: {exc}") from exc

    @property
    def slo(self) -> SLO:
        return SLO(self.itl_ms, self.itl_quantile, self.ttft_ms, self.ttft_quantile)


DISAGG_FULL = DisaggSettings()
DISAGG_QUICK = DisaggSettings(
    low_gpus=(),
    requests=60,
    colocated_requests=400,
    tolerance=0.1,
    budgets=(256, 320, 384),
    truth_knobs=False,
    sweep_gbps=(25.0, 0.5),
    twin_cpu_s=5.0,
)


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


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Comparison:
    """Colocated against disaggregated on ``gpus`` GPUs at one KV bandwidth (true capacities, req/s)."""

    gpus: int
    bandwidth_gbps: float
    colocated_req_s: float
    colocated_budget: int
    disaggregated_req_s: float
    layout: str
    knobs: str
    kv_transfer_ms: float

    @property
    def gain(self) -> float:
        return self.disaggregated_req_s / self.colocated_req_s - 1 if self.colocated_req_s > 0 else math.inf

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpus": self.gpus,
            "bandwidth_gbps": self.bandwidth_gbps,
            "colocated_req_s": self.colocated_req_s,
            "colocated_budget": self.colocated_budget,
            "disaggregated_req_s": self.disaggregated_req_s,
            "topology": self.layout,
            "knobs": self.knobs,
            "kv_transfer_ms_p50": _finite(self.kv_transfer_ms),
            "gain": _finite(self.gain),
        }


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


@dataclass(frozen=True)
class DisaggResult:
    """One run: the headline comparison, the twin's recommendation, the sweeps."""

    settings: DisaggSettings
    mean_prompt_tokens: float
    kv_mb_per_request: float
    headline: Comparison
    target_req_s: float
    #: Per colocated budget: its ITL and TTFT quantiles at the target load.
    colocated_at_target: dict[str, dict[str, float]]
    disaggregated_at_target: dict[str, float]
    recommendation: dict[str, Any]
    sweep: tuple[Comparison, ...]
    low_volume: tuple[Comparison, ...]
    cpu_s: float
    wall_s: float
    notes: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        s = self.settings
        return {
            "settings": {
                "truth": s.truth,
                "gpus": s.gpus,
                "workload": f"bimodal: azure_conv_2023 chat + {s.long_share:.0%} arxiv summarisation",
                "slo": {
                    "itl_ms": s.itl_ms,
                    "itl_quantile": s.itl_quantile,
                    "ttft_ms": s.ttft_ms,
                    "ttft_quantile": s.ttft_quantile,
                },
                "requests_per_replica": s.requests,
                "colocated_requests": s.colocated_requests,
                "tolerance": s.tolerance,
                "budgets": list(s.budgets),
                "kv_bandwidth_gbps": s.bandwidth_gbps,
                "kv_latency_ms": s.latency_ms,
            },
            "mean_prompt_tokens": self.mean_prompt_tokens,
            "kv_mb_per_request": self.kv_mb_per_request,
            "headline": self.headline.to_dict(),
            "target_req_s": self.target_req_s,
            "colocated_at_target": self.colocated_at_target,
            "disaggregated_at_target": self.disaggregated_at_target,
            "recommendation": self.recommendation,
            "bandwidth_sweep": [c.to_dict() for c in self.sweep],
            "low_volume": [c.to_dict() for c in self.low_volume],
            "cpu_s": self.cpu_s,
            "wall_s": self.wall_s,
        }


# --------------------------------------------------------------------------- the truth side


@dataclass(frozen=True)
class _Job:
    """One capacity search on the truth (picklable, for the worker processes)."""

    truth: SimConfig
    lengths: Workload
    slo: SLO
    tolerance: float
    budget: int | None = None
    layout: Layout | None = None
    kv: KVTransfer | None = None
    requests: int = 200
    colocated_requests: int = 1000


def _scheduler(base: SchedulerConfig, budget: int, seqs: int) -> SchedulerConfig:
    return replace(base, max_num_batched_tokens=budget, max_num_seqs=min(seqs, budget))


def _run(job: _Job) -> LayoutCapacity | float:
    if job.layout is not None:
        assert job.kv is not None
        evaluate = sim_evaluator(
            job.truth,
            job.lengths,
            job.slo,
            job.kv,
            requests_per_replica=job.requests,
            tolerance=job.tolerance,
        )
        return evaluate(job.layout)
    assert job.budget is not None
    engine = replace(
        job.truth, scheduler=_scheduler(job.truth.scheduler, job.budget, job.truth.scheduler.max_num_seqs)
    )
    lengths = tiled(job.lengths, job.colocated_requests)
    result = find_capacity(engine, lengths, job.slo, tolerance=job.tolerance)
    return result.capacity_req_s if result.feasible else 0.0


class _Pool:
    """Capacity searches, in worker processes when ``jobs`` > 1."""

    def __init__(self, jobs: int) -> None:
        self._executor = ProcessPoolExecutor(max_workers=jobs) if jobs > 1 else None

    def map(self, jobs: Sequence[_Job]) -> list[LayoutCapacity | float]:
        if self._executor is None:
            return [_run(j) for j in jobs]
        return list(self._executor.map(_run, jobs))

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown()


def _colocated(pool: _Pool, base: _Job, budgets: Sequence[int]) -> tuple[float, int]:
    """The best per-replica capacity over the budgets, and its budget."""
    values = pool.map([replace(base, budget=b) for b in budgets])
    capacities = [float(v) for v in values if isinstance(v, float)]
    best = max(range(len(budgets)), key=lambda i: (capacities[i], -i))
    return capacities[best], budgets[best]


def _layouts(pool: _Pool, base: _Job, layouts: Sequence[Layout]) -> list[LayoutCapacity]:
    results = pool.map([replace(base, layout=layout) for layout in layouts])
    return [r for r in results if isinstance(r, LayoutCapacity)]


def _quantiles(summary_itl: float, summary_ttft: float) -> dict[str, float]:
    return {"itl_ms": round(summary_itl, 1), "ttft_ms": round(summary_ttft, 1)}


def _compare(
    pool: _Pool,
    base: _Job,
    gpus: int,
    bandwidth: float,
    colocated: tuple[float, int],
    layouts: Sequence[Layout],
    known: Mapping[Layout, LayoutCapacity] | None = None,
) -> Comparison:
    """The best of ``layouts`` at ``bandwidth`` (``known``: results at the base job's bandwidth)."""
    kv = KVTransfer(bandwidth, base.kv.latency_ms if base.kv else 1.0)
    reuse = known if known is not None and base.kv is not None and bandwidth == base.kv.bandwidth_gbps else {}
    missing = [layout for layout in layouts if layout not in reuse]
    found = [reuse[layout] for layout in layouts if layout in reuse]
    found += _layouts(pool, replace(base, kv=kv), missing)
    best = min(found, key=lambda r: (-r.capacity_req_s, layouts.index(r.layout)))
    return Comparison(
        gpus,
        bandwidth,
        colocated[0] * gpus,
        colocated[1],
        best.capacity_req_s,
        best.layout.describe(),
        best.layout.knobs(),
        best.kv_transfer_ms,
    )


def _split_layouts(template: Layout, gpus: int) -> list[Layout]:
    return [
        Layout(replace(template.prefill, replicas=p), replace(template.decode, replicas=d))
        for p, d in splits(gpus)
    ]


def _fit_twin(truth: SimConfig, lengths: Workload, settings: DisaggSettings, rate: float, root: Path) -> Twin:
    """The tuner's twin when it declares the SLOs infeasible, the datasheet as its prior.

    Its steps: one window of the stable config plus one canary window per colocated budget (the
    trials that found no budget meeting both SLOs), all at the live load; its workload: captured
    from the stable window.
    """
    telemetry = StepTelemetry()
    live = retime(tiled(lengths, WORKLOAD_REQUESTS), rate, settings.seed)
    stable = replace(
        truth, scheduler=_scheduler(truth.scheduler, settings.stable_budget, settings.max_num_seqs)
    )
    observed = simulate(stable, live, settings.slo, keep_records=True, telemetry=telemetry)
    canary = replace(live, requests=live.requests[: WORKLOAD_REQUESTS // 2])
    for budget in settings.budgets:
        engine = replace(truth, scheduler=_scheduler(truth.scheduler, budget, settings.max_num_seqs))
        simulate(engine, canary, settings.slo, telemetry=telemetry)
    fit = fit_steps(telemetry.totals(), MODEL, DATASHEET)
    captured = synthesize(
        observe_window(observed, MAX_MODEL_LEN),
        WORKLOAD_REQUESTS,
        max_model_len=MAX_MODEL_LEN,
        seed=settings.seed,
    )
    return Twin.build(fit, captured, root / "twin")


def _truth_path(name: str) -> Path:
    shipped = family()
    return shipped[name] if name in shipped else Path(name)


def run_disagg_benchmark(
    settings: DisaggSettings = DISAGG_FULL, progress: Callable[[str], None] = lambda _msg: None
) -> DisaggResult:
    """Run the comparison, the twin's recommendation and the sweeps."""
    started_wall, started_cpu = time.perf_counter(), time.process_time()
    slo = settings.slo
    lengths = bimodal_workload(
        max(settings.requests * max((settings.gpus, *settings.low_gpus)), 400),
        settings.long_share,
        settings.seed,
    )
    prompts = [r.prompt_tokens for r in lengths.requests]
    mean_prompt = sum(prompts) / len(prompts)
    kv_mb = load_model(MODEL).kv_bytes_per_token * mean_prompt / 1e6
    pool = _Pool(settings.jobs)
    with tempfile.TemporaryDirectory(prefix="bench-disagg-") as tmp:
        root = Path(tmp)
        base_sched = SchedulerConfig(max_num_seqs=settings.max_num_seqs, max_model_len=MAX_MODEL_LEN)
        truth = truth_engine(_truth_path(settings.truth), root / "truth", model=MODEL, scheduler=base_sched)
        kv = KVTransfer(settings.bandwidth_gbps, settings.latency_ms)
        base = _Job(
            truth,
            lengths,
            slo,
            settings.tolerance,
            kv=kv,
            requests=settings.requests,
            colocated_requests=settings.colocated_requests,
        )
        try:
            progress(f"colocated: {len(settings.budgets)} budgets on the truth")
            colocated = _colocated(pool, base, settings.budgets)
            progress(f"disaggregated: layouts of {settings.gpus} GPUs on the truth")

            known: dict[Layout, LayoutCapacity] = {}

            def on_truth(layout: Layout) -> LayoutCapacity:
                if layout not in known:
                    result = _run(replace(base, layout=layout))
                    assert isinstance(result, LayoutCapacity)
                    known[layout] = result
                return known[layout]

            # The search's first stage (every split, default knobs) in parallel; the rest in order.
            seqs = settings.max_num_seqs
            first = [
                Layout(Pool(p, PREFILL_BUDGETS[0], seqs), Pool(d, max(settings.stable_budget, seqs), seqs))
                for p, d in splits(settings.gpus)
            ]
            known.update((r.layout, r) for r in _layouts(pool, base, first))

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
            headline = Comparison(
                settings.gpus,
                settings.bandwidth_gbps,
                colocated[0] * settings.gpus,
                colocated[1],
                best.capacity_req_s,
                best.layout.describe(),
                best.layout.knobs(),
                best.kv_transfer_ms,
            )
            target = TARGET_SHARE * best.capacity_req_s
            per_replica = target / settings.gpus
            at_target = {
                budget: simulate(
                    replace(truth, scheduler=_scheduler(base_sched, budget, settings.max_num_seqs)),
                    retime(tiled(lengths, settings.colocated_requests), per_replica, settings.seed),
                    slo,
                )
                for budget in settings.budgets
            }
            disagg_at = simulate_disaggregated(
                topology_of(truth, best.layout, kv),
                retime(tiled(lengths, settings.requests * best.layout.replicas), target, settings.seed),
                slo,
            )
            progress("twin: fit on one window of the stable config, then its recommendation")
            twin = _fit_twin(truth, lengths, settings, per_replica, root)
            job = RecommendRequest(
                key="bench",
                twin=twin,
                slo=slo,
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
            recommendation = {
                "topology": advised.layout.describe() if advised else None,
                "knobs": advised.layout.knobs() if advised else None,
                "predicted_req_s": advised.capacity_req_s if advised else None,
                "true_req_s": true_of_advised,
                "error": _finite(advised.capacity_req_s / true_of_advised - 1)
                if advised and true_of_advised > 0
                else None,
                "share_of_true_best": _finite(true_of_advised / best.capacity_req_s),
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
            template = best.layout
            count = len(splits(settings.gpus))
            progress(f"bandwidth sweep: {len(settings.sweep_gbps)} KV bandwidths x {count} splits")
            sweep = tuple(
                _compare(
                    pool, base, settings.gpus, bw, colocated, _split_layouts(template, settings.gpus), known
                )
                for bw in settings.sweep_gbps
            )
            low = []
            for gpus in settings.low_gpus:
                progress(f"low volume: {gpus} GPUs")
                low.append(
                    _compare(
                        pool, base, gpus, settings.bandwidth_gbps, colocated, _split_layouts(template, gpus)
                    )
                )
        finally:
            pool.close()
    return DisaggResult(
        settings=settings,
        mean_prompt_tokens=mean_prompt,
        kv_mb_per_request=kv_mb,
        headline=headline,
        target_req_s=target,
        colocated_at_target={
            str(b): _quantiles(m.itl_at_slo_quantile_ms, m.ttft_at_slo_quantile_ms)
            for b, m in at_target.items()
        },
        disaggregated_at_target=_quantiles(
            disagg_at.itl_at_slo_quantile_ms, disagg_at.ttft_at_slo_quantile_ms
        ),
        recommendation=recommendation,
        sweep=sweep,
        low_volume=tuple(low),
        cpu_s=time.process_time() - started_cpu,
        wall_s=time.perf_counter() - started_wall,
    )


# --------------------------------------------------------------------------- output


def _gain(c: Comparison) -> str:
    return f"{c.gain:+.0%}" if math.isfinite(c.gain) else "inf"


def _rows(comparisons: Sequence[Comparison]) -> list[str]:
    return [
        f"| {c.gpus} | {c.bandwidth_gbps:g} | {c.colocated_req_s:.2f} (budget {c.colocated_budget}) | "
        f"{c.disaggregated_req_s:.2f} ({c.layout}) | {_gain(c)} | "
        f"{c.kv_transfer_ms:.0f} |"
        for c in comparisons
    ]


HEADER = (
    "| GPUs | KV GB/s | colocated req/s (best budget) | disaggregated req/s (best split) | gain "
    "| KV hop p50 ms |",
    "|---:|---:|---:|---:|---:|---:|",
)


def format_disagg_markdown(result: DisaggResult) -> str:
    """The tables docs/benchmarks.md shows."""
    s, h, r = result.settings, result.headline, result.recommendation
    co, dis = result.colocated_at_target, result.disaggregated_at_target
    slo = (
        f"ITL p{s.itl_quantile * 100:g} ≤ {s.itl_ms:g} ms, TTFT p{s.ttft_quantile * 100:g} ≤ {s.ttft_ms:g} ms"
    )
    lines = [
        f"Truth {s.truth}, {s.gpus} GPUs, {slo}; bimodal workload (chat + {s.long_share:.0%} summarisation, "
        f"mean prompt {result.mean_prompt_tokens:.0f} tokens = {result.kv_mb_per_request:.0f} MB of KV), "
        f"{s.requests} requests per replica per disaggregated probe, "
        f"{s.colocated_requests} per colocated one.",
        "",
        *HEADER,
        *_rows([h]),
        "",
        f"At the target load, {result.target_req_s:.1f} req/s ({TARGET_SHARE:.0%} of the disaggregated "
        f"capacity), {h.layout}: ITL {dis['itl_ms']:g} ms, TTFT {dis['ttft_ms']:g} ms; "
        "colocated, per budget:",
        "",
        "| budget | " + " | ".join(co) + " |",
        "|---|" + "---:|" * len(co),
        "| ITL ms | " + " | ".join(f"{v['itl_ms']:g}" for v in co.values()) + " |",
        "| TTFT ms | " + " | ".join(f"{v['ttft_ms']:g}" for v in co.values()) + " |",
        "",
        "| twin recommends | predicted req/s | true req/s | error | share of the true best | "
        "predicted / true colocated req/s | evaluations | CPU s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        f"| {r['topology']} ({r['knobs']}) | {_num(r['predicted_req_s'])} | {_num(r['true_req_s'])} | "
        f"{_pct(r['error'])} | {_pct(r['share_of_true_best'], signed=False)} | "
        f"{_num(r['predicted_colocated_req_s'])} / {_num(r['true_colocated_req_s'])} | {r['evaluations']} | "
        f"{r['cpu_s']} |",
        "",
        "KV-transfer bandwidth (every split with the best pool knobs, on the truth):",
        "",
        *HEADER,
        *_rows(result.sweep),
    ]
    if result.low_volume:
        lines += [
            "",
            "Fewer GPUs (lower volume):",
            "",
            *HEADER,
            *_rows(result.low_volume),
        ]
    lines += ["", f"CPU {result.cpu_s:.0f} s (this process), wall {result.wall_s:.0f} s."]
    return "\n".join(lines)


def _num(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, float) and math.isfinite(value) else "-"


def _pct(value: Any, signed: bool = True) -> str:
    if not isinstance(value, float) or not math.isfinite(value):
        return "-"
    return f"{value:+.0%}" if signed else f"{value:.0%}"


def format_disagg_table(result: DisaggResult) -> str:
    """What the command prints (the same tables)."""
    return format_disagg_markdown(result)


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
    changes: dict[str, Any] = {
        key: value
        for key, value in (
            ("truth", args.truth_gpu),
            ("gpus", args.gpus),
            ("sweep_gbps", tuple(args.bandwidth) if args.bandwidth else None),
            ("itl_ms", args.itl_ms),
            ("ttft_ms", args.ttft_ms),
            ("long_share", args.long_share),
            ("requests", args.requests),
            ("jobs", args.jobs),
        )
        if value is not None
    }
    return replace(base, **changes)


def run_disagg_command(args: Any) -> int:
    """Run the benchmark and print its tables (or JSON)."""
    import json
    import sys

    try:
        settings = settings_from(args)
        result = run_disagg_benchmark(settings, progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    except BenchError as exc:
        print(f"chunkpilot bench disagg: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result.to_dict(), indent=2) if args.json else format_disagg_table(result))
    return 0
