"""Observe when the twin should evaluate disaggregated topologies, and build that job.

:func:`recommend_due`: the service is ``SLOInfeasible``, no trial is active, and the status holds no
recommendation of the current twin fit; :func:`request` builds the picklable job that
:func:`chunkpilot.tuner.topology.recommend.recommend` runs in the twin's worker process
(CPU-bounded like the ranking).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from chunkpilot.engine.sim.offline import SLO
from chunkpilot.operator.status import get_condition
from chunkpilot.tuner import records as rec
from chunkpilot.tuner.observe.snapshot import Snapshot
from chunkpilot.tuner.space import TunedConfig
from chunkpilot.tuner.topology.recommend import RecommendRequest
from chunkpilot.tuner.twin import online
from chunkpilot.tuner.twin.online import Calibration

from chunkpilot.api import ConditionStatus, ConditionType

#: The recommendation runs once per twin fit of an infeasible service: it may spend this many times
#: the ranking's CPU budget (``CHUNKPILOT_TWIN_CPU_SECONDS``).
CPU_BUDGET_FACTOR: Final = 2.0


def is_disaggregated(snap: Snapshot) -> bool:
    """The service declares a disaggregated topology."""
    return snap.isvc.spec.disaggregated


def kv_transfer(snap: Snapshot) -> tuple[float, float]:
    """The KV transfer bandwidth (GB/s) and latency (ms): the spec's hint, else its defaults."""
    kv = snap.isvc.spec.kv_transfer
    return kv.bandwidth_gbps, kv.latency_ms


def recommend_due(snap: Snapshot, key: str) -> bool:
    """``SLOInfeasible`` is True, no trial is active and no recommendation of fit ``key`` for the
    service's replicas is recorded (``spec.replicas`` was edited since: its layout has other replicas)."""
    if snap.active() or is_disaggregated(snap):
        return False
    infeasible = get_condition(snap.status.conditions, ConditionType.SLO_INFEASIBLE)
    if infeasible is None or infeasible.status != ConditionStatus.TRUE:
        return False
    before = snap.status.recommendation
    if before is None or before.key != key:
        return True
    evaluated = (before.prefill_replicas or 0) + (before.decode_replicas or 0)
    return bool(evaluated) and evaluated != max(snap.isvc.spec.replicas, 2)  # one replica: 1 + 1


def request(
    snap: Snapshot,
    key: str,
    calibration: Calibration,
    slo: SLO,
    *,
    cpu_budget_s: float = online.DEFAULT_CPU_SECONDS,
) -> RecommendRequest:
    """The job for the worker: the twin, the SLO with its offsets off, the replicas, the pools' defaults.

    ``cpu_budget_s``: what one ranking may spend (the tuner's settings); the layout search gets
    :data:`CPU_BUDGET_FACTOR` times as much.
    """
    stable = rec.tuned_config(snap.incumbent)
    candidates: Sequence[TunedConfig] = ()
    if snap.status.twin is not None:
        candidates = [rec.tuned_config(c.config) for c in snap.status.twin.candidates[:3]]
    if calibration.ranked:
        candidates = [c.config for c in calibration.ranked[:3]]
    bandwidth, latency = kv_transfer(snap)
    return RecommendRequest(
        key=key,
        twin=calibration.twin,
        slo=online.offset_slo(slo, calibration.offset_ms),
        replicas=snap.isvc.spec.replicas,
        max_model_len=rec.service_facts(snap.isvc).max_model_len,
        decode_seqs=stable.max_num_seqs,
        decode_budget=stable.max_num_batched_tokens,
        kv_bandwidth_gbps=bandwidth,
        kv_latency_ms=latency,
        cpu_budget_s=CPU_BUDGET_FACTOR * cpu_budget_s,
        colocated=(stable, *candidates),
    )
