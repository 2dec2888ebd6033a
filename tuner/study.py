"""A durable Optuna study over the search space (ask/tell, rebuilt from the trial history).

The study itself is never stored: each time the tuner needs a configuration it
rebuilds an in-memory study from the finished trials (``TuningTrial`` objects in
the cluster, or any list of :class:`TrialRecord`), adds them with
``Study.add_trial``, and asks once.  The sampler is seeded from the service and
the trial number, so asking again after an operator restart proposes the same
configuration.  Constraints use ``FrozenTrial`` constraints (the data behind
``Trial.set_constraint``): a value <= 0 means the SLO is met.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import optuna
from chunkpilot.tuner.space import SearchSpace, TunedConfig
from chunkpilot.tuner.warmstart import WarmStart
from optuna.distributions import BaseDistribution, IntDistribution
from optuna.samplers import BaseSampler, RandomSampler, TPESampler
from optuna.trial import FrozenTrial, TrialState, create_trial

from chunkpilot.api import SamplerKind

#: Random trials TPE needs before it models the space (Optuna's default of 10 is
#: too many for a budget of a dozen trials that starts from a model-based guess).
TPE_STARTUP_TRIALS = 3
#: Attempts to get a configuration not tried before, before falling back to random.
MAX_ASK_ATTEMPTS = 24

optuna.logging.set_verbosity(optuna.logging.WARNING)


class SamplerUnavailableError(RuntimeError):
    """The chosen sampler cannot run here (missing optional dependency)."""


class RecordState(StrEnum):
    """How a trial ended, from the study's point of view."""

    COMPLETE = "complete"  # measured: objective and constraints known
    FAILED = "failed"  # no usable measurement (crash, aborted, inconclusive)


@dataclass(frozen=True)
class TrialRecord:
    """One finished trial as the study sees it.

    ``constraints`` are relative: ``measured / target - 1`` per SLO, so ITL and TTFT
    violations weigh alike; <= 0 means met.
    """

    number: int
    params: Mapping[str, int]
    state: RecordState
    objective: float | None = None
    constraints: Mapping[str, float] = field(default_factory=dict)

    @property
    def feasible(self) -> bool:
        """Measured and every constraint met."""
        return (
            self.state is RecordState.COMPLETE
            and bool(self.constraints)
            and all(v <= 0 for v in self.constraints.values())
        )


def relative_constraints(measured: Mapping[str, float], targets: Mapping[str, float]) -> dict[str, float]:
    """``measured / target - 1`` for each SLO present in both mappings."""
    return {key: measured[key] / targets[key] - 1.0 for key in targets if key in measured}


