"""Evaluate a disaggregated layout with the simulator (:mod:`chunkpilot.engine.sim.disagg`).

Both pools run the same engine (the twin's fitted step profile, or a truth profile in the
benchmark), or each pool its own (:class:`PoolEngines`: a topology trial's pools, each fitted on its
own steps); the capacity search is the simulator's own, over the whole service, with the
workload's request lengths repeated so that every replica sees about ``requests_per_replica``
requests (a shorter horizon per replica reads more capacity, so colocated and disaggregated are
compared at the same horizon per replica).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Final

from chunkpilot.engine.sim.capacity import retime
from chunkpilot.engine.sim.disagg import (
    KVTransfer,
    PoolConfig,
    Topology,
    disaggregated_capacity,
    simulate_disaggregated,
)
from chunkpilot.engine.sim.engine import SimConfig
from chunkpilot.engine.sim.offline import SLO
from chunkpilot.engine.sim.scheduler import SchedulerConfig
from chunkpilot.engine.sim.workload import Workload
from chunkpilot.tuner.topology.layouts import Layout, LayoutCapacity, LayoutEvaluator, Pool
from chunkpilot.tuner.twin.predict import Twin

__all__ = [
    "COLOCATED_REQUESTS",
    "REQUESTS_PER_REPLICA",
    "TOLERANCE",
    "LayoutLatencies",
    "PoolEngines",
    "sim_evaluator",
    "tiled",
    "topology_of",
    "twin_evaluator",
    "twin_latencies",
]

#: Requests per replica of one disaggregated capacity probe in the tuner, and the bisection width
#: (about 5-10 CPU seconds per layout of four replicas of an 8B model).
REQUESTS_PER_REPLICA: Final = 200
TOLERANCE: Final = 0.05
#: The Poisson arrival sample every layout is searched on (the colocated reference uses it too).
LAYOUT_SEED: Final = 0
#: Requests of one colocated capacity probe the recommendation compares with: a colocated engine
#: near its capacity on a bimodal workload builds its queue slowly (long prompts behind long
#: prompts), so its capacity only settles after about 1000 requests (400 read 20-30 % more),
#: while a disaggregated layout's settles within 100-300 per replica (docs/disaggregation.md).
COLOCATED_REQUESTS: Final = 1000


def tiled(workload: Workload, count: int) -> Workload:
    """``count`` requests: the workload's own, repeated in order as often as needed."""
    requests = workload.requests
    if not requests:
        raise ValueError("the workload has no requests")
    if count <= len(requests):
        return replace(workload, requests=requests[:count])
    repeats = math.ceil(count / len(requests))
    return replace(workload, requests=(requests * repeats)[:count])


def _pool_engine(engine: SimConfig, pool: Pool) -> SimConfig:
    budget = max(pool.max_num_batched_tokens, pool.max_num_seqs)
    scheduler: SchedulerConfig = replace(
        engine.scheduler, max_num_batched_tokens=budget, max_num_seqs=pool.max_num_seqs
    )
    return replace(engine, scheduler=scheduler)


@dataclass(frozen=True)
class PoolEngines:
    """The engines a layout's pools run when they differ (each pool's own fitted step model)."""

    prefill: SimConfig
    decode: SimConfig


def topology_of(engine: SimConfig | PoolEngines, layout: Layout, kv: KVTransfer) -> Topology:
    """The simulator's topology of ``layout``, every replica running ``engine`` (or its pool's engine
    of ``engine``'s two) with its pool's knobs."""
    engines = engine if isinstance(engine, PoolEngines) else PoolEngines(engine, engine)
    return Topology(
        PoolConfig(_pool_engine(engines.prefill, layout.prefill), layout.prefill.replicas),
        PoolConfig(_pool_engine(engines.decode, layout.decode), layout.decode.replicas),
        kv,
    )


