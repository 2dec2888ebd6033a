"""A fleet of simulated replicas on a hidden truth, scaled while it serves: ``bench autoscale``'s engine.

Replicas are simulated engines (:class:`~chunkpilot.engine.sim.offline.EngineRun`) advanced in step,
one tick at a time. Each arrival goes to a Ready replica picked at random, as a Kubernetes Service
spreads connections; a replica asked for becomes Ready ``startup_s`` later and counts GPU time from
the moment it is asked for; a replica scaled away (the newest first, as a ReplicaSet removes them)
takes no new requests and finishes the ones it holds. What a scaling method sees at a tick
(:class:`View`) is what Prometheus would show: the request rate as the operator reads it
(completions plus the growth of the requests in the engines, a fall not subtracted:
:attr:`TrackMeasurement.offered_rate <chunkpilot.tuner.measure.TrackMeasurement.offered_rate>`, so
the arrivals while a backlog grows and the completions while one drains) and both SLO quantiles over
the last minute, the mean of ``num_requests_waiting`` over Ready replicas. Every minute is judged
afterwards on the SLO quantiles of the requests that arrived in it (TTFT) and the tokens produced in
it (ITL).
"""

from __future__ import annotations

import itertools
import math
import random
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from chunkpilot.bench.exhaustive import WORKLOADS, tuned_scheduler
from chunkpilot.bench.rate_profile import RateProfile
from chunkpilot.engine.sim.engine import SimConfig
from chunkpilot.engine.sim.offline import SLO, EngineRun, FloatArray, new_request, quantile
from chunkpilot.engine.sim.scheduler import Request
from chunkpilot.engine.sim.workload import RequestSpec, load_trace
from chunkpilot.tuner.space import TunedConfig

__all__ = [
    "TICK_S",
    "Fleet",
    "FleetRun",
    "Minute",
    "View",
    "fewest_replicas",
    "per_minute",
    "profile_requests",
    "request_lengths",
]

#: How often arrivals are routed, replicas advanced and a method asked (the HPA's sync period).
TICK_S = 15.0
#: The window a method's view covers (Prometheus ``rate(...[1m])``).
VIEW_S = 60.0


def request_lengths(workload: str, seed: int) -> Callable[[], RequestSpec]:
    """Request shapes of a bundled trace, in the trace's order from a seeded offset, cycling."""
    specs = load_trace(WORKLOADS[workload], rate=1.0).requests
    position = random.Random(seed).randrange(len(specs))

    def take() -> RequestSpec:
        nonlocal position
        spec = specs[position % len(specs)]
        position += 1
        return spec

    return take


def profile_requests(profile: RateProfile, unit_req_s: float, seed: int) -> list[RequestSpec]:
    """The requests of a run: Poisson arrivals of the profile (:meth:`RateProfile.arrivals`), each
    shaped by the workload in force."""
    shapes = {w: request_lengths(w, seed + k) for k, w in enumerate(profile.workloads)}
    out = []
    for at, workload in profile.arrivals(unit_req_s, seed):
        spec = shapes[workload]()
        out.append(RequestSpec(at, spec.prompt_tokens, spec.output_tokens, spec.block_hashes))
    return out


def fewest_replicas(
    sim: SimConfig,
    max_model_len: int,
    requests: list[RequestSpec],
    slo: SLO,
    start: int,
    seed: int,
    most: int = 1000,
) -> int:
    """The fewest replicas, from ``start`` up, whose engines (empty at first, ``requests`` spread at
    random) meet both SLO quantiles over ``requests``; ``most`` if none up to it does."""
    for replicas in range(max(1, start), most + 1):
        rng = random.Random(seed)
        runs = [EngineRun(sim.build()) for _ in range(replicas)]
        made = []
        for index, spec in enumerate(requests):
            request = new_request(
                index,
                spec.arrival_s,
                spec.prompt_tokens,
                spec.output_tokens,
                spec.block_hashes,
                max_model_len,
            )
            rng.choice(runs).add([request])
            made.append(request)
        minute = Minute(0, len(made), requests=made)
        for run in runs:
            run.advance()
            minute.itl.append(run.take_itl())
        if minute.met(slo):
            return replicas
    return most


@dataclass(frozen=True)
class View:
    """What a scaling method sees at a tick (the last :data:`VIEW_S` seconds)."""

    now_s: float
    #: Replicas asked for (starting or Ready) and Ready ones.
    replicas: int
    ready: int
    rate_req_s: float
    #: The SLO quantiles over the window (NaN: no sample).
    itl_ms: float
    ttft_ms: float
    waiting_per_replica: float
    #: The workload the captured traffic shows.
    workload: str
    config: TunedConfig


