"""Offline benchmark of the tuner against exhaustive search, vLLM's defaults and two baselines.

Ground truth is the simulator: the **capacity at SLO** of a configuration is the highest
Poisson arrival rate at which a slice of a bundled trace still meets both SLO quantiles,
found by the simulator's bisection (:func:`chunkpilot.engine.sim.capacity.find_capacity`).

For each workload x SLO pair the search space is the tuner's own
(:func:`chunkpilot.tuner.space.build_space`), discretised into a grid; the exhaustive
optimum is the best grid point.  Every method picks grid points, so the optimum bounds
them all, and each configuration is simulated once (results are cached):

- **tpe**: the tuner itself: its warm start (the model-based guess) and then
  :func:`chunkpilot.tuner.study.suggest` (Optuna TPE with constraints) on the
  trial history; a sampled point is snapped onto the grid; a point that snaps onto a
  configuration already measured is told to the study with the known result and costs
  no trial;
- **random**: distinct grid points drawn uniformly;
- **grid**: vLLM's ``auto_tune`` style sweep, max-num-seqs (outer loop) x
  max-num-batched-tokens (inner loop) over a coarse subset, in a fixed order.

The stochastic methods are repeated with different seeds and averaged.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from enum import Enum
from functools import lru_cache
from typing import Any

from chunkpilot.bench.grid import Grid, autotune_order
from chunkpilot.engine.sim.capacity import find_capacity
from chunkpilot.engine.sim.engine import SimConfig
from chunkpilot.engine.sim.flags import engine_server_defaults
from chunkpilot.engine.sim.offline import SLO
from chunkpilot.engine.sim.scheduler import Engine, SchedulerConfig
from chunkpilot.engine.sim.workload import Workload, load_trace
from chunkpilot.tuner.space import (
    ServiceFacts,
    TunedConfig,
    build_space,
)
from chunkpilot.tuner.study import RecordState, TrialRecord, seed_for, suggest
from chunkpilot.tuner.warmstart import WarmStart, warm_start

METHODS = ("tpe", "random", "grid")
#: Engines the benchmark simulates and tunes (``--engine``): each one's scheduling semantics,
#: server defaults (the incumbent) and search space from the knob table.
ENGINES = tuple(e.value for e in Engine)
#: Diagnostic variant: the tuner without its model-based warm start (not a baseline).
DIAGNOSTICS = ("tpe-cold",)
#: Goal of the benchmark: the tuner's best after this many trials ...
GOAL_TRIALS = 12
#: ... reaches this share of the exhaustive optimum.
GOAL_SHARE = 0.98
#: Sampled points that snap onto known configurations before a random unseen grid point is used.
MAX_SNAP_COLLISIONS = 40


class BenchError(ValueError):
    """Bad benchmark settings; the message names the option."""


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class SLOPair:
    """One pair of latency objectives (quantiles 0-1, targets in milliseconds)."""

    name: str
    itl_ms: float
    ttft_ms: float
    itl_quantile: float = 0.99
    ttft_quantile: float = 0.95

    def describe(self) -> str:
        return (
            f"ITL p{self.itl_quantile * 100:g} <= {self.itl_ms:g} ms, "
            f"TTFT p{self.ttft_quantile * 100:g} <= {self.ttft_ms:g} ms"
        )


WORKLOADS: dict[str, str] = {
    "azure_conv": "azure_conv_2023",
    "azure_code": "azure_code_2023",
    "arxiv": "arxiv_summarization_lengths",
}
SLO_PAIRS: tuple[SLOPair, ...] = (
    SLOPair("itl-tight", itl_ms=50.0, ttft_ms=2000.0),
    SLOPair("ttft-tight", itl_ms=150.0, ttft_ms=500.0),
)


@dataclass(frozen=True)
class BenchSettings:
    """Sizes of one benchmark run."""

    requests: int = 300
    trials: int = 20
    repeats: int = 5
    tolerance: float = 0.02
    start_rate: float = 8.0
    budget_points: int = 8
    seq_values: tuple[int, ...] = (32, 64, 128, 256, 512, 1024)
    long_prefill_values: tuple[int, ...] = (256, 1024)
    autotune_seqs: tuple[int, ...] = (128, 256, 512, 1024)
    workloads: tuple[str, ...] = tuple(WORKLOADS)
    slo_pairs: tuple[SLOPair, ...] = SLO_PAIRS
    model: str = "llama-3.1-8b"
    accelerator: str = "h100"
    max_model_len: int = 8192
    seed: int = 0
    jobs: int = 2
    #: Whose scheduling semantics the simulated engine has and whose knob table the tuner searches.
    engine: str = "vllm"

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise BenchError(f"--engine: unknown {self.engine!r}; choose from {', '.join(ENGINES)}")
        if self.requests < 2:
            raise BenchError("--requests must be >= 2")
        if self.trials < 1:
            raise BenchError("--trials must be >= 1")
        if self.repeats < 1:
            raise BenchError("--repeats must be >= 1")
        if self.jobs < 1:
            raise BenchError("--jobs must be >= 1")
        if not 0 < self.tolerance < 1 or self.start_rate <= 0:
            raise BenchError("capacity search: need 0 < tolerance < 1 and start_rate > 0")
        if self.budget_points < 2:
            raise BenchError("budget_points must be >= 2")
        unknown = [w for w in self.workloads if w not in WORKLOADS]
        if unknown:
            raise BenchError(f"--workload: unknown {unknown}; choose from {sorted(WORKLOADS)}")


FULL = BenchSettings()
QUICK = replace(
    FULL,
    requests=160,
    trials=12,
    repeats=3,
    tolerance=0.05,
    budget_points=6,
    seq_values=(16, 64, 256, 1024),
    long_prefill_values=(512,),
    autotune_seqs=(256, 1024),
)


# --------------------------------------------------------------------------- ground truth


@dataclass(frozen=True)
class Capacity:
    """Capacity at SLO of one configuration (req/s; 0 when no rate meets the SLO).

    ``constraints`` are the study's relative constraints (``measured / target - 1``, <= 0 met)
    at the capacity (or at the lowest rate tried when none meets the SLO).
    """

    rate: float
    constraints: dict[str, float]
    probes: int


@dataclass(frozen=True)
class EvalTask:
    """Capacities of one configuration on one workload, for some SLO pairs."""

    workload: str
    config: TunedConfig
    slo_pairs: tuple[SLOPair, ...]
    settings: BenchSettings


@lru_cache(maxsize=8)
def _workload(trace: str, requests: int) -> Workload:
    return load_trace(trace, rate=1.0, limit=requests)


@lru_cache(maxsize=8)
def _engine_defaults(engine: str, model: str, accelerator: str, max_model_len: int) -> SimConfig:
    return engine_server_defaults(engine, model, accelerator, max_model_len)


def engine_defaults(settings: BenchSettings) -> SimConfig:
    """The engine of ``settings.engine`` at its server defaults (the tuned knobs are replaced per trial)."""
    return _engine_defaults(settings.engine, settings.model, settings.accelerator, settings.max_model_len)


#: The engine-only scheduler settings the benchmark records per engine (fixed: not in the tuned space).
ENGINE_SETTINGS: dict[str, tuple[str, ...]] = {
    Engine.VLLM.value: ("policy", "enable_prefix_caching"),
    Engine.SGLANG.value: ("policy", "enable_mixed_chunk", "max_prefill_tokens", "enable_prefix_caching"),
    Engine.TRTLLM.value: (
        "capacity_scheduler_policy",
        "context_chunking_policy",
        "chunk_unit_size",
        "enable_prefix_caching",
    ),
}


def engine_settings(settings: BenchSettings) -> dict[str, object]:
    """The engine's own scheduler settings every trial runs with (the knobs the tuner does not move)."""
    sim = engine_defaults(settings)
    out: dict[str, object] = {"gpu_memory_utilization": sim.gpu_memory_utilization}
    for name in ENGINE_SETTINGS[settings.engine]:
        value = getattr(sim.scheduler, name)
        out[name] = value.value if isinstance(value, Enum) else value
    return out


