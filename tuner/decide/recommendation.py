"""Decide what the service says of the disaggregation recommendation (pure).

:func:`infeasible_note` is the sentence the ``SLOInfeasible`` condition carries, :func:`record` writes
``status.recommendation`` and the ``TopologyRecommendation`` Event when a recommendation was computed
this step (:mod:`chunkpilot.tuner.observe.recommendation` says when; the job is
:mod:`chunkpilot.tuner.topology.recommend`). A service that already runs disaggregated is not tuned
with colocated canaries: :func:`disaggregated_note` says so.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Final

from chunkpilot.operator.events import EventType
from chunkpilot.tuner.decide.plan import Plan
from chunkpilot.tuner.topology.layouts import (
    Layout,
    SLOText,
    recommendation_message,
)
from chunkpilot.tuner.topology.recommend import RecommendationResult

from chunkpilot.api import PoolRole, TopologyRecommendation

if TYPE_CHECKING:
    pass

EVENT_REASON: Final = "TopologyRecommendation"


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
    promoted = plan.snap.status.best_topology_trial
    back = ""
    if not plan.snap.runs_promoted_pools() or promoted is None:
        kept = "their declared knobs"
    else:
        kept = f"the knobs topology trial {promoted} promoted"
        if spec.scaling.acts and spec.autotune.allow_topology_change:
            back = "; the planner's proposal of colocated replicas is tried as a colocated topology trial"
    return (
        f"the service runs prefill/decode disaggregated ({shape} replicas): the tuner runs no colocated "
        "canaries of its knobs against it, and tuning the pools' knobs or the split online is not "
        f"implemented; the pools keep {kept}{back}"
    )