@dataclass
class _Replica:
    run: EngineRun
    config: TunedConfig
    asked_s: float
    ready_s: float
    removed_s: float | None = None

    def serving(self, now: float) -> bool:
        return (self.removed_s is None or now < self.removed_s) and self.ready_s <= now


@dataclass
class Minute:
    """One minute of the run, judged afterwards."""

    index: int
    arrivals: int = 0
    itl: list[tuple[FloatArray, FloatArray]] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    replicas: int = 0
    ready: int = 0

    def itl_ms(self, q: float) -> float:
        if not self.itl:
            return math.nan
        values = np.concatenate([v for v, _ in self.itl])
        weights = np.concatenate([w for _, w in self.itl])
        return quantile(values, q, weights) * 1e3 if values.size else math.nan

    def ttft_ms(self, q: float) -> float:
        done = [r.first_token_s - r.arrival_s for r in self.requests if r.first_token_s is not None]
        if len(done) < len(self.requests):
            return math.inf  # a request that never got its first token
        return quantile(np.asarray(done), q) * 1e3 if done else math.nan

    def met(self, slo: SLO) -> bool:
        itl, ttft = self.itl_ms(slo.itl_quantile), self.ttft_ms(slo.ttft_quantile)
        return not (itl > slo.itl_ms or ttft > slo.ttft_ms)  # NaN: nothing to miss


@dataclass
class FleetRun:
    """A finished run: per minute the judged latencies, per replica its GPU time, the scale events."""

    minutes: list[Minute]
    gpu_seconds: float
    #: (time, replicas asked for) at every change.
    events: list[tuple[float, int]]

    @property
    def max_replicas(self) -> int:
        return max((n for _, n in self.events), default=0)

    def direction_changes(self) -> int:
        signs = [
            1 if b > a else -1 for (_, a), (_, b) in zip(self.events, self.events[1:], strict=False) if b != a
        ]
        return sum(1 for a, b in itertools.pairwise(signs) if a != b)


