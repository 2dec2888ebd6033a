"""The disaggregation recommendation in the tuning loop: when to compute it, the worker's job, the status.

* Observing (:mod:`chunkpilot.tuner.calibration`): :func:`recommend_due` says when the twin should
  evaluate disaggregated topologies (the service is ``SLOInfeasible``, no trial is active, and the
  status holds no recommendation of the current twin fit); :func:`request` builds the picklable job
  and :func:`recommend` runs it in the twin's worker process (CPU-bounded like the ranking).
* Deciding (:mod:`chunkpilot.tuner.decide`, pure): :func:`infeasible_note` is the sentence the
  ``SLOInfeasible`` condition carries, :func:`record` writes ``status.recommendation`` and the
  ``TopologyRecommendation`` Event when a recommendation was computed this step.
* A service that already runs disaggregated is not tuned with colocated canaries:
  :func:`disaggregated_note` says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Final

from chunkpilot.engine.sim.offline import SLO
from chunkpilot.engine.sim.profiles.loader import load_model
from chunkpilot.operator.events import EventType
from chunkpilot.operator.status import get_condition
from chunkpilot.tuner import records as rec
from chunkpilot.tuner.actions import Plan
from chunkpilot.tuner.space import TunedConfig
from chunkpilot.tuner.topology import (
    Layout,
    LayoutEvaluator,
    Recommendation,
    SLOText,
    kv_bytes_per_request,
    recommendation_message,
    search_topologies,
)
from chunkpilot.tuner.topology_sim import (
    COLOCATED_REQUESTS,
    LAYOUT_SEED,
    REQUESTS_PER_REPLICA,
    TOLERANCE,
    tiled,
    twin_evaluator,
)
from chunkpilot.tuner.twin import online
from chunkpilot.tuner.twin.online import Calibration
from chunkpilot.tuner.twin.predict import Twin
from chunkpilot.tuner.twin.search import evaluate_on_twin

from chunkpilot.api import ConditionStatus, ConditionType, PoolRole, TopologyMode, TopologyRecommendation

if TYPE_CHECKING:
    from chunkpilot.tuner.snapshot import Snapshot

__all__ = [
    "RecommendRequest",
    "RecommendationResult",
    "disaggregated_note",
    "infeasible_note",
    "kv_transfer",
    "recommend",
    "recommend_due",
    "record",
    "request",
]

EVENT_REASON: Final = "TopologyRecommendation"
#: The recommendation runs once per twin fit of an infeasible service: it may spend this many times
#: the ranking's CPU budget (``CHUNKPILOT_TWIN_CPU_SECONDS``).
CPU_BUDGET_FACTOR: Final = 2.0


@dataclass(frozen=True)
class RecommendRequest:
    """Everything one recommendation needs (picklable: it runs in the twin's worker process).

    ``slo``: the SLO the simulated steps must meet (the twin's offsets taken off);
    ``colocated_req_s``: one replica's best colocated capacity when known, else the best of the
    ``colocated`` configurations on the twin.
    """

    key: str
    twin: Twin
    slo: SLO
    replicas: int
    max_model_len: int
    decode_seqs: int
    decode_budget: int
    kv_bandwidth_gbps: float
    kv_latency_ms: float
    cpu_budget_s: float
    colocated_req_s: float | None = None
    colocated: tuple[TunedConfig, ...] = ()
    requests_per_replica: int = REQUESTS_PER_REPLICA
    colocated_requests: int = COLOCATED_REQUESTS
    tolerance: float = TOLERANCE


@dataclass(frozen=True)
class RecommendationResult:
    """A recommendation computed this step for twin fit ``key`` (or why there is none)."""

    key: str
    recommendation: Recommendation | None = None
    error: str | None = None


EvaluatorFactory = Callable[[RecommendRequest], LayoutEvaluator]


def _sim_evaluator(job: RecommendRequest) -> LayoutEvaluator:
    return twin_evaluator(
        job.twin,
        job.slo,
        job.kv_bandwidth_gbps,
        job.kv_latency_ms,
        max_model_len=job.max_model_len,
        requests_per_replica=job.requests_per_replica,
        tolerance=job.tolerance,
    )


def recommend(job: RecommendRequest, evaluator: EvaluatorFactory = _sim_evaluator) -> Recommendation:
    """Colocated capacity and the best disaggregated layouts of ``job.replicas`` on the twin."""
    per_replica = job.colocated_req_s
    if per_replica is None:  # over a horizon long enough for a colocated queue to settle
        # On the one arrival sample the layouts are searched on, so the two compare alike.
        colocated = tiled(job.twin.workload, job.colocated_requests)
        twin = replace(job.twin, workload=colocated, arrival_seeds=(LAYOUT_SEED,))
        found = [
            evaluate_on_twin(
                twin,
                config,
                job.slo,
                max_model_len=job.max_model_len,
                requests=job.colocated_requests,
                tolerance=job.tolerance,
            ).capacity_req_s
            for config in dict.fromkeys(job.colocated)
        ]
        per_replica = max(found, default=0.0)
    search = search_topologies(
        evaluator(job),
        job.replicas,
        decode_seqs=job.decode_seqs,
        decode_budget=job.decode_budget,
        cpu_budget_s=job.cpu_budget_s,
    )
    prompts = [r.prompt_tokens for r in job.twin.workload.requests]
    mean_prompt = sum(prompts) / len(prompts) if prompts else 0.0
    kv_bytes = kv_bytes_per_request(load_model(job.twin.fit.model).kv_bytes_per_token, mean_prompt)
    return Recommendation(
        replicas=job.replicas,
        colocated_req_s=per_replica * job.replicas,
        search=search,
        kv_bandwidth_gbps=job.kv_bandwidth_gbps,
        kv_latency_ms=job.kv_latency_ms,
        kv_mb_per_request=kv_bytes / 1e6,
    )


# --------------------------------------------------------------------------- observing


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


def request(snap: Snapshot, key: str, calibration: Calibration, slo: SLO) -> RecommendRequest:
    """The job for the worker: the twin, the SLO with its offsets off, the replicas, the pools' defaults."""
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
        cpu_budget_s=CPU_BUDGET_FACTOR * online.cpu_budget_s(),
        colocated=(stable, *candidates),
    )


# --------------------------------------------------------------------------- deciding


def slo_text(plan: Plan) -> SLOText:
    slo = plan.snap.slo
    return SLOText(slo.itl_quantile, slo.itl_ms, slo.ttft_quantile, slo.ttft_ms)


def _finite(value: float) -> float | None:
    return round(value, 3) if math.isfinite(value) else None


def status_of(result: RecommendationResult, plan: Plan) -> TopologyRecommendation:
    """``status.recommendation`` of a result computed this step."""
    now = plan.snap.now.replace(microsecond=0)
    found = result.recommendation
    if found is None:
        message = f"no disaggregation recommendation: {result.error or 'the twin could not evaluate it'}"
        return TopologyRecommendation(key=result.key, computed_at=now, message=message[:2048])
    best = found.best
    layout: Layout | None = best.layout if best is not None else None
    return TopologyRecommendation(
        key=result.key,
        computed_at=now,
        message=recommendation_message(found, slo_text(plan))[:2048],
        meets_slo=found.meets,
        prefill_replicas=layout.prefill.replicas if layout else None,
        decode_replicas=layout.decode.replicas if layout else None,
        prefill_max_num_batched_tokens=layout.prefill.max_num_batched_tokens if layout else None,
        decode_max_num_seqs=layout.decode.max_num_seqs if layout else None,
        capacity_req_s=_finite(best.capacity_req_s) if best is not None else None,
        colocated_capacity_req_s=_finite(found.colocated_req_s),
    )


def current(plan: Plan) -> TopologyRecommendation | None:
    """The recommendation computed this step, else the recorded one of the same twin fit."""
    result = plan.snap.twin.recommendation
    if result is not None:
        return status_of(result, plan)
    before = plan.snap.status.recommendation
    key = plan.snap.twin.key
    if before is not None and (key is None or before.key == key):
        return before
    return None


def infeasible_note(plan: Plan) -> str:
    """What the ``SLOInfeasible`` condition says about disaggregation (empty: nothing to say)."""
    found = current(plan)
    if found is not None:
        return found.message
    reading = plan.snap.twin
    if reading.calibration is not None:
        return "Evaluating prefill/decode disaggregation on the twin."
    return ""


def record(plan: Plan) -> None:
    """Write a recommendation computed this step to the status, with an Event."""
    result = plan.snap.twin.recommendation
    if result is None:
        return
    found = status_of(result, plan)
    plan.status["recommendation"] = found.to_k8s()
    kind = EventType.NORMAL if result.recommendation is not None else EventType.WARNING
    plan.emit(kind, EVENT_REASON, found.message)


def disaggregated_note(plan: Plan) -> str:
    """Why a disaggregated service runs no colocated canaries."""
    spec = plan.snap.isvc.spec
    shape = " + ".join(
        f"{spec.pool(role).replicas} {role.value}" for role in (PoolRole.PREFILL, PoolRole.DECODE)
    )
    declared = (plan.snap.body.get("spec") or {}).get("topology") or {}
    promoted = plan.snap.status.best_topology_trial
    if declared.get("mode") == TopologyMode.DISAGGREGATED.value or promoted is None:
        kept = "their declared knobs"
    else:
        kept = f"the knobs topology trial {promoted} promoted"
    return (
        f"the service runs prefill/decode disaggregated ({shape} replicas): the tuner runs no colocated "
        "canaries against it, and tuning the pools' knobs or the split online is not implemented; "
        f"the pools keep {kept}"
    )
