"""``chunkpilot bench tuner``: the tuner against a hidden truth, at a live load below capacity.

The engine's hardware is a **truth profile** (an accelerator profile JSON, ``--truth-gpu``, or each
of the shipped perturbed H100 profiles, ``--truth-family``), possibly of another structure than the
twin's roofline (a step profile, ``--truth-step-profile``, or each shipped structural one,
``--truth-family structural``), that only two objects here ever load: the
simulated engine (:class:`TruthEngine`, what the online methods call) and the ground truth
(:class:`GroundTruth`, capacity at SLO of a configuration on the truth). The tuner side
(:mod:`chunkpilot.bench.online`) is told the datasheet accelerator, as online, and sees only
the engine's measurements at the offered load and its step telemetry.

For each truth x workload x SLO pair the tuner's space is discretised into the benchmark grid; the
offered load is a share (``--load``) of the best grid point's true capacity; each method's promoted
incumbent after 1, 2, ... canary trials is scored by its true capacity as a share of the **true
optimum**: the best true capacity over the grid and every configuration any method promoted (the
twin searches the continuous space, so it may find points between grid points).
"""

from __future__ import annotations

import itertools
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from chunkpilot.bench.exhaustive import (
    FULL,
    SLO_PAIRS,
    WORKLOADS,
    BenchError,
    BenchSettings,
    SLOPair,
    default_config,
    engine_defaults,
    engine_settings,
    engine_version,
    scenario_facts,
    tuned_scheduler,
)
from chunkpilot.bench.grid import Grid
from chunkpilot.bench.online import (
    LiveEngine,
    Observation,
    OnlineContext,
    TwinSettings,
    run_grid_online,
    run_random_online,
    run_slack,
    run_twin,
)
from chunkpilot.bench.structural_truths import structural_family
from chunkpilot.bench.twin_truth import (
    family,
    read_perturbation,
    read_truth_step_profile,
    step_profile_label,
    truth_engine,
)
from chunkpilot.bench.twin_validate import observe_window
from chunkpilot.engine.sim.capacity import find_capacity, retime
from chunkpilot.engine.sim.engine import SimConfig
from chunkpilot.engine.sim.metrics import StepTelemetry
from chunkpilot.engine.sim.offline import SLO, Summary, simulate
from chunkpilot.engine.sim.scheduler import Engine
from chunkpilot.engine.sim.workload import Workload, load_trace
from chunkpilot.tuner.space import TunedConfig, build_space
from chunkpilot.tuner.study import seed_for
from chunkpilot.tuner.twin.capture import WorkloadWindow
from chunkpilot.tuner.twin.predict import LatencyQuantiles

__all__ = [
    "DEFAULT_TRUTH",
    "GOAL_MEDIAN",
    "GOAL_SHARE",
    "GOAL_TRIALS",
    "MARKS",
    "METHODS",
    "GroundTruth",
    "TruthEngine",
    "TruthResult",
    "TruthSettings",
    "format_truth_markdown",
    "format_truth_table",
    "run_truth_benchmark",
]

METHODS = ("twin", "slack", "random", "grid")
#: Goal: the twin's incumbent reaches GOAL_SHARE of the true optimum within GOAL_TRIALS canary
#: trials in every scenario, load and truth, and GOAL_MEDIAN in the median.
GOAL_TRIALS = 3
GOAL_SHARE = 0.95
GOAL_MEDIAN = 0.98
#: Trials the tables print.
MARKS = (1, 2, 3, 4, 6, 12)
#: The truth used without ``--truth-gpu`` / ``--truth-family``.
DEFAULT_TRUTH = "h100-c075-m085-o2"


