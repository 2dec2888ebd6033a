"""Decide the stable replicas (``spec.scaling.mode`` Advise or Auto): ``status.scaling``, Events.

The tuner is the one writer of the decision. In Advise it is published and nothing acts; in Auto
the operator runs it (:meth:`~chunkpilot.api.InferenceService.running_replicas`). The numbers are
the planner's (:mod:`chunkpilot.tuner.planner`) on the twin's capacity of the stable configuration
and the stable track's live load; a canary is judged at the load per replica it carries, so a change
of replicas during a trial does not bias its verdict.

A disaggregated service's pools are decided each on its own (``status.scaling.pools``): the
prefill pool on one prefill replica's capacity, the decode pool on one decode replica's, each less
the twin's error on that pool, both at the live request rate over the service
(:mod:`chunkpilot.tuner.topology.sizing`); a missed TTFT caps the prefill replica's capacity at its
load, a missed ITL the decode replica's. A decision is for one topology
(``status.scaling.topology``): when the service changes topology the planner starts afresh.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final, Literal

from chunkpilot.operator.events import EventType
from chunkpilot.tuner.decide.plan import Log, Plan, ScalingGauges
from chunkpilot.tuner.planner import (
    DEFAULT_ERROR,
    Capacity,
    decide_replicas,
    remember,
    replicas_for,
    settled,
    sizing_capacity,
    startup_seconds,
)
from chunkpilot.tuner.policy import SLOTargets, check_slo
from chunkpilot.tuner.topology.pools import ROLES
from chunkpilot.tuner.topology.sizing import PoolCapacities

from chunkpilot.api import (
    PoolScalingStatus,
    ScalingMode,
    ScalingProposal,
    ScalingRecommendation,
    ScalingStatus,
    TwinState,
)

__all__ = ["PROPOSE_AT", "RECORD_EVERY_S", "colocated_proposal", "plan_scaling", "split_proposal"]

#: The decision is recorded in the status (and as a recommendation the windows look back over) at
#: most this often while it does not change: a fleet's status writes stay few.
RECORD_EVERY_S: Final = 30.0


def _twin_capacity(plan: Plan) -> tuple[float, float | None] | None:
    """One replica's capacity at SLO of the stable config and the twin's error (None: not known):
    the ranking's, when the sustained one (:attr:`TwinReading.planning`) is not computed."""
    reading = plan.snap.twin
    calibration = reading.calibration
    if reading.ranked and calibration is not None and calibration.incumbent is not None:
        return calibration.incumbent.capacity_req_s, calibration.error
    twin = plan.snap.status.twin
    if twin is None or twin.state is not TwinState.FITTED or twin.capacity_req_s is None:
        return None
    return twin.capacity_req_s, twin.error


def _fit_key(plan: Plan) -> str | None:
    """The twin fit the planner sizes with (a learnt cap is kept while it stands)."""
    reading = plan.snap.twin
    if reading.calibration is not None:
        return reading.calibration.key
    if reading.key is not None:
        return reading.key
    twin = plan.snap.status.twin
    return None if twin is None or twin.config_hash is None else f"{twin.config_hash}-{twin.refit_trial or 0}"


def _previous(plan: Plan, *, disaggregated: bool) -> ScalingStatus:
    """The decision this step starts from: the recorded one, or none when it was computed for the
    other topology (its replicas, caps and history are another layout's). The engines' start-up time
    is kept: the same pods start either way."""
    before = plan.snap.status.scaling or ScalingStatus()
    topology = "disaggregated" if disaggregated else "colocated"
    if not before.decided_for(disaggregated):
        plan.do(
            Log(
                f"scaling: the recorded decision was for a {before.topology} service; planning the "
                f"{topology} one afresh"
            )
        )
        before = ScalingStatus(mode=before.mode, startup_seconds=before.startup_seconds)
    # A colocated decision has no pools (a status an earlier version wrote before a switch may hold some).
    return before.model_copy(update={"topology": topology, **({} if disaggregated else {"pools": []})})


