"""Rank configurations on the twin: Optuna TPE over the search space, each evaluation one capacity search.

Every evaluation asks the twin for the capacity at SLO of one configuration
(:meth:`~chunkpilot.tuner.twin.predict.Twin.capacity`). The search stops when its CPU budget
(:func:`time.process_time`) or its evaluation cap is spent, or when the sampler keeps proposing
configurations it already knows. It is seeded: with the same twin, space, seed, warm starts and
evaluation count the ranking is the same (a CPU budget that binds can stop it at a different count).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

import optuna
from chunkpilot.engine.sim.capacity import DEFAULT_GROWTH, CapacityResult
from chunkpilot.engine.sim.offline import SLO, Summary
from chunkpilot.engine.sim.scheduler import SchedulerConfig
from chunkpilot.tuner.space import SearchSpace, TunedConfig
from chunkpilot.tuner.twin.predict import CAPACITY_REQUESTS, CAPACITY_TOLERANCE, SAMPLE_GROWTH, Twin
from optuna.distributions import BaseDistribution
from optuna.samplers import TPESampler
from optuna.trial import TrialState

from chunkpilot.api import Objective

__all__ = [
    "ERROR_POINTS",
    "NEAR_GROWTH",
    "ROBUST_EVALUATIONS",
    "SUSTAINED_S",
    "Candidate",
    "Ranking",
    "TwinSearchResult",
    "nearest_capacity",
    "planning_capacity",
    "robust_ranking",
    "scheduler_of",
    "search_on_twin",
    "twin_objective",
]

T = TypeVar("T")

#: Consecutive proposals of known configurations after which the space counts as exhausted.
MAX_REPEATS = 50
#: Random proposals before TPE models the results.
STARTUP_TRIALS = 8
#: Most candidates :func:`robust_ranking` evaluates again under the fit's uncertainty.
ROBUST_EVALUATIONS = 4
#: The step-time errors, in standard errors, a robust capacity is also evaluated at (slower, faster).
ERROR_POINTS = (1.0, -1.0)
#: The bracket's factor per probe of a capacity search started at a neighbour's capacity: one
#: bisection fewer than doubling's when the neighbour is within it (a 20% bracket halves to the 3%
#: tolerance in three probes), a few probes more when it is far off.
NEAR_GROWTH = 1.2
#: How long a capacity the replica planner sizes with must be sustained (seconds of arrivals per
#: probed rate): a few hundred requests at tens of requests/s arrive within seconds, and the rate at
#: which a replica absorbs such a burst is up to several times what it serves for minutes.
SUSTAINED_S = 180.0


@dataclass(frozen=True)
class Candidate:
    """One configuration as the twin sees it.

    ``capacity_req_s``: predicted capacity at SLO of one replica (0 when no rate meets the SLO);
    ``tokens_s``: predicted output throughput at that capacity; ``itl_ms`` / ``ttft_ms``: the SLO
    quantiles there (NaN when infeasible).
    """

    config: TunedConfig
    capacity_req_s: float
    tokens_s: float = 0.0
    itl_ms: float = math.nan
    ttft_ms: float = math.nan
    #: Its capacity under the fit's step-time uncertainty at its budget (:func:`robust_ranking`: the
    #: mean over the twin as fitted, one standard error slower and one faster, at most the capacity);
    #: None: not evaluated.
    robust_req_s: float | None = None

    @property
    def robust_key(self) -> float:
        """What the robust ranking orders by: the robust capacity, else (an upper bound of it) the
        capacity."""
        return self.capacity_req_s if self.robust_req_s is None else self.robust_req_s


@dataclass(frozen=True)
class Ranking(Generic[T]):
    """What a search on the twin evaluated, best first, and what the search cost."""

    ranked: tuple[T, ...]
    evaluations: int
    cpu_seconds: float

    @property
    def best(self) -> T | None:
        """The top-ranked entry (None when nothing was evaluated)."""
        return self.ranked[0] if self.ranked else None


class TwinSearchResult(Ranking[Candidate]):
    """The twin's ranking: distinct configurations, best first (excluded ones left out)."""


