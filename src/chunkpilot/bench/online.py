"""The tuner side of the hidden-truth benchmark: online methods that see only the live engine.

Every method here receives a :class:`LiveEngine`, which serves a configuration at the offered load
and returns an :class:`Observation` (the measured SLO quantiles, throughput, step telemetry and the
request-length window: what Prometheus shows online), and the datasheet facts the tuner is told.
Nothing here can name, load or read the truth profile: it lives only inside the engine object and
the ground-truth functions of :mod:`chunkpilot.bench.truth`.

Methods (each returns the promoted incumbent after every canary trial):

- ``twin``: fit the twin from the stable track's step telemetry and captured workload, rank the
  space on it (:func:`~chunkpilot.tuner.twin.search.search_on_twin`), canary the best untried
  candidate, the one with the most capacity under the fit's step-time uncertainty
  (:func:`~chunkpilot.tuner.twin.search.robust_ranking`); refit with the canary's steps and
  re-rank; promote only when the canary meets both SLOs at the live load, agrees with the twin's
  prediction within :data:`AGREEMENT`, its predicted capacity beats the incumbent's by the margin
  and its robust capacity is still above the incumbent's. It stops when no untried
  candidate is predicted to beat the incumbent by the margin.
- ``slack``: today's online objective, ``policy.objective_value`` (throughput x (1 + 0.5 x slack))
  at the offered load, searched with the tuner's TPE (warm start included) on the benchmark grid;
- ``random`` / ``grid``: random grid points / vLLM auto_tune's sweep, judged online the same way.

Promotion for the last three follows ``policy.judge_final``: the canary meets both SLOs and its
objective is at least the margin above the incumbent's, both measured at the same load (or the
incumbent violates an SLO).
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from chunkpilot.bench.exhaustive import BenchSettings, Capacity, run_random, run_tpe
from chunkpilot.bench.grid import Grid, autotune_order
from chunkpilot.engine.sim.metrics import StepTotals
from chunkpilot.engine.sim.offline import SLO
from chunkpilot.engine.sim.scheduler import SchedulerConfig
from chunkpilot.tuner.measure import TrackMeasurement
from chunkpilot.tuner.policy import AGREEMENT_FLOOR, PROMOTE_MARGIN, SLOTargets, check_slo, objective_value
from chunkpilot.tuner.space import SearchSpace, ServiceFacts, TunedConfig
from chunkpilot.tuner.twin.capture import WorkloadWindow, synthesize
from chunkpilot.tuner.twin.fit import fit_steps
from chunkpilot.tuner.twin.online import SUSTAINED_REQUESTS, quantile_errors
from chunkpilot.tuner.twin.predict import ARRIVAL_SAMPLES, LatencyQuantiles, Twin, arrival_seeds
from chunkpilot.tuner.twin.search import (
    Candidate,
    evaluate_on_twin,
    planning_capacity,
    robust_ranking,
    scheduler_of,
    search_on_twin,
)
from chunkpilot.tuner.warmstart import warm_start

__all__ = [
    "AGREEMENT",
    "LiveEngine",
    "Observation",
    "OnlineContext",
    "TwinSettings",
    "TwinTrace",
    "agrees",
    "replay_promotions",
    "run_grid_online",
    "run_random_online",
    "run_slack",
    "run_twin",
    "twin_capacity",
]

#: The twin's predicted SLO quantiles at the live load must lie within this relative distance of the
#: canary's measured ones (or within the tuner's ``AGREEMENT_FLOOR`` of the target, for tiny latencies).
AGREEMENT = 0.25


@dataclass(frozen=True)
class Observation:
    """One track over one window, as the tuner sees it online."""

    config: TunedConfig
    rate_req_s: float
    itl_ms: float  # at the SLO's ITL quantile
    ttft_ms: float  # at the SLO's TTFT quantile
    quantiles: LatencyQuantiles
    throughput_tok_s: float
    prompt_tok_s: float
    request_rate: float
    samples: int
    steps: Mapping[str, StepTotals]
    window: WorkloadWindow

    def measurement(self, slo: SLO, track: str) -> TrackMeasurement:
        """The same numbers as the tuner's per-track measurement (one replica)."""
        return TrackMeasurement(
            track=track,
            window="window",
            time=datetime(2026, 1, 1, tzinfo=UTC),
            itl_quantile=slo.itl_quantile,
            ttft_quantile=slo.ttft_quantile,
            itl_ms=self.itl_ms,
            ttft_ms=self.ttft_ms,
            itl_samples=float(self.samples),
            ttft_samples=float(self.samples),
            generation_tok_s=self.throughput_tok_s,
            prompt_tok_s=self.prompt_tok_s,
            request_rate=self.request_rate,
            replicas=1,
        )