def _startup(plan: Plan, before: ScalingStatus) -> float | None:
    """How long the service's engine pods take from scheduled to Ready: a canary's, and the stable
    ones the last change of replicas started (in Advise, which starts none, any), else as recorded."""
    snap = plan.snap
    since = before.last_scale_time if snap.isvc.spec.scaling.acts else None
    seen = [
        found
        for found in (startup_seconds(snap.canary_pods), startup_seconds(snap.stable_pods, since))
        if found is not None
    ]
    return round(max(seen), 1) if seen else before.startup_seconds


def plan_scaling(plan: Plan) -> None:
    """``status.scaling`` from this step's twin and stable measurement; an Event when the decision
    changes ("would scale 3 -> 5" in Advise)."""
    snap = plan.snap
    spec = snap.isvc.spec.scaling
    if not spec.plans:
        if snap.status.scaling is not None:
            plan.status["scaling"] = None
            plan.do(ScalingGauges(None, None))
        return
    if snap.isvc.spec.disaggregated:
        _plan_pools(plan, _previous(plan, disaggregated=True))
        return
    before = _previous(plan, disaggregated=False)
    current = snap.isvc.running_replicas() if spec.acts else snap.isvc.spec.replicas
    stable = snap.stable_reading.value
    per_replica = stable.per_replica(stable.request_rate) if stable is not None else None
    live = snap.service_rate()
    found = _twin_capacity(plan)
    if stable is None or per_replica is None or live is None or found is None or not found[0] > 0:
        waiting = "no live request rate yet" if live is None else "no capacity from the twin yet"
        if before.reason != f"waiting: {waiting}" or before.mode != spec.mode:
            plan.status["scaling"] = _status(before, spec.mode, reason=f"waiting: {waiting}")
        plan.do(ScalingGauges(before.desired_replicas, before.capacity_low_req_s))
        return
    startup = _startup(plan, before)
    check = check_slo(stable, snap.slo)
    met = check.met if settled(before.last_scale_time, snap.now, startup) else None
    planning = snap.twin.planning
    nominal, low = (
        (planning[0], planning[1]) if planning is not None and planning[0] > 0 else (found[0], None)
    )
    fit = _fit_key(plan)
    kept = before.capacity_cap_req_s if before.capacity_cap_fit == fit else None
    cap, capacity = sizing_capacity(
        nominal, found[1], low_req_s=low, cap_req_s=kept, per_replica_req_s=per_replica, met=met
    )
    decision = decide_replicas(
        spec, current, live, capacity, before.recommendations, snap.now, startup, stable.window_s
    )
    if spec.acts and before.mode != ScalingMode.AUTO:
        previous = snap.isvc.spec.replicas  # what ran until the planner acted (Off, Advise)
    else:
        previous = before.desired_replicas if before.desired_replicas is not None else current
    changed = decision.desired != previous
    plan.do(ScalingGauges(decision.desired, capacity.low))
    last = before.recommendations[-1].time if before.recommendations else None
    proposal = split_proposal(
        decision.planned_req_s, decision.needed, capacity.error, snap.twin.pool_capacities
    )
    _propose(plan, before.proposal, proposal)
    quiet = not changed and startup == before.startup_seconds and cap == kept and proposal == before.proposal
    if quiet and last is not None and (snap.now - last).total_seconds() < RECORD_EVERY_S:
        return  # the status is rewritten every RECORD_EVERY_S, or at once when the decision changes
    plan.status["scaling"] = _status(
        before,
        spec.mode,
        desired=decision.desired,
        reason=decision.reason,
        live=live,
        planned=decision.planned_req_s,
        capacity=capacity,
        predicted=snap.twin.forecast.get(decision.desired),
        startup=startup,
        now=snap.now if changed else None,
        history=remember(before.recommendations, snap.now, decision.needed, live),
        cap=(cap, fit),
        proposal=proposal,
    )
    if changed:
        verb = "would scale" if spec.mode == ScalingMode.ADVISE else "scaling"
        reason = (
            "ScalingAdvised"
            if spec.mode == ScalingMode.ADVISE
            else ("ScaledUp" if decision.desired > previous else "ScaledDown")
        )
        said = _predicted(snap.twin.forecast, snap.slo, previous, decision.desired) or decision.reason
        plan.emit(EventType.NORMAL, reason, f"{verb} {previous} -> {decision.desired}: {said}"[:1024])