@dataclass(frozen=True)
class Truth:
    """One hidden truth: a name, an accelerator profile file and, for a truth of another structure, a
    step profile file (without an accelerator file, the step profile runs on the datasheet accelerator).
    """

    name: str
    path: str | None
    step_profile: str | None = None

    def label(self) -> str:
        if self.path is None:
            hardware = "the datasheet accelerator"
        else:
            data, _overhead = read_perturbation(Path(self.path))
            hardware = str(data.get("description", self.name))
        if self.step_profile is None:
            return hardware
        profile = Path(self.step_profile)
        return f"{hardware}; step profile {profile.stem}: {step_profile_label(profile)}"

    def engine(self, directory: Path, settings: BenchSettings) -> SimConfig:
        """The simulated engine on this truth (files under ``directory``): the benchmark's model, the
        engine's semantics and own knobs at their defaults (the tuned ones are replaced per run)."""
        sim = truth_engine(
            None if self.path is None else Path(self.path),
            directory,
            model=settings.model,
            accelerator=settings.accelerator,
            step_profile=None if self.step_profile is None else Path(self.step_profile),
        )
        defaults = engine_defaults(settings)
        return replace(
            sim, scheduler=defaults.scheduler, gpu_memory_utilization=defaults.gpu_memory_utilization
        )

    @classmethod
    def of(cls, gpu: str | None, step_profile: str | None) -> Truth:
        """The truth of ``--truth-gpu`` and ``--truth-step-profile`` (one of them at least)."""
        names = [Path(p).stem for p in (gpu, step_profile) if p is not None]
        if not names:
            raise BenchError("a truth needs --truth-gpu or --truth-step-profile")
        return cls("+".join(names), gpu, step_profile)


@dataclass(frozen=True)
class TruthSettings:
    """Sizes of one hidden-truth run (``grid`` sizes the benchmark grid and the truth's capacity search)."""

    grid: BenchSettings = field(
        default_factory=lambda: replace(
            FULL,
            requests=200,
            tolerance=0.02,
            budget_points=6,
            seq_values=(16, 64, 256, 1024),
            long_prefill_values=(512,),
        )
    )
    truths: tuple[Truth, ...] = ()
    loads: tuple[float, ...] = (0.3, 0.6, 0.9)
    trials: int = 12
    repeats: int = 2
    #: Poisson arrival samples of the slice the ground truth averages a capacity over: on one sample
    #: the capacity of one configuration moves by up to 30% with the seed (docs/benchmarks.md).
    truth_arrivals: int = 3
    twin: TwinSettings = field(default_factory=TwinSettings)

    def __post_init__(self) -> None:
        if not self.loads or not all(0 < x <= 1.5 for x in self.loads):
            raise BenchError("--load: each offered load is a share of the optimum's capacity in (0, 1.5]")
        if self.trials < 1 or self.repeats < 1:
            raise BenchError("--trials and --repeats must be >= 1")
        if self.truth_arrivals < 1:
            raise BenchError("--truth-arrivals must be >= 1")
        check_truths(self.truths, self.grid.model)

    def with_truths(self, truths: Sequence[Truth]) -> TruthSettings:
        return replace(self, truths=tuple(truths))


def check_truths(truths: Sequence[Truth], model: str) -> None:
    """Read every truth's files as the simulated engines will, before any runs: a
    :class:`BenchError` naming the option and the fix for one that cannot be used with ``model``
    (a shipped family's files fit the model they are chosen for)."""
    for truth in truths:
        overhead = 1.0
        if truth.path is not None:
            try:
                _data, overhead = read_perturbation(Path(truth.path))
            except ValueError as exc:
                raise BenchError(f"--truth-gpu: {exc}") from exc
        if truth.step_profile is not None:
            try:
                read_truth_step_profile(Path(truth.step_profile), model=model, overhead=overhead)
            except ValueError as exc:
                raise BenchError(f"--truth-step-profile: {exc}") from exc


def family_truths() -> tuple[Truth, ...]:
    """The shipped perturbed profiles as truths."""
    return tuple(Truth(name, str(path)) for name, path in family().items())


def structural_family_truths(model: str = FULL.model) -> tuple[Truth, ...]:
    """The shipped structural step profiles of ``model`` as truths, each on the datasheet
    accelerator."""
    try:
        found = structural_family(model)
    except ValueError as exc:
        raise BenchError(f"--truth-family structural: {exc}") from exc
    return tuple(Truth(name, None, str(path)) for name, path in found.items())


def default_truths() -> tuple[Truth, ...]:
    return (Truth(DEFAULT_TRUTH, str(family()[DEFAULT_TRUTH])),)


