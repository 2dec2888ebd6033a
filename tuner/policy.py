"""Pure safety and decision policy of the tuner: prune, promote, discard, infeasible, stop, re-tune.

Nothing here talks to the cluster or Prometheus: every function takes
measurements and settings and returns a decision with a human-readable reason.

Objective.  Online, a canary receives its share of the live load, so every
configuration that keeps up serves the same throughput; what distinguishes them
is how much latency headroom they keep (headroom is capacity left for more load).
The objective is therefore served throughput per replica (tokens/s, or requests/s
per GPU for ``goodput``) scaled by ``1 + HEADROOM_WEIGHT x slack``, where slack is
the smaller of ``1 - ITL/target`` and ``1 - TTFT/target``.  A configuration that
sheds load (queues) loses throughput, one that runs close to a target loses slack.

Promotion needs evidence: enough samples on both tracks in the same window, the
canary within both SLOs, and either the stable track violating an SLO or the
canary's objective above the stable one by ``PROMOTE_MARGIN``.

With a digital twin (:func:`judge_capacity`) the objective is the *predicted capacity at
SLO* instead, which the slack-scaled throughput only approximates at high load: the canary
must meet both SLOs at the live load, its measured quantiles must agree with the twin's
prediction within the tolerance, and its predicted capacity must beat the incumbent's by the
margin.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from chunkpilot.tuner.measure import TrackMeasurement, WindowMeasurement
from chunkpilot.tuner.study import RecordState, TrialRecord, best_record

from chunkpilot.api import Objective

#: Weight of the latency slack in the objective.
HEADROOM_WEIGHT = 0.5
#: Relative objective gain over the incumbent a feasible canary needs to be promoted.
PROMOTE_MARGIN = 0.05
#: Measured trials (without a feasible one) before the SLOs are declared infeasible.
INFEASIBLE_MIN_TRIALS = 6
#: Measured trials (none feasible) before the SLOs are declared infeasible on the evidence of a
#: calibrated twin whose search predicts that no colocated configuration serves the live load within
#: both SLOs (:class:`TwinBound`).
TWIN_INFEASIBLE_MIN_TRIALS = 2
#: Trials without a gain of at least CONVERGENCE_GAIN in the best objective before the tuner stops.
CONVERGENCE_PATIENCE = 8
CONVERGENCE_GAIN = 0.01
#: How much longer than its window a trial may wait for enough samples before it is given up.
INCONCLUSIVE_WINDOW_FACTOR = 2.0


@dataclass(frozen=True)
class SLOTargets:
    """The latency objectives of a service."""

    itl_ms: float
    ttft_ms: float
    itl_quantile: float = 0.99
    ttft_quantile: float = 0.95

    def as_dict(self) -> dict[str, float]:
        return {"itl": self.itl_ms, "ttft": self.ttft_ms}


@dataclass(frozen=True)
class AbortRules:
    """Early-abort thresholds (mirrors the API's ``AbortPolicy``)."""

    itl_factor: float = 2.0
    ttft_factor: float = 2.0
    min_samples: int = 100


class Decision(StrEnum):
    """What to do with a trial after looking at its measurements."""

    CONTINUE = "Continue"  # keep measuring
    PRUNE = "Prune"  # canary breaches an SLO by the abort factor: stop now
    PROMOTE = "Promote"  # meets the SLOs and beats the incumbent
    DISCARD = "Discard"  # measured; not good enough
    INCONCLUSIVE = "Inconclusive"  # not enough samples to judge


@dataclass(frozen=True)
class SLOCheck:
    """Whether one measurement meets the SLOs (``met`` is None without data)."""

    met: bool | None
    excess_ms: dict[str, float] = field(default_factory=dict)  # measured - target
    relative: dict[str, float] = field(default_factory=dict)  # measured / target - 1

    @property
    def slack(self) -> float | None:
        """Smallest relative distance below a target (negative when violated)."""
        return -max(self.relative.values()) if self.relative else None


def check_slo(m: TrackMeasurement, slo: SLOTargets) -> SLOCheck:
    """Compare measured quantiles to the targets; no data means ``met is None``."""
    if m.itl_ms is None or m.ttft_ms is None:
        return SLOCheck(met=None)
    excess = {"itl": m.itl_ms - slo.itl_ms, "ttft": m.ttft_ms - slo.ttft_ms}
    relative = {"itl": m.itl_ms / slo.itl_ms - 1.0, "ttft": m.ttft_ms / slo.ttft_ms - 1.0}
    return SLOCheck(met=all(v <= 0 for v in excess.values()), excess_ms=excess, relative=relative)


def objective_value(
    m: TrackMeasurement,
    slo: SLOTargets,
    kind: Objective = Objective.THROUGHPUT,
    gpus_per_replica: int = 1,
) -> float | None:
    """Headroom-scaled throughput per replica (or goodput per GPU); None without data."""
    check = check_slo(m, slo)
    if kind is Objective.GOODPUT:
        served = m.per_replica(m.request_rate)
        served = None if served is None else served / max(1, gpus_per_replica)
    else:
        served = m.per_replica(m.throughput_tok_s)
    if served is None or check.slack is None:
        return None
    slack = max(-1.0, min(1.0, check.slack))
    return served * (1.0 + HEADROOM_WEIGHT * slack)


@dataclass(frozen=True)
class Judgement:
    """A decision with its evidence."""

    decision: Decision
    reason: str
    canary: SLOCheck = field(default_factory=lambda: SLOCheck(met=None))
    stable: SLOCheck = field(default_factory=lambda: SLOCheck(met=None))
    canary_objective: float | None = None
    stable_objective: float | None = None


def _fmt(check: SLOCheck, m: TrackMeasurement, slo: SLOTargets) -> str:
    if m.itl_ms is None or m.ttft_ms is None:
        return "no data"
    note = f"; {m.itl_note}" if m.itl_note else ""
    return (
        f"ITL p{slo.itl_quantile * 100:g} {m.itl_ms:.0f}/{slo.itl_ms:g}ms, "
        f"TTFT p{slo.ttft_quantile * 100:g} {m.ttft_ms:.0f}/{slo.ttft_ms:g}ms{note}"
    )


def judge_early(canary: TrackMeasurement, slo: SLOTargets, abort: AbortRules) -> Judgement:
    """Prune when the canary, on enough samples, breaches an SLO by the abort factor."""
    check = check_slo(canary, slo)
    if not canary.enough_samples(abort.min_samples):
        return Judgement(Decision.CONTINUE, "waiting for samples", canary=check)
    assert canary.itl_ms is not None and canary.ttft_ms is not None
    if canary.itl_ms > slo.itl_ms * abort.itl_factor:
        return Judgement(
            Decision.PRUNE,
            f"canary ITL {canary.itl_ms:.0f}ms exceeds {abort.itl_factor:g}x the {slo.itl_ms:g}ms target"
            + (f" ({canary.itl_note})" if canary.itl_note else ""),
            canary=check,
        )
    if canary.ttft_ms > slo.ttft_ms * abort.ttft_factor:
        return Judgement(
            Decision.PRUNE,
            f"canary TTFT {canary.ttft_ms:.0f}ms exceeds {abort.ttft_factor:g}x the {slo.ttft_ms:g}ms target",
            canary=check,
        )
    return Judgement(Decision.CONTINUE, "within the abort limits", canary=check)


def _premature(
    canary: TrackMeasurement,
    slo: SLOTargets,
    abort: AbortRules,
    verdict: Callable[[Decision, str], Judgement],
) -> Judgement | None:
    """The judgement before any comparison: too few canary samples, or a canary already pruned."""
    if not canary.enough_samples(abort.min_samples):
        return Judgement(
            Decision.INCONCLUSIVE,
            f"canary served {canary.ttft_samples:.0f} requests in {canary.window}; "
            f"{abort.min_samples} needed to judge",
        )
    early = judge_early(canary, slo, abort)
    if early.decision is Decision.PRUNE:
        return verdict(Decision.PRUNE, early.reason)
    return None


def judge_final(
    window: WindowMeasurement,
    slo: SLOTargets,
    abort: AbortRules,
    kind: Objective = Objective.THROUGHPUT,
    gpus_per_replica: int = 1,
    incumbent_objective: float | None = None,
    margin: float = PROMOTE_MARGIN,
) -> Judgement:
    """Decide a trial at the end of its window: promote, discard, prune or inconclusive.

    ``incumbent_objective`` stands in for the stable track when it has too few
    samples of its own in this window (e.g. a single-replica service).
    """
    canary, stable = window.canary, window.stable
    c_check, s_check = check_slo(canary, slo), check_slo(stable, slo)
    c_obj = objective_value(canary, slo, kind, gpus_per_replica)
    s_obj = objective_value(stable, slo, kind, gpus_per_replica)

    def verdict(decision: Decision, reason: str) -> Judgement:
        return Judgement(decision, reason, c_check, s_check, c_obj, s_obj)

    premature = _premature(canary, slo, abort, verdict)
    if premature is not None:
        return premature
    if not c_check.met:
        return verdict(Decision.DISCARD, f"canary violates the SLO ({_fmt(c_check, canary, slo)})")
    stable_judged = stable.enough_samples(abort.min_samples)
    if stable_judged and s_check.met is False:
        return verdict(
            Decision.PROMOTE,
            f"canary meets the SLO ({_fmt(c_check, canary, slo)}) where stable violates it "
            f"({_fmt(s_check, stable, slo)})",
        )
    reference = s_obj if stable_judged else incumbent_objective
    if reference is None:
        return verdict(
            Decision.DISCARD,
            "canary meets the SLO but there is no incumbent measurement to compare with",
        )
    assert c_obj is not None
    gain = c_obj / reference - 1.0 if reference > 0 else float("inf")
    if gain >= margin:
        return verdict(
            Decision.PROMOTE,
            f"canary meets the SLO ({_fmt(c_check, canary, slo)}) with objective {c_obj:.1f} vs "
            f"{reference:.1f} ({gain:+.0%})",
        )
    return verdict(
        Decision.DISCARD,
        f"canary meets the SLO but its objective {c_obj:.1f} is not {margin:.0%} above the incumbent's "
        f"{reference:.1f} ({gain:+.0%})",
    )


#: A quantile whose prediction lies within this share of its SLO target of the measurement agrees
#: with it whatever its relative error (``CanaryCheck.confirms`` in the twin's online module): a few
#: milliseconds either way at a latency far below its target say nothing of the capacity at it.
AGREEMENT_FLOOR = 0.1


@dataclass(frozen=True)
class TwinEvidence:
    """What the twin says about a canary: its quantiles at the canary's live load and capacities.

    ``capacity`` and ``incumbent_capacity`` are predicted capacities at SLO in the objective's unit
    (``unit``), ``robust_capacity`` the canary's under the twin's step-time uncertainty
    (None: not evaluated); ``fit_error`` is the twin's error on the stable track, ``tolerance`` the
    largest error at which a prediction counts as confirmed.
    """

    predicted_ms: tuple[float, float]
    measured_ms: tuple[float | None, float | None]
    rate_req_s: float
    #: The twin's error on the canary (relative, beyond the measurement's sampling band; NaN: none).
    error: float
    capacity: float
    incumbent_capacity: float | None
    unit: str
    fit_error: float
    tolerance: float
    robust_capacity: float | None = None
    #: Whether the canary, and the stable track in the same window, confirm the twin
    #: (:meth:`~chunkpilot.tuner.twin.online.CanaryCheck.confirms`: within the tolerance, or within a
    #: small share of the target); None: judged by ``error`` and ``fit_error`` against the tolerance.
    confirmed: bool | None = None
    fit_confirmed: bool | None = None

    @property
    def canary_agrees(self) -> bool:
        return self.confirmed if self.confirmed is not None else self.error <= self.tolerance

    @property
    def stable_agrees(self) -> bool:
        return self.fit_confirmed if self.fit_confirmed is not None else self.fit_error <= self.tolerance

    def agreement(self, slo: SLOTargets) -> str:
        (p_itl, p_ttft), (m_itl, m_ttft) = self.predicted_ms, self.measured_ms
        shown = "/".join("-" if m is None else f"{m:.0f}" for m in (m_itl, m_ttft))
        floor = (
            f", each within {AGREEMENT_FLOOR:.0%} of its target"
            if self.confirmed and not self.error <= self.tolerance
            else ""
        )
        return (
            f"twin predicted ITL p{slo.itl_quantile * 100:g}/TTFT p{slo.ttft_quantile * 100:g} "
            f"{p_itl:.0f}/{p_ttft:.0f}ms at {self.rate_req_s:.2f} req/s, canary measured {shown}ms "
            f"(error {_percent(self.error)}, tolerance {self.tolerance:.0%}{floor})"
        )


def _percent(value: float) -> str:
    return f"{value:.0%}" if math.isfinite(value) else "unknown"


def judge_capacity(
    window: WindowMeasurement,
    slo: SLOTargets,
    abort: AbortRules,
    twin: TwinEvidence,
    margin: float = PROMOTE_MARGIN,
) -> Judgement:
    """Decide a trial on predicted capacity at SLO, verified by the canary at the live load.

    Promote when the canary meets both SLOs and either the stable track violates them (measured
    evidence), or the twin is confirmed (its error on the canary and on stable within tolerance)
    and the canary's predicted capacity beats the incumbent's by ``margin`` with the gain larger
    than its uncertainty (its robust capacity, where known, above the incumbent's). A twin the canary
    contradicts promotes nothing on its prediction; the reason says so (the caller refits).
    """
    canary, stable = window.canary, window.stable
    c_check, s_check = check_slo(canary, slo), check_slo(stable, slo)

    def verdict(decision: Decision, reason: str) -> Judgement:
        return Judgement(decision, reason, c_check, s_check, twin.capacity, twin.incumbent_capacity)

    premature = _premature(canary, slo, abort, verdict)
    if premature is not None:
        return premature
    agreement = twin.agreement(slo)
    if not c_check.met:
        return verdict(
            Decision.DISCARD, f"canary violates the SLO ({_fmt(c_check, canary, slo)}); {agreement}"
        )
    met = f"canary meets the SLO at the live load ({_fmt(c_check, canary, slo)})"
    if stable.enough_samples(abort.min_samples) and s_check.met is False:
        return verdict(
            Decision.PROMOTE, f"{met} where stable violates it ({_fmt(s_check, stable, slo)}); {agreement}"
        )
    if not twin.canary_agrees:
        return verdict(
            Decision.DISCARD,
            f"{met}, but the twin and the canary disagree: {agreement}; no promotion on the prediction "
            "alone: refitting the twin with this canary's steps and re-ranking",
        )
    if not twin.stable_agrees:
        return verdict(
            Decision.DISCARD,
            f"{met} and confirms the twin ({agreement}), but the twin's error on the stable track is "
            f"{_percent(twin.fit_error)}: no promotion on the prediction alone",
        )
    reference = twin.incumbent_capacity
    if reference is None:
        return verdict(Decision.DISCARD, f"{met}; the twin has no capacity for the stable config to compare")
    gain = twin.capacity / reference - 1.0 if reference > 0 else math.inf
    capacities = f"predicted capacity {twin.capacity:.4g} vs {reference:.4g} {twin.unit} ({gain:+.0%})"
    if gain >= margin and twin.robust_capacity is not None and twin.robust_capacity < reference:
        return verdict(
            Decision.DISCARD,
            f"{met}, {agreement}; {capacities}, but the gain is within the twin's uncertainty: its "
            f"robust capacity {twin.robust_capacity:.4g} {twin.unit} is below the stable config's",
        )
    if gain >= margin:
        return verdict(Decision.PROMOTE, f"{met}, {agreement}; {capacities}")
    return verdict(
        Decision.DISCARD, f"{met}, {agreement}; {capacities} is not {margin:.0%} above the stable config's"
    )


# --------------------------------------------------------------------------- study-level policy


class Remedy(StrEnum):
    """What to change when no configuration can meet the SLOs."""

    MORE_REPLICAS = "MoreReplicas"
    PARALLELISM = "DifferentParallelism"
    DISAGGREGATION = "PrefillDecodeDisaggregation"


@dataclass(frozen=True)
class Infeasibility:
    """No tried configuration met both SLOs: the best achievable quantiles and the remedies."""

    best_itl_ms: float | None
    best_ttft_ms: float | None
    remedies: tuple[Remedy, ...]
    message: str
    #: Declared on the twin's evidence (:class:`TwinBound`) after fewer than ``INFEASIBLE_MIN_TRIALS``.
    twin: bool = False


@dataclass(frozen=True)
class TwinCheck:
    """The twin against one canary: its error, and whether it predicted a higher latency than the
    canary measured (for ITL or TTFT)."""

    error: float | None
    pessimistic: bool = True


@dataclass(frozen=True)
class TwinBound:
    """What a fitted twin says about the colocated space at the live load.

    ``best_capacity_req_s``: the best predicted capacity at SLO (requests/s per replica) its search
    found over the colocated space, the stable config included (0: no rate meets both SLOs);
    ``live_rate_req_s``: the live requests/s per stable replica; ``fit_error``: its error on the
    stable track (reported); ``canary_checks``: the twin against each canary it checked over a whole window,
    by trial number (a pruned canary's window is cut short at its first samples, before its queue
    settles, and is no check of the twin); ``tolerance``: the largest error at which a prediction
    counts as confirmed.
    """

    best_capacity_req_s: float
    live_rate_req_s: float
    fit_error: float | None
    canary_checks: Mapping[int, TwinCheck]
    tolerance: float
    evaluations: int | None = None

    @property
    def predicts_infeasible(self) -> bool:
        """No colocated configuration the twin found serves the live load within both SLOs."""
        return self.live_rate_req_s > 0 and self.best_capacity_req_s < self.live_rate_req_s

    def _within(self, error: float | None) -> bool:
        return error is not None and math.isfinite(error) and error <= self.tolerance

    def newest_check(self, numbers: Sequence[int]) -> tuple[int, TwinCheck] | None:
        """The newest of these canaries the twin checked (None: none)."""
        for number in sorted(numbers, reverse=True):
            check = self.canary_checks.get(number)
            if check is not None and check.error is not None and math.isfinite(check.error):
                return number, check
        return None

    def calibrated(self, numbers: Sequence[int]) -> bool:
        """Its error on the newest of these canaries it checked is within tolerance (each canary's
        steps refit it: an older canary's error was an older fit's), or that canary measured worse
        than predicted on both quantiles: a twin too optimistic about a configuration does not
        contradict its prediction that none meets the SLOs.

        The canaries are the configurations it ranked best, checked at the live load; its error on
        the stable track is reported, not required (the stable config may be far from the
        configurations that decide, e.g. a budget whose steps carry whole prompts)."""
        newest = self.newest_check(numbers)
        if newest is None:
            return False
        return self._within(newest[1].error) or not newest[1].pessimistic

    def sentence(self, numbers: Sequence[int]) -> str:
        searched = f" ({self.evaluations} evaluated)" if self.evaluations else ""
        newest = self.newest_check(numbers)
        checked = ""
        if newest is not None:
            number, check = newest
            worse = "" if self._within(check.error) else ", which measured worse than predicted"
            error = check.error if check.error is not None else math.nan
            checked = f"{_percent(error)} on trial {number}'s canary{worse}, "
        stable = _percent(self.fit_error if self.fit_error is not None else math.nan)
        return (
            f"the twin predicts at most {self.best_capacity_req_s:.3g} req/s per replica within the SLOs "
            f"for any colocated configuration{searched}, the live load is {self.live_rate_req_s:.3g} req/s "
            f"per replica; {len(numbers)} canaries confirmed it (the twin's error {checked}{stable} on the "
            f"stable track; tolerance {self.tolerance:.0%})"
        )


def _diagnosis(measured: Sequence[TrialRecord], slo: SLOTargets, evidence: str = "") -> Infeasibility:
    """Why the measured trials missed, the best quantiles they reached (and ``evidence``), the remedies."""
    itl = [r.constraints["itl"] for r in measured if "itl" in r.constraints]
    ttft = [r.constraints["ttft"] for r in measured if "ttft" in r.constraints]
    best_itl = (1.0 + min(itl)) * slo.itl_ms if itl else None
    best_ttft = (1.0 + min(ttft)) * slo.ttft_ms if ttft else None
    itl_ever = any(v <= 0 for v in itl)
    ttft_ever = any(v <= 0 for v in ttft)
    if not itl_ever:
        remedies: tuple[Remedy, ...] = (Remedy.PARALLELISM, Remedy.DISAGGREGATION)
        why = "even the smallest budgets tried keep decode steps above the ITL target"
        fix = (
            "raise spec.engine.tensorParallelSize (faster decode steps) or run prefill and decode "
            "on separate pools (prefill/decode disaggregation)"
        )
    elif not ttft_ever:
        remedies = (Remedy.MORE_REPLICAS, Remedy.DISAGGREGATION)
        why = "prompts queue longer than the TTFT target at every budget tried"
        fix = "raise spec.replicas (less load per replica) or use prefill/decode disaggregation"
    else:
        remedies = (Remedy.MORE_REPLICAS, Remedy.DISAGGREGATION)
        why = "budgets small enough for the ITL target are too small for the TTFT target"
        fix = "raise spec.replicas or use prefill/decode disaggregation"
    best = (
        f"best achieved ITL p{slo.itl_quantile * 100:g} {best_itl:.0f}ms (target {slo.itl_ms:g}ms), "
        f"TTFT p{slo.ttft_quantile * 100:g} {best_ttft:.0f}ms (target {slo.ttft_ms:g}ms)"
        if best_itl is not None and best_ttft is not None
        else "no complete measurement"
    )
    best += f"; {evidence}" if evidence else ""
    message = f"no configuration of {len(measured)} measured meets both SLOs: {why}; {best}. Remedy: {fix}."
    return Infeasibility(best_itl, best_ttft, remedies, message, twin=bool(evidence))


def assess_infeasibility(
    records: Sequence[TrialRecord],
    slo: SLOTargets,
    incumbent_met: bool | None,
    min_trials: int = INFEASIBLE_MIN_TRIALS,
    twin: TwinBound | None = None,
    twin_min_trials: int = TWIN_INFEASIBLE_MIN_TRIALS,
) -> Infeasibility | None:
    """An :class:`Infeasibility` when enough trials ran and none, nor the incumbent, met the SLOs.

    Enough is ``min_trials`` measured trials; with a ``twin`` that predicts that no colocated
    configuration serves the live load within both SLOs and is calibrated
    (:meth:`TwinBound.calibrated`), ``twin_min_trials`` suffice, and the message carries its evidence.
    """
    measured = [r for r in records if r.state is RecordState.COMPLETE and r.constraints]
    if incumbent_met or not measured or any(r.feasible for r in measured):
        return None
    if len(measured) >= min_trials:
        return _diagnosis(measured, slo)
    numbers = [r.number for r in measured]
    if len(measured) < twin_min_trials or twin is None:
        return None
    if not twin.predicts_infeasible or not twin.calibrated(numbers):
        return None
    return _diagnosis(measured, slo, twin.sentence(numbers))


class StopReason(StrEnum):
    """Why a tuning run ended."""

    MAX_TRIALS = "MaxTrialsReached"
    CONVERGED = "Converged"
    EXHAUSTED = "SearchSpaceExhausted"
    INFEASIBLE = "SLOInfeasible"


def should_stop(
    records: Sequence[TrialRecord],
    max_trials: int,
    patience: int = CONVERGENCE_PATIENCE,
    min_gain: float = CONVERGENCE_GAIN,
) -> StopReason | None:
    """Stop after ``max_trials`` trials, or when the best feasible objective has not improved
    by ``min_gain`` over the last ``patience`` trials."""
    if len(records) >= max_trials:
        return StopReason.MAX_TRIALS
    ordered = sorted(records, key=lambda r: r.number)
    if len(ordered) <= patience:
        return None
    before = best_record(ordered[:-patience])
    after = best_record(ordered)
    if before is None or after is None or before.objective is None or after.objective is None:
        return None
    if after.objective <= before.objective * (1.0 + min_gain):
        return StopReason.CONVERGED
    return None


def sustained_violation(violated_since: datetime | None, now: datetime, window: timedelta) -> bool:
    """True when the stable track has violated the SLO continuously for at least ``window``."""
    return violated_since is not None and now - violated_since >= window


def trial_deadline(window: timedelta) -> timedelta:
    """How long a trial may measure (waiting for samples) before it is given up as inconclusive."""
    return window * INCONCLUSIVE_WINDOW_FACTOR