def tuned_scheduler(
    base: SchedulerConfig, config: TunedConfig, max_model_len: int | None = None
) -> SchedulerConfig:
    """``base`` (an engine's scheduler: its kind and own knobs) running the tuned knobs of ``config``.

    On vLLM's defaults this is :func:`chunkpilot.tuner.twin.search.scheduler_of`.
    """
    length = base.max_model_len if max_model_len is None else max_model_len
    return replace(base, **config.as_dict(), max_model_len=length)  # type: ignore[arg-type]


def sim_config(config: TunedConfig, settings: BenchSettings) -> SimConfig:
    """The simulated engine running ``config`` (every tuned knob; the simulator's names are the table's)."""
    base = engine_defaults(settings)
    return replace(base, scheduler=tuned_scheduler(base.scheduler, config), seed=settings.seed)


def capacity(config: TunedConfig, workload: str, slo: SLOPair, settings: BenchSettings) -> Capacity:
    """The simulator's capacity search (:func:`chunkpilot.engine.sim.capacity.find_capacity`)."""
    sim_slo = SLO(
        itl_ms=slo.itl_ms, itl_quantile=slo.itl_quantile, ttft_ms=slo.ttft_ms, ttft_quantile=slo.ttft_quantile
    )
    workload_slice = _workload(WORKLOADS[workload], settings.requests)
    try:
        result = find_capacity(
            sim_config(config, settings),
            workload_slice,
            sim_slo,
            tolerance=settings.tolerance,
            start_rate=settings.start_rate,
            seed=settings.seed,
        )
    except ValueError as exc:
        raise BenchError(
            f"--requests {settings.requests}: {workload} with {config.summary()} under {slo.describe()}: "
            f"{exc}; use a longer trace slice"
        ) from exc
    at = result.at_capacity
    itl, ttft = (
        (at.itl_at_slo_quantile_ms, at.ttft_at_slo_quantile_ms) if at is not None else (math.inf, math.inf)
    )
    constraints = {"itl": itl / slo.itl_ms - 1.0, "ttft": ttft / slo.ttft_ms - 1.0}
    constraints = {k: (v if math.isfinite(v) else 1e6) for k, v in constraints.items()}
    return Capacity(result.capacity_req_s if result.feasible else 0.0, constraints, len(result.probes))