class Fleet:
    """The replicas of one method on the truth (see the module docstring)."""

    def __init__(self, sim: SimConfig, max_model_len: int, startup_s: float, slo: SLO, seed: int = 0) -> None:
        self._sim, self._max_model_len, self._startup_s, self._slo = sim, max_model_len, startup_s, slo
        self._rng = random.Random(seed)
        self._replicas: list[_Replica] = []
        self._builds: dict[TunedConfig, SimConfig] = {}
        self._recent: deque[tuple[float, Request]] = deque()
        self._recent_itl: deque[tuple[float, FloatArray, FloatArray]] = deque()
        self.events: list[tuple[float, int]] = []

    def _build(self, config: TunedConfig) -> EngineRun:
        if config not in self._builds:
            self._builds[config] = replace(
                self._sim, scheduler=tuned_scheduler(self._sim.scheduler, config, self._max_model_len)
            )
        core = self._builds[config].build()
        return EngineRun(core, fast_forward=not core.steps_spread)

    @property
    def active(self) -> list[_Replica]:
        return [r for r in self._replicas if r.removed_s is None]

    def scale(
        self, replicas: int, config: TunedConfig, now: float, *, startup_s: float | None = None
    ) -> None:
        """Ask for ``replicas`` (at least one): new ones Ready after the start-up time, the newest
        removed first."""
        replicas = max(1, replicas)
        active = self.active
        if replicas == len(active):
            return
        delay = self._startup_s if startup_s is None else startup_s
        for _ in range(replicas - len(active)):
            self._replicas.append(_Replica(self._build(config), config, now, now + delay))
        for replica in sorted(active, key=lambda r: r.asked_s, reverse=True)[
            : max(0, len(active) - replicas)
        ]:
            replica.removed_s = now
        self.events.append((now, replicas))

    def roll(self, replicas: int, config: TunedConfig, now: float, *, startup_s: float | None = None) -> None:
        """Replace every replica with ``replicas`` of ``config`` (a promotion's roll-out): the new ones
        Ready after the start-up time, the old ones serving until then."""
        replicas = max(1, replicas)
        ready = now + (self._startup_s if startup_s is None else startup_s)
        for replica in self.active:
            replica.removed_s = ready
        for _ in range(replicas):
            self._replicas.append(_Replica(self._build(config), config, now, ready))
        self.events.append((now, replicas))

    def run(
        self,
        profile: RateProfile,
        unit_req_s: float,
        decide: Callable[[View], int],
        config: TunedConfig,
        initial: int,
        seed: int,
        *,
        startup_s: float | None = None,
        knobs: Callable[[View], TunedConfig] | None = None,
    ) -> FleetRun:
        """Serve ``profile`` (``load x unit_req_s`` requests/s), asking ``decide`` every tick for the
        replicas and ``knobs`` (if given) for their configuration, a new one rolled out at once
        (:meth:`roll`); the first ``initial`` replicas are Ready at once."""
        self.scale(initial, config, 0.0, startup_s=0.0)
        arrivals = profile_requests(profile, unit_req_s, seed)
        minutes = [Minute(i) for i in range(math.ceil(profile.duration_s / 60.0))]
        index, t = 0, 0.0
        while t < profile.duration_s:
            end = t + TICK_S
            serving = [r for r in self._replicas if r.serving(t)] or self.active[:1]
            minute = minutes[min(int(t // 60), len(minutes) - 1)]
            while index < len(arrivals) and arrivals[index].arrival_s < end:
                spec = arrivals[index]
                at = spec.arrival_s
                request = new_request(
                    index, at, spec.prompt_tokens, spec.output_tokens, spec.block_hashes, self._max_model_len
                )
                self._rng.choice(serving).run.add([request])
                minutes[min(int(at // 60), len(minutes) - 1)].requests.append(request)
                self._recent.append((at, request))
                index += 1
            for replica in self._replicas:
                replica.run.advance(end)
                values, weights = replica.run.take_itl()
                if values.size:
                    minute.itl.append((values, weights))
                    self._recent_itl.append((end, values, weights))
            minute.arrivals = len(minute.requests)
            active = self.active
            minute.replicas = max(minute.replicas, len(active))
            minute.ready = max(minute.ready, sum(1 for r in self._replicas if r.serving(end)))
            view = self._view(end, config, profile.workload_at(end))
            wanted = decide(view)
            chosen = knobs(view) if knobs is not None else config
            if chosen != config:
                config = chosen
                self.roll(wanted, config, end, startup_s=startup_s)
            else:
                self.scale(wanted, config, end, startup_s=startup_s)
            t = end
        for replica in self._replicas:
            replica.run.advance()
        gpu = sum(
            min(r.removed_s or profile.duration_s, profile.duration_s) - r.asked_s for r in self._replicas
        )
        return FleetRun(minutes, gpu, self.events)

    def _view(self, now: float, config: TunedConfig, workload: str) -> View:
        since = now - VIEW_S
        while self._recent and self._recent[0][0] < since - 600.0:
            self._recent.popleft()
        while self._recent_itl and self._recent_itl[0][0] <= since:
            self._recent_itl.popleft()
        arrived = sum(1 for at, _ in self._recent if at >= since)
        # The operator's live rate: completions plus the growth of the requests in the engines, a fall
        # not subtracted (TrackMeasurement.offered_rate); arrivals = completions + growth, so it is
        # the larger of the two.
        completed = sum(1 for _, r in self._recent if r.finish_s is not None and since < r.finish_s <= now)
        ttft = [
            r.first_token_s - r.arrival_s
            for _, r in self._recent
            if r.first_token_s is not None and since < r.first_token_s <= now
        ]
        slo = self._slo
        itl = math.nan
        if self._recent_itl:
            values = np.concatenate([v for _, v, _ in self._recent_itl])
            weights = np.concatenate([w for _, _, w in self._recent_itl])
            itl = quantile(values, slo.itl_quantile, weights) * 1e3
        ready = [r for r in self._replicas if r.serving(now)]
        waiting = sum(r.run.waiting for r in ready) / len(ready) if ready else 0.0
        return View(
            now_s=now,
            replicas=len(self.active),
            ready=len(ready),
            rate_req_s=max(arrived, completed) / min(VIEW_S, now),
            itl_ms=itl,
            ttft_ms=quantile(np.asarray(ttft), slo.ttft_quantile) * 1e3 if ttft else math.nan,
            waiting_per_replica=waiting,
            workload=workload,
            config=config,
        )


def per_minute(run: FleetRun, slo: SLO) -> list[Mapping[str, float]]:
    """Each minute's arrivals, replicas and SLO quantiles (for the JSON and the plots)."""
    return [
        {
            "minute": m.index,
            "arrivals": m.arrivals,
            "replicas": m.replicas,
            "ready": m.ready,
            "itl_ms": round(m.itl_ms(slo.itl_quantile), 2),
            "ttft_ms": round(m.ttft_ms(slo.ttft_quantile), 2),
            "met": m.met(slo),
        }
        for m in run.minutes
    ]