class LiveEngine(Protocol):
    """The engine the tuner tunes: it serves a configuration at a load and reports its metrics."""

    def serve(self, config: TunedConfig, rate_req_s: float) -> Observation: ...


@dataclass(frozen=True)
class OnlineContext:
    """What the tuner knows about the service: datasheet facts, space, SLOs and the live load."""

    facts: ServiceFacts
    space: SearchSpace
    grid: Grid
    slo: SLO
    rate_req_s: float
    trials: int
    seed: int
    #: The engine's own scheduler settings as the service spec gives them (kind, and the knobs the
    #: tuner does not move); the twin simulates with them. None: vLLM's defaults.
    engine: SchedulerConfig | None = None

    @property
    def targets(self) -> SLOTargets:
        return SLOTargets(self.slo.itl_ms, self.slo.ttft_ms, self.slo.itl_quantile, self.slo.ttft_quantile)

    def met(self, observation: Observation) -> bool:
        return bool(check_slo(observation.measurement(self.slo, "canary"), self.targets).met)

    def slack_value(self, observation: Observation) -> float:
        """Today's online objective of one observation (0 without data)."""
        value = objective_value(observation.measurement(self.slo, "canary"), self.targets)
        return value if value is not None else 0.0


def replay_promotions(
    context: OnlineContext,
    engine: LiveEngine,
    tried: Sequence[TunedConfig],
    margin: float = PROMOTE_MARGIN,
) -> list[TunedConfig]:
    """The incumbent after each canary trial, judged by today's online objective at the live load."""
    incumbent = context.facts.incumbent
    stable = engine.serve(incumbent, context.rate_req_s)
    best, best_met = context.slack_value(stable), context.met(stable)
    out: list[TunedConfig] = []
    for config in tried:
        canary = engine.serve(config, context.rate_req_s)
        value = context.slack_value(canary)
        if context.met(canary) and (not best_met or value >= best * (1 + margin)):
            incumbent, best, best_met = config, value, True
        out.append(incumbent)
    return out


# --------------------------------------------------------------------------- the twin method


@dataclass(frozen=True)
class TwinSettings:
    """Sizes of the twin method: search budget, re-ranking width and prediction accuracy."""

    evaluations: int = 48
    cpu_budget_s: float = 60.0
    rerank: int = 6
    requests: int = 200
    tolerance: float = 0.03
    margin: float = PROMOTE_MARGIN
    #: Seeds of the arrival samples each of the twin's capacities is averaged over (the operator's).
    arrival_seeds: tuple[int, ...] = arrival_seeds(ARRIVAL_SAMPLES)


@dataclass
class TwinTrace:
    """What the twin method did: incumbents after each trial, the canaries and why, and its CPU cost."""

    incumbents: list[TunedConfig] = field(default_factory=list)
    canaries: list[TunedConfig] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    predicted_req_s: list[float] = field(default_factory=list)
    cpu_s: float = 0.0
    evaluations: int = 0
    stopped: str = ""

    @property
    def cpu_s_per_trial(self) -> float:
        return self.cpu_s / max(1, len(self.canaries))