def evaluate(task: EvalTask) -> dict[str, Capacity]:
    """Capacity per SLO pair name (runs in a worker process)."""
    return {slo.name: capacity(task.config, task.workload, slo, task.settings) for slo in task.slo_pairs}


# --------------------------------------------------------------------------- methods


Objective = Callable[[TunedConfig], Capacity]


def run_tpe(
    grid: Grid, facts: ServiceFacts, objective: Objective, trials: int, uid: str, *, warm: bool = True
) -> list[tuple[TunedConfig, float]]:
    """The tuner's loop: warm start, then ``suggest`` on the history; one distinct config per trial."""
    space = grid.space
    records: list[TrialRecord] = []
    measured: dict[TunedConfig, Capacity] = {}
    history: list[tuple[TunedConfig, float]] = []
    warm_starts: list[WarmStart] = []
    for start in warm_start(space, facts) if warm else []:
        snapped = space.to_params(grid.snap(start))
        if snapped is not None:
            warm_starts.append(WarmStart(snapped, start.when_slack))
    number = 0
    while len(history) < trials and len(measured) < len(grid.configs):
        suggestion = suggest(space, records, seed=seed_for(uid, number), warm_starts=warm_starts)
        params = suggestion.params if suggestion is not None else {}
        config = grid.snap(params) if suggestion is not None else None
        collisions = 0
        while config is None or config in measured:
            if config is not None and suggestion is not None:
                # Known result: tell it for the sampled point, free of charge.
                records.append(_record(number, suggestion.params, measured[config]))
                number += 1
                collisions += 1
            if suggestion is None or collisions >= MAX_SNAP_COLLISIONS:
                unseen = [c for c in grid.configs if c not in measured]
                config = random.Random(seed_for(uid, number)).choice(unseen)
                params = space.to_params(config) or {}
                break
            suggestion = suggest(space, records, seed=seed_for(uid, number))
            params = suggestion.params if suggestion is not None else {}
            config = grid.snap(params) if suggestion is not None else None
        result = objective(config)
        measured[config] = result
        history.append((config, result.rate))
        exact = space.to_params(config)
        records.append(_record(number, exact if exact is not None else params, result))
        number += 1
    return history


