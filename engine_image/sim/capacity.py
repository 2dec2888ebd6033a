"""Capacity search: the highest Poisson request rate whose latency quantiles meet the SLOs.

Sarathi-Serve style: keep the request lengths of a workload, replace its arrivals by a Poisson process
of rate ``r``, simulate, and call ``r`` feasible when the ITL and TTFT quantiles meet their targets.
Feasibility is monotone in the rate (up to noise), so the rate is bracketed by doubling or halving
and then bisected until the bracket is narrower than ``tolerance`` (relative to its lower end).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from chunkpilot.engine.sim.engine import SimConfig
from chunkpilot.engine.sim.offline import SLO, Summary, simulate
from chunkpilot.engine.sim.workload import RequestSpec, Workload

DEFAULT_TOLERANCE = 0.025
#: The bracket's factor per probe while it grows (or shrinks) to hold the capacity.
DEFAULT_GROWTH = 2.0
#: Bracket probes at a small ``growth`` before the bracket grows by :data:`DEFAULT_GROWTH` instead:
#: a start near the capacity brackets it within these, and a start far from it (or a configuration
#: that meets the SLOs at no rate) is not walked off in small steps.
NEAR_PROBES = 3
MIN_RATE = 1e-3
MAX_RATE = 1e6


@dataclass(frozen=True, slots=True)
class Probe:
    """One simulated rate and its verdict."""

    rate_req_s: float
    slo_met: bool
    itl_ms: float
    ttft_ms: float


@dataclass(frozen=True, slots=True)
class CapacityResult:
    """Outcome of a capacity search (``chunkpilot sim capacity --json`` prints :meth:`to_dict`)."""

    capacity_req_s: float
    lower_req_s: float
    upper_req_s: float
    tolerance: float
    requests: int
    feasible: bool
    probes: tuple[Probe, ...]
    at_capacity: Summary | None
    wall_s: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready mapping."""
        summary = self.at_capacity.to_dict() if self.at_capacity is not None else None
        return {
            "capacity_req_s": self.capacity_req_s,
            "lower_req_s": self.lower_req_s,
            "upper_req_s": self.upper_req_s,
            "relative_width": (self.upper_req_s - self.lower_req_s) / self.lower_req_s
            if self.lower_req_s
            else math.inf,
            "tolerance": self.tolerance,
            "requests": self.requests,
            "feasible": self.feasible,
            "iterations": len(self.probes),
            "probes": [asdict(p) for p in self.probes],
            "slo": summary["slo"] if summary is not None else None,
            "at_capacity": summary,
            "wall_s": self.wall_s,
        }


def retime(workload: Workload, rate: float, seed: int = 0, min_duration_s: float = 0.0) -> Workload:
    """The same requests (lengths and prefix hashes, in order) arriving as a Poisson process of ``rate``;
    repeated in order until the arrivals span ``min_duration_s`` (a sustained load, not a burst)."""
    rng = random.Random(seed)
    t = 0.0
    specs: list[RequestSpec] = []
    requests = workload.requests
    while True:
        for spec in requests:
            specs.append(RequestSpec(t, spec.prompt_tokens, spec.output_tokens, spec.block_hashes))
            t += rng.expovariate(rate)
            if t >= min_duration_s and len(specs) >= len(requests):
                return Workload(f"{workload.name}@{rate:g}", tuple(specs))


def find_capacity(
    config: SimConfig,
    workload: Workload,
    slo: SLO,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    start_rate: float = 1.0,
    seed: int = 0,
    growth: float = DEFAULT_GROWTH,
    min_duration_s: float = 0.0,
    stop_on_miss: bool = False,
) -> CapacityResult:
    """Bisect the Poisson rate until ``(upper - lower) / lower <= tolerance``.

    ``stop_on_miss``: a probe ends once its TTFT quantile has missed for certain (see
    :func:`~chunkpilot.engine.sim.offline.simulate`): the same capacity and verdicts for less
    simulation; a failed probe's summary then covers part of its requests.

    Each probe runs the workload's requests at least once; with ``min_duration_s`` they repeat until
    the arrivals span that long, so the capacity is one the engine sustains, not the rate at which it
    absorbs a burst of ``len(workload.requests)`` (on a fast engine a few hundred requests arrive
    within seconds, and a queue that grows all the while still meets the SLOs).
    """
    return search_capacity(
        lambda retimed: simulate(config, retimed, slo, stop_on_miss=stop_on_miss),
        workload,
        tolerance=tolerance,
        start_rate=start_rate,
        seed=seed,
        growth=growth,
        min_duration_s=min_duration_s,
    )


def search_capacity(
    run: Callable[[Workload], Summary],
    workload: Workload,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    start_rate: float = 1.0,
    seed: int = 0,
    growth: float = DEFAULT_GROWTH,
    min_duration_s: float = 0.0,
) -> CapacityResult:
    """:func:`find_capacity` over any simulation: ``run`` summarises the workload retimed to a rate.

    The bracket grows (or shrinks) from ``start_rate`` by ``growth`` per probe until it holds the
    capacity; a start known to lie near the answer brackets it in fewer probes with a small growth
    (after :data:`NEAR_PROBES` probes without a bracket, by :data:`DEFAULT_GROWTH` at least).
    """
    if not 0 < tolerance < 1:
        raise ValueError("--tolerance must be in (0, 1)")
    if not growth > 1:
        raise ValueError("growth must be above 1")
    if not workload.requests:
        raise ValueError("the workload has no requests")
    wall_start = time.perf_counter()
    probes: list[Probe] = []
    summaries: dict[float, Summary] = {}

    def met(rate: float) -> bool:
        summary = run(retime(workload, rate, seed, min_duration_s))
        summaries[rate] = summary
        probes.append(
            Probe(rate, summary.slo_met, summary.itl_at_slo_quantile_ms, summary.ttft_at_slo_quantile_ms)
        )
        return summary.slo_met

    def step() -> float:
        return growth if len(probes) < NEAR_PROBES else max(growth, DEFAULT_GROWTH)

    rate = max(MIN_RATE, start_rate)
    if met(rate):
        lower, upper = rate, rate * growth
        while met(upper):
            lower, upper = upper, upper * step()
            if upper > MAX_RATE:
                raise ValueError(
                    f"the SLOs are met even at {lower:g} req/s; the workload is too light to bound"
                )
    else:
        lower, upper = rate / growth, rate
        while not met(lower):
            lower, upper = lower / step(), lower
            if lower < MIN_RATE:
                return CapacityResult(
                    0.0, 0.0, upper, tolerance, len(workload.requests), False, tuple(probes),
                    summaries[upper], time.perf_counter() - wall_start,
                )  # fmt: skip
    while (upper - lower) > tolerance * lower:
        middle = (lower + upper) / 2
        if met(middle):
            lower = middle
        else:
            upper = middle
    return CapacityResult(
        lower, lower, upper, tolerance, len(workload.requests), True, tuple(probes),
        summaries[lower], time.perf_counter() - wall_start,
    )  # fmt: skip