def agrees(predicted: LatencyQuantiles, observation: Observation, slo: SLO) -> tuple[bool, str]:
    """Whether the twin's predicted SLO quantiles match the canary's (see :data:`AGREEMENT`)."""
    pairs = (
        ("ITL", predicted.itl_p99_ms, observation.quantiles.itl_p99_ms, slo.itl_ms),
        ("TTFT", predicted.ttft_p95_ms, observation.quantiles.ttft_p95_ms, slo.ttft_ms),
    )
    worst = ""
    ok = True
    for name, p, m, target in pairs:
        if not (math.isfinite(p) and math.isfinite(m)):
            return False, f"{name}: no prediction or measurement"
        if abs(p - m) > max(AGREEMENT * m, AGREEMENT_FLOOR * target):
            ok = False
            worst = f"{name} predicted {p:.1f} ms, measured {m:.1f} ms"
    return ok, worst


def _add_steps(a: Mapping[str, StepTotals], b: Mapping[str, StepTotals]) -> dict[str, StepTotals]:
    out = dict(a)
    for label, totals in b.items():
        base = out.get(label, StepTotals())
        out[label] = StepTotals(*(getattr(base, f.name) + getattr(totals, f.name) for f in fields(totals)))
    return out


class _TwinState:
    """The twin, its telemetry and its current ranking (rebuilt at each refit)."""

    def __init__(self, context: OnlineContext, settings: TwinSettings, root: Path, stable: Observation):
        self.context, self.settings, self.root = context, settings, root
        self.steps: dict[str, StepTotals] = dict(stable.steps)
        self.workload = synthesize(
            stable.window, settings.requests, max_model_len=context.space.max_model_len, seed=context.seed
        )
        #: The larger sample the operator plans a sustained capacity on (:func:`twin_capacity`).
        self.sustained = synthesize(
            stable.window,
            SUSTAINED_REQUESTS,
            max_model_len=context.space.max_model_len,
            seed=context.seed,
            by_segment=True,
        )
        self.refits = 0
        self.twin = self._fit()
        self.predicted: dict[TunedConfig, Candidate] = {}

    def _fit(self) -> Twin:
        facts = self.context.facts
        fit = fit_steps(self.steps, facts.model, facts.accelerator)
        self.refits += 1
        return Twin.build(
            fit,
            self.workload,
            self.root / f"fit-{self.refits}",
            gpu_memory_utilization=facts.gpu_memory_utilization,
            engine=self.context.engine,
            arrival_seeds=self.settings.arrival_seeds,
            sustained_workload=self.sustained,
        )

    def refit(self, canary: Observation) -> None:
        self.steps = _add_steps(self.steps, canary.steps)
        self.twin = self._fit()

    def evaluate(self, configs: Sequence[TunedConfig], *, seed: int, evaluations: int) -> int:
        """Re-predict ``configs`` on the current twin, then (budget left) let TPE add new ones."""
        result = search_on_twin(
            self.twin,
            self.context.space,
            self.context.slo,
            seed=seed,
            cpu_budget_s=self.settings.cpu_budget_s,
            max_evaluations=max(evaluations, len(configs)),
            warm=configs,
            requests=self.settings.requests,
            tolerance=self.settings.tolerance,
        )
        self.predicted.update({c.config: c for c in result.ranked})
        return result.evaluations

    def capacity(self, config: TunedConfig) -> float:
        if config not in self.predicted:
            self.predicted[config] = evaluate_on_twin(
                self.twin,
                config,
                self.context.slo,
                max_model_len=self.context.space.max_model_len,
                requests=self.settings.requests,
                tolerance=self.settings.tolerance,
            )
        return self.predicted[config].capacity_req_s

    def robust_capacity(self, config: TunedConfig) -> float:
        """``config``'s capacity under the twin's step-time uncertainty (as the operator judges)."""
        self.capacity(config)
        (evaluated,) = robust_ranking(
            self.twin,
            [self.predicted[config]],
            self.context.slo,
            max_model_len=self.context.space.max_model_len,
            requests=self.settings.requests,
            tolerance=self.settings.tolerance,
            limit=1,
        )
        self.predicted[config] = evaluated
        return evaluated.robust_key

    def ranking(self, tried: set[TunedConfig]) -> list[Candidate]:
        """Untried candidates, the most robust first (:func:`robust_ranking`, as the operator ranks)."""
        order = list(self.predicted)
        untried = [c for c in self.predicted.values() if c.config not in tried]
        ranked = robust_ranking(
            self.twin,
            sorted(untried, key=lambda c: (-c.capacity_req_s, order.index(c.config))),
            self.context.slo,
            max_model_len=self.context.space.max_model_len,
            requests=self.settings.requests,
            tolerance=self.settings.tolerance,
        )
        self.predicted.update({c.config: c for c in ranked})
        return ranked

    def latency(self, config: TunedConfig) -> LatencyQuantiles:
        scheduler = scheduler_of(config, self.context.space.max_model_len)
        return self.twin.latency(scheduler, self.context.rate_req_s, self.context.slo)


