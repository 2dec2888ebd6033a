"""Rank configurations on the twin: Optuna TPE over the search space, each evaluation one capacity search.

Every evaluation asks the twin for the capacity at SLO of one configuration
(:meth:`~chunkpilot.tuner.twin.predict.Twin.capacity`). The search stops when its CPU budget
(:func:`time.process_time`) or its evaluation cap is spent, or when the sampler keeps proposing
configurations it already knows. It is seeded: with the same twin, space, seed, warm starts and
evaluation count the ranking is the same (a CPU budget that binds can stop it at a different count).

One draw of the captured workload is a sample: on a few hundred requests, which long prompts it holds
moves a predicted capacity by several percent, more than separates the best configurations. Given
further draws (``draws``), the search **refines** the top of its ranking: the candidates predicted
within :data:`REFINE_BAND` of the best (at most :data:`REFINE_TOP`) are predicted again on every
draw (the same draws for each, so they are compared on the same requests) and ranked on the mean.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import optuna
from chunkpilot.engine.sim.offline import SLO
from chunkpilot.engine.sim.scheduler import SchedulerConfig
from chunkpilot.engine.sim.workload import Workload
from chunkpilot.tuner.space import SearchSpace, TunedConfig
from chunkpilot.tuner.twin.predict import CAPACITY_REQUESTS, CAPACITY_TOLERANCE, Twin
from optuna.samplers import TPESampler
from optuna.trial import TrialState

from chunkpilot.api import Objective

__all__ = [
    "REFINE_BAND",
    "REFINE_DRAWS",
    "REFINE_TOP",
    "Candidate",
    "TwinSearchResult",
    "evaluate_on_twin",
    "refine_on_draws",
    "scheduler_of",
    "search_on_twin",
    "twin_objective",
]

#: Consecutive proposals of known configurations after which the space counts as exhausted.
MAX_REPEATS = 50
#: Random proposals before TPE models the results.
STARTUP_TRIALS = 8
#: Refinement: candidates predicted within this share of the best are re-predicted on further workload
#: draws (the promotion margin: what the ranking must separate), at most REFINE_TOP of them, on
#: REFINE_DRAWS draws in all (the search's own included).
REFINE_BAND = 0.05
REFINE_TOP = 6
REFINE_DRAWS = 3
#: Evaluations the TPE search makes before it may stop early to leave CPU budget for the refinement.
SEARCH_MIN = 2 * STARTUP_TRIALS


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


@dataclass(frozen=True)
class TwinSearchResult:
    """The twin's ranking: distinct configurations, best first (excluded ones left out)."""

    ranked: tuple[Candidate, ...]
    evaluations: int
    cpu_seconds: float
    #: Candidates re-predicted on further workload draws (their capacity is the mean over the draws).
    refined: int = 0

    @property
    def best(self) -> Candidate | None:
        """The top-ranked candidate (None when nothing was evaluated)."""
        return self.ranked[0] if self.ranked else None


def scheduler_of(config: TunedConfig, max_model_len: int = 8192) -> SchedulerConfig:
    """The simulator's scheduler running ``config`` (every tuned knob; the names are the same)."""
    return SchedulerConfig(**config.as_dict(), max_model_len=max_model_len)  # type: ignore[arg-type]


