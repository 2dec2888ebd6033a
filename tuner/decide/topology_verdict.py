"""A topology trial's verdict: as its clients see it, at the stable's load per replica, as the twin said.

Pure: a :class:`~chunkpilot.tuner.measure.TopologyWindow` and the twin's :class:`Prediction` in, a
decision and its reason out (:func:`judge`). A canary topology is promoted only when it met both
SLOs (the decode pool's ITL; the prefill pool's TTFT plus the decode pool's), carried at least the
stable's requests per replica (less the twin's tolerance: promoted, each of its replicas carries
what a stable replica carries now), and the measurement does not contradict the twin's prediction
beyond that tolerance (DESIGN: no promotion on a prediction the engine contradicts). A colocated
topology trial of a service that runs pools (:func:`judge_colocated`) is promoted when its canary
met both SLOs carrying what each of the colocated replicas it was tried for would carry.
"""

from __future__ import annotations

from dataclasses import dataclass

from chunkpilot.tuner.measure import ItlSource, TopologyWindow, TrackMeasurement, WindowMeasurement
from chunkpilot.tuner.policy import Decision, SLOCheck, SLOTargets, check_slo
from chunkpilot.tuner.topology.pools import PoolCheck
from chunkpilot.tuner.twin.online import TOLERANCE

from chunkpilot.api import TopologyRecommendation, TrialTwin

__all__ = ["Load", "Prediction", "judge", "judge_colocated", "twin_check"]


def _ms(value: float | None) -> str:
    return f"{value:.0f} ms" if value is not None else "no data"


def _family(measured: TrackMeasurement, parts: str = "all") -> str:
    """Which histograms ``parts`` were read from (one family per window: ``measure.window_source``)."""
    if measured.itl_source is ItlSource.FINE:
        return f"{parts} read from Chunkpilot's fine histograms"
    return measured.itl_note or f"{parts} read from the engine's own histograms"


@dataclass(frozen=True)
class Load:
    """The canary topology's requests/s per replica (a GPU at tensor parallel 1) beside the stable's:
    promoted, each of its replicas carries what a stable replica carries now."""

    canary: float | None
    stable: float | None

    @classmethod
    def of(cls, window: TopologyWindow) -> Load:
        both, stable = window.combined(), window.stable
        return cls(both.per_replica(both.request_rate), stable.per_replica(stable.request_rate))

    def comparable(self, tolerance: float) -> bool:
        """It carried at least the stable's load per replica, less the tolerance."""
        if self.canary is None or self.stable is None or not self.stable > 0:
            return False
        return self.canary >= self.stable * (1 - tolerance)

    def text(self) -> str:
        def rate(value: float | None) -> str:
            return f"{value:.3g}" if value is not None else "unknown"

        return f"{rate(self.canary)} req/s per replica, the stable {rate(self.stable)} per replica"


@dataclass(frozen=True)
class Prediction:
    """The twin's word on the topology: both SLOs met up to ``capacity_req_s`` on its ``replicas``,
    and what the word rests on (``basis``: its recommendation, or the pools' own steps)."""

    capacity_req_s: float | None = None
    replicas: int = 0
    tolerance: float = TOLERANCE
    basis: str = "on the stable's step model"

    def rate(self, load: Load) -> float | None:
        """The whole topology's rate at the canary's load per replica."""
        return load.canary * self.replicas if load.canary is not None and self.replicas else None

    def contradicted(self, load: Load, check: SLOCheck) -> str | None:
        """How the measurement contradicts the twin beyond the tolerance (None: it does not)."""
        rate, capacity = self.rate(load), self.capacity_req_s
        if rate is None or capacity is None or check.met is None:
            return None
        said = (
            f"the twin, {self.basis}, predicted both SLOs met up to {capacity:.3g} req/s, this load is "
            f"{rate:.3g} req/s"
        )
        excess = max(check.relative.values())
        if rate <= capacity and excess > self.tolerance:
            return f"{said}, yet it missed by {excess:.0%} (tolerance {self.tolerance:.0%})"
        if check.met and rate > capacity * (1 + self.tolerance):
            return f"{said}, beyond which it predicted a miss (tolerance {self.tolerance:.0%})"
        return None


