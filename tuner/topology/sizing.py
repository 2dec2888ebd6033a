"""One replica's capacity of each pool of a running disaggregated service, for the planner (pure).

The planner sizes a disaggregated service's pools separately: the prefill pool's replicas from what
one prefill replica serves within the SLOs, the decode pool's from what one decode replica serves
(:mod:`chunkpilot.tuner.decide.scaling`). Both come from one twin of the running pools, fitted on
their own telemetry: the step model on the steps of both pools (they run on the same hardware),
then each pool's own where it ran enough steps (:func:`~chunkpilot.tuner.topology.pools.pool_twins`);
the request lengths the decode pool served, as it serves every request whole (the prefill pool
serves each with one output token). A pool's capacity per replica is the layout's capacity with that pool
at one replica and the other one ample (:func:`pool_capacities`): so the P:D ratio follows the
workload's mix of prompt and output lengths, as the twin models them. Given what the running
pools measured, the twin's error on each is read on that pool's own quantile (the prefill pool's
TTFT, the decode pool's ITL) at the rate they served, and the planner plans that pool with it.
Runs in the twin's worker.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Final

from chunkpilot.engine.sim.metrics import StepTotals
from chunkpilot.engine.sim.offline import SLO
from chunkpilot.engine.sim.scheduler import SchedulerConfig
from chunkpilot.tuner.space import TunedConfig
from chunkpilot.tuner.topology.layouts import Layout, LayoutEvaluator
from chunkpilot.tuner.topology.pools import (
    ROLES,
    PoolCheckRequest,
    PoolFit,
    pool_twins,
    pools_evaluator,
    pools_latencies,
)
from chunkpilot.tuner.topology.simulate import REQUESTS_PER_REPLICA, TOLERANCE
from chunkpilot.tuner.twin.capture import WorkloadWindow
from chunkpilot.tuner.twin.fit import MIN_STEPS
from chunkpilot.tuner.twin.online import build_twin, merge_steps, quantile_errors
from chunkpilot.tuner.twin.predict import Twin
from chunkpilot.tuner.twin.search import SUSTAINED_S, planning_capacity

__all__ = [
    "AMPLE",
    "MeasuredPools",
    "PoolCapacities",
    "PoolSizingRequest",
    "layout_capacities",
    "pool_capacities",
    "single_pool_capacities",
]

#: The other pool's replicas when one pool's capacity is read at one replica, to begin with; more
#: when the other pool may have bound it (up to :data:`MAX_AMPLE`).
AMPLE: Final = 2
MAX_AMPLE: Final = 8


@dataclass(frozen=True)
class MeasuredPools:
    """What the running pools showed over the window: the service's request rate, each pool's
    replicas, and at the SLO's quantiles the prefill pool's own TTFT and the decode pool's ITL (ms;
    None: no data). The twin's error on the pools is read against these."""

    rate_req_s: float
    prefill_replicas: int
    decode_replicas: int
    prefill_ttft_ms: float | None
    decode_itl_ms: float | None


@dataclass(frozen=True)
class PoolSizingRequest:
    """Everything one sizing needs (picklable): the running pools' steps per role and layout, the
    decode pool's captured workload, the service's model and SLO (``key``: the fit it is for)."""

    key: str
    model: str
    accelerator: str
    tensor_parallel_size: int
    max_model_len: int
    gpu_memory_utilization: float
    steps_by_role: Mapping[str, Mapping[str, StepTotals]]
    workload: WorkloadWindow
    layout: Layout
    slo: SLO
    kv_bandwidth_gbps: float
    kv_latency_ms: float
    engine: SchedulerConfig | None = None
    #: The service's colocated configuration, whose sustained capacity per replica on the same twin
    #: is read too (None: not read): what running colocated would take instead.
    colocated: TunedConfig | None = None
    seed: int = 0
    directory: str | None = None
    requests_per_replica: int = REQUESTS_PER_REPLICA
    tolerance: float = TOLERANCE
    min_steps: int = MIN_STEPS
    #: Each capacity probe's arrivals span at least this long, as the colocated planner's do: the
    #: rate the pools sustain, not the rate at which they absorb a burst of a few hundred requests.
    sustained_s: float = SUSTAINED_S
    #: What the running pools measured (None: the twin's error on them is not read).
    measured: MeasuredPools | None = None

    @property
    def steps(self) -> dict[str, StepTotals]:
        """Both pools' steps together: the hardware's, which the joint step model is fitted on."""
        return merge_steps(*self.steps_by_role.values())


@dataclass(frozen=True)
class PoolCapacities:
    """One replica's capacity at SLO of each pool (req/s of the whole service's requests; 0: no
    rate meets the SLOs), and the fits they rest on."""

    key: str
    prefill_req_s: float
    decode_req_s: float
    pools: tuple[PoolFit, ...]
    #: Layouts simulated to read them, and the CPU seconds that took.
    evaluations: int = 0
    cpu_seconds: float = 0.0
    #: What one colocated replica would sustain on the same twin (None: not read).
    colocated_req_s: float | None = None
    #: The twin's relative error on each running pool's own quantile at the measured rate: the
    #: prefill pool's TTFT, the decode pool's ITL (None: not measured).
    prefill_error: float | None = None
    decode_error: float | None = None

    def per_replica(self, role: str) -> float:
        """The capacity of one replica of the pool of ``role``."""
        return self.prefill_req_s if role == "prefill" else self.decode_req_s

    def error(self, role: str) -> float | None:
        """The twin's error on the pool of ``role`` (None: not measured)."""
        return self.prefill_error if role == "prefill" else self.decode_error

    def describe(self) -> str:
        """``one prefill replica serves 6.1 req/s, one decode replica 2.3 (prefill: ...; decode: ...)``."""
        said = (
            f"one prefill replica serves {self.prefill_req_s:.3g} req/s, one decode replica "
            f"{self.decode_req_s:.3g}"
        )
        fits = "; ".join(p.describe() for p in self.pools)
        said = f"{said} ({fits})" if fits else f"{said} (on the service's twin)"
        errors = [
            f"{what} {error:.0%}"
            for what, error in (("prefill TTFT", self.prefill_error), ("decode ITL", self.decode_error))
            if error is not None
        ]
        return f"{said}; the twin's error on the running pools: {', '.join(errors)}" if errors else said