def evaluate_on_twin(
    twin: Twin,
    config: TunedConfig,
    slo: SLO,
    *,
    max_model_len: int = 8192,
    requests: int = CAPACITY_REQUESTS,
    tolerance: float = CAPACITY_TOLERANCE,
) -> Candidate:
    """One evaluation: the twin's capacity at SLO of ``config``."""
    result = twin.capacity(scheduler_of(config, max_model_len), slo, requests=requests, tolerance=tolerance)
    at = result.at_capacity
    if not result.feasible or at is None:
        return Candidate(config, 0.0)
    return Candidate(
        config,
        result.capacity_req_s,
        tokens_s=at.throughput_tok_s,
        itl_ms=at.itl_at_slo_quantile_ms,
        ttft_ms=at.ttft_at_slo_quantile_ms,
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
    draws: Sequence[Workload] = (),
) -> TwinSearchResult:
    """TPE on the twin's predicted capacity; warm configurations are evaluated first.

    Excluded configurations (already tried on a canary) may be evaluated to inform the sampler but
    never appear in the ranking. ``draws``: further draws of the captured workload on which the top
    of the ranking is refined (:func:`refine_on_draws`), within the same CPU budget: after
    :data:`SEARCH_MIN` evaluations the TPE search stops when what is left would no longer pay for
    the refinement at the evaluations' mean cost.
    """
    started = time.process_time()
    reserve_evaluations = REFINE_TOP * len(draws)
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
        used = time.process_time() - started
        over_cpu = used >= cpu_budget_s
        if draws and len(known) >= SEARCH_MIN:
            over_cpu = over_cpu or cpu_budget_s - used < reserve_evaluations * used / len(known)
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
    refined: list[Candidate] = []
    if draws:
        left = cpu_budget_s - (time.process_time() - started)
        ranked, refined = refine_on_draws(
            twin,
            ranked,
            draws,
            slo,
            max_model_len=space.max_model_len,
            requests=requests,
            tolerance=tolerance,
            cpu_budget_s=left,
        )
    return TwinSearchResult(tuple(ranked), len(known), time.process_time() - started, len(refined))


def refine_on_draws(
    twin: Twin,
    ranked: Sequence[Candidate],
    draws: Sequence[Workload],
    slo: SLO,
    *,
    max_model_len: int = 8192,
    requests: int = CAPACITY_REQUESTS,
    tolerance: float = CAPACITY_TOLERANCE,
    band: float = REFINE_BAND,
    top: int = REFINE_TOP,
    cpu_budget_s: float = math.inf,
) -> tuple[list[Candidate], list[Candidate]]:
    """Re-rank the top of ``ranked`` (best first) on the mean capacity over ``twin``'s draw and ``draws``.

    The candidates within ``band`` of the best (at most ``top``) are refined, in rank order, while
    the CPU budget lasts; each draw is one more capacity search per candidate. Returns the new
    ranking and the refined candidates (none when fewer than two fall in the band: nothing to separate).
    """
    started = time.process_time()
    if not ranked or not draws or ranked[0].capacity_req_s <= 0:
        return list(ranked), []
    floor = ranked[0].capacity_req_s * (1 - band)
    chosen = [c for c in ranked[:top] if c.capacity_req_s >= floor]
    if len(chosen) < 2:
        return list(ranked), []
    twins = [replace(twin, workload=w) for w in draws]
    refined: dict[TunedConfig, Candidate] = {}
    for candidate in chosen:
        if time.process_time() - started >= cpu_budget_s:
            break
        runs = [candidate] + [
            evaluate_on_twin(
                t, candidate.config, slo, max_model_len=max_model_len, requests=requests, tolerance=tolerance
            )
            for t in twins
        ]
        refined[candidate.config] = Candidate(
            candidate.config,
            sum(r.capacity_req_s for r in runs) / len(runs),
            tokens_s=sum(r.tokens_s for r in runs) / len(runs),
            itl_ms=candidate.itl_ms,
            ttft_ms=candidate.ttft_ms,
        )
    if len(refined) < 2:  # the budget ran out: one refined value would not compare with the others
        return list(ranked), []
    order = [c.config for c in ranked]
    out = [refined.get(c.config, c) for c in ranked]
    out.sort(key=lambda c: (-c.capacity_req_s, order.index(c.config)))
    return out, list(refined.values())


def twin_objective(candidate: Candidate, objective: Objective, gpus: int) -> float:
    """Requests/s per GPU (``goodput``), or output tokens/s per GPU with ``objective=throughput``."""
    value = candidate.tokens_s if objective is Objective.THROUGHPUT else candidate.capacity_req_s
    return value / max(1, gpus)