def _warm(context: OnlineContext) -> list[TunedConfig]:
    starts = [context.space.to_config(w) for w in warm_start(context.space, context.facts)]
    return list(dict.fromkeys([context.facts.incumbent, *starts]))


def run_twin(context: OnlineContext, engine: LiveEngine, settings: TwinSettings) -> TwinTrace:
    """The twin method (module docstring); CPU time counts the tuner's work, not the engine's."""
    trace = TwinTrace()
    clock = _Clock()
    stable = engine.serve(context.facts.incumbent, context.rate_req_s)
    with tempfile.TemporaryDirectory(prefix="bench-twin-") as tmp, clock:
        state = _TwinState(context, settings, Path(tmp), stable)
        trace.evaluations += state.evaluate(
            _warm(context), seed=context.seed, evaluations=settings.evaluations
        )
        incumbent = context.facts.incumbent
        tried = {incumbent}
        for number in range(context.trials):
            incumbent_req_s = state.capacity(incumbent)
            ranking = state.ranking(tried)
            if not ranking or ranking[0].capacity_req_s < incumbent_req_s * (1 + settings.margin):
                trace.stopped = (
                    f"stopped after {number} trials: no untried candidate "
                    f"predicted {settings.margin:.0%} above the incumbent"
                )
                break
            candidate = ranking[0]
            predicted = state.latency(candidate.config)
            with clock.paused():
                canary = engine.serve(candidate.config, context.rate_req_s)
            tried.add(candidate.config)
            ok, disagreement = agrees(predicted, canary, context.slo)
            state.refit(canary)
            if not ok:
                # The refitted twin has seen this configuration's own steps: check it again.
                ok, after = agrees(state.latency(candidate.config), canary, context.slo)
                disagreement = f"{disagreement}; after the refit: {after or 'agrees'}"
            rerank = [incumbent, candidate.config, *(c.config for c in ranking[1 : 1 + settings.rerank])]
            state.predicted = {}
            trace.evaluations += state.evaluate(
                rerank, seed=context.seed + number + 1, evaluations=len(rerank)
            )
            incumbent, reason = _judge(
                context, settings, state, incumbent, candidate, canary, ok, disagreement
            )
            trace.canaries.append(candidate.config)
            trace.incumbents.append(incumbent)
            trace.reasons.append(reason)
            trace.predicted_req_s.append(state.capacity(candidate.config))
    trace.cpu_s = clock.total
    return trace


def twin_capacity(context: OnlineContext, settings: TwinSettings, stable: Observation) -> tuple[float, float]:
    """The twin fitted on one track's window (``stable``), as the replica planner sizes with it
    (:func:`~chunkpilot.tuner.twin.search.planning_capacity`): the capacity the configuration it ran
    sustains at SLO, and at the SLO with each target tightened by the twin's relative error on that
    quantile over that window, as the operator does)."""
    context = replace(context, rate_req_s=stable.rate_req_s)
    with tempfile.TemporaryDirectory(prefix="bench-twin-") as tmp:
        state = _TwinState(context, settings, Path(tmp), stable)
        predicted = state.latency(stable.config)
        measured = stable.quantiles
        errors = quantile_errors(
            (predicted.itl_p99_ms, predicted.ttft_p95_ms), (measured.itl_p99_ms, measured.ttft_p95_ms)
        )
        return planning_capacity(
            state.twin.for_planning(),
            stable.config,
            context.slo,
            errors,
            max_model_len=context.space.max_model_len,
            tolerance=settings.tolerance,
        )