#: The SLO quantile that caps each pool's capacity when it is missed (its share of the latency).
_POOL_SLO: Final = {"prefill": "ttft", "decode": "itl"}


def _plan_pools(plan: Plan, before: ScalingStatus) -> None:
    """``status.scaling`` of a disaggregated service: each pool's replicas at the live rate, on one
    replica's capacity of that pool; an Event when a pool's decision changes."""
    snap = plan.snap
    spec, isvc = snap.isvc.spec.scaling, snap.isvc
    pools = snap.pools_reading.value
    sizes = snap.twin.pool_capacities
    live = snap.pools_rate()  # a colocated topology trial's canary serves a share of it
    own = pools.decode.request_rate if pools is not None else None
    if pools is None or live is None or not live > 0 or sizes is None:
        waiting = (
            "no live request rate of the pools yet"
            if not live
            else "no capacity of the pools from the twin yet"
        )
        reason = f"waiting: {waiting}"
        if before.reason != reason or before.mode != spec.mode:
            plan.status["scaling"] = _status(before, spec.mode, reason=reason)
        plan.do(ScalingGauges(before.desired_replicas, None))
        return
    check = check_slo(pools.combined(), snap.slo)
    startup = _startup(plan, before)
    measured = {"prefill": pools.prefill.replicas, "decode": pools.decode.replicas}
    decided: list[PoolScalingStatus] = []
    moves: list[str] = []
    up, planned, needed = False, live, 0
    quiet = before.mode == spec.mode and bool(before.pools) and startup == before.startup_seconds
    for role in ROLES:
        old = before.pool(role) or PoolScalingStatus(role=role)
        current = isvc.running_pool_replicas(role) if spec.acts else isvc.spec.pool(role).replicas
        if spec.acts and before.mode != ScalingMode.AUTO:
            previous = isvc.spec.pool(role).replicas  # what ran until the planner acted (Off, Advise)
        else:
            previous = old.desired_replicas if old.desired_replicas is not None else current
        per_replica = (own or live) / max(1, measured[role] or current)
        relative = check.relative.get(_POOL_SLO[role])
        own_met = None if relative is None else relative <= 0
        met = own_met if settled(old.last_scale_time, snap.now, startup) else None
        kept = old.capacity_cap_req_s if old.capacity_cap_fit == sizes.key else None
        cap, capacity = sizing_capacity(
            sizes.per_replica(role),
            sizes.error(role),
            low_req_s=None,
            cap_req_s=kept,
            per_replica_req_s=per_replica,
            met=met,
        )
        decision = decide_replicas(
            spec, current, live, capacity, old.recommendations, snap.now, startup, pools.decode.window_s
        )
        planned = decision.planned_req_s  # the same rate for both pools: the service's
        needed += decision.needed
        if decision.desired != previous:
            moves.append(f"{role} {previous} -> {decision.desired}")
            up = up or decision.desired > previous
        last = old.recommendations[-1].time if old.recommendations else None
        recent = last is not None and (snap.now - last).total_seconds() < RECORD_EVERY_S
        quiet = quiet and decision.desired == previous and cap == kept and recent
        decided.append(
            PoolScalingStatus(
                role=role,
                desired_replicas=decision.desired,
                reason=f"{role}: {decision.reason}"[:1024],
                capacity_per_replica_req_s=round(capacity.req_s, 4),
                capacity_low_req_s=round(capacity.low, 4),
                capacity_cap_req_s=round(cap, 4) if cap is not None else None,
                capacity_cap_fit=sizes.key if cap is not None else None,
                last_scale_time=snap.now if decision.desired != previous else old.last_scale_time,
                recommendations=remember(old.recommendations, snap.now, decision.needed, live),
            )
        )
    total = sum(p.desired_replicas or 0 for p in decided)
    plan.do(ScalingGauges(total, None))
    proposal = colocated_proposal(planned, needed, DEFAULT_ERROR, sizes.colocated_req_s, spec.min_replicas)
    _propose(plan, before.proposal, proposal)
    if quiet and proposal == before.proposal:
        return  # rewritten every RECORD_EVERY_S, or at once when a pool's decision changes
    reason = "; ".join(p.reason for p in decided)
    status = before.model_copy(
        update={
            "mode": spec.mode,
            "desired_replicas": total,
            "reason": reason[:1024],
            "live_rate_req_s": round(live, 4),
            "planned_rate_req_s": round(planned, 4),
            "capacity_per_replica_req_s": None,
            "capacity_low_req_s": None,
            "capacity_high_req_s": None,
            "predicted_itl_ms": None,
            "predicted_ttft_ms": None,
            "last_scale_time": snap.now if moves else before.last_scale_time,
            "startup_seconds": startup,
            "pools": decided,
            "proposal": proposal,
        }
    )
    plan.status["scaling"] = status.as_patch()
    if moves:
        verb = "would scale" if spec.mode == ScalingMode.ADVISE else "scaling"
        event = "ScalingAdvised" if spec.mode == ScalingMode.ADVISE else ("ScaledUp" if up else "ScaledDown")
        said = f"{verb} {', '.join(moves)}: {sizes.describe()}; {reason}"
        plan.emit(EventType.NORMAL, event, said[:1024])


