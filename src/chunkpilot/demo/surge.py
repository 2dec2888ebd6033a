"""The demo's load surge: when it starts, how high it goes, when it is over.

Pure: :meth:`Surge.step` is fed the clock and the InferenceService as read from the API server and
answers the extra rate to replay when the surge begins (the demo then turns the planner from Advise
to Auto). It waits for the tuning run to end and for the replica planner's capacity of the
configuration that runs (``status.scaling.capacityLowReqS``: one replica's capacity at SLO less the
twin's error, what the planner sizes with; :func:`planned_capacity`), surges for ``surge_s``, then
waits up to ``calm_s`` for the stable replicas to come back to what the planner asked for before.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from chunkpilot.api import InferenceService
from chunkpilot.demo.scenario import DemoScenario


def planned_capacity(service: InferenceService) -> tuple[float, int] | None:
    """One replica's capacity the planner sizes with and its desired replicas, once both are of the
    configuration that runs: the twin fitted on it, and the planner's last recommendation after that
    fit (right after a promotion the status still shows the capacity of the configuration before)."""
    status = service.status
    scaling = status.scaling if status else None
    twin = status.twin if status else None
    if status is None or scaling is None or twin is None or twin.fitted_at is None:
        return None
    if twin.config_hash is None or twin.config_hash != status.applied_config_hash:
        return None
    if not scaling.recommendations or scaling.recommendations[-1].time < twin.fitted_at:
        return None
    capacity, desired = scaling.capacity_low_req_s, scaling.desired_replicas
    if capacity is None or not capacity > 0 or not desired:
        return None
    return capacity, desired


#: The stable replicas must read as before the surge this long before it counts as over.
BACK_FOR_S = 5.0


@dataclass(frozen=True)
class ExtraLoad:
    """A load to replay beside the demo's own: requests/s for this long."""

    rate: float
    duration_s: float


class SurgePhase(StrEnum):
    WAITING = "waiting"
    SURGING = "surging"
    CALMING = "calming"
    DONE = "done"
    SKIPPED = "skipped"


@dataclass
class Surge:
    """One surge of the replayed rate (module docstring); ``note`` says why it was skipped."""

    scenario: DemoScenario
    phase: SurgePhase = SurgePhase.WAITING
    rate: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    #: Stable replicas when the surge began (the count it comes back to).
    before: int | None = None
    #: When the tuning run was first seen finished while the surge still waited.
    tuning_done_at: float | None = None
    note: str = ""
    #: Whether the second half of the surge's extra load has started.
    ramped: bool = False
    #: Since when the stable replicas have been back at ``before`` (a passing reading is not enough).
    back_since: float | None = None

    def __post_init__(self) -> None:
        if not self.scenario.scales:
            self.phase, self.note = SurgePhase.SKIPPED, "the replica planner is off (--max-replicas 1)"

    @property
    def busy(self) -> bool:
        """Whether the demo should keep running for it (surging, calming, or waiting on a capacity
        after the tuning run has ended)."""
        return self.phase in (SurgePhase.SURGING, SurgePhase.CALMING) or (
            self.phase is SurgePhase.WAITING and self.tuning_done_at is not None
        )

    def step(self, now: float, service: InferenceService, tuning_finished: bool) -> ExtraLoad | None:
        """Advance the phase; an extra load to replay when one starts (half the surge's extra rate at
        its start, the other half ``surge_ramp_s`` later: the rate rises in two steps)."""
        stable = service.status.stable_replicas if service.status else None
        if self.phase is SurgePhase.WAITING:
            if not tuning_finished:
                return None
            if self.tuning_done_at is None:
                self.tuning_done_at = now
            current = planned_capacity(service)
            if current is not None:
                capacity, desired = current
                load = self._start(now, capacity, service.spec.scaling.headroom, desired)
                if load is not None:
                    return load
            if now - self.tuning_done_at >= self.scenario.calm_s:
                self.phase = SurgePhase.SKIPPED
                self.note = self.note or "the planner stated no capacity: no configuration met both SLOs"
        elif self.phase is SurgePhase.SURGING:
            assert self.started_at is not None and self.rate is not None
            elapsed = now - self.started_at
            if elapsed >= self.scenario.surge_s:
                self.phase, self.ended_at = SurgePhase.CALMING, now
            elif not self.ramped and elapsed >= self.scenario.surge_ramp_s:
                self.ramped = True
                return ExtraLoad((self.rate - self.scenario.rate) / 2, self.scenario.surge_s - elapsed)
        elif self.phase is SurgePhase.CALMING:
            assert self.ended_at is not None
            back = stable is not None and self.before is not None and stable <= self.before
            self.back_since = (self.back_since or now) if back else None
            settled = self.back_since is not None and now - self.back_since >= BACK_FOR_S
            if settled or now - self.ended_at >= self.scenario.calm_s:
                self.phase = SurgePhase.DONE
        return None

    def _start(self, now: float, capacity: float, headroom: float, replicas: int) -> ExtraLoad | None:
        rate = self.scenario.surge_rate(capacity)
        if rate <= self.scenario.rate:  # no more than the demo's own load: nothing to add
            self.note = (
                f"{self.scenario.surge_replicas:g} replicas' worth of one replica's capacity "
                f"({capacity:.3g} req/s) is no more than the demo's own {self.scenario.rate:g} req/s: "
                "nothing to surge"
            )
            return None
        if rate * (1 + headroom) <= capacity * replicas:  # not now; the capacity may still change
            self.note = (
                f"{replicas} replica(s) serve {capacity * replicas:.3g} req/s, more than the surge "
                f"may replay on this machine ({rate:.3g}, --surge-max-factor)"
            )
            return None
        self.phase, self.rate, self.started_at, self.before = SurgePhase.SURGING, rate, now, replicas
        return ExtraLoad((rate - self.scenario.rate) / 2, self.scenario.surge_s)

    def describe(self, now: float) -> str:
        """One line for the live view and the log."""
        if self.phase is SurgePhase.SURGING and self.started_at is not None and self.rate is not None:
            return (
                f"load surge: {self.rate:.3g} req/s ({now - self.started_at:.0f}/"
                f"{self.scenario.surge_s:.0f} s), then back to {self.scenario.rate:g}"
            )
        if self.phase is SurgePhase.CALMING:
            return f"load back to {self.scenario.rate:g} req/s: waiting for the replicas to come down"
        if self.phase is SurgePhase.WAITING:
            return (
                f"load {self.scenario.rate:g} req/s; once the tuning has ended the planner turns from "
                "Advise to Auto and the load surges"
            )
        if self.phase is SurgePhase.SKIPPED:
            return f"load {self.scenario.rate:g} req/s; no surge: {self.note}"
        return f"load {self.scenario.rate:g} req/s; the surge is over"


__all__ = ["ExtraLoad", "Surge", "SurgePhase", "planned_capacity"]
