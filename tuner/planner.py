"""The capacity planner: how many stable replicas the live load needs, by the twin (pure).

One replica serves the twin's capacity at SLO of the stable configuration (requests/s within both
SLO quantiles). The planner asks for the fewest replicas whose capacity, less the twin's measured
error, covers the live request rate plus ``headroom`` (and, when the rate is rising, where its
trend will be once a new replica has started). Live evidence beats the model: when the stable track
misses an SLO at its load per replica, that load (less a margin) caps the capacity at once.
Recommendations are stabilised as a HorizontalPodAutoscaler's are: up at once by default, down no
lower than the highest recommendation of the last five minutes, each step within its policies.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from chunkpilot.api import ScalingRecommendation, ScalingRules, ScalingSpec

__all__ = [
    "DOWN_WINDOW_S",
    "LOOKAHEAD_S",
    "STARTUP_WATCH_S",
    "Capacity",
    "Decision",
    "capacity_of",
    "decide_replicas",
    "learnt_cap",
    "needed_replicas",
    "remember",
    "replicas_for",
    "settled",
    "sizing_capacity",
    "stabilized",
    "startup_seconds",
    "trend_rate",
    "watches_startup",
]

#: The stabilization windows when ``behavior`` sets none (the HorizontalPodAutoscaler's defaults).
UP_WINDOW_S: Final = 0
DOWN_WINDOW_S: Final = 300
#: How far ahead a rising rate is projected until the service's own engine pods have shown how long
#: one takes from scheduled to Ready (:func:`startup_seconds`): about that with its weights cached.
LOOKAHEAD_S: Final = 120.0
#: How long after a change of replicas in ``Auto`` the stable engine pods are read for the start-up
#: time of those it started (:func:`watches_startup`).
STARTUP_WATCH_S: Final = 900.0
#: The recent recommendations a rate's trend is fitted over (at least :data:`MIN_TREND_POINTS`).
TREND_WINDOW_S: Final = 600.0
MIN_TREND_POINTS: Final = 3
#: The twin's error taken when it has none measured yet, and the most it is trusted with.
DEFAULT_ERROR: Final = 0.15
MAX_ERROR: Final = 0.5
#: After a missed SLO, one replica's capacity is at most the load it missed at, less this share.
MISS_MARGIN: Final = 0.05
#: A planned rate within this share above what the running replicas serve keeps them, and fewer
#: replicas must serve it with this share to spare (the HorizontalPodAutoscaler's tolerance, both
#: ways): a minute's Poisson noise is about 10% at 100 arrivals.
TOLERANCE: Final = 0.1
#: How long after the last change of replicas (and their start-up) a missed SLO is not held against
#: the twin's capacity: two measurement windows.
SETTLE_S: Final = 120.0
#: A miss at a load per replica below this share of the planned capacity is not held against it:
#: that light, the latency is the requests' own (a run of long prompts), and more replicas would not
#: help.
MISS_MIN_LOAD: Final = 0.5
#: Recommendations kept in the status (the longest window they serve is an hour).
KEEP_RECOMMENDATIONS: Final = 64


@dataclass(frozen=True)
class Capacity:
    """One replica's capacity at SLO (req/s), with the twin's relative error around it."""

    req_s: float
    error: float
    #: Why live evidence lowered the twin's figure ("": it did not).
    corrected: str = ""

    @classmethod
    def between(cls, req_s: float, low_req_s: float) -> Capacity:
        """The capacity with ``low_req_s`` as its low end (the twin's capacity should its latencies
        be as much longer as its measured error), at most :data:`MAX_ERROR` below."""
        error = 1.0 - low_req_s / req_s if req_s > 0 else MAX_ERROR
        return cls(req_s, min(max(error, 0.0), MAX_ERROR))

    @property
    def low(self) -> float:
        """The capacity planned with: less the error."""
        return self.req_s * (1.0 - self.error)

    @property
    def high(self) -> float:
        return self.req_s * (1.0 + self.error)


def learnt_cap(
    cap_req_s: float | None,
    planned_low_req_s: float,
    per_replica_req_s: float | None,
    met: bool | None,
) -> float | None:
    """What the live service has shown one replica serves, where that is below what the twin plans
    with (None: nothing below it). A miss at a load per replica (one that counts: settled, and at
    least :data:`MISS_MIN_LOAD` of the planned capacity) lowers it to that load less
    :data:`MISS_MARGIN`; both SLOs met at a load above it raise it to that load; at or above the
    twin's planned capacity it is dropped. Kept from step to step until the twin refits, so a twin
    that overstates the capacity is corrected once, not at every miss."""
    if per_replica_req_s is not None and per_replica_req_s > 0 and met is not None:
        if not met and per_replica_req_s >= MISS_MIN_LOAD * planned_low_req_s:
            lowered = per_replica_req_s * (1.0 - MISS_MARGIN)
            cap_req_s = lowered if cap_req_s is None else min(cap_req_s, lowered)
        elif met and cap_req_s is not None and per_replica_req_s > cap_req_s:
            cap_req_s = per_replica_req_s
    if cap_req_s is None or cap_req_s >= planned_low_req_s:
        return None
    return cap_req_s


def capacity_of(
    twin_req_s: float,
    twin_error: float | None,
    low_req_s: float | None = None,
    cap_req_s: float | None = None,
) -> Capacity:
    """The twin's capacity with its error (:data:`DEFAULT_ERROR` unmeasured, at most
    :data:`MAX_ERROR`; or the one ``low_req_s`` implies, :meth:`Capacity.between`), capped by
    ``cap_req_s``: what the live service showed (:func:`learnt_cap`)."""
    if low_req_s is not None and twin_req_s > 0:
        error = Capacity.between(twin_req_s, low_req_s).error
    else:
        error = DEFAULT_ERROR if twin_error is None or not math.isfinite(twin_error) else twin_error
        error = min(max(error, 0.0), MAX_ERROR)
    planned_low = twin_req_s * (1.0 - error)
    if cap_req_s is not None and 0 < cap_req_s < planned_low:
        corrected = (
            f"the live service showed {cap_req_s:.3g} req/s per replica, below the twin's "
            f"{planned_low:.3g}: planning with it until the twin refits"
        )
        return Capacity(cap_req_s / (1.0 - error), error, corrected)
    return Capacity(twin_req_s, error)


def sizing_capacity(
    twin_req_s: float,
    twin_error: float | None,
    *,
    low_req_s: float | None,
    cap_req_s: float | None,
    per_replica_req_s: float,
    met: bool | None,
) -> tuple[float | None, Capacity]:
    """The learnt cap after this measurement (:func:`learnt_cap`) and the capacity the planner
    sizes with (:func:`capacity_of` under that cap)."""
    cap = learnt_cap(cap_req_s, capacity_of(twin_req_s, twin_error, low_req_s).low, per_replica_req_s, met)
    return cap, capacity_of(twin_req_s, twin_error, low_req_s, cap)


def settled(last_scale: datetime | None, now: datetime, startup_s: float | None) -> bool:
    """Whether the replicas have served as they are for two windows since the last change (its new
    replicas' start-up included): before that, a missed SLO may be the backlog of the load before
    the change rather than a capacity the twin overstates."""
    if last_scale is None:
        return True
    ahead = LOOKAHEAD_S if startup_s is None else startup_s
    return (now - last_scale).total_seconds() >= ahead + SETTLE_S


def startup_seconds(pods: Iterable[Mapping[str, Any]], since: datetime | None = None) -> float | None:
    """The longest time from scheduled to Ready of ``pods`` (engine pods of the service that became
    Ready, scheduled at or after ``since`` when given; None: none did): what a new replica takes
    before it serves."""
    found: list[float] = []
    for pod in pods:
        conditions = {c.get("type"): c for c in (pod.get("status") or {}).get("conditions") or []}
        scheduled, ready = conditions.get("PodScheduled"), conditions.get("Ready")
        if not scheduled or not ready or ready.get("status") != "True":
            continue
        try:
            start = datetime.fromisoformat(str(scheduled["lastTransitionTime"]).replace("Z", "+00:00"))
            end = datetime.fromisoformat(str(ready["lastTransitionTime"]).replace("Z", "+00:00"))
        except (KeyError, ValueError):
            continue
        if end >= start and (since is None or start >= since):
            found.append((end - start).total_seconds())
    return max(found) if found else None


def watches_startup(startup_s: float | None, last_scale: datetime | None, acts: bool, now: datetime) -> bool:
    """Whether the service's stable engine pods are read for their start-up time: until one has been
    measured, and in ``Auto`` after a change of replicas (the pods it started) for
    :data:`STARTUP_WATCH_S`, or twice the start-up measured last when that is longer. Otherwise they
    are not read at all: a fleet's API requests stay few."""
    if startup_s is None:
        return True
    watch = max(STARTUP_WATCH_S, 2.0 * startup_s)
    return acts and last_scale is not None and (now - last_scale).total_seconds() <= watch


def trend_rate(
    history: Sequence[ScalingRecommendation], now: datetime, live_req_s: float, ahead_s: float = LOOKAHEAD_S
) -> float:
    """The live rate, or where its rising trend over :data:`TREND_WINDOW_S` will be ``ahead_s`` from
    now (least squares over the recorded rates); never below the live rate."""
    since = now - timedelta(seconds=TREND_WINDOW_S)
    points = [(r.time, r.rate_req_s) for r in history if r.time >= since and r.rate_req_s is not None]
    points.append((now, live_req_s))
    if len(points) < MIN_TREND_POINTS:
        return live_req_s
    xs = [(t - now).total_seconds() for t, _ in points]
    ys = [float(rate) for _, rate in points]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    if spread <= 0:
        return live_req_s
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread
    return max(live_req_s, live_req_s + slope * ahead_s)


def replicas_for(rate_req_s: float, capacity: Capacity) -> int | None:
    """The fewest replicas whose capacity less the error covers ``rate_req_s`` (None: one replica
    serves nothing, so no count does)."""
    if capacity.low <= 0:
        return None
    return max(1, math.ceil(rate_req_s / capacity.low - 1e-9))


def needed_replicas(rate_req_s: float, capacity: Capacity, spec: ScalingSpec) -> int:
    """:func:`replicas_for` within ``minReplicas`` and ``maxReplicas``; ``maxReplicas`` when one
    replica serves nothing."""
    most = spec.max_replicas or spec.min_replicas
    found = replicas_for(rate_req_s, capacity)
    return most if found is None else max(spec.min_replicas, min(most, found))


def _window(rules: ScalingRules | None, default: int) -> int:
    if rules is None or rules.stabilization_window_seconds is None:
        return default
    return rules.stabilization_window_seconds


def _step_limit(rules: ScalingRules | None, current: int) -> int | None:
    """How far one decision may move from ``current`` (None: unlimited; 0: never this way)."""
    if rules is None or not rules.policies:
        return None
    if rules.select_policy == "Disabled":
        return 0
    limits = [
        p.value if p.type == "Pods" else max(1, math.ceil(current * p.value / 100.0)) for p in rules.policies
    ]
    return max(limits) if rules.select_policy == "Max" else min(limits)


def stabilized(
    current: int,
    recommended: int,
    history: Sequence[ScalingRecommendation],
    now: datetime,
    spec: ScalingSpec,
) -> int:
    """``recommended`` as the HorizontalPodAutoscaler would act on it from ``current`` replicas.

    Up: no higher than the lowest recommendation of the scale-up window (none by default: at once);
    down: no lower than the highest of the scale-down window (five minutes by default, so a dip
    does not shed replicas a returning load needs); each step within its direction's policies.
    """
    behavior = spec.behavior
    up_rules, down_rules = (behavior.scale_up, behavior.scale_down) if behavior else (None, None)

    def within(seconds: int) -> list[int]:
        since = now - timedelta(seconds=seconds)
        return [r.replicas for r in history if r.time > since] + [recommended]

    if recommended > current:
        target = max(current, min(within(_window(up_rules, UP_WINDOW_S))))
        limit = _step_limit(up_rules, current)
        return target if limit is None else min(target, current + limit)
    if recommended < current:
        target = min(current, max(within(_window(down_rules, DOWN_WINDOW_S))))
        limit = _step_limit(down_rules, current)
        return target if limit is None else max(target, current - limit)
    return current


@dataclass(frozen=True)
class Decision:
    """What the planner asks for and why."""

    desired: int
    needed: int
    planned_req_s: float
    capacity: Capacity
    reason: str


def decide_replicas(
    spec: ScalingSpec,
    current: int,
    live_req_s: float,
    capacity: Capacity,
    history: Sequence[ScalingRecommendation],
    now: datetime,
    startup_s: float | None = None,
    window_s: float = 0.0,
) -> Decision:
    """The replicas to run from ``current`` at the live rate over the service, with the reason;
    a rising rate is planned where it will be once a new replica has started (``startup_s``, the
    service's own pods' time from scheduled to Ready; :data:`LOOKAHEAD_S` unmeasured).

    ``window_s``: how long the live rate is averaged over. A rate rising steadily averages over a
    window to what it was half the window ago, so its trend is projected that much further.
    """
    ahead = (LOOKAHEAD_S if startup_s is None else startup_s) + max(0.0, window_s) / 2
    rate = trend_rate(history, now, live_req_s, ahead)
    planned = rate * (1.0 + spec.headroom)
    needed = needed_replicas(planned, capacity, spec)
    if needed > current >= spec.min_replicas and planned <= capacity.low * current * (1.0 + TOLERANCE):
        needed = current  # within the tolerance of what runs: a rate's noise moves nothing
    elif needed < current:
        # Fewer replicas only where they serve the rate with the tolerance to spare: a count that
        # serves it only just is one a rate's noise (or a capacity a few percent high) moves back up.
        needed = min(current, needed_replicas(planned * (1.0 + TOLERANCE), capacity, spec))
    held = stabilized(current, needed, history, now, spec)
    desired = max(spec.min_replicas, min(spec.max_replicas or needed, held))
    trend = f", its trend {rate:.3g} req/s in {ahead:.0f} s" if rate > live_req_s else ""
    reason = (
        f"{needed} replica(s) serve {planned:.3g} req/s (live {live_req_s:.3g} req/s{trend}, plus "
        f"{spec.headroom:.0%} headroom) at {capacity.low:.3g} req/s each (the twin's "
        f"{capacity.req_s:.3g} less its {capacity.error:.0%} error)"
    )
    if capacity.corrected:
        reason += f"; {capacity.corrected}"
    if desired > needed:
        reason += f"; {desired} kept: the highest recommendation of the scale-down window, or its step limit"
    elif desired < needed:
        reason += f"; {desired} for now: the scale-up window or its step limit"
    if needed == spec.max_replicas and planned > capacity.low * needed:
        reason += f"; maxReplicas {spec.max_replicas} is short of the load"
    return Decision(desired, needed, planned, capacity, reason)


def remember(
    history: Sequence[ScalingRecommendation], now: datetime, replicas: int, rate_req_s: float
) -> list[ScalingRecommendation]:
    """``history`` with this recommendation, the oldest beyond :data:`KEEP_RECOMMENDATIONS` or an
    hour dropped."""
    since = now - timedelta(hours=1)
    kept = [r for r in history if r.time > since]
    kept.append(ScalingRecommendation(time=now, replicas=replicas, rate_req_s=round(rate_req_s, 4)))
    return kept[-KEEP_RECOMMENDATIONS:]