TRUTH_FULL = TruthSettings()
TRUTH_QUICK = TruthSettings(
    grid=replace(
        FULL,
        requests=120,
        tolerance=0.05,
        budget_points=4,
        seq_values=(64, 256),
        long_prefill_values=(),
        autotune_seqs=(64, 256),
        workloads=("azure_code",),
        slo_pairs=(SLO_PAIRS[0],),
    ),
    trials=4,
    repeats=1,
    truth_arrivals=1,
    twin=TwinSettings(evaluations=12, rerank=2, requests=120, tolerance=0.06),
)


# --------------------------------------------------------------------------- the truth side


def _sim_slo(slo: SLOPair) -> SLO:
    return SLO(
        itl_ms=slo.itl_ms, itl_quantile=slo.itl_quantile, ttft_ms=slo.ttft_ms, ttft_quantile=slo.ttft_quantile
    )


class TruthEngine:
    """The live engine on the truth's hardware (a :class:`~chunkpilot.bench.online.LiveEngine`).

    It simulates a configuration at an offered load on the bundled trace's request lengths and returns
    only what the engine's metrics would show. Results are cached (the simulator is deterministic).
    """

    def __init__(
        self, sim: SimConfig, lengths: Workload, slo: SLO, max_model_len: int, seed: int = 0
    ) -> None:
        self._sim, self._lengths, self._slo = sim, lengths, slo
        self._max_model_len, self._seed = max_model_len, seed
        self._cache: dict[tuple[TunedConfig, float], Observation] = {}
        self.windows = 0

    def serve(self, config: TunedConfig, rate_req_s: float) -> Observation:
        key = (config, rate_req_s)
        if key not in self._cache:
            self.windows += 1
            telemetry = StepTelemetry()
            summary = simulate(
                replace(
                    self._sim, scheduler=tuned_scheduler(self._sim.scheduler, config, self._max_model_len)
                ),
                retime(self._lengths, rate_req_s, self._seed),
                self._slo,
                keep_records=True,
                telemetry=telemetry,
            )
            self._cache[key] = Observation(
                config=config,
                rate_req_s=rate_req_s,
                itl_ms=summary.itl_at_slo_quantile_ms,
                ttft_ms=summary.ttft_at_slo_quantile_ms,
                quantiles=LatencyQuantiles.of(summary),
                throughput_tok_s=summary.throughput_tok_s,
                prompt_tok_s=summary.prompt_throughput_tok_s,
                request_rate=summary.request_throughput_req_s,
                samples=summary.completed,
                steps=telemetry.totals(),
                window=self._window(summary),
            )
        return self._cache[key]

    def _window(self, summary: Summary) -> WorkloadWindow:
        """The request-length window; TensorRT-LLM exports no prefix-cache counters (a hit rate of 0)."""
        window = observe_window(summary, self._max_model_len)
        if self._sim.engine is Engine.TRTLLM:
            window = replace(window, prefix_cache_queries=0.0, prefix_cache_hits=0.0)
        return window


class GroundTruth:
    """Capacity at SLO on the truth (the simulator's bisection), cached per configuration.

    A configuration's capacity is the mean over ``arrivals`` Poisson arrival samples of the slice
    (seeds ``settings.seed``, ``+1``, ...; the same seeds for every configuration), 0 where a sample
    meets the SLOs at no rate: what the configuration serves on the next window, not on one draw;
    with ``min_duration_s``, a rate sustained that long (the slice repeated).
    """

    def __init__(
        self,
        sim: SimConfig,
        lengths: Workload,
        slo: SLO,
        settings: BenchSettings,
        arrivals: int = 1,
        min_duration_s: float = 0.0,
    ) -> None:
        self._sim, self._lengths, self._slo, self._settings = sim, lengths, slo, settings
        self._min_duration_s = min_duration_s
        self._seeds = tuple(settings.seed + k for k in range(arrivals))
        self._cache: dict[TunedConfig, float] = {}

    def capacity(self, config: TunedConfig) -> float:
        if config not in self._cache:
            self._cache[config] = statistics.fmean(self.samples(config))
        return self._cache[config]

    def samples(self, config: TunedConfig) -> list[float]:
        """The capacity on each arrival sample (requests/s, 0 where infeasible)."""
        st = self._settings
        sim = replace(self._sim, scheduler=tuned_scheduler(self._sim.scheduler, config, st.max_model_len))
        results = [
            find_capacity(
                sim,
                self._lengths,
                self._slo,
                tolerance=st.tolerance,
                start_rate=st.start_rate,
                seed=seed,
                min_duration_s=self._min_duration_s,
            )
            for seed in self._seeds
        ]
        return [r.capacity_req_s if r.feasible else 0.0 for r in results]