def _record(number: int, params: Mapping[str, int], result: Capacity) -> TrialRecord:
    return TrialRecord(
        number=number,
        params=dict(params),
        state=RecordState.COMPLETE,
        objective=result.rate,
        constraints=result.constraints,
    )


def run_random(grid: Grid, objective: Objective, trials: int, seed: int) -> list[tuple[TunedConfig, float]]:
    """Distinct grid configurations drawn uniformly at random."""
    chosen = random.Random(seed).sample(list(grid.configs), min(trials, len(grid.configs)))
    return [(c, objective(c).rate) for c in chosen]


def run_grid(
    grid: Grid, objective: Objective, trials: int, settings: BenchSettings
) -> list[tuple[TunedConfig, float]]:
    """The first ``trials`` points of the auto_tune sweep."""
    return [(c, objective(c).rate) for c in autotune_order(grid, settings)[:trials]]


def best_so_far(history: Sequence[tuple[TunedConfig, float]], trials: int) -> list[float]:
    """Best capacity after 1..``trials`` trials (the last value repeats when the history is shorter)."""
    out: list[float] = []
    best = 0.0
    for i in range(trials):
        if i < len(history):
            best = max(best, history[i][1])
        out.append(best)
    return out


# --------------------------------------------------------------------------- the run


@dataclass(frozen=True)
class ScenarioResult:
    """One workload x SLO pair."""

    workload: str
    slo: SLOPair
    space: str
    grid_size: int
    optimum: float
    optimum_config: TunedConfig
    default: float
    default_config: TunedConfig
    guess_config: TunedConfig
    best_after: dict[str, list[float]]  # method -> mean best capacity after 1..N trials
    best_config: dict[str, TunedConfig]  # method -> best configuration of the first repeat
    landscape: tuple[tuple[TunedConfig, float], ...] = ()  # every grid point's capacity, best first

    @property
    def name(self) -> str:
        return f"{self.workload} / {self.slo.name}"

    def share(self, method: str, trials: int) -> float:
        """Mean best capacity after ``trials`` trials as a share of the optimum."""
        values = self.best_after[method]
        value = values[min(trials, len(values)) - 1]
        return value / self.optimum if self.optimum > 0 else math.nan

    def to_dict(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "trace": WORKLOADS[self.workload],
            "slo": {
                "name": self.slo.name,
                **{k: getattr(self.slo, k) for k in ("itl_ms", "itl_quantile", "ttft_ms", "ttft_quantile")},
            },
            "space": self.space,
            "grid_size": self.grid_size,
            "optimum_req_s": self.optimum,
            "optimum_config": self.optimum_config.as_dict(),
            "default_req_s": self.default,
            "default_config": self.default_config.as_dict(),
            "default_share": self.default / self.optimum if self.optimum > 0 else None,
            "warm_start_config": self.guess_config.as_dict(),
            "best_req_s_after_trials": self.best_after,
            "share_after_trials": {
                m: [v / self.optimum if self.optimum > 0 else None for v in vals]
                for m, vals in self.best_after.items()
            },
            "best_config": {m: c.as_dict() for m, c in self.best_config.items()},
            "grid_req_s": {c.summary(): rate for c, rate in self.landscape},
        }


