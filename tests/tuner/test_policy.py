"""Decisions: prune, promote with evidence, discard, inconclusive, infeasible, stop, re-tune."""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from chunkpilot.tuner.measure import TrackMeasurement, WindowMeasurement
from chunkpilot.tuner.policy import (
    TWIN_INFEASIBLE_MIN_TRIALS,
    AbortRules,
    Decision,
    Remedy,
    SLOTargets,
    StopReason,
    TwinBound,
    TwinCheck,
    assess_infeasibility,
    judge_early,
    judge_final,
    objective_value,
    should_stop,
    sustained_violation,
)

from chunkpilot.testing.tuner import a_measurement, a_record

SLO = SLOTargets(itl_ms=50.0, ttft_ms=2000.0)
ABORT = AbortRules(itl_factor=2.0, ttft_factor=2.0, min_samples=100)
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def m(
    track: str,
    itl: float | None,
    ttft: float | None,
    samples: float = 500,
    tok_s: float = 1000.0,
    replicas: int = 1,
) -> TrackMeasurement:
    """A 5-minute window at ``samples`` / 300 req/s, no prompt tokens counted."""
    return a_measurement(
        track,
        itl,
        ttft,
        samples=samples,
        window="5m",
        time=T0,
        generation_tok_s=tok_s,
        prompt_tok_s=0.0,
        request_rate=samples / 300,
        replicas=replicas,
    )


def test_prune_needs_samples_and_a_wide_breach() -> None:
    assert judge_early(m("canary", 120, 500, samples=20), SLO, ABORT).decision is Decision.CONTINUE
    assert judge_early(m("canary", 90, 500), SLO, ABORT).decision is Decision.CONTINUE
    pruned = judge_early(m("canary", 120, 500), SLO, ABORT)
    assert pruned.decision is Decision.PRUNE and "ITL" in pruned.reason
    assert judge_early(m("canary", 30, 4500), SLO, ABORT).decision is Decision.PRUNE


def test_promote_when_canary_meets_the_slo_that_stable_violates() -> None:
    j = judge_final(WindowMeasurement(m("canary", 45, 900), m("stable", 80, 700, replicas=2)), SLO, ABORT)
    assert j.decision is Decision.PROMOTE


def test_promote_needs_a_margin_over_a_feasible_incumbent() -> None:
    close = judge_final(WindowMeasurement(m("canary", 40, 900), m("stable", 41, 900)), SLO, ABORT)
    assert close.decision is Decision.DISCARD
    better = judge_final(WindowMeasurement(m("canary", 20, 600), m("stable", 48, 1900)), SLO, ABORT)
    assert better.decision is Decision.PROMOTE
    assert better.canary_objective is not None and better.stable_objective is not None
    assert better.canary_objective > better.stable_objective


def test_objective_is_per_replica() -> None:
    one = objective_value(m("canary", 40, 900, tok_s=1000.0), SLO)
    three = objective_value(m("stable", 40, 900, tok_s=3000.0, replicas=3), SLO)
    assert one == three


def test_discard_when_canary_violates() -> None:
    j = judge_final(WindowMeasurement(m("canary", 60, 900), m("stable", 80, 900)), SLO, ABORT)
    assert j.decision is Decision.DISCARD


def test_never_judge_on_missing_data() -> None:
    no_data = judge_final(WindowMeasurement(m("canary", None, None), m("stable", 80, 900)), SLO, ABORT)
    assert no_data.decision is Decision.INCONCLUSIVE
    few = judge_final(WindowMeasurement(m("canary", 10, 100, samples=99), m("stable", 80, 900)), SLO, ABORT)
    assert few.decision is Decision.INCONCLUSIVE


def test_stable_without_samples_falls_back_to_the_incumbent_objective() -> None:
    window = WindowMeasurement(m("canary", 40, 900), m("stable", None, None, samples=0))
    assert judge_final(window, SLO, ABORT).decision is Decision.DISCARD
    assert judge_final(window, SLO, ABORT, incumbent_objective=100.0).decision is Decision.PROMOTE


def _rec(n: int, itl: float, ttft: float, obj: float = 100.0):  # type: ignore[no-untyped-def]
    return a_record(n, {"max_num_batched_tokens": 256 + n}, obj, {"itl": itl, "ttft": ttft})