# --------------------------------------------------------------------------- one truth x workload x SLO


@dataclass(frozen=True)
class UnitTask:
    """One truth x workload x SLO pair, every load (runs in a worker process)."""

    truth: Truth
    workload: str
    slo: SLOPair
    settings: TruthSettings


def _curve(incumbents: Sequence[TunedConfig], start: TunedConfig, trials: int) -> list[TunedConfig]:
    """Incumbent after 1..``trials`` trials (the last repeats once a method stops)."""
    out: list[TunedConfig] = []
    current = start
    for i in range(trials):
        if i < len(incumbents):
            current = incumbents[i]
        out.append(current)
    return out


def _methods(
    context: OnlineContext, engine: LiveEngine, settings: TruthSettings
) -> tuple[dict[str, list[list[TunedConfig]]], dict[str, Any]]:
    """Each method's incumbent curves (one per seed) and the twin's trace facts."""
    start, trials = context.facts.incumbent, context.trials
    curves: dict[str, list[list[TunedConfig]]] = {m: [] for m in METHODS}
    traces = []
    for rep in range(settings.repeats):
        seeded = replace(context, seed=seed_for(f"bench/{context.seed}", rep))
        if rep == 0:
            trace = run_twin(seeded, engine, settings.twin)
            traces.append(trace)
            curves["twin"].append(_curve(trace.incumbents, start, trials))
        curves["slack"].append(_curve(run_slack(seeded, engine), start, trials))
        curves["random"].append(_curve(run_random_online(seeded, engine), start, trials))
    curves["grid"].append(_curve(run_grid_online(context, engine, settings.grid), start, trials))
    trace = traces[0]
    facts = {
        "cpu_s": trace.cpu_s,
        "cpu_s_per_trial": trace.cpu_s_per_trial,
        "evaluations": trace.evaluations,
        "canary_trials": len(trace.canaries),
        "canaries": [c.summary() for c in trace.canaries],
        "reasons": trace.reasons,
        "predicted_req_s": trace.predicted_req_s,
        "stopped": trace.stopped,
    }
    return curves, facts


def run_unit(task: UnitTask) -> list[dict[str, Any]]:
    """Every load of one truth x workload x SLO pair: the scenario entries of the JSON."""
    st = task.settings
    grid_st = st.grid
    lengths = load_trace(WORKLOADS[task.workload], rate=1.0, limit=grid_st.requests)
    slo = _sim_slo(task.slo)
    facts = scenario_facts(grid_st, task.slo, task.workload)
    space = build_space(facts)
    grid = Grid.over(space, grid_st)
    default = default_config(grid_st)
    with tempfile.TemporaryDirectory(prefix="bench-truth-") as tmp:
        sim = task.truth.engine(Path(tmp), grid_st)
        engine_sim = engine_defaults(grid_st)
        truth = GroundTruth(sim, lengths, slo, grid_st, st.truth_arrivals)
        landscape = {c: truth.capacity(c) for c in (*grid.configs, default)}
        grid_best = max(grid.configs, key=lambda c: (landscape[c], -grid.configs.index(c)))
        runs = []
        for load in st.loads:
            rate = load * landscape[grid_best]
            context = OnlineContext(
                facts, space, grid, slo, rate, st.trials, grid_st.seed, engine=engine_sim.scheduler
            )
            engine = TruthEngine(sim, lengths, slo, grid_st.max_model_len, grid_st.seed)
            curves, twin_facts = _methods(context, engine, st)
            runs.append((load, rate, curves, twin_facts, engine.windows))
        promoted = {c for *_, curves, _f, _w in runs for cs in curves.values() for curve in cs for c in curve}
        true = {c: truth.capacity(c) for c in promoted} | landscape
    optimum_config = max(true, key=lambda c: true[c])
    optimum = true[optimum_config]
    out = []
    for load, rate, curves, twin_facts, windows in runs:
        share = {m: _mean([[true[c] / optimum for c in curve] for curve in cs]) for m, cs in curves.items()}
        out.append(
            {
                "truth": task.truth.name,
                "truth_profile": task.truth.label(),
                "engine": grid_st.engine,
                "space": space.describe(),
                "workload": task.workload,
                "trace": WORKLOADS[task.workload],
                "slo": {
                    "name": task.slo.name,
                    **{
                        k: getattr(task.slo, k)
                        for k in ("itl_ms", "itl_quantile", "ttft_ms", "ttft_quantile")
                    },
                },
                "load": load,
                "offered_rate_req_s": rate,
                "optimum_req_s": optimum,
                "optimum_config": optimum_config.as_dict(),
                "grid_optimum_req_s": landscape[grid_best],
                "grid_size": len(grid.configs),
                "default_share": landscape[default] / optimum if optimum > 0 else None,
                "share_after_trials": share,
                "final_config": {m: cs[0][-1].as_dict() for m, cs in curves.items()},
                "twin": twin_facts,
                "engine_windows": windows,
            }
        )
    return out