def single_pool_capacities(
    evaluate: LayoutEvaluator, layout: Layout, tolerance: float = TOLERANCE
) -> tuple[tuple[float, float], int]:
    """What one replica of each pool of ``layout``'s knobs serves with the other pool ample, and the
    layouts evaluated to find it.

    Each pool is read at one replica beside :data:`AMPLE` of the other; where the reading comes
    within ``tolerance`` of what those replicas of the other pool serve, the other pool may have
    bound it, and it is read again beside enough of them (at most :data:`MAX_AMPLE`).
    """
    ample = {role: AMPLE for role in ROLES}
    evaluations = 0

    def read(role: str) -> float:
        nonlocal evaluations
        prefill = 1 if role == "prefill" else ample[role]
        decode = 1 if role == "decode" else ample[role]
        evaluations += 1
        return evaluate(
            Layout(replace(layout.prefill, replicas=prefill), replace(layout.decode, replicas=decode))
        ).capacity_req_s

    found = {role: read(role) for role in ROLES}
    for _ in range(3):
        again = False
        for role, other in (("prefill", "decode"), ("decode", "prefill")):
            beside = ample[role] * found[other]
            if found[role] <= 0 or found[other] <= 0 or ample[role] >= MAX_AMPLE:
                continue
            if found[role] >= beside * (1.0 - tolerance):
                ample[role] = min(MAX_AMPLE, math.ceil(1.5 * found[role] / found[other]) + 1)
                found[role] = read(role)
                again = True
        if not again:
            break
    return (found["prefill"], found["decode"]), evaluations


def pool_capacities(request: PoolSizingRequest) -> PoolCapacities:
    """Fit the running pools' twin and read one replica's capacity of each pool on it.

    Raises :class:`~chunkpilot.tuner.twin.fit.TwinFitError` (too few steps, or steps that cannot be
    fitted) or :class:`~chunkpilot.tuner.twin.capture.CaptureError` (a workload that cannot be
    synthesized).
    """
    started = time.process_time()
    twin = build_twin(request, min_steps=request.min_steps)
    twins, fits = pool_twins(twin, request.steps_by_role, request.min_steps, "stable")
    # Sized as the colocated planner sizes: on the larger sample (at a TTFT quantile a capacity
    # rests on the few longest prompts), the colocated capacity it is compared with on the same.
    planning = twin.for_planning()
    evaluate = pools_evaluator(planning, request, twins)
    (prefill, decode), evaluations = single_pool_capacities(evaluate, request.layout, request.tolerance)
    colocated = None
    if request.colocated is not None:
        colocated, _ = planning_capacity(
            planning, request.colocated, request.slo, 0.0, max_model_len=request.max_model_len
        )
    prefill_error, decode_error = _errors(twin, twins, request)
    return PoolCapacities(
        request.key,
        prefill,
        decode,
        fits,
        evaluations,
        time.process_time() - started,
        colocated,
        prefill_error,
        decode_error,
    )


def _errors(
    twin: Twin, twins: tuple[Twin, Twin], request: PoolSizingRequest
) -> tuple[float | None, float | None]:
    """The twin's relative error on the running pools' own quantiles at their measured rate: the
    prefill pool's TTFT, the decode pool's ITL (None where nothing compares)."""
    measured = request.measured
    if measured is None or not measured.rate_req_s > 0:
        return None, None
    if measured.prefill_replicas < 1 or measured.decode_replicas < 1:
        return None, None  # the pods were not counted: no layout to simulate
    running = Layout(
        replace(request.layout.prefill, replicas=measured.prefill_replicas),
        replace(request.layout.decode, replicas=measured.decode_replicas),
    )
    at = pools_latencies(twin, request, twins, running, measured.rate_req_s)
    itl, ttft = quantile_errors(
        (at.itl_ms, at.prefill_ttft_ms), (measured.decode_itl_ms, measured.prefill_ttft_ms)
    )
    return (None if math.isnan(ttft) else ttft), (None if math.isnan(itl) else itl)


def layout_capacities(request: PoolCheckRequest) -> PoolCapacities:
    """Each pool's capacity per replica of ``request.layout`` on ``request.twin`` (its one step
    model in both pools, where ``steps_by_role`` has too few steps of a pool's own): what splitting
    a colocated service into prefill and decode pools would take."""
    started = time.process_time()
    twins, _ = pool_twins(request.twin, request.steps_by_role, request.min_steps, request.key)
    evaluate = pools_evaluator(request.twin, request, twins)
    (prefill, decode), evaluations = single_pool_capacities(evaluate, request.layout, request.tolerance)
    return PoolCapacities(request.key, prefill, decode, (), evaluations, time.process_time() - started)