def test_infeasible_names_best_quantiles_and_remedy() -> None:
    itl_bound = [_rec(n, 0.2 + n / 10, -0.5) for n in range(6)]
    verdict = assess_infeasibility(itl_bound, SLO, incumbent_met=False)
    assert verdict is not None
    assert verdict.best_itl_ms == 60.0
    assert Remedy.PARALLELISM in verdict.remedies and "tensorParallelSize" in verdict.message
    ttft_bound = [_rec(n, -0.1, 0.3) for n in range(6)]
    verdict = assess_infeasibility(ttft_bound, SLO, incumbent_met=False)
    assert verdict is not None and Remedy.MORE_REPLICAS in verdict.remedies
    assert assess_infeasibility(itl_bound[:5], SLO, incumbent_met=False) is None
    assert assess_infeasibility(itl_bound, SLO, incumbent_met=True) is None
    assert assess_infeasibility([*itl_bound, _rec(9, -0.1, -0.1)], SLO, incumbent_met=False) is None


def checks(errors: Mapping[int, float | None], pessimistic: bool = True) -> dict[int, TwinCheck]:
    return {n: TwinCheck(e, pessimistic) for n, e in errors.items()}


def bound(best: float = 0.3, live: float = 0.75, **fields: Any) -> TwinBound:
    values: dict[str, Any] = {
        "best_capacity_req_s": best,
        "live_rate_req_s": live,
        "fit_error": 0.05,
        "canary_checks": checks({1: 0.04, 2: 0.1}),
        "tolerance": 0.15,
        "evaluations": 12,
        **fields,
    }
    return TwinBound(**values)


def test_a_calibrated_twin_that_predicts_infeasibility_declares_it_after_two_missed_canaries() -> None:
    missed = [_rec(1, -0.1, 1.2), _rec(2, 5.0, -0.2)]
    assert TWIN_INFEASIBLE_MIN_TRIALS == 2
    assert assess_infeasibility(missed, SLO, incumbent_met=False) is None  # measurements alone: 6 needed
    verdict = assess_infeasibility(missed, SLO, incumbent_met=False, twin=bound())
    assert verdict is not None and verdict.twin
    assert "no configuration of 2 measured meets both SLOs" in verdict.message
    assert (
        "the twin predicts at most 0.3 req/s per replica within the SLOs for any colocated configuration "
        "(12 evaluated), the live load is 0.75 req/s per replica; 2 canaries confirmed it (the twin's "
        "error 10% on trial 2's canary, 5% on the stable track; tolerance 15%)" in verdict.message
    )
    assert verdict.message.endswith("Remedy: raise spec.replicas or use prefill/decode disaggregation.")
    assert Remedy.DISAGGREGATION in verdict.remedies
    # One canary is not enough, nor is a feasible one, nor an incumbent that meets the SLOs.
    assert assess_infeasibility(missed[:1], SLO, incumbent_met=False, twin=bound()) is None
    feasible = [*missed, _rec(3, -0.1, -0.1)]
    assert assess_infeasibility(feasible, SLO, incumbent_met=False, twin=bound()) is None
    assert assess_infeasibility(missed, SLO, incumbent_met=True, twin=bound()) is None