def scheduler_of(config: TunedConfig, max_model_len: int = 8192) -> SchedulerConfig:
    """The simulator's scheduler running ``config`` (every tuned knob; the names are the same)."""
    return SchedulerConfig(**config.as_dict(), max_model_len=max_model_len)  # type: ignore[arg-type]


def planning_capacity(
    twin: Twin,
    config: TunedConfig,
    slo: SLO,
    error: float | tuple[float, float],
    *,
    max_model_len: int = 8192,
    requests: int | None = None,
    tolerance: float = CAPACITY_TOLERANCE,
) -> tuple[float, float]:
    """What the replica planner sizes with: the capacity one replica of ``config`` sustains
    (:data:`SUSTAINED_S`) at ``slo``, and at ``slo`` with each target divided by ``1 + error`` (the
    twin's relative latency error: one for both, or the ITL's and the TTFT's own): the capacity
    should its latencies be that much longer (``requests``: only the first of the twin's workload).
    The replica planner passes :meth:`Twin.for_planning
    <chunkpilot.tuner.twin.predict.Twin.for_planning>`, and so do the pools' capacities it is
    compared with (:mod:`chunkpilot.tuner.topology.sizing`). Near the targets a small latency
    error moves the capacity a lot; this carries it over. A quantile the twin predicts well is not
    tightened for the other's error."""
    itl_error, ttft_error = (error, error) if isinstance(error, (int, float)) else error
    itl_error, ttft_error = (max(0.0, e) if math.isfinite(e) else 0.0 for e in (itl_error, ttft_error))
    sample = len(twin.workload.requests) if requests is None else requests

    def at(target: SLO, near: float | None = None) -> float:
        return evaluate_on_twin(
            twin,
            config,
            target,
            max_model_len=max_model_len,
            requests=sample,
            tolerance=tolerance,
            min_duration_s=SUSTAINED_S,
            near_req_s=near,
        ).capacity_req_s

    nominal = at(slo)
    if (itl_error <= 0 and ttft_error <= 0) or nominal <= 0:
        return nominal, nominal
    tight = replace(slo, itl_ms=slo.itl_ms / (1 + itl_error), ttft_ms=slo.ttft_ms / (1 + ttft_error))
    return nominal, min(nominal, at(tight, near=nominal))


def _sample_capacities(
    twin: Twin,
    scheduler: SchedulerConfig,
    slo: SLO,
    seeds: Sequence[int],
    *,
    requests: int,
    tolerance: float,
    min_duration_s: float,
    start_rate: float | None = None,
    growth: float = DEFAULT_GROWTH,
) -> list[CapacityResult]:
    """The capacity on each arrival sample of ``seeds``: the first searched from ``start_rate`` (the
    captured arrival rate when None) by ``growth``, the others from the first's capacity by
    :data:`SAMPLE_GROWTH` (or as the first, when it found none)."""
    found: list[CapacityResult] = []
    for seed in seeds:
        first = found[0] if found else None
        near = first is not None and first.feasible
        found.append(
            twin.capacity(
                scheduler,
                slo,
                requests=requests,
                tolerance=tolerance,
                seed=seed,
                start_rate=first.capacity_req_s if first is not None and near else start_rate,
                growth=SAMPLE_GROWTH if near else growth,
                min_duration_s=min_duration_s,
            )
        )
    return found


def _candidate(config: TunedConfig, samples: Sequence[CapacityResult]) -> Candidate:
    """The mean over ``samples``: a sample on which no rate meets the SLO counts 0; the throughput
    and quantiles are the means over the feasible ones."""
    capacities: list[float] = []
    at: list[Summary] = []
    for sample in samples:
        if sample.feasible and sample.at_capacity is not None:
            capacities.append(sample.capacity_req_s)
            at.append(sample.at_capacity)
    if not at:
        return Candidate(config, 0.0)
    return Candidate(
        config,
        sum(capacities) / len(samples),
        tokens_s=statistics.fmean(s.throughput_tok_s for s in at),
        itl_ms=statistics.fmean(s.itl_at_slo_quantile_ms for s in at),
        ttft_ms=statistics.fmean(s.ttft_at_slo_quantile_ms for s in at),
    )