def _mean(rows: Sequence[Sequence[float]]) -> list[float]:
    return [sum(values) / len(rows) for values in zip(*rows, strict=True)]


# --------------------------------------------------------------------------- the run


@dataclass
class TruthResult:
    """Every scenario x load entry plus run facts."""

    settings: TruthSettings
    scenarios: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = 0.0

    def goal(self) -> dict[str, Any]:
        """The twin's share after GOAL_TRIALS trials: every entry >= GOAL_SHARE, median >= GOAL_MEDIAN."""
        k = min(GOAL_TRIALS, self.settings.trials)
        shares = [s["share_after_trials"]["twin"][k - 1] for s in self.scenarios]
        misses = [_key(s) for s in self.scenarios if s["share_after_trials"]["twin"][k - 1] < GOAL_SHARE]
        median = statistics.median(shares) if shares else float("nan")
        return {
            "trials": GOAL_TRIALS,
            "share": GOAL_SHARE,
            "median_share": GOAL_MEDIAN,
            "measured_median": median,
            "measured_min": min(shares) if shares else None,
            "misses": misses,
            "falls": [fall for s in self.scenarios for fall in _falls(s)],
            "met": bool(shares) and not misses and median >= GOAL_MEDIAN,
        }

    def to_dict(self) -> dict[str, Any]:
        st, grid = self.settings, self.settings.grid
        cpu = [s["twin"]["cpu_s_per_trial"] for s in self.scenarios]
        return {
            "benchmark": "tuner",
            "mode": "hidden-truth",
            "model": grid.model,
            "accelerator": grid.accelerator,
            "engine": grid.engine,
            "engine_version": engine_version(grid.engine),
            "engine_settings": engine_settings(grid),
            "truths": [{"name": t.name, "profile": t.label()} for t in st.truths],
            "loads": list(st.loads),
            "requests_per_slice": grid.requests,
            "truth_arrivals": st.truth_arrivals,
            "trials": st.trials,
            "repeats": st.repeats,
            "methods": list(METHODS),
            "capacity_search": {"tolerance": grid.tolerance, "start_rate": grid.start_rate},
            "twin_settings": {k: getattr(st.twin, k) for k in st.twin.__dataclass_fields__},
            "goal": self.goal(),
            "twin_cpu_s_per_trial": {"max": max(cpu, default=0.0), "mean": sum(cpu) / max(1, len(cpu))},
            "wall_s": self.wall_s,
            "scenarios": self.scenarios,
        }


def _falls(entry: dict[str, Any]) -> list[str]:
    """Every promotion after which the twin's incumbent served less than the one before."""
    curve = entry["share_after_trials"]["twin"]
    return [
        f"{_key(entry)}: {before:.1%} after trial {trial} -> {after:.1%} after trial {trial + 1}"
        for trial, (before, after) in enumerate(itertools.pairwise(curve), start=1)
        if after < before
    ]


def _key(entry: dict[str, Any]) -> str:
    return f"{entry['truth']} / {entry['workload']} / {entry['slo']['name']} @ {entry['load']:.0%}"