def test_the_twin_declares_nothing_when_it_predicts_a_feasible_config_or_is_not_calibrated() -> None:
    missed = [_rec(1, -0.1, 1.2), _rec(2, 5.0, -0.2)]

    def judged(twin: TwinBound) -> bool:
        return assess_infeasibility(missed, SLO, incumbent_met=False, twin=twin) is not None

    assert judged(bound())
    assert not judged(bound(best=0.75))  # a config serves the live load: keep tuning
    assert not judged(bound(live=0.0))  # no live load to compare with
    # The canaries calibrate it; its error on the stable track is reported, not required.
    assert judged(bound(fit_error=0.3)) and judged(bound(fit_error=None))
    off = assess_infeasibility(missed, SLO, incumbent_met=False, twin=bound(fit_error=math.nan))
    assert off is not None and "10% on trial 2's canary, unknown on the stable track" in off.message
    assert not judged(bound(canary_checks=checks({1: 0.04, 2: 0.3})))  # the newest canary contradicted it
    assert not judged(bound(canary_checks=checks({})))  # no canary checked
    # The newest canary it checked decides (each canary's steps refit the twin): one it did not
    # check (pruned, or no reading) neither confirms nor contradicts, an older miss was an older fit's.
    assert judged(bound(canary_checks=checks({1: 0.04, 2: None})))
    assert judged(bound(canary_checks=checks({1: 0.04, 2: math.nan})))
    assert judged(bound(canary_checks=checks({1: 0.3, 2: 0.1})))
    assert not judged(bound(canary_checks=checks({1: 0.3, 2: None})))
    # A canary that measured worse than the twin predicted does not contradict "nothing meets them".
    assert judged(bound(canary_checks=checks({1: 0.04, 2: 0.3}, pessimistic=False)))
    optimistic = assess_infeasibility(
        missed, SLO, incumbent_met=False, twin=bound(canary_checks=checks({2: 0.24}, pessimistic=False))
    )
    assert optimistic is not None
    assert "(the twin's error 24% on trial 2's canary, which measured worse than predicted, 5% on" in (
        optimistic.message
    )
    assert judged(
        bound(canary_checks=checks({1: 0.04, 2: 0.1, 7: 0.5}))
    )  # trial 7 is not among those measured
    three = [*missed, _rec(3, 0.5, 0.5)]
    found = assess_infeasibility(
        three, SLO, incumbent_met=False, twin=bound(canary_checks=checks({1: 0.0, 3: 0.02}))
    )
    assert (
        found is not None
        and "3 canaries confirmed it (the twin's error 2% on trial 3's canary" in found.message
    )
    # With six measured trials the twin is not needed (and does not change the message).
    six = [_rec(n, 0.2 + n / 10, -0.5) for n in range(6)]
    plain = assess_infeasibility(six, SLO, incumbent_met=False)
    assert plain is not None and not plain.twin
    with_twin = assess_infeasibility(six, SLO, incumbent_met=False, twin=bound(best=9.0))
    assert with_twin == plain


def test_stop_after_max_trials_or_convergence() -> None:
    improving = [_rec(n, -0.1, -0.1, obj=100.0 + 10 * n) for n in range(10)]
    assert should_stop(improving, max_trials=20) is None
    assert should_stop(improving, max_trials=10) is StopReason.MAX_TRIALS
    flat = [_rec(0, -0.1, -0.1, obj=200.0)] + [_rec(n, -0.1, -0.1, obj=150.0) for n in range(1, 10)]
    assert should_stop(flat, max_trials=20) is StopReason.CONVERGED


def test_retune_only_after_a_sustained_violation() -> None:
    window = timedelta(minutes=5)
    assert not sustained_violation(None, T0, window)
    assert not sustained_violation(T0, T0 + timedelta(minutes=4), window)
    assert sustained_violation(T0, T0 + timedelta(minutes=5), window)


def test_a_verdict_on_itl_judged_from_tpot_says_so() -> None:
    """TensorRT-LLM without a per-token histogram: the reason names the TPOT rule it was judged by."""
    from dataclasses import replace

    from chunkpilot.tuner.measure import TPOT_ITL_FACTOR, ItlSource

    def from_tpot(track: str, tpot_ms: float, ttft: float) -> TrackMeasurement:
        measured = m(track, tpot_ms * TPOT_ITL_FACTOR, ttft)
        return replace(measured, itl_source=ItlSource.TPOT, tpot_ms=tpot_ms, engine="trtllm")

    met = judge_final(
        WindowMeasurement(from_tpot("canary", 10.0, 900), from_tpot("stable", 30.0, 900)), SLO, ABORT
    )
    assert met.decision is Decision.PROMOTE
    assert "ITL judged from TPOT (TensorRT-LLM exports no ITL histogram)" in met.reason
    # 37.5 ms TPOT against 50 ms reads as 150 ms ITL: never "met" on the raw TPOT
    missed = judge_final(WindowMeasurement(from_tpot("canary", 37.5, 900), m("stable", 80, 900)), SLO, ABORT)
    assert missed.decision is Decision.PRUNE and "TPOT p99 37.5ms" in missed.reason