def _judge(
    context: OnlineContext,
    settings: TwinSettings,
    state: _TwinState,
    incumbent: TunedConfig,
    candidate: Candidate,
    canary: Observation,
    agreed: bool,
    disagreement: str,
) -> tuple[TunedConfig, str]:
    """Promote or keep the incumbent, with the reason the trial records."""
    if not context.met(canary):
        return incumbent, f"canary misses the SLO (ITL {canary.itl_ms:.1f} ms, TTFT {canary.ttft_ms:.1f} ms)"
    if not agreed:
        return incumbent, f"twin and canary disagree ({disagreement}): refitted and re-ranked"
    note = f" (twin disagreed before its refit: {disagreement})" if disagreement else ""
    mine, theirs = state.capacity(candidate.config), state.capacity(incumbent)
    if mine < theirs * (1 + settings.margin):
        return (
            incumbent,
            f"predicted {mine:.2f} req/s is not {settings.margin:.0%} above the incumbent's {theirs:.2f}",
        )
    robust = state.robust_capacity(candidate.config)
    if robust < theirs:
        return (
            incumbent,
            f"predicted {mine:.2f} req/s vs {theirs:.2f}, but the gain is within the twin's uncertainty "
            f"({robust:.2f} req/s under its step-time uncertainty)",
        )
    return candidate.config, f"promoted: predicted {mine:.2f} req/s vs {theirs:.2f}{note}"


class _Clock:
    """CPU seconds (``time.process_time``) inside ``with clock:``, less those in ``clock.paused()``."""

    def __init__(self) -> None:
        self.total = 0.0
        self._started = 0.0

    def __enter__(self) -> _Clock:
        self._started = time.process_time()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.total += time.process_time() - self._started

    def paused(self) -> _Pause:
        return _Pause(self)


class _Pause:
    def __init__(self, clock: _Clock) -> None:
        self.clock = clock

    def __enter__(self) -> None:
        self.clock.__exit__()

    def __exit__(self, *_exc: object) -> None:
        self.clock.__enter__()


def _online_capacity(context: OnlineContext, engine: LiveEngine) -> Callable[[TunedConfig], Capacity]:
    """Today's online objective as the benchmark's objective callable (constraints as the tuner records)."""

    def objective(config: TunedConfig) -> Capacity:
        observation = engine.serve(config, context.rate_req_s)
        constraints = {
            "itl": observation.itl_ms / context.slo.itl_ms - 1.0,
            "ttft": observation.ttft_ms / context.slo.ttft_ms - 1.0,
        }
        constraints = {k: (v if math.isfinite(v) else 1e6) for k, v in constraints.items()}
        return Capacity(context.slack_value(observation), constraints, 1)

    return objective


def run_slack(context: OnlineContext, engine: LiveEngine) -> list[TunedConfig]:
    """Today's tuner: warm start + TPE on the grid, ranking by the online (slack) objective."""
    uid = f"bench/{context.seed}"
    history = run_tpe(context.grid, context.facts, _online_capacity(context, engine), context.trials, uid)
    return replay_promotions(context, engine, [c for c, _ in history])


def run_random_online(context: OnlineContext, engine: LiveEngine) -> list[TunedConfig]:
    """Random distinct grid points, judged by the online objective."""
    history = run_random(context.grid, _online_capacity(context, engine), context.trials, context.seed)
    return replay_promotions(context, engine, [c for c, _ in history])


def run_grid_online(context: OnlineContext, engine: LiveEngine, sizes: BenchSettings) -> list[TunedConfig]:
    """vLLM auto_tune's sweep order, judged by the online objective."""
    order = autotune_order(context.grid, sizes)[: context.trials]
    return replay_promotions(context, engine, order)