def judge(
    window: TopologyWindow, slo: SLOTargets, min_samples: int, twin: Prediction | None = None
) -> tuple[Decision, str]:
    """Promote a canary topology that met both SLOs as its clients see it, at a load per replica
    comparable to the stable's and as the twin predicted; discard one that misses (or any other)."""
    twin = twin or Prediction()
    p, d, both = window.prefill, window.decode, window.combined()
    load = Load.of(window)
    measured = (
        f"decode ITL p{slo.itl_quantile * 100:g} {_ms(both.itl_ms)} (target {slo.itl_ms:g} ms), "
        f"TTFT p{slo.ttft_quantile * 100:g} {_ms(both.ttft_ms)} = prefill {_ms(p.ttft_ms)} + decode "
        f"{_ms(d.ttft_ms)} (target {slo.ttft_ms:g} ms), at {load.text()}"
    )
    stable = window.stable
    apart = stable.itl_source is not both.itl_source  # the stable had too few fine samples of its own
    if stable.itl_ms is not None and stable.ttft_ms is not None:
        measured += f"; colocated stable ITL {_ms(stable.itl_ms)}, TTFT {_ms(stable.ttft_ms)}"
        measured += f" ({_family(stable, 'the stable')})" if apart else ""
    measured += f"; {_family(both, 'the pools' if apart else 'all')}"
    if not both.enough_samples(min_samples):
        return Decision.INCONCLUSIVE, (
            f"too few samples: the pools served {p.ttft_samples:.0f} and {d.ttft_samples:.0f} requests in "
            f"{both.window}, {min_samples} needed ({measured})"
        )
    check = check_slo(both, slo)
    contradiction = twin.contradicted(load, check)
    if not check.met:
        missed = " and ".join(k.upper() for k, v in check.excess_ms.items() if v > 0)
        note = f"; it contradicts the twin: {contradiction}" if contradiction else ""
        return Decision.DISCARD, f"the canary topology misses {missed}: {measured}{note}"
    if not load.comparable(twin.tolerance):  # the router's share of a short window is a draw: widen it
        return Decision.INCONCLUSIVE, (
            f"the canary topology meets both SLOs, but at a load per replica more than {twin.tolerance:.0%} "
            f"below the stable's, lighter than it would carry promoted (the window widens until the loads "
            f"compare, up to the trial's deadline): {measured}"
        )
    if contradiction is not None:
        return Decision.DISCARD, (
            f"the canary topology meets both SLOs but contradicts the twin ({contradiction}): no promotion "
            f"on a prediction the engine contradicts: {measured}"
        )
    return (
        Decision.PROMOTE,
        f"the canary topology meets both SLOs at the stable's load per replica: {measured}",
    )


def judge_colocated(
    window: WindowMeasurement, slo: SLOTargets, min_samples: int, replicas: int, tolerance: float = TOLERANCE
) -> tuple[Decision, str]:
    """Promote the colocated canary of a service that runs pools when it met both SLOs carrying what
    each of ``replicas`` colocated replicas would carry of the whole service's rate (less
    ``tolerance``); discard it when it missed one; inconclusive on too few samples or a lighter load.
    """
    canary, pools = window.canary, window.stable
    total = window.offered_request_rate
    carried = canary.per_replica(canary.request_rate)
    needed = total / replicas if total is not None and replicas > 0 else None

    def rate(value: float | None) -> str:
        return f"{value:.3g} req/s" if value is not None else "an unknown rate"

    measured = (
        f"canary ITL p{slo.itl_quantile * 100:g} {_ms(canary.itl_ms)} (target {slo.itl_ms:g} ms), TTFT "
        f"p{slo.ttft_quantile * 100:g} {_ms(canary.ttft_ms)} (target {slo.ttft_ms:g} ms), at {rate(carried)} "
        f"per replica where each of {replicas} colocated replicas would carry {rate(needed)} of the live "
        f"{rate(total)}; the pools ITL {_ms(pools.itl_ms)}, TTFT {_ms(pools.ttft_ms)}; "
        f"{_family(canary, 'the canary')}"
    )
    if not canary.enough_samples(min_samples):
        return Decision.INCONCLUSIVE, (
            f"too few samples: the colocated canary served {canary.ttft_samples:.0f} requests in "
            f"{canary.window}, {min_samples} needed ({measured})"
        )
    check = check_slo(canary, slo)
    if not check.met:
        missed = " and ".join(k.upper() for k, v in check.excess_ms.items() if v > 0) or "an SLO"
        return Decision.DISCARD, f"the colocated canary misses {missed}: {measured}"
    if carried is None or needed is None or carried < needed * (1 - tolerance):
        return Decision.INCONCLUSIVE, (
            f"the colocated canary meets both SLOs, but at a load per replica more than {tolerance:.0%} "
            f"below what it would carry promoted (the window widens until the loads compare, up to the "
            f"trial's deadline): {measured}"
        )
    return Decision.PROMOTE, f"the colocated canary meets both SLOs at the load it would carry: {measured}"


def twin_check(
    found: TopologyRecommendation | None, window: TopologyWindow, pools: PoolCheck | None = None
) -> TrialTwin:
    """What the twin predicted for the topology (its recommendation ``found``, and ``pools``: again on
    its pools' own steps) beside what its canary measured."""
    both = window.combined()
    rate = both.request_rate
    recommended = found.capacity_req_s if found is not None else None
    predicted = (
        f"the twin predicted it meets both SLOs up to {recommended:g} req/s (whole service)"
        if recommended is not None
        else "no prediction recorded"
    )
    capacity = recommended
    if pools is not None:
        capacity = round(pools.capacity_req_s, 3)
        predicted = (
            f"{predicted} on the stable's step model; {pools.describe()}, up to {capacity:g} req/s"
            if recommended is not None
            else f"the twin, {pools.describe()}, predicted it meets both SLOs up to {capacity:g} req/s"
        )
    measured = f"{rate:.2f} req/s" if rate is not None else "an unknown rate"
    measured += f" ({Load.of(window).text()})"
    return TrialTwin(
        capacity_req_s=capacity,
        rate_req_s=round(rate, 3) if rate is not None else None,
        measured_itl_ms=both.itl_ms,
        measured_ttft_ms=both.ttft_ms,
        message=f"{predicted}; its canary topology was measured at {measured}, its share of the traffic",
    )