def evaluate_on_twin(
    twin: Twin,
    config: TunedConfig,
    slo: SLO,
    *,
    max_model_len: int = 8192,
    requests: int = CAPACITY_REQUESTS,
    tolerance: float = CAPACITY_TOLERANCE,
    min_duration_s: float = 0.0,
    near_req_s: float | None = None,
) -> Candidate:
    """One evaluation: the twin's capacity at SLO of ``config``, the mean over its arrival samples
    (sustained for ``min_duration_s`` when given: what a replica serves, not a burst it absorbs).
    ``near_req_s``: a rate the capacity is expected near, where the search starts (with brackets of
    :data:`NEAR_GROWTH`); else at the captured arrival rate.

    A sample on which no rate meets the SLO counts 0; the throughput and quantiles are the means
    over the samples that are feasible.
    """
    near = near_req_s is not None and near_req_s > 0
    samples = _sample_capacities(
        twin,
        scheduler_of(config, max_model_len),
        slo,
        twin.arrival_seeds,
        requests=requests,
        tolerance=tolerance,
        min_duration_s=min_duration_s,
        start_rate=near_req_s if near else None,
        growth=NEAR_GROWTH if near else DEFAULT_GROWTH,
    )
    return _candidate(config, samples)


def _position(distribution: BaseDistribution, value: float) -> float:
    """``value`` within its knob's range as a share of it (on a log scale where sampled so)."""
    low, high = getattr(distribution, "low", None), getattr(distribution, "high", None)
    if not isinstance(low, (int, float)) or not isinstance(high, (int, float)) or high <= low:
        return float(value)
    if getattr(distribution, "log", False) and low > 0 and value > 0:
        return (math.log(value) - math.log(low)) / (math.log(high) - math.log(low))
    return (value - low) / (high - low)


def nearest_capacity(
    distributions: Mapping[str, BaseDistribution],
    params: Mapping[str, float],
    evaluated: Iterable[tuple[Mapping[str, float], float]],
) -> float | None:
    """The capacity of the evaluated parameters nearest ``params`` (each knob as a share of its
    range) among those that meet the SLO at some rate; None: none does."""

    def at(point: Mapping[str, float]) -> dict[str, float]:
        return {n: _position(d, point[n]) for n, d in distributions.items() if n in point}

    here = at(params)
    best: tuple[float, float] | None = None
    for point, capacity in evaluated:
        if not capacity > 0:
            continue
        there = at(point)
        distance = sum((here[n] - there[n]) ** 2 for n in here.keys() & there.keys())
        if best is None or distance < best[0]:
            best = (distance, capacity)
    return None if best is None else best[1]


