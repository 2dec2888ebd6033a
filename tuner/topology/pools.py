"""A topology trial's pools on their own step models: each pool's steps refit its twin.

The recommendation predicts a layout with the stable engine's step model in both pools. The pools
that run it may step otherwise: another node or a busier one, and batches the stable never ran on
their own (a decode pool's are all decode, a prefill pool's all prompt chunks). At the end of a
topology trial's window each pool's step telemetry fits that pool's own step model (the stable's
fit stands in for a pool that ran too few steps), and the layout's capacity is predicted again on
the two: the verdict judges the measurement against this prediction, not the recommendation's.
Pure; it runs in the twin's worker process.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Protocol

from chunkpilot.engine.sim.disagg import KVTransfer
from chunkpilot.engine.sim.metrics import StepTotals
from chunkpilot.engine.sim.offline import SLO
from chunkpilot.tuner.topology.layouts import Layout, LayoutEvaluator
from chunkpilot.tuner.topology.simulate import (
    REQUESTS_PER_REPLICA,
    TOLERANCE,
    LayoutLatencies,
    twin_evaluator,
    twin_latencies,
)
from chunkpilot.tuner.twin.fit import MIN_STEPS, TwinFit, fit_steps, time_ratio
from chunkpilot.tuner.twin.predict import Twin

__all__ = [
    "ROLES",
    "PoolCheck",
    "PoolCheckRequest",
    "PoolFit",
    "PoolsJob",
    "check_pools",
    "pool_twins",
    "pools_evaluator",
    "pools_latencies",
]

#: The pools of a disaggregated layout, in the order :class:`PoolCheck` reports them.
ROLES: Final = ("prefill", "decode")


@dataclass(frozen=True)
class PoolCheckRequest:
    """Everything one check needs (picklable): the stable's twin, the layout, each pool's steps.

    ``key``: the trial it is for; ``slo``: the SLO the simulated steps must meet (the twin's offsets
    taken off, as the recommendation's); ``steps_by_role``: each role's step telemetry over the window.
    """

    key: str
    twin: Twin
    layout: Layout
    steps_by_role: Mapping[str, Mapping[str, StepTotals]]
    slo: SLO
    kv_bandwidth_gbps: float
    kv_latency_ms: float
    max_model_len: int
    requests_per_replica: int = REQUESTS_PER_REPLICA
    tolerance: float = TOLERANCE
    min_steps: int = MIN_STEPS
    #: Each probe's arrivals span at least this long (0: ``requests_per_replica`` a replica, as the
    #: recommendation it is compared with was searched).
    sustained_s: float = 0.0


@dataclass(frozen=True)
class PoolFit:
    """One pool's step model: fitted on its own steps (``own``), or the stable's (too few of them)."""

    role: str
    steps: float
    own: bool
    #: The pool's measured step time over what the stable's fit predicts for the same batches.
    stable_ratio: float
    rms_relative_error: float

    def describe(self) -> str:
        ratio = f"{self.stable_ratio:.2f}x" if math.isfinite(self.stable_ratio) else "an unknown multiple of"
        if not self.own:
            return (
                f"{self.role}: {self.steps:,.0f} steps, fewer than {MIN_STEPS} needed, on the stable's model"
            )
        return (
            f"{self.role}: {self.steps:,.0f} steps at {ratio} the stable's model, refitted to "
            f"{self.rms_relative_error:.1%}"
        )


@dataclass(frozen=True)
class PoolCheck:
    """The layout's capacity at SLO (whole service, req/s) predicted on its pools' own step models."""

    key: str
    capacity_req_s: float
    itl_ms: float
    ttft_ms: float
    pools: tuple[PoolFit, ...]
    cpu_seconds: float = 0.0

    def describe(self) -> str:
        """``refitted on each pool's own steps (prefill: ...; decode: ...)``."""
        return "refitted on each pool's own steps (" + "; ".join(p.describe() for p in self.pools) + ")"


def _pool_fit(
    stable: TwinFit, role: str, steps: Mapping[str, StepTotals], min_steps: int
) -> tuple[TwinFit, PoolFit]:
    count = sum(t.steps for t in steps.values())
    ratio = time_ratio(stable, steps)
    if count < min_steps:
        return stable, PoolFit(role, count, False, ratio, stable.rms_relative_error)
    fit = fit_steps(steps, stable.model, stable.accelerator, stable.tensor_parallel_size, min_steps=min_steps)
    return fit, PoolFit(role, count, True, ratio, fit.rms_relative_error)


def pool_twins(
    twin: Twin, steps: Mapping[str, Mapping[str, StepTotals]], min_steps: int, name: str
) -> tuple[tuple[Twin, Twin], tuple[PoolFit, ...]]:
    """The prefill and decode pools' twins, each fitted on its own ``steps`` (``twin`` itself for a
    pool with fewer than ``min_steps``), on ``twin``'s workload; their profiles under
    ``pool-<name>-<role>`` beside ``twin``'s. Raises :class:`TwinFitError` when a pool's steps
    cannot be fitted."""
    fits: list[PoolFit] = []
    twins: list[Twin] = []
    for role in ROLES:
        fit, pool = _pool_fit(twin.fit, role, steps.get(role, {}), min_steps)
        fits.append(pool)
        directory = twin.profile_path.parent / f"pool-{name}-{role}"
        twins.append(
            twin
            if not pool.own
            else Twin.build(
                fit,
                twin.workload,
                directory,
                gpu_memory_utilization=twin.gpu_memory_utilization,
                engine=twin.engine,
            )
        )
    return (twins[0], twins[1]), tuple(fits)


class PoolsJob(Protocol):
    """What a layout is evaluated with on its pools' own models: each role's steps, the SLO (the
    twin's offsets taken off), the KV hop and the capacity search's sizes."""

    @property
    def steps_by_role(self) -> Mapping[str, Mapping[str, StepTotals]]: ...
    @property
    def slo(self) -> SLO: ...
    @property
    def kv_bandwidth_gbps(self) -> float: ...
    @property
    def kv_latency_ms(self) -> float: ...
    @property
    def max_model_len(self) -> int: ...
    @property
    def requests_per_replica(self) -> int: ...
    @property
    def tolerance(self) -> float: ...
    @property
    def min_steps(self) -> int: ...
    @property
    def sustained_s(self) -> float: ...


def pools_evaluator(twin: Twin, job: PoolsJob, pools: tuple[Twin, Twin]) -> LayoutEvaluator:
    """Layouts evaluated with each pool on its own twin (:func:`pool_twins`) and ``twin``'s workload."""
    return twin_evaluator(
        twin,
        job.slo,
        job.kv_bandwidth_gbps,
        job.kv_latency_ms,
        max_model_len=job.max_model_len,
        requests_per_replica=job.requests_per_replica,
        tolerance=job.tolerance,
        pools=pools,
        min_duration_s=job.sustained_s,
    )


def pools_latencies(
    twin: Twin, job: PoolsJob, pools: tuple[Twin, Twin], layout: Layout, rate_req_s: float
) -> LayoutLatencies:
    """``layout``'s latencies at ``rate_req_s`` with each pool on its own twin, as
    :func:`pools_evaluator` reads its capacity."""
    return twin_latencies(
        twin,
        layout,
        rate_req_s,
        job.slo,
        KVTransfer(job.kv_bandwidth_gbps, job.kv_latency_ms),
        max_model_len=job.max_model_len,
        requests_per_replica=job.requests_per_replica,
        pools=pools,
        min_duration_s=job.sustained_s,
    )


def check_pools(request: PoolCheckRequest) -> PoolCheck:
    """Fit each pool on its own steps and predict the layout's capacity on the two fits.

    Raises :class:`~chunkpilot.tuner.twin.fit.TwinFitError` when a pool's steps cannot be fitted.
    """
    started = time.process_time()
    twin = request.twin
    twins, fits = pool_twins(twin, request.steps_by_role, request.min_steps, request.key)
    found = pools_evaluator(twin, request, twins)(request.layout)
    return PoolCheck(
        request.key,
        found.capacity_req_s,
        found.itl_ms,
        found.ttft_ms,
        fits,
        time.process_time() - started,
    )