@dataclass
class BenchResult:
    """Every scenario plus run facts."""

    settings: BenchSettings
    scenarios: list[ScenarioResult] = field(default_factory=list)
    simulations: int = 0
    wall_s: float = 0.0

    def goal_met(self) -> dict[str, bool]:
        """Per scenario: TPE >= 98% of the optimum within 12 trials and >= both baselines there."""
        trials = min(GOAL_TRIALS, self.settings.trials)
        out: dict[str, bool] = {}
        for s in self.scenarios:
            tpe = s.share("tpe", trials)
            out[s.name] = bool(
                tpe >= GOAL_SHARE and tpe >= s.share("random", trials) and tpe >= s.share("grid", trials)
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        st = self.settings
        return {
            "benchmark": "tuner",
            "model": st.model,
            "accelerator": st.accelerator,
            "requests_per_slice": st.requests,
            "trials": st.trials,
            "repeats": st.repeats,
            "capacity_search": {"tolerance": st.tolerance, "start_rate": st.start_rate},
            "goal": {"trials": GOAL_TRIALS, "share": GOAL_SHARE, "met": self.goal_met()},
            "simulations": self.simulations,
            "wall_s": self.wall_s,
            "scenarios": [s.to_dict() for s in self.scenarios],
        }


def default_config(settings: BenchSettings) -> TunedConfig:
    """The engine's server defaults for the accelerator: vLLM's (DESIGN §4) budget 8192 / 1024 seqs on
    H100-class; SGLang's ``--chunked-prefill-size`` 8192 / ``--max-running-requests`` 2048; TensorRT-LLM's
    ``max_num_tokens`` 8192 / ``max_batch_size`` 2048."""
    from chunkpilot.engine.sim.engine import default_limits
    from chunkpilot.engine.sim.profiles.loader import load_accelerator

    if settings.engine != Engine.VLLM.value:
        scheduler = engine_defaults(settings).scheduler
        return TunedConfig(scheduler.max_num_batched_tokens, scheduler.max_num_seqs)
    budget, seqs = default_limits(load_accelerator(settings.accelerator))
    return TunedConfig(max_num_batched_tokens=budget, max_num_seqs=seqs)


def engine_version(engine: str) -> str:
    """The engine release the benchmark's service runs (the knob table is read at it)."""
    from chunkpilot.engine.sim.flags import SGLANG_PINNED_VERSION, TRTLLM_PINNED_VERSION

    pinned = {Engine.SGLANG.value: SGLANG_PINNED_VERSION, Engine.TRTLLM.value: TRTLLM_PINNED_VERSION}
    return pinned.get(engine, "0.33.0")


def scenario_facts(settings: BenchSettings, slo: SLOPair, workload: str | None = None) -> ServiceFacts:
    """The service the tuner would see: the engine (vLLM 0.33, SGLang or TensorRT-LLM at their pinned
    releases) with its default configuration as incumbent.

    With ``workload`` the facts carry its mean prompt and output lengths (what the tuner
    reads from the stable track's token counters online).
    """
    prompt = output = None
    if workload is not None:
        requests = _workload(WORKLOADS[workload], settings.requests).requests
        prompt = sum(r.prompt_tokens for r in requests) / len(requests)
        output = sum(r.output_tokens for r in requests) / len(requests)
    return ServiceFacts(
        accelerator=settings.accelerator,
        model=settings.model,
        incumbent=default_config(settings),
        itl_target_ms=slo.itl_ms,
        max_model_len=settings.max_model_len,
        engine_kind=settings.engine,
        engine_version=engine_version(settings.engine),
        gpu_memory_utilization=engine_defaults(settings).gpu_memory_utilization,
        itl_quantile=slo.itl_quantile,
        mean_prompt_tokens=prompt,
        mean_output_tokens=output,
    )


def _evaluate_all(tasks: list[EvalTask], jobs: int) -> list[dict[str, Capacity]]:
    if jobs <= 1 or len(tasks) <= 1:
        return [evaluate(t) for t in tasks]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(evaluate, tasks, chunksize=2))