def search_on_twin(
    twin: Twin,
    space: SearchSpace,
    slo: SLO,
    *,
    seed: int,
    cpu_budget_s: float = 60.0,
    max_evaluations: int | None = None,
    exclude: Iterable[TunedConfig] = (),
    warm: Iterable[TunedConfig] = (),
    requests: int = CAPACITY_REQUESTS,
    tolerance: float = CAPACITY_TOLERANCE,
) -> TwinSearchResult:
    """TPE on the twin's predicted capacity; warm configurations are evaluated first.

    Each configuration's capacity search starts at the capacity of the nearest configuration
    evaluated so far (:func:`nearest_capacity`): a bracket of :data:`NEAR_GROWTH` holds it in a
    probe or two where doubling from the captured arrival rate takes several. Excluded
    configurations (already tried on a canary) may be evaluated to inform the sampler but never
    appear in the ranking.
    """
    started = time.process_time()
    excluded = set(exclude)
    known: dict[TunedConfig, Candidate] = {}
    points: list[tuple[Mapping[str, float], float]] = []
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        direction="maximize", sampler=TPESampler(seed=seed, n_startup_trials=STARTUP_TRIALS)
    )
    for config in dict.fromkeys(warm):
        params = space.to_params(config)
        if params is not None:
            study.enqueue_trial(dict(params), skip_if_exists=True)
    distributions = space.distributions()

    def spent() -> bool:
        over_cpu = time.process_time() - started >= cpu_budget_s
        return over_cpu or (max_evaluations is not None and len(known) >= max_evaluations)

    repeats = 0
    while not spent() and repeats < MAX_REPEATS:
        trial = study.ask(distributions)
        config = space.to_config({k: int(v) for k, v in trial.params.items()})
        if config in known:
            repeats += 1
            study.tell(trial, known[config].capacity_req_s)
            continue
        repeats = 0
        candidate = evaluate_on_twin(
            twin,
            config,
            slo,
            max_model_len=space.max_model_len,
            requests=requests,
            tolerance=tolerance,
            near_req_s=nearest_capacity(distributions, trial.params, points),
        )
        known[config] = candidate
        points.append((trial.params, candidate.capacity_req_s))
        study.tell(trial, candidate.capacity_req_s, state=TrialState.COMPLETE)
    order = list(known)
    ranked = sorted(
        (c for c in known.values() if c.config not in excluded),
        key=lambda c: (-c.capacity_req_s, order.index(c.config)),
    )
    return TwinSearchResult(tuple(ranked), len(known), time.process_time() - started)


def robust_ranking(
    twin: Twin,
    candidates: Iterable[Candidate],
    slo: SLO,
    *,
    max_model_len: int = 8192,
    requests: int = CAPACITY_REQUESTS,
    tolerance: float = CAPACITY_TOLERANCE,
    limit: int = ROBUST_EVALUATIONS,
) -> list[Candidate]:
    """``candidates`` ordered by their capacity under the fit's uncertainty at their budget
    (:meth:`TwinFit.step_sigma <chunkpilot.tuner.twin.fit.TwinFit.step_sigma>`).

    Each leader is evaluated again on the twin one standard error slower and one faster; its robust
    capacity is the mean of the three capacities, at most its capacity (a three-point expectation
    over the step-time error that counts the risk, not the chance). A configuration at the edge of
    an SLO loses most of its capacity one step slower and gains little one faster, and drops; one
    with room keeps it. A fit that is sure of its steps moves nothing: ranking on the slowed twin
    alone (the pessimistic end) cost 4 of 30 entries on the perturbed truths, which the roofline
    fits exactly. Lazily: the candidate first by :attr:`Candidate.robust_key` (the capacity stands
    in, an upper bound, until evaluated) is evaluated and re-sorted, until the first is evaluated or
    ``limit`` candidates are.
    """
    order = list(candidates)
    position = {c.config: i for i, c in enumerate(order)}

    def ranked() -> list[Candidate]:
        return sorted(order, key=lambda c: (-c.robust_key, -c.capacity_req_s, position[c.config]))

    for _ in range(limit):
        first = next(iter(ranked()), None)
        if first is None or first.robust_req_s is not None:
            break
        if first.capacity_req_s <= 0:
            order[position[first.config]] = replace(first, robust_req_s=0.0)
            continue
        sigma = twin.fit.step_sigma(first.config.max_num_batched_tokens)
        shifted = [
            evaluate_on_twin(
                twin.slowed(math.exp(z * sigma)),
                first.config,
                slo,
                max_model_len=max_model_len,
                requests=requests,
                tolerance=tolerance,
                near_req_s=first.capacity_req_s,
            ).capacity_req_s
            for z in ERROR_POINTS
        ]
        expected = (first.capacity_req_s + sum(shifted)) / (1 + len(shifted))
        order[position[first.config]] = replace(first, robust_req_s=min(expected, first.capacity_req_s))
    return ranked()


def twin_objective(candidate: Candidate, objective: Objective, gpus: int) -> float:
    """Requests/s per GPU (``goodput``), or output tokens/s per GPU with ``objective=throughput``."""
    value = candidate.tokens_s if objective is Objective.THROUGHPUT else candidate.capacity_req_s
    return value / max(1, gpus)