def sim_evaluator(
    engine: SimConfig | PoolEngines,
    workload: Workload,
    slo: SLO,
    kv: KVTransfer,
    *,
    requests_per_replica: int = REQUESTS_PER_REPLICA,
    tolerance: float = TOLERANCE,
    start_rate: float = 1.0,
    min_duration_s: float = 0.0,
) -> LayoutEvaluator:
    """Capacity at SLO of a layout (the whole service) with every replica running ``engine`` (or, with
    :class:`PoolEngines`, each pool its own); ``min_duration_s``: each probe's arrivals span at
    least that long (a sustained load: the requests repeat), else ``requests_per_replica`` a replica."""

    def evaluate(layout: Layout) -> LayoutCapacity:
        topology = topology_of(engine, layout, kv)
        lengths = tiled(workload, requests_per_replica * layout.replicas)
        result = disaggregated_capacity(
            topology,
            lengths,
            slo,
            tolerance=tolerance,
            start_rate=start_rate * layout.replicas,
            seed=LAYOUT_SEED,
            min_duration_s=min_duration_s,
        )
        at = result.at_capacity
        transfer = getattr(at, "transfer_ms", None)
        transfer_ms = float(transfer.p50) if transfer is not None else math.nan
        if not result.feasible or at is None:
            probe = min(result.probes, key=lambda p: p.rate_req_s, default=None)
            itl = probe.itl_ms if probe is not None else math.nan
            ttft = probe.ttft_ms if probe is not None else math.nan
            return LayoutCapacity(layout, 0.0, itl, ttft, transfer_ms)
        return LayoutCapacity(
            layout,
            result.capacity_req_s,
            at.itl_at_slo_quantile_ms,
            at.ttft_at_slo_quantile_ms,
            transfer_ms,
        )

    return evaluate


def _twin_engine(twin: Twin, max_model_len: int, pools: tuple[Twin, Twin] | None) -> SimConfig | PoolEngines:
    scheduler = SchedulerConfig(max_model_len=max_model_len)
    if pools is not None:
        return PoolEngines(pools[0].config(scheduler), pools[1].config(scheduler))
    return twin.config(scheduler)


@dataclass(frozen=True)
class LayoutLatencies:
    """What a layout shows at one rate, at the SLO's quantiles: the decode pool's ITL, the client's
    TTFT, and the prefill pool's own TTFT (arrival to its first token, as its engines report it)."""

    itl_ms: float
    ttft_ms: float
    prefill_ttft_ms: float


def twin_latencies(
    twin: Twin,
    layout: Layout,
    rate_req_s: float,
    slo: SLO,
    kv: KVTransfer,
    *,
    max_model_len: int = 8192,
    requests_per_replica: int = REQUESTS_PER_REPLICA,
    pools: tuple[Twin, Twin] | None = None,
    min_duration_s: float = 0.0,
) -> LayoutLatencies:
    """The twin's latencies of ``layout`` serving ``rate_req_s`` (Poisson, the captured workload's
    lengths; ``pools`` as in :func:`twin_evaluator`)."""
    topology = topology_of(_twin_engine(twin, max_model_len, pools), layout, kv)
    lengths = tiled(twin.workload, requests_per_replica * layout.replicas)
    summary = simulate_disaggregated(topology, retime(lengths, rate_req_s, LAYOUT_SEED, min_duration_s), slo)
    return LayoutLatencies(
        summary.itl_at_slo_quantile_ms,
        summary.ttft_at_slo_quantile_ms,
        summary.prefill_ttft_at_slo_quantile_ms,
    )


def twin_evaluator(
    twin: Twin,
    slo: SLO,
    bandwidth_gbps: float,
    latency_ms: float,
    *,
    max_model_len: int = 8192,
    requests_per_replica: int = REQUESTS_PER_REPLICA,
    tolerance: float = TOLERANCE,
    pools: tuple[Twin, Twin] | None = None,
    min_duration_s: float = 0.0,
) -> LayoutEvaluator:
    """The twin's capacity at SLO of a layout: its fitted engine and its captured workload.

    ``pools``: the prefill and decode pools' own twins (each fitted on its pool's steps), run
    instead of ``twin``'s engine on the same workload.
    """
    engine = _twin_engine(twin, max_model_len, pools)
    arrivals = [r.arrival_s for r in twin.workload.requests]
    span = arrivals[-1] - arrivals[0] if len(arrivals) > 1 else 0.0
    rate = (len(arrivals) - 1) / span if span > 0 else 1.0
    return sim_evaluator(
        engine,
        twin.workload,
        slo,
        KVTransfer(bandwidth_gbps, latency_ms),
        requests_per_replica=requests_per_replica,
        tolerance=tolerance,
        start_rate=rate,
        min_duration_s=min_duration_s,
    )