def run_benchmark(settings: BenchSettings, progress: Callable[[str], None] | None = None) -> BenchResult:
    """Evaluate every grid point of every scenario, then replay the methods on the cached results."""
    say = progress or (lambda _msg: None)
    started = time.perf_counter()
    result = BenchResult(settings)
    default = default_config(settings)
    # Load profiles, calibration and traces once, before the worker processes fork.
    sim_config(default, settings).build()
    for workload in settings.workloads:
        _workload(WORKLOADS[workload], settings.requests)
    spaces = {slo.name: build_space(scenario_facts(settings, slo)) for slo in settings.slo_pairs}
    grids = {name: Grid.over(space, settings) for name, space in spaces.items()}
    needed: dict[tuple[str, TunedConfig], list[SLOPair]] = {}
    for workload in settings.workloads:
        for slo in settings.slo_pairs:
            for config in (*grids[slo.name].configs, default):
                needed.setdefault((workload, config), []).append(slo)
    tasks = [EvalTask(w, c, tuple(slos), settings) for (w, c), slos in needed.items()]
    say(f"simulating {len(tasks)} configurations x workloads on {settings.jobs} process(es)")
    outcomes = _evaluate_all(tasks, settings.jobs)
    cache: dict[tuple[str, str, TunedConfig], Capacity] = {}
    for task, outcome in zip(tasks, outcomes, strict=True):
        for slo_name, capacity in outcome.items():
            cache[(task.workload, slo_name, task.config)] = capacity
            result.simulations += capacity.probes
    for workload in settings.workloads:
        for slo in settings.slo_pairs:
            result.scenarios.append(_scenario(settings, workload, slo, grids[slo.name], default, cache))
            say(f"done {workload} / {slo.name}")
    result.wall_s = time.perf_counter() - started
    return result


def _scenario(
    settings: BenchSettings,
    workload: str,
    slo: SLOPair,
    grid: Grid,
    default: TunedConfig,
    cache: Mapping[tuple[str, str, TunedConfig], Capacity],
) -> ScenarioResult:
    def objective(config: TunedConfig) -> Capacity:
        return cache[(workload, slo.name, config)]

    facts = scenario_facts(settings, slo, workload)
    optimum_config = max(grid.configs, key=lambda c: (objective(c).rate, -grid.configs.index(c)))
    runs: dict[str, list[list[tuple[TunedConfig, float]]]] = {m: [] for m in (*METHODS, *DIAGNOSTICS)}
    for rep in range(settings.repeats):
        uid = f"bench/{workload}/{slo.name}/{settings.seed + rep}"
        runs["tpe"].append(run_tpe(grid, facts, objective, settings.trials, uid))
        runs["tpe-cold"].append(run_tpe(grid, facts, objective, settings.trials, uid, warm=False))
        runs["random"].append(run_random(grid, objective, settings.trials, seed_for(uid, -1)))
    runs["grid"].append(run_grid(grid, objective, settings.trials, settings))
    best_after = {m: _mean_curves([best_so_far(h, settings.trials) for h in hs]) for m, hs in runs.items()}
    best_config = {m: max(hs[0], key=lambda item: item[1])[0] for m, hs in runs.items() if hs[0]}
    warm = warm_start(grid.space, facts)
    guess = grid.snap(warm[0]) if warm else facts.incumbent
    return ScenarioResult(
        workload=workload,
        slo=slo,
        space=grid.space.describe(),
        grid_size=len(grid.configs),
        optimum=objective(optimum_config).rate,
        optimum_config=optimum_config,
        default=objective(default).rate,
        default_config=default,
        guess_config=guess,
        best_after=best_after,
        best_config=best_config,
        landscape=tuple(sorted(((c, objective(c).rate) for c in grid.configs), key=lambda item: -item[1])),
    )


def _mean_curves(curves: Iterable[list[float]]) -> list[float]:
    rows = list(curves)
    return [sum(values) / len(rows) for values in zip(*rows, strict=True)]