def seed_for(service_uid: str, number: int) -> int:
    """A stable 32-bit seed for asking trial ``number`` of a service."""
    digest = hashlib.sha256(f"{service_uid}:{number}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def make_sampler(kind: SamplerKind | str, seed: int | None = None) -> BaseSampler:
    """TPE (default) or GP sampler; constraints are read from each trial's constraint values."""
    choice = SamplerKind(str(kind))
    if choice is SamplerKind.GP:
        missing = [name for name in ("torch", "scipy") if importlib.util.find_spec(name) is None]
        if missing:
            raise SamplerUnavailableError(
                "spec.autotune.sampler: gp needs torch and scipy in the operator image "
                f"({', '.join(missing)} missing); install them or use sampler: tpe"
            )
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=TPE_STARTUP_TRIALS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return TPESampler(
            seed=seed,
            n_startup_trials=TPE_STARTUP_TRIALS,
            multivariate=True,
            group=False,
        )


def _within(distribution: BaseDistribution, value: int) -> bool:
    """Whether ``value`` is a point of ``distribution`` (the study's knobs are integer ranges)."""
    if not isinstance(distribution, IntDistribution):
        return False
    low, high, step = distribution.low, distribution.high, distribution.step
    return low <= value <= high and (value - low) % step == 0


def _frozen(space: SearchSpace, record: TrialRecord) -> FrozenTrial | None:
    distributions = space.distributions()
    params = {k: int(v) for k, v in record.params.items() if k in distributions}
    if set(params) != set(distributions):
        return None
    if any(not _within(distributions[k], v) for k, v in params.items()):
        return None
    if (
        record.state is RecordState.COMPLETE
        and record.objective is not None
        and math.isfinite(record.objective)
    ):
        constraints = {k: float(v) for k, v in record.constraints.items() if math.isfinite(v)}
        return create_trial(
            state=TrialState.COMPLETE,
            value=float(record.objective),
            params=params,
            distributions=distributions,
            constraints=constraints,
            user_attrs={"number": record.number},
        )
    return create_trial(
        state=TrialState.FAIL,
        params=params,
        distributions=distributions,
        user_attrs={"number": record.number},
    )


def rebuild_study(space: SearchSpace, records: Iterable[TrialRecord], sampler: BaseSampler) -> optuna.Study:
    """An in-memory study holding every record that fits the current space (others are skipped)."""
    study = optuna.create_study(direction="maximize", sampler=sampler)
    for record in sorted(records, key=lambda r: r.number):
        frozen = _frozen(space, record)
        if frozen is not None:
            study.add_trial(frozen)
    return study


@dataclass(frozen=True)
class Suggestion:
    """What to try next: the sampled parameters and the configuration they map onto."""

    params: dict[str, int]
    config: TunedConfig
    source: str  # "warm-start", "sampler" or "random"


def suggest(
    space: SearchSpace,
    records: Sequence[TrialRecord],
    *,
    sampler: SamplerKind | str = SamplerKind.TPE,
    seed: int | None = None,
    warm_starts: Sequence[Mapping[str, int]] = (),
    exclude: Iterable[TunedConfig] = (),
) -> Suggestion | None:
    """Ask the study for a configuration not tried before (nor in ``exclude``).

    Warm starts are used first, in order, unless already tried or (a
    :class:`~chunkpilot.tuner.warmstart.WarmStart` with a condition) not wanted given the
    measured trials.  Returns None when the space seems exhausted (no new
    configuration after many attempts).
    """
    tried = {space.to_config(r.params) for r in records}
    tried.update(exclude)
    measured = [
        (r.number, r.constraints) for r in records if r.state is RecordState.COMPLETE and r.constraints
    ]
    for params in warm_starts:
        config = space.to_config(params)
        if config in tried or (isinstance(params, WarmStart) and not params.wanted(measured)):
            continue
        return Suggestion(dict(params), config, "warm-start")

    study = rebuild_study(space, records, make_sampler(sampler, seed))
    found = _ask_untried(study, space, tried, MAX_ASK_ATTEMPTS, "sampler")
    if found is not None:
        return found
    rng_study = optuna.create_study(direction="maximize", sampler=RandomSampler(seed=seed))
    return _ask_untried(rng_study, space, tried, MAX_ASK_ATTEMPTS * 4, "random")


def _ask_untried(
    study: optuna.Study, space: SearchSpace, tried: set[TunedConfig], attempts: int, source: str
) -> Suggestion | None:
    """The first of up to ``attempts`` asks of ``study`` whose config is not in ``tried``."""
    distributions = space.distributions()
    for _ in range(attempts):
        trial = study.ask(distributions)
        params = {k: int(v) for k, v in trial.params.items()}
        config = space.to_config(params)
        if config not in tried:
            return Suggestion(params, config, source)
        # A repeat: tell the sampler it was not useful and ask again.
        study.tell(trial, state=TrialState.FAIL)
    return None


def best_record(records: Iterable[TrialRecord]) -> TrialRecord | None:
    """The feasible record with the highest objective (None when none is feasible)."""
    feasible = [r for r in records if r.feasible and r.objective is not None]
    return max(feasible, key=lambda r: (r.objective, -r.number)) if feasible else None