#: The other topology is proposed when it takes at most this share of the replicas the running one
#: takes at the rate planned for (and at least one fewer): well past the twin's error either way.
PROPOSE_AT: Final = 0.75


def _fewer(proposed: int, current: int) -> bool:
    return proposed <= current * PROPOSE_AT and proposed < current


def split_proposal(
    planned_req_s: float, needed: int, error: float, split: PoolCapacities | None
) -> ScalingProposal | None:
    """Prefill/decode pools, when the twin says they serve ``planned_req_s`` on far fewer replicas
    than the ``needed`` colocated ones (each pool's capacity less the same ``error``)."""
    if split is None:
        return None
    prefill = replicas_for(planned_req_s, Capacity(split.prefill_req_s, error))
    decode = replicas_for(planned_req_s, Capacity(split.decode_req_s, error))
    if prefill is None or decode is None or not _fewer(prefill + decode, needed):
        return None
    return ScalingProposal(
        topology="disaggregated",
        replicas=prefill + decode,
        prefill_replicas=prefill,
        decode_replicas=decode,
        current_replicas=needed,
        message=(
            f"prefill/decode pools would serve {planned_req_s:.3g} req/s on {prefill} + {decode} "
            f"replicas where colocated takes {needed}: {split.describe()}; to switch, declare "
            "spec.topology (mode disaggregated, both pools), or in scaling.mode Auto allow "
            "autotune.allowTopologyChange and it is tried as a topology trial"
        )[:1024],
    )


