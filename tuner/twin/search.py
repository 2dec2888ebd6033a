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
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

import optuna
from chunkpilot.engine.sim.capacity import DEFAULT_GROWTH
from chunkpilot.engine.sim.offline import SLO, Summary
from chunkpilot.engine.sim.scheduler import SchedulerConfig
from chunkpilot.tuner.space import SearchSpace, TunedConfig
from chunkpilot.tuner.twin.predict import CAPACITY_REQUESTS, CAPACITY_TOLERANCE, SAMPLE_GROWTH, Twin
from optuna.samplers import TPESampler
from optuna.trial import TrialState

from chunkpilot.api import Objective

__all__ = [
    "ERROR_POINTS",
    "ROBUST_EVALUATIONS",
    "SUSTAINED_S",
    "Candidate",
    "Ranking",
    "TwinSearchResult",
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
    requests: int = CAPACITY_REQUESTS,
    tolerance: float = CAPACITY_TOLERANCE,
) -> tuple[float, float]:
    """What the replica planner sizes with: the capacity one replica of ``config`` sustains
    (:data:`SUSTAINED_S`) at ``slo``, and at ``slo`` with each target divided by ``1 + error`` (the
    twin's relative latency error: one for both, or the ITL's and the TTFT's own): the capacity
    should its latencies be that much longer. Near the targets a small latency error moves the
    capacity a lot; this carries it over. A quantile the twin predicts well is not tightened for
    the other's error."""
    itl_error, ttft_error = (error, error) if isinstance(error, (int, float)) else error
    itl_error, ttft_error = (max(0.0, e) if math.isfinite(e) else 0.0 for e in (itl_error, ttft_error))

    def at(target: SLO) -> float:
        return evaluate_on_twin(
            twin,
            config,
            target,
            max_model_len=max_model_len,
            requests=requests,
            tolerance=tolerance,
            min_duration_s=SUSTAINED_S,
        ).capacity_req_s

    nominal = at(slo)
    if (itl_error <= 0 and ttft_error <= 0) or nominal <= 0:
        return nominal, nominal
    tight = replace(slo, itl_ms=slo.itl_ms / (1 + itl_error), ttft_ms=slo.ttft_ms / (1 + ttft_error))
    return nominal, min(nominal, at(tight))


def evaluate_on_twin(
    twin: Twin,
    config: TunedConfig,
    slo: SLO,
    *,
    max_model_len: int = 8192,
    requests: int = CAPACITY_REQUESTS,
    tolerance: float = CAPACITY_TOLERANCE,
    min_duration_s: float = 0.0,
) -> Candidate:
    """One evaluation: the twin's capacity at SLO of ``config``, the mean over its arrival samples
    (sustained for ``min_duration_s`` when given: what a replica serves, not a burst it absorbs).

    A sample on which no rate meets the SLO counts 0; the throughput and quantiles are the means
    over the samples that are feasible.
    """
    scheduler = scheduler_of(config, max_model_len)
    first, *others = twin.arrival_seeds
    samples = [
        twin.capacity(
            scheduler, slo, requests=requests, tolerance=tolerance, seed=first, min_duration_s=min_duration_s
        )
    ]
    near = samples[0].capacity_req_s if samples[0].feasible else None
    samples += [
        twin.capacity(
            scheduler,
            slo,
            requests=requests,
            tolerance=tolerance,
            seed=seed,
            start_rate=near,
            growth=SAMPLE_GROWTH if near is not None else DEFAULT_GROWTH,
            min_duration_s=min_duration_s,
        )
        for seed in others
    ]
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

    Excluded configurations (already tried on a canary) may be evaluated to inform the sampler but
    never appear in the ranking.
    """
    started = time.process_time()
    excluded = set(exclude)
    known: dict[TunedConfig, Candidate] = {}
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
            twin, config, slo, max_model_len=space.max_model_len, requests=requests, tolerance=tolerance
        )
        known[config] = candidate
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