def run_truth_benchmark(
    settings: TruthSettings, progress: Callable[[str], None] | None = None
) -> TruthResult:
    """Run every truth x workload x SLO pair (in ``settings.grid.jobs`` processes)."""
    say = progress or (lambda _msg: None)
    started = time.perf_counter()
    truths = settings.truths or default_truths()
    settings = settings.with_truths(truths)
    grid = settings.grid
    tasks = [UnitTask(t, w, s, settings) for t in truths for w in grid.workloads for s in grid.slo_pairs]
    say(
        f"{len(tasks)} truth x workload x SLO units, {len(settings.loads)} loads each, "
        f"{grid.jobs} process(es)"
    )
    result = TruthResult(settings)
    if grid.jobs <= 1 or len(tasks) <= 1:
        outcomes = (run_unit(t) for t in tasks)
        for task, entries in zip(tasks, outcomes, strict=True):
            result.scenarios.extend(entries)
            say(f"done {task.truth.name} / {task.workload} / {task.slo.name}")
    else:
        with ProcessPoolExecutor(max_workers=grid.jobs) as pool:
            for task, entries in zip(tasks, pool.map(run_unit, tasks), strict=True):
                result.scenarios.extend(entries)
                say(f"done {task.truth.name} / {task.workload} / {task.slo.name}")
    result.wall_s = time.perf_counter() - started
    return result


# --------------------------------------------------------------------------- output


def _marks(trials: int) -> list[int]:
    return [k for k in MARKS if k <= trials]


def format_truth_table(result: TruthResult) -> str:
    """Per scenario and load: the share of the true optimum after 1, 2, 3, 4, 6, 12 canary trials."""
    st = result.settings
    marks = _marks(st.trials)
    lines = [
        f"Tuner benchmark with a hidden truth: {st.grid.model} on {st.grid.engine}, "
        f"the tuner told {st.grid.accelerator}; "
        f"{st.grid.requests} requests per trace slice; share of the true optimum's capacity at SLO "
        f"reached by each method's promoted configuration; slack/random mean of {st.repeats} seeds",
        "",
    ]
    for s in result.scenarios:
        lines.append(
            f"== {_key(s)}: offered {s['offered_rate_req_s']:.2f} req/s, "
            f"optimum {s['optimum_req_s']:.2f} req/s "
            f"({s['truth_profile']})"
        )
        lines.append("   trials " + "".join(f"{m:>9}" for m in METHODS))
        for k in marks:
            cells = "".join(f"{s['share_after_trials'][m][k - 1]:9.1%}" for m in METHODS)
            lines.append(f"   {k:>6} {cells}")
        twin = s["twin"]
        lines.append(
            f"   twin: {twin['canary_trials']} canary trials, {twin['evaluations']} twin evaluations, "
            f"{twin['cpu_s_per_trial']:.1f} CPU s per trial"
            + (f"; {twin['stopped']}" if twin["stopped"] else "")
        )
        lines.append("")
    goal = result.goal()
    lines.append(
        f"goal (twin >= {GOAL_SHARE:.0%} within {GOAL_TRIALS} trials everywhere, "
        f"median >= {GOAL_MEDIAN:.0%}): "
        f"{'met' if goal['met'] else 'NOT met'}; median {goal['measured_median']:.1%}, "
        f"min {goal['measured_min'] or 0:.1%}; misses: {', '.join(goal['misses']) or 'none'}; "
        f"falls: {', '.join(goal['falls']) or 'none'}"
    )
    lines.append(f"{result.wall_s:.0f} s wall")
    return "\n".join(lines)


def format_truth_markdown(data: dict[str, Any]) -> str:
    """Markdown tables (one per truth) from :meth:`TruthResult.to_dict`, for docs/benchmarks.md."""
    marks = _marks(int(data["trials"]))
    out: list[str] = []
    for truth in data["truths"]:
        rows = [s for s in data["scenarios"] if s["truth"] == truth["name"]]
        out.append(f"**{truth['name']}** ({truth['profile']})\n")
        head = ["scenario", "load", *(f"{m} {k}" for m in METHODS for k in marks), "twin CPU s/trial"]
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "---|" * len(head))
        for s in rows:
            cells = [f"{s['workload']} / {s['slo']['name']}", f"{s['load']:.0%}"]
            cells += [f"{s['share_after_trials'][m][k - 1]:.0%}" for m in METHODS for k in marks]
            cells.append(f"{s['twin']['cpu_s_per_trial']:.1f}")
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)
