"""The truth side of ``chunkpilot bench disagg``: capacity searches on the hidden truth profile.

Every capacity here is the simulator's search on the truth engine (colocated budgets, disaggregated
layouts at a KV bandwidth), in worker processes when asked; :func:`fit_twin` builds the tuner's twin
from what the truth's telemetry shows (the datasheet as its prior, never the truth itself).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from chunkpilot.bench.disagg_report import Comparison
from chunkpilot.bench.disagg_settings import DisaggSettings
from chunkpilot.bench.twin_truth import family
from chunkpilot.bench.twin_validate import observe_window
from chunkpilot.engine.sim.capacity import find_capacity, retime
from chunkpilot.engine.sim.disagg import KVTransfer
from chunkpilot.engine.sim.engine import SimConfig
from chunkpilot.engine.sim.metrics import StepTelemetry
from chunkpilot.engine.sim.offline import SLO, simulate
from chunkpilot.engine.sim.scheduler import SchedulerConfig
from chunkpilot.engine.sim.workload import Workload
from chunkpilot.tuner.topology.layouts import Layout, LayoutCapacity, splits
from chunkpilot.tuner.topology.simulate import sim_evaluator, tiled
from chunkpilot.tuner.twin.capture import synthesize
from chunkpilot.tuner.twin.fit import fit_steps
from chunkpilot.tuner.twin.online import WORKLOAD_REQUESTS
from chunkpilot.tuner.twin.predict import Twin

MODEL = "llama-3.1-8b"
DATASHEET = "h100"
MAX_MODEL_LEN = 8192


@dataclass(frozen=True)
class CapacityJob:
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


def scheduler_with(base: SchedulerConfig, budget: int, seqs: int) -> SchedulerConfig:
    """``base`` with the token ``budget`` and at most ``seqs`` sequences (never more than the budget)."""
    return replace(base, max_num_batched_tokens=budget, max_num_seqs=min(seqs, budget))


def run_job(job: CapacityJob) -> LayoutCapacity | float:
    """The job's layout capacity, or its colocated per-replica capacity (0 when infeasible)."""
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
        job.truth, scheduler=scheduler_with(job.truth.scheduler, job.budget, job.truth.scheduler.max_num_seqs)
    )
    lengths = tiled(job.lengths, job.colocated_requests)
    result = find_capacity(engine, lengths, job.slo, tolerance=job.tolerance)
    return result.capacity_req_s if result.feasible else 0.0


class JobPool:
    """Capacity searches, in worker processes when ``jobs`` > 1."""

    def __init__(self, jobs: int) -> None:
        self._executor = ProcessPoolExecutor(max_workers=jobs) if jobs > 1 else None

    def map(self, jobs: Sequence[CapacityJob]) -> list[LayoutCapacity | float]:
        """Run ``jobs``, results in their order."""
        if self._executor is None:
            return [run_job(j) for j in jobs]
        return list(self._executor.map(run_job, jobs))

    def close(self) -> None:
        """Stop the worker processes."""
        if self._executor is not None:
            self._executor.shutdown()


class LayoutsOnTruth:
    """Each layout's true capacity at the base job's KV bandwidth, searched once and remembered."""

    def __init__(self, base: CapacityJob) -> None:
        self.base = base
        self.known: dict[Layout, LayoutCapacity] = {}

    def __call__(self, layout: Layout) -> LayoutCapacity:
        if layout not in self.known:
            result = run_job(replace(self.base, layout=layout))
            assert isinstance(result, LayoutCapacity)
            self.known[layout] = result
        return self.known[layout]


def best_colocated(pool: JobPool, base: CapacityJob, budgets: Sequence[int]) -> tuple[float, int]:
    """The best per-replica capacity over the budgets, and its budget."""
    values = pool.map([replace(base, budget=b) for b in budgets])
    capacities = [float(v) for v in values if isinstance(v, float)]
    best = max(range(len(budgets)), key=lambda i: (capacities[i], -i))
    return capacities[best], budgets[best]


def evaluate_layouts(pool: JobPool, base: CapacityJob, layouts: Sequence[Layout]) -> list[LayoutCapacity]:
    """The true capacity of each of ``layouts`` at the base job's KV bandwidth."""
    results = pool.map([replace(base, layout=layout) for layout in layouts])
    return [r for r in results if isinstance(r, LayoutCapacity)]


def compare(
    pool: JobPool,
    base: CapacityJob,
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
    found += evaluate_layouts(pool, replace(base, kv=kv), missing)
    best = min(found, key=lambda r: (-r.capacity_req_s, layouts.index(r.layout)))
    return comparison(gpus, bandwidth, colocated, best)


def comparison(gpus: int, bandwidth: float, colocated: tuple[float, int], best: LayoutCapacity) -> Comparison:
    """``best`` against the colocated (per-replica capacity, budget) on ``gpus`` GPUs."""
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


def split_layouts(template: Layout, gpus: int) -> list[Layout]:
    """Every P:D split of ``gpus`` with the pools' knobs of ``template``."""
    return [
        Layout(replace(template.prefill, replicas=p), replace(template.decode, replicas=d))
        for p, d in splits(gpus)
    ]


def fit_twin(truth: SimConfig, lengths: Workload, settings: DisaggSettings, rate: float, root: Path) -> Twin:
    """The tuner's twin when it declares the SLOs infeasible, the datasheet as its prior.

    Its steps: one window of the stable config plus one canary window per colocated budget (the
    trials that found no budget meeting both SLOs), all at the live load; its workload: captured
    from the stable window.
    """
    telemetry = StepTelemetry()
    live = retime(tiled(lengths, WORKLOAD_REQUESTS), rate, settings.seed)
    stable = replace(
        truth, scheduler=scheduler_with(truth.scheduler, settings.stable_budget, settings.max_num_seqs)
    )
    observed = simulate(stable, live, settings.slo, keep_records=True, telemetry=telemetry)
    canary = replace(live, requests=live.requests[: WORKLOAD_REQUESTS // 2])
    for budget in settings.budgets:
        engine = replace(truth, scheduler=scheduler_with(truth.scheduler, budget, settings.max_num_seqs))
        simulate(engine, canary, settings.slo, telemetry=telemetry)
    fit = fit_steps(telemetry.totals(), MODEL, DATASHEET)
    captured = synthesize(
        observe_window(observed, MAX_MODEL_LEN),
        WORKLOAD_REQUESTS,
        max_model_len=MAX_MODEL_LEN,
        seed=settings.seed,
    )
    return Twin.build(fit, captured, root / "twin")


def truth_path(name: str) -> Path:
    """A shipped truth profile by name, else the profile file at ``name``."""
    shipped = family()
    return shipped[name] if name in shipped else Path(name)
