"""Study: rebuilt from records, constraints honoured, no repeats, deterministic asks."""

from __future__ import annotations

import pytest
from chunkpilot.tuner.space import TunedConfig
from chunkpilot.tuner.study import (
    RecordState,
    SamplerUnavailableError,
    TrialRecord,
    best_record,
    make_sampler,
    rebuild_study,
    relative_constraints,
    seed_for,
    suggest,
)
from chunkpilot.tuner.warmstart import WarmStart

from chunkpilot.testing.tuner import a_record, a_space

SPACE = a_space()


def toy(config: TunedConfig) -> tuple[float, dict[str, float]]:
    """Throughput grows with the budget; ITL crosses its target at 3000 tokens."""
    budget = config.max_num_batched_tokens
    return float(budget), {"itl": budget / 3000 - 1.0}


def run(n: int, seed: str = "svc") -> list[TrialRecord]:
    records: list[TrialRecord] = []
    for number in range(n):
        s = suggest(SPACE, records, seed=seed_for(seed, number))
        assert s is not None
        objective, constraints = toy(s.config)
        records.append(a_record(number, s.params, objective, constraints))
    return records


def test_rebuilt_study_holds_values_and_constraints() -> None:
    records = [
        a_record(0, {"max_num_batched_tokens": 1000, "max_num_seqs": 64}, 1000.0, {"itl": -0.5}),
        TrialRecord(1, {"max_num_batched_tokens": 5000, "max_num_seqs": 64}, RecordState.FAILED),
        a_record(2, {"max_num_batched_tokens": 99999, "max_num_seqs": 64}, 1.0, {"itl": 0.0}),
    ]
    study = rebuild_study(SPACE, records, make_sampler("tpe", 0))
    assert len(study.trials) == 2  # the out-of-space record is skipped
    assert study.trials[0].value == 1000.0
    assert study.trials[0].constraints == {"itl": -0.5}
    assert study.trials[1].state.name == "FAIL"


def test_suggestions_do_not_repeat_and_stay_in_bounds() -> None:
    records = run(12)
    configs = [SPACE.to_config(r.params) for r in records]
    assert len(set(configs)) == len(configs)
    assert all(256 <= c.max_num_batched_tokens <= 8192 for c in configs)


def test_constrained_search_finds_a_good_feasible_config() -> None:
    best = best_record(run(15))
    assert best is not None and best.feasible
    assert best.objective is not None and best.objective >= 0.8 * 3000


def test_asks_are_deterministic_for_the_same_history() -> None:
    records = run(5)
    first = suggest(SPACE, records, seed=seed_for("svc", 5))
    again = suggest(SPACE, records, seed=seed_for("svc", 5))
    assert first == again


def test_warm_start_comes_first_and_exclusions_are_honoured() -> None:
    guess = {"max_num_batched_tokens": 2900, "max_num_seqs": 128}
    s = suggest(SPACE, [], seed=1, warm_starts=[guess])
    assert s is not None and s.source == "warm-start" and s.params == guess
    s = suggest(SPACE, [], seed=1, warm_starts=[guess], exclude=[SPACE.to_config(guess)])
    assert s is not None and s.source != "warm-start"


def test_a_conditional_warm_start_waits_for_slack_on_its_slo() -> None:
    guess = WarmStart({"max_num_batched_tokens": 1200, "max_num_seqs": 128})
    upper = WarmStart({"max_num_batched_tokens": 2400, "max_num_seqs": 128}, when_slack="itl")
    s = suggest(SPACE, [], seed=1, warm_starts=[guess, upper])
    assert s is not None and s.source == "warm-start" and s.params == dict(guess)

    def after(constraints: dict[str, float]) -> str | None:
        first = a_record(0, dict(guess), 10.0, constraints)
        incumbent = a_record(-1, {"max_num_batched_tokens": 8192, "max_num_seqs": 256}, 1.0, {})
        s = suggest(SPACE, [incumbent, first], seed=1, warm_starts=[guess, upper])
        assert s is not None
        return s.source if s.params != dict(upper) else "upper"

    # TTFT bound the guess (ITL had slack): the larger budget is worth a trial.
    assert after({"itl": -0.4, "ttft": 0.0}) == "upper"
    # ITL bound it: the larger budget would only break ITL; the sampler takes over.
    assert after({"itl": 0.0, "ttft": -0.5}) == "sampler"
    assert after({"itl": 0.2, "ttft": 0.1}) == "sampler"
    # Nothing measured (the guess's trial failed): no evidence, no upper point.
    failed = TrialRecord(0, dict(guess), RecordState.FAILED)
    s = suggest(SPACE, [failed], seed=1, warm_starts=[guess, upper])
    assert s is not None and s.source == "sampler"


def test_best_record_is_the_best_feasible_one() -> None:
    a = a_record(0, {"max_num_batched_tokens": 1000, "max_num_seqs": 64}, 10.0, {"itl": 0.3, "ttft": 0.1})
    b = a_record(1, {"max_num_batched_tokens": 900, "max_num_seqs": 64}, 9.0, {"itl": 0.1, "ttft": -0.2})
    assert best_record([a, b]) is None
    c = a_record(2, {"max_num_batched_tokens": 800, "max_num_seqs": 64}, 8.0, {"itl": -0.1, "ttft": -0.2})
    assert best_record([a, b, c]) == c


def test_relative_constraints() -> None:
    assert relative_constraints({"itl": 60.0, "ttft": 500.0}, {"itl": 50.0, "ttft": 1000.0}) == pytest.approx(
        {"itl": 0.2, "ttft": -0.5}
    )


def test_gp_without_its_dependencies_is_a_clear_error() -> None:
    try:
        make_sampler("gp", 0)
    except SamplerUnavailableError as exc:
        assert "sampler: tpe" in str(exc)