def colocated_proposal(
    planned_req_s: float, needed: int, error: float, colocated_req_s: float | None, least: int = 1
) -> ScalingProposal | None:
    """Colocated replicas (``least`` at least: ``scaling.minReplicas``), when the pools' twin says
    they serve ``planned_req_s`` on far fewer replicas than the ``needed`` of both pools together."""
    if colocated_req_s is None or not needed:
        return None
    replicas = replicas_for(planned_req_s, Capacity(colocated_req_s, error))
    replicas = max(replicas, least) if replicas is not None else None
    if replicas is None or not _fewer(replicas, needed):
        return None
    return ScalingProposal(
        topology="colocated",
        replicas=replicas,
        current_replicas=needed,
        message=(
            f"colocated replicas would serve {planned_req_s:.3g} req/s on {replicas} where the pools take "
            f"{needed}: one colocated replica sustains {colocated_req_s:.3g} req/s on the pools' twin; to "
            "switch, set spec.topology.mode: colocated (for a topology a trial promoted: "
            "autotune.allowTopologyChange false)"
        )[:1024],
    )


def _propose(plan: Plan, before: ScalingProposal | None, proposal: ScalingProposal | None) -> None:
    """An Event when a proposal appears or its replicas change (not at every step)."""
    if proposal is None:
        return
    if before is not None and (before.topology, before.replicas, before.current_replicas) == (
        proposal.topology,
        proposal.replicas,
        proposal.current_replicas,
    ):
        return
    plan.emit(EventType.NORMAL, "TopologyProposed", proposal.message)


def _predicted(
    forecast: Mapping[int, tuple[float, float]], slo: SLOTargets, before: int, after: int
) -> str | None:
    """``predicted ITL p99 71 ms and TTFT p95 420 ms at 3 replicas, 38 ms and 300 ms at 5``."""
    if before not in forecast or after not in forecast:
        return None
    (itl_b, ttft_b), (itl_a, ttft_a) = forecast[before], forecast[after]
    return (
        f"predicted ITL p{slo.itl_quantile * 100:g} {itl_b:.0f} ms and TTFT p{slo.ttft_quantile * 100:g} "
        f"{ttft_b:.0f} ms at {before} replicas, {itl_a:.0f} ms and {ttft_a:.0f} ms at {after} (targets "
        f"{slo.itl_ms:g} and {slo.ttft_ms:g} ms)"
    )


def _status(
    before: ScalingStatus,
    mode: ScalingMode,
    *,
    reason: str,
    desired: int | None = None,
    live: float | None = None,
    planned: float | None = None,
    capacity: Capacity | None = None,
    predicted: tuple[float, float] | None = None,
    startup: float | None = None,
    now: datetime | None = None,
    history: list[ScalingRecommendation] | None = None,
    cap: tuple[float | None, str | None] | None = None,
    proposal: ScalingProposal | Literal["kept"] | None = "kept",
) -> dict[str, Any]:
    learnt, fit = cap if cap is not None else (before.capacity_cap_req_s, before.capacity_cap_fit)
    status = before.model_copy(
        update={
            "capacity_cap_req_s": round(learnt, 4) if learnt is not None else None,
            "capacity_cap_fit": fit if learnt is not None else None,
            "mode": mode,
            "desired_replicas": desired if desired is not None else before.desired_replicas,
            "reason": reason[:1024],
            "live_rate_req_s": round(live, 4) if live is not None else before.live_rate_req_s,
            "planned_rate_req_s": round(planned, 4) if planned is not None else before.planned_rate_req_s,
            "capacity_per_replica_req_s": round(capacity.req_s, 4) if capacity else None,
            "capacity_low_req_s": round(capacity.low, 4) if capacity else None,
            "capacity_high_req_s": round(capacity.high, 4) if capacity else None,
            "last_scale_time": now or before.last_scale_time,
            "startup_seconds": round(startup, 1) if startup is not None else before.startup_seconds,
            "predicted_itl_ms": round(predicted[0], 1) if predicted else None,
            "predicted_ttft_ms": round(predicted[1], 1) if predicted else None,
            "recommendations": history if history is not None else before.recommendations,
            "proposal": before.proposal if proposal == "kept" else proposal,  # waiting: it stands
        }
    )
    return status.as_patch()
