"""Topology trials: the recommended prefill/decode topology tried as a canary topology, then kept or not.

With ``spec.autotune.allowTopologyChange``, once colocated tuning is ``SLOInfeasible`` and the
twin's recommendation (``status.recommendation``) meets both SLOs, the tuner tries that topology
at the live load, once per tuning round. In ``scaling.mode: Auto``, once tuning stopped otherwise,
the planner's proposal of prefill/decode pools (``status.scaling.proposal``: they would serve the
rate on far fewer replicas) is tried the same way (:func:`proposal_gate`); promoted, its pools are
sized by the planner from then on, whatever the colocated replicas were:

.. code-block:: text

    gate        -- a recommendation of the current twin fit, predicted to serve the live rate and to
                   beat colocated (both by the promotion margin), on spec.replicas replicas, and a
                   spec that can run it --> a topology trial
                -- otherwise: TopologyChange=False saying which failed (e.g. it needs 2 GPUs, has 1)
    Pending     -- canary pools applied -->  RollingOut
    RollingOut  -- both pools Ready --> the canary router applied; it Ready too -->  Measuring (warm-up
                   first); timeout, progress deadline (also while Prometheus is down) or crash -->  Failed
    Measuring   -- a breach by the abort factor before the window ends -->  RolledBack (Discarded)
                -- window over: meets both SLOs at the stable's load per replica, as the twin
                   predicted -->  Promoted (status.bestTopology)
                -- misses one, a lighter load, or a twin the measurement contradicts -->  RolledBack
                -- too few samples -->  the window widens up to its deadline, then Failed (Aborted)
                -- Prometheus silent -->  a metrics gap, as for a colocated trial
    any phase   -- allowTopologyChange off, or spec.replicas (outside Auto), engine or model
                   changed -->  Failed

The other way, in ``scaling.mode: Auto`` a service that runs pools a topology trial promoted tries
the planner's proposal of colocated replicas (:func:`colocated_gate`): colocated canary engines of
the config it ran before, behind a canary router in its regular mode, judged on their own quantiles
at the load each proposed replica would carry (:func:`advance_colocated`); promoted, the pools give
way (:func:`promote_colocated`).

The canary router's pods carry the service label, so the service's Service sends them a share of
the live traffic beside the stable pods. The topology is judged as its clients see it
(:meth:`~chunkpilot.tuner.measure.TopologyWindow.combined`): the decode pool's ITL, and the
prefill pool's TTFT plus the decode pool's (:mod:`~chunkpilot.tuner.decide.topology_verdict`). Every verdict
deletes every canary object, the router first and the pools once it is gone (the colocated stable
Deployment serves throughout); a promotion writes ``status.bestTopology``, which
the operator renders as pools and router in place of the colocated Deployment. Pure: a snapshot
in, a plan filled.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar

from chunkpilot.operator.builders import (
    RenderError,
    as_declared,
    build_canary_colocated,
    build_canary_topology,
    runs_at_its_replicas,
    topology_replicas,
    with_topology,
)
from chunkpilot.operator.events import EventType
from chunkpilot.operator.objects import adopt
from chunkpilot.operator.status import POOL_PARTS, DeploymentState, TopologyPart, get_condition
from chunkpilot.tuner import records as rec
from chunkpilot.tuner.decide import lifecycle
from chunkpilot.tuner.decide.canary import delete_canary, remove_orphan
from chunkpilot.tuner.decide.lifecycle import TunerSettings
from chunkpilot.tuner.decide.plan import (
    ApplyCanary,
    CreateTrial,
    CurrentTrialGauge,
    DeleteCanaryTopology,
    Log,
    PatchTrial,
    Plan,
)
from chunkpilot.tuner.decide.recommendation import current as current_recommendation
from chunkpilot.tuner.decide.topology_verdict import Load, Prediction, judge, judge_colocated, twin_check
from chunkpilot.tuner.measure import TopologyWindow, TrackMeasurement, WindowMeasurement
from chunkpilot.tuner.observe.canary import canary_owner, is_terminating
from chunkpilot.tuner.policy import PROMOTE_MARGIN, Decision, judge_early
from chunkpilot.tuner.topology.layouts import decode_pool, starting_layout
from chunkpilot.tuner.topology.pools import PoolCheck
from chunkpilot.tuner.twin.online import TOLERANCE

from chunkpilot.api import (
    LABEL_ROLE,
    ConditionStatus,
    ConditionType,
    EngineConfig,
    InferenceService,
    ObjectMeta,
    PoolRole,
    PoolScalingStatus,
    PoolSpec,
    ScalingProposal,
    ScalingRecommendation,
    ScalingStatus,
    TopologyMode,
    TopologyRecommendation,
    TopologySpec,
    Track,
    TrialPhase,
    TrialVerdict,
    TuningTrial,
    TuningTrialSpec,
    TuningTrialStatus,
    trial_labels,
    trial_name,
)

if TYPE_CHECKING:
    from chunkpilot.tuner.observe.snapshot import Reading, Snapshot

__all__ = [
    "Gate",
    "Load",
    "Prediction",
    "TopologyReason",
    "advance",
    "basis_documents",
    "complete_promotion",
    "consider",
    "gate",
    "judge",
    "layout",
    "note_not_running",
    "proposal_gate",
    "proposal_layout",
    "remove_orphans",
]

#: The canary topology's parts: its pools (rolled out first) and its router.
ROUTER: Final = TopologyPart.ROUTER
POOLS: Final = POOL_PARTS
#: Spec fields a topology trial's pools are rendered from, and their digests' annotation (:func:`basis`).
BASIS_FIELDS: Final = ("engine", "model", "resources")
ANNOTATION_BASIS: Final = f"{rec.GROUP_PREFIX}/topology-trial-"
#: On a topology trial that tries the planner's proposal (``status.scaling.proposal``).
ANNOTATION_PROPOSED: Final = f"{rec.GROUP_PREFIX}/proposed-by-planner"
#: Knobs a pool takes over from the stable config (the rest of ``PoolSpec`` is its replicas).
POOL_KNOBS: Final = tuple(name for name in PoolSpec.model_fields if name != "replicas")


class TopologyReason(StrEnum):
    """Reasons of the ``TopologyChange`` condition (and its Events)."""

    RUNNING = "TopologyTrialRunning"
    NEEDS_REPLICAS = "TopologyNeedsReplicas"
    STALE = "TopologyRecommendationStale"
    NO_LOAD = "TopologyNoLiveLoad"
    SHORT = "TopologyCapacityShort"
    DOES_NOT_PAY = "TopologyDoesNotPay"
    UNSUPPORTED = "TopologyUnsupported"
    PROMOTED = "TopologyPromoted"
    NOT_RUNNING = "TopologyPromotedNotRunning"
    ROLLED_BACK = "TopologyRolledBack"
    ABORTED = "TopologyTrialAborted"


VERDICT_REASONS: Final = {
    TrialVerdict.PROMOTED: (ConditionStatus.TRUE, TopologyReason.PROMOTED),
    TrialVerdict.DISCARDED: (ConditionStatus.FALSE, TopologyReason.ROLLED_BACK),
    TrialVerdict.ABORTED: (ConditionStatus.FALSE, TopologyReason.ABORTED),
}


# --------------------------------------------------------------------------- the gate


def _pool(stable: EngineConfig, replicas: int, budget: int, seqs: int) -> PoolSpec:
    """A pool running the stable config's knobs with its own budget and ``maxNumSeqs``."""
    knobs = {name: getattr(stable, name) for name in POOL_KNOBS if getattr(stable, name, None) is not None}
    knobs.update(max_num_batched_tokens=budget, max_num_seqs=seqs)
    if knobs.get("max_num_active_seqs") is not None:
        knobs["max_num_active_seqs"] = min(knobs["max_num_active_seqs"], seqs)
    return PoolSpec(replicas=replicas, **knobs)


def layout(found: TopologyRecommendation, stable: EngineConfig) -> TopologySpec | None:
    """The recommended topology as pools (None: it meets no SLO, or names no layout).

    As the twin evaluated it: the prefill pool runs the recommended budget and the stable
    ``maxNumSeqs``; the decode pool the recommended ``maxNumSeqs`` and the budget the twin's layout
    search gives it (:func:`~chunkpilot.tuner.topology.layouts.decode_pool`).
    """
    p, d = found.prefill_replicas, found.decode_replicas
    budget, seqs = found.prefill_max_num_batched_tokens, found.decode_max_num_seqs
    if not found.meets_slo or not p or not d or not budget or not seqs:
        return None
    return TopologySpec(
        mode=TopologyMode.DISAGGREGATED,
        prefill=_pool(stable, p, max(budget, stable.max_num_seqs), stable.max_num_seqs),
        decode=_pool(
            stable, d, decode_pool(d, seqs, stable.max_num_batched_tokens).max_num_batched_tokens, seqs
        ),
    )


@dataclass(frozen=True)
class Gate:
    """Roll ``topology`` out, or (``topology`` None) why not: a ``TopologyChange`` reason and message.
    ``proposed``: the planner's proposal it comes from ("": the twin's recommendation); ``replicas``:
    the colocated replicas a colocated topology trial is judged for."""

    topology: TopologySpec | None
    reason: TopologyReason | None = None
    message: str = ""
    proposed: str = ""
    replicas: int = 0


def gate(plan: Plan, round_: int, settings: TunerSettings | None = None) -> Gate | None:
    """Whether the service's recommendation is tried as a canary topology now; None: nothing to say.

    Nothing to say: the flag is off, the service is not ``SLOInfeasible``, no recommendation
    meets the SLOs, or the round already had its topology trial. Tried only: a recommendation of
    the twin's current fit (:func:`~chunkpilot.tuner.decide.recommendation.current`) whose predicted capacity
    serves the live request rate with the promotion margin and beats colocated by it (else the
    topology would not pay), and a layout of the service's own replicas (a one-replica service's
    1 + 1 needs two).
    """
    snap = plan.snap
    spec = snap.isvc.spec
    if not spec.autotune.allow_topology_change or spec.disaggregated:
        return None
    infeasible = get_condition(snap.status.conditions, ConditionType.SLO_INFEASIBLE)
    if infeasible is None or infeasible.status != ConditionStatus.TRUE or snap.status.recommendation is None:
        return None
    if any(t.spec.is_topology and rec.trial_round(t) == round_ for t in snap.trials):
        return None
    found = current_recommendation(plan)
    if found is None:
        return Gate(
            None,
            TopologyReason.STALE,
            "not trying the recorded recommendation: it was computed for an older twin fit "
            f"({snap.status.recommendation.key}, now {snap.twin.key}); waiting for the twin's new one",
        )
    topology = layout(found, snap.incumbent)
    if topology is None:
        return None
    described, need = rec.describe_topology(topology), topology_replicas(topology)
    tp = spec.engine.tensor_parallel_size
    # The twin evaluates the service's own replicas (1 + 1 for one): another count is an older spec's.
    if need != max(spec.replicas, 2):
        return Gate(
            None,
            TopologyReason.STALE,
            f"not trying the recorded {described}: it was evaluated for {need} replicas, the service has "
            f"{spec.replicas} (spec.replicas); waiting for the twin's recommendation for them",
        )
    short = pays(found, snap, described)
    if short is not None:
        return short
    if need != spec.replicas:
        return Gate(
            None,
            TopologyReason.NEEDS_REPLICAS,
            f"not trying the recommended {described} as a canary topology: it needs {need * tp} GPUs "
            f"({need} replicas), the service has {spec.replicas * tp} (spec.replicas {spec.replicas}); "
            f"a topology is tried only on the service's own replicas: raise spec.replicas to {need}",
        )
    return _runnable(snap, topology, f"the recommended {described}", settings) or Gate(topology)


def _runnable(
    snap: Snapshot, topology: TopologySpec, what: str, settings: TunerSettings | None
) -> Gate | None:
    """None when the installation and the spec can run ``topology``; else why not."""
    if settings is not None and not settings.disaggregation:
        return Gate(
            None,
            TopologyReason.UNSUPPORTED,
            f"not trying {what}: this installation runs no disaggregated topologies "
            "(set the chart value disaggregation.enabled=true)",
        )
    if with_topology(snap.isvc, topology) is None:
        return Gate(
            None,
            TopologyReason.UNSUPPORTED,
            f"not trying {what}: the spec cannot run a disaggregated topology "
            "(it needs engine.kind vllm 0.9.0 or later, or sim; autotune.liveAdjust false; no "
            "--kv-transfer-config in engine.extraArgs)",
        )
    return None


def proposal_layout(proposal: ScalingProposal, stable: EngineConfig) -> TopologySpec | None:
    """The planner's proposal of prefill/decode pools as a topology (None: it proposes colocated):
    its replicas, with the knobs the twin split the service with (the layout search's start,
    :func:`~chunkpilot.tuner.topology.layouts.starting_layout`)."""
    p, d = proposal.prefill_replicas, proposal.decode_replicas
    if proposal.topology != TopologyMode.DISAGGREGATED.value or not p or not d:
        return None
    start = starting_layout(p, d, stable.max_num_seqs, stable.max_num_batched_tokens)
    return TopologySpec(
        mode=TopologyMode.DISAGGREGATED,
        prefill=_pool(stable, p, start.prefill.max_num_batched_tokens, start.prefill.max_num_seqs),
        decode=_pool(stable, d, start.decode.max_num_batched_tokens, start.decode.max_num_seqs),
    )


def current_proposal(plan: Plan) -> ScalingProposal | None:
    """The planner's proposal as this step left it (``plan_scaling`` runs first), else as recorded."""
    if "scaling" in plan.status:
        written = plan.status["scaling"]
        found = written.get("proposal") if written is not None else None
        return ScalingProposal.model_validate(found) if found is not None else None
    scaling = plan.snap.status.scaling
    return scaling.proposal if scaling is not None else None


def proposal_gate(plan: Plan, round_: int, settings: TunerSettings | None = None) -> Gate | None:
    """Whether the planner's proposal of prefill/decode pools (``status.scaling.proposal``) is tried
    as a canary topology now; None: nothing to say.

    Tried in ``scaling.mode: Auto`` only, where the planner sizes the pools once the topology is
    promoted (so it may take fewer replicas than run colocated), with ``allowTopologyChange``, once
    a tuning round (the same round's recommended topology counts), on pools the spec can run.
    """
    snap = plan.snap
    spec = snap.isvc.spec
    if not spec.autotune.allow_topology_change or spec.disaggregated or not spec.scaling.acts:
        return None
    proposal = current_proposal(plan)
    topology = proposal_layout(proposal, snap.incumbent) if proposal is not None else None
    if proposal is None or topology is None:
        return None
    if any(t.spec.is_topology and rec.trial_round(t) == round_ for t in snap.trials):
        return None
    if snap.stable is None or not snap.stable.rollout_complete:
        return None  # tried beside a stable track that serves as it is
    what = f"the proposed {rec.describe_topology(topology)}"
    return _runnable(snap, topology, what, settings) or Gate(topology, proposed=proposal.message)


def pays(found: TopologyRecommendation, snap: Snapshot, described: str) -> Gate | None:
    """None when the predicted capacity serves the live rate and beats colocated, by the margin."""
    capacity, colocated = found.capacity_req_s, found.colocated_capacity_req_s
    stable = snap.stable_reading.value
    live = stable.offered_rate if stable is not None else None
    predicted = f"the twin predicts the recommended {described} meets both SLOs up to {capacity or 0:.3g}"
    predicted += " req/s"
    if live is None or not live > 0:
        return Gate(
            None, TopologyReason.NO_LOAD, f"not trying the recommended {described}: no live request rate yet"
        )
    if capacity is None or capacity < live * (1 + PROMOTE_MARGIN):
        return Gate(
            None,
            TopologyReason.SHORT,
            f"not trying it: {predicted}, short of the live {live:.3g} req/s with the "
            f"{PROMOTE_MARGIN:.0%} margin",
        )
    if colocated is not None and capacity < colocated * (1 + PROMOTE_MARGIN):
        return Gate(
            None,
            TopologyReason.DOES_NOT_PAY,
            f"not trying it: {predicted}, not {PROMOTE_MARGIN:.0%} above colocated's {colocated:.3g} "
            "req/s on the same GPUs: the topology does not pay",
        )
    return None


def consider(plan: Plan, round_: int, settings: TunerSettings, *, proposal: bool = False) -> None:
    """Once tuning stopped ``SLOInfeasible`` (``proposal``: stopped otherwise, with the planner's
    proposal of pools in ``Auto``): start the round's topology trial, or say why not."""
    report(plan, round_)
    found = (proposal_gate if proposal else gate)(plan, round_, settings)
    if found is None:
        return
    if found.topology is None:
        refuse(plan, found)
        return
    create(plan, found.topology, round_, found.proposed)


def refuse(plan: Plan, found: Gate) -> None:
    """``TopologyChange=False`` saying why ``found`` tries nothing (an Event when the reason is new)."""
    assert found.reason is not None
    before = plan.current_condition(ConditionType.TOPOLOGY_CHANGE)
    if before is None or before.reason != found.reason.value:
        plan.emit(EventType.WARNING, found.reason.value, found.message)
    plan.condition(ConditionType.TOPOLOGY_CHANGE, ConditionStatus.FALSE, found.reason.value, found.message)


def report(plan: Plan, round_: int) -> None:
    """``TopologyChange`` from the round's finished topology trial."""
    snap = plan.snap
    done = [
        t for t in snap.trials if t.spec.is_topology and rec.trial_round(t) == round_ and not rec.is_active(t)
    ]
    last = max(done, key=lambda t: t.spec.number, default=None)
    if last is None or last.status is None or last.status.verdict not in VERDICT_REASONS:
        return
    status, reason = VERDICT_REASONS[last.status.verdict]
    message = f"topology trial {last.spec.number} ({rec.trial_label(last)}): {last.status.reason or ''}"
    promoted = last.spec.topology if reason is TopologyReason.PROMOTED else None
    pools = promoted is not None and not last.spec.tries_colocated
    if pools and promoted is not None and not runs_at_its_replicas(snap.isvc, promoted):
        return  # not running: note_not_running says so
    plan.condition(ConditionType.TOPOLOGY_CHANGE, status, reason.value, message[:2048])


def note_not_running(plan: Plan) -> None:
    """``TopologyChange=False`` for a promoted topology the service does not run: it was measured on
    other replicas than ``spec.replicas`` (the service runs colocated on those)."""
    status, replicas = plan.snap.status, plan.snap.isvc.spec.replicas
    promoted = status.best_topology
    if promoted is None or runs_at_its_replicas(plan.snap.isvc, promoted):
        return
    need = topology_replicas(promoted)
    plan.condition(
        ConditionType.TOPOLOGY_CHANGE,
        ConditionStatus.FALSE,
        TopologyReason.NOT_RUNNING.value,
        f"the topology promoted by {status.best_topology_trial or 'a topology trial'} "
        f"({rec.describe_topology(promoted)}) has {need} replicas and spec.replicas is {replicas}: the "
        f"service runs colocated on spec.replicas; it runs the topology again at spec.replicas {need}",
    )


def complete_promotion(plan: Plan) -> bool:
    """The newest finished topology trial was promoted but ``status.bestTopology`` misses it (a restart
    between the verdict and the status write): write it, whatever stopped tuning (True: written; the
    step ends there, the next one sees a disaggregated service)."""
    snap = plan.snap
    done = [t for t in snap.trials if t.spec.is_topology and not rec.is_active(t)]
    last = max(done, key=lambda t: t.spec.number, default=None)
    if last is None or last.status is None or last.status.verdict is not TrialVerdict.PROMOTED:
        return False
    topology = last.spec.topology
    # A colocated topology trial's promotion clears bestTopology and names itself.
    promoted = None if last.spec.tries_colocated else topology
    recorded = snap.status.best_topology == promoted and snap.status.best_topology_trial == last.metadata.name
    if topology is None or recorded:
        return False
    (promote_colocated if last.spec.tries_colocated else promote)(
        plan, last, "completing a promotion interrupted by a restart"
    )
    return True


def new_trial(
    plan: Plan, topology: TopologySpec, round_: int, *, proposed: bool, replicas: int | None = None
) -> TuningTrial:
    """The service's next trial, of ``topology`` over the stable config, in ``round_`` (``proposed``:
    it tries the planner's proposal; ``replicas``: a colocated topology's)."""
    snap = plan.snap
    number = max((t.spec.number for t in snap.trials), default=0) + 1
    return TuningTrial(
        metadata=ObjectMeta(
            name=trial_name(snap.name, number),
            namespace=snap.namespace,
            labels={**trial_labels(snap.name, number), rec.LABEL_ROUND: str(round_)},
            annotations={**basis(snap.isvc), **({ANNOTATION_PROPOSED: "true"} if proposed else {})},
        ),
        spec=TuningTrialSpec(
            service_name=snap.name,
            number=number,
            params=plan.stable_config,
            baseline_config_hash=plan.stable_config.config_hash(),
            track=Track.CANARY,
            window=snap.isvc.spec.autotune.trial_window,
            topology=topology,
            replicas=replicas,
        ),
    )


def create(plan: Plan, topology: TopologySpec, round_: int, proposed: str = "") -> None:
    """The round's topology trial: the pools to try, over the stable config (``proposed``: the
    planner's proposal it tries, else the twin's recommendation)."""
    trial = new_trial(plan, topology, round_, proposed=bool(proposed))
    number = trial.spec.number
    described = rec.describe_topology(topology)
    what = f"the proposed {described}" if proposed else f"the recommended {described}"
    said = f"trying {what} as a canary topology (trial {number}); stable stays colocated"
    if proposed:
        said += f" (the planner: {proposed})"
    start(plan, trial, described, said)


def start(plan: Plan, trial: TuningTrial, label: str, said: str) -> None:
    """Create ``trial`` (Pending, labelled ``label``) as the current trial; ``TopologyChange=True``
    says ``said``."""
    number = trial.spec.number
    status = TuningTrialStatus(phase=TrialPhase.PENDING, params_summary=label)
    plan.do(CreateTrial(adopt(trial.to_manifest(), plan.snap.body), lifecycle.status_patch(status)))
    plan.status["currentTrial"] = trial.metadata.name
    plan.condition(
        ConditionType.TUNING, ConditionStatus.TRUE, "TrialRunning", f"topology trial {number}: {label}"
    )
    plan.condition(
        ConditionType.TOPOLOGY_CHANGE, ConditionStatus.TRUE, TopologyReason.RUNNING.value, said[:2048]
    )
    plan.do(CurrentTrialGauge(number), Log(f"topology trial {number} created: {label}"))


# --------------------------------------------------------------------------- the active topology trial


def remove_orphans(plan: Plan, current: TuningTrial | None) -> None:
    """Delete canary topology objects no active topology trial owns (left by a verdict, a crash or a
    restart): the router first, the pools once it is gone."""
    if current is not None and current.spec.is_topology:
        return
    parts = plan.snap.topology_canary
    if any(parts.values()):
        gone = parts.get(ROUTER) is None  # the router first
        what = "a canary topology" if gone else "the router of a canary topology"
        plan.do(DeleteCanaryTopology(pools=gone), Log(f"deleted {what} no active topology trial owns"))


def advance(plan: Plan, trial: TuningTrial, settings: TunerSettings) -> None:
    """The active topology trial's step: roll out (pools, then router), wait for Ready, measure, judge."""
    snap = plan.snap
    phase = rec.trial_phase(trial)
    number = trial.spec.number
    plan.status["currentTrial"] = trial.metadata.name
    label = rec.trial_label(trial)
    plan.condition(
        ConditionType.TUNING,
        ConditionStatus.TRUE,
        "TrialRunning",
        f"topology trial {number} {phase.value}: {label}",
    )
    plan.do(CurrentTrialGauge(number))
    if not snap.isvc.spec.autotune.allow_topology_change:
        abort(plan, trial, "autotune.allowTopologyChange was turned off")
        return
    changed = spec_changed(trial, snap.isvc)
    if changed is not None:
        abort(plan, trial, changed)
        return
    if phase is TrialPhase.PENDING or any(snap.topology_canary.get(part) is None for part in POOLS):
        roll_out(plan, trial)  # new, or lost (deleted by hand, or never applied before a restart)
        return
    crashed = lifecycle.crash_message(snap.topology_pods, settings.crash_restarts)
    if crashed is not None:
        abort(plan, trial, crashed)
        return
    if phase is TrialPhase.ROLLING_OUT or snap.topology_canary.get(ROUTER) is None:
        check_rollout(plan, trial, settings)  # Kubernetes' view: also while Prometheus is down
    elif snap.stable_reading.down:
        lifecycle.metrics_gap(plan, trial, None, settings)
    else:
        measure(plan, trial, settings)


def basis(isvc: InferenceService, *, defaults: bool = False) -> dict[str, str]:
    """Annotations of digests of what a topology trial's pools are rendered from besides its topology:
    :func:`basis_documents` (``defaults``: with the fields at their defaults, as releases before did)."""
    texts = {k: json.dumps(v, sort_keys=True) for k, v in basis_documents(isvc, defaults=defaults).items()}
    return {ANNOTATION_BASIS + name: hashlib.sha256(t.encode()).hexdigest()[:12] for name, t in texts.items()}


def basis_documents(isvc: InferenceService, *, defaults: bool = False) -> dict[str, Any]:
    """``spec.engine``, ``spec.model`` and ``spec.resources`` without the fields at their defaults: an
    upgrade whose CRD adds a defaulted field (the API server writes it in) is no edit mid-trial."""
    spec = isvc.spec.model_dump(mode="json", by_alias=True, exclude_none=True, exclude_defaults=not defaults)
    return {name: spec.get(name) for name in BASIS_FIELDS}


def spec_changed(trial: TuningTrial, isvc: InferenceService) -> str | None:
    """Why the spec the trial started on changed under it (replicas, engine, model, resources); None: not.
    The topology was chosen for those replicas and the twin's fit of that engine, model and GPU."""
    topology, replicas = trial.spec.topology, isvc.spec.replicas
    # In Auto the planner sizes a promoted topology's pools: the replicas may change under it.
    if (
        topology is not None
        and not isvc.spec.scaling.acts
        and (had := topology_replicas(topology)) != replicas
    ):
        return f"spec.replicas changed to {replicas} mid-trial: the topology was chosen for {had} replicas"
    now, before, recorded = basis(isvc), basis(isvc, defaults=True), trial.metadata.annotations
    for name in BASIS_FIELDS:
        key = ANNOTATION_BASIS + name
        if key in recorded and recorded[key] not in (now[key], before[key]):
            return f"spec.{name} changed mid-trial: the canary topology runs the {name} it started with"
    return None


def abort(plan: Plan, trial: TuningTrial, reason: str) -> None:
    lifecycle.abort(plan, trial, reason)
    plan.condition(
        ConditionType.TOPOLOGY_CHANGE,
        ConditionStatus.FALSE,
        TopologyReason.ABORTED.value,
        f"topology trial {trial.spec.number} ({rec.trial_label(trial)}): {reason}"[:2048],
    )


def _manifests(plan: Plan, trial: TuningTrial) -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
    """The canary pools' manifests and the canary router's (with its RBAC); None: the trial aborted."""
    assert trial.spec.topology is not None
    try:
        manifests = build_canary_topology(plan.snap.isvc, trial.spec.topology)
    except ValueError as error:
        abort(plan, trial, f"the engine refuses the topology: {error}")
        return None
    owned = [adopt(manifest, plan.snap.body) for manifest in manifests]
    pools = [m for m in owned if m["kind"] == "Deployment" and m["metadata"]["labels"].get(LABEL_ROLE)]
    return pools, [m for m in owned if m not in pools]


def roll_out(plan: Plan, trial: TuningTrial) -> None:
    """Apply the canary pools (again, if one went missing); the router follows once both are Ready."""
    found = _manifests(plan, trial)
    if found is None:
        return
    plan.do(*(ApplyCanary(manifest) for manifest in found[0]))
    rolling_out(plan, trial)
    if rec.trial_phase(trial) is TrialPhase.PENDING:
        plan.emit(
            EventType.NORMAL,
            "TopologyTrialStarted",
            f"trial {trial.spec.number}: canary topology {rec.trial_label(trial)} started; its canary router "
            "follows once both pools are Ready and takes a share of the traffic; the stable track stays "
            "colocated",
        )


def rolling_out(plan: Plan, trial: TuningTrial) -> None:
    """Phase RollingOut (kept since its first rollout: the rollout timeout counts from there)."""
    status = trial.status
    started_at = status.started_at if status is not None and status.started_at else plan.snap.now
    patch = TuningTrialStatus(
        phase=TrialPhase.ROLLING_OUT, params_summary=rec.trial_label(trial), started_at=started_at
    )
    plan.do(PatchTrial(trial.metadata.name or "", lifecycle.status_patch(patch)))


def check_rollout(plan: Plan, trial: TuningTrial, settings: TunerSettings) -> None:
    """Both pools Ready: apply the router; it Ready too: start the warm-up; else time out."""
    snap = plan.snap
    parts = snap.topology_canary
    states = {part: DeploymentState.from_manifest(m) for part, m in parts.items() if m is not None}
    pools_ready = all(part in states and lifecycle.ready(states[part]) for part in POOLS)
    if pools_ready and ROUTER not in states:
        found = _manifests(plan, trial)
        if found is not None:
            plan.do(*(ApplyCanary(manifest) for manifest in found[1]))
            rolling_out(plan, trial)
        return
    if pools_ready and lifecycle.ready(states[ROUTER]):
        plan.do(*lifecycle.start_warmup(plan, trial, rec.trial_progress(trial)))
        return
    since = trial.status.started_at if trial.status is not None else None
    failed = lifecycle.rollout_failure(
        list(states.values()), "the canary topology", since, snap.now, settings
    )
    if failed is not None:
        abort(plan, trial, failed)


def measure(plan: Plan, trial: TuningTrial, settings: TunerSettings) -> None:
    """Measuring: wait out the warm-up and the window, then judge (a thin window widens to its deadline)."""
    snap = plan.snap
    judge_window(
        plan,
        trial,
        settings,
        Judging(
            snap.topology_window,
            "the canary topology",
            "no measurement of the topology trial's window",
            TopologyWindow.combined,
            lambda window, least: judge(window, snap.slo, least, prediction(plan, trial)),
            conclude,
        ),
    )


W = TypeVar("W")


@dataclass(frozen=True)
class Judging(Generic[W]):
    """How a topology trial's window is read and judged: the observed ``reading``, what its canary
    is called, what to say when nothing was measured, the canary's own measurement (for the early
    prune), the verdict on a whole window (given ``abort.minSamples``), and how it is recorded."""

    reading: Reading[W]
    canary: str
    missing: str
    early: Callable[[W], TrackMeasurement]
    verdict: Callable[[W, int], tuple[Decision, str]]
    conclude: Callable[[Plan, TuningTrial, Decision, str, W], None]


def judge_window(plan: Plan, trial: TuningTrial, settings: TunerSettings, how: Judging[W]) -> None:
    """Wait out the warm-up and the window; prune early on a breach by the abort factor, as any
    canary; else judge the whole window (an inconclusive one widens up to the trial's deadline)."""
    snap = plan.snap
    found = lifecycle.due_measurement(plan, trial, how.reading, how.missing, settings)
    if found is None:
        return
    due, window = found
    rules = rec.abort_rules(snap.isvc)
    if not due.final:
        early = judge_early(how.early(window), snap.slo, rules)
        if early.decision is Decision.PRUNE:
            how.conclude(plan, trial, Decision.PRUNE, f"{how.canary}: {early.reason}", window)
        return
    decision, reason = how.verdict(window, rules.min_samples)
    if decision is Decision.INCONCLUSIVE and snap.now < due.deadline:
        return
    how.conclude(plan, trial, decision, reason, window)


def conclude(plan: Plan, trial: TuningTrial, decision: Decision, reason: str, window: TopologyWindow) -> None:
    """Record the verdict with each pool's measurement; the canary objects go; a winner is promoted."""
    name = trial.metadata.name or ""
    pools = {"prefill": window.prefill.to_api().to_k8s(), "decode": window.decode.to_api().to_k8s()}
    plan.do(
        PatchTrial(
            name,
            {
                "status": {
                    **pools,
                    "twin": twin_check(recommended(plan, trial), window, pool_check(plan, trial)).to_k8s(),
                }
            },
        )
    )
    if record(plan, trial, decision, reason, window.window()) is TrialVerdict.PROMOTED:
        promote(plan, trial, reason)


def record(
    plan: Plan, trial: TuningTrial, decision: Decision, reason: str, window: WindowMeasurement
) -> TrialVerdict:
    """Finish a topology trial on ``decision`` (a prune is a roll-back: the stable topology was never
    in danger) and say so in ``TopologyChange``; the verdict."""
    phase, verdict = lifecycle.VERDICTS.get(decision, (TrialPhase.FAILED, TrialVerdict.ABORTED))
    if verdict is TrialVerdict.PRUNED:
        phase, verdict = TrialPhase.ROLLED_BACK, TrialVerdict.DISCARDED
    lifecycle.finish(plan, trial, phase, verdict, reason, window)
    status, why = VERDICT_REASONS[verdict]
    message = f"topology trial {trial.spec.number} ({rec.trial_label(trial)}): {reason}"
    plan.condition(ConditionType.TOPOLOGY_CHANGE, status, why.value, message[:2048])
    return verdict


def pool_check(plan: Plan, trial: TuningTrial) -> PoolCheck | None:
    """The trial's topology predicted on its pools' own steps, when observing computed it."""
    pools = plan.snap.twin.pools
    return pools if pools is not None and pools.key == trial.metadata.name else None


def prediction(plan: Plan, trial: TuningTrial) -> Prediction:
    """What the twin predicts for the trial's topology: on its pools' own steps once they refit it,
    else its recommendation (on the stable's step model)."""
    replicas = topology_replicas(trial.spec.topology) if trial.spec.topology is not None else 0
    pools = pool_check(plan, trial)
    if pools is not None:
        return Prediction(pools.capacity_req_s, replicas, basis=pools.describe())
    found = recommended(plan, trial)
    return Prediction(found.capacity_req_s if found is not None else None, replicas)


def recommended(plan: Plan, trial: TuningTrial) -> TopologyRecommendation | None:
    """The twin's recommendation, for a trial that tries one (not for the planner's proposal)."""
    if trial.metadata.annotations.get(ANNOTATION_PROPOSED):
        return None
    return plan.snap.status.recommendation


def promoted_pools(plan: Plan, topology: TopologySpec, trial: str) -> dict[str, Any]:
    """``status.scaling`` in ``scaling.mode: Auto`` once a topology is promoted: the planner's
    decision is the promoted pools' replicas, which the operator runs whatever ran colocated
    (:func:`~chunkpilot.operator.builders.runs_at_its_replicas`) until the planner sizes them."""
    reason = f"the pools topology trial {trial} promoted, until the planner sizes them"
    pools = [
        PoolScalingStatus(
            role=role.value,
            desired_replicas=pool.replicas,
            reason=reason,
            recommendations=[ScalingRecommendation(time=plan.snap.now, replicas=pool.replicas)],
        )
        for role in PoolRole
        if (pool := topology.pool(role)) is not None
    ]
    return promoted_decision(plan, TopologyMode.DISAGGREGATED, topology_replicas(topology), reason, pools)


def promoted_decision(
    plan: Plan, topology: TopologyMode, replicas: int, reason: str, pools: list[PoolScalingStatus]
) -> dict[str, Any]:
    """``status.scaling`` as a patch once a topology trial is promoted: a fresh decision for the
    promoted ``topology`` at its ``replicas`` (the mode and start-up time kept). The promoted counts
    are in the history the scale-down window looks back over (each pool's own, for ``pools``), so
    they hold for a window."""
    before = plan.snap.status.scaling or ScalingStatus()
    held = [] if pools else [ScalingRecommendation(time=plan.snap.now, replicas=replicas)]
    status = ScalingStatus(
        mode=before.mode,
        topology=topology.value,
        desired_replicas=replicas,
        reason=reason,
        startup_seconds=before.startup_seconds,
        last_scale_time=plan.snap.now,
        recommendations=held,
        pools=pools,
    )
    return status.as_patch()


def promote(plan: Plan, trial: TuningTrial, reason: str) -> None:
    """Make the trial's topology the service's; the operator runs it instead of the colocated Deployment."""
    assert trial.spec.topology is not None
    plan.status["bestTopology"] = trial.spec.topology.to_k8s()
    plan.status["bestTopologyTrial"] = trial.metadata.name
    if plan.snap.isvc.spec.scaling.acts:
        plan.status["scaling"] = promoted_pools(plan, trial.spec.topology, trial.metadata.name or "")
    plan.emit(
        EventType.NORMAL,
        "TopologyPromoted",
        f"promoted topology trial {trial.spec.number}: {rec.trial_label(trial)} replaces the colocated "
        f"Deployment; {reason}",
    )


# --------------------------------------------------------------------------- colocated, tried again

#: A colocated topology trial is tried again no sooner than this after the last one ended.
RETRY_COLOCATED_S: Final = 3600.0
#: The most pods a colocated topology trial's canary router runs to draw its share of the traffic.
MAX_CANARY_ROUTERS: Final = 8
#: How far below the exact share a colocated canary is sized at most (the verdict allows the twin's
#: tolerance below it: the Service's spread of requests over router pods is no exact split).
SIZING_SLACK: Final = 0.05


@dataclass(frozen=True)
class ColocatedCanary:
    """How a colocated topology trial runs: ``engines`` colocated canary replicas behind a canary
    router of ``routers`` pods, beside the stable router's ``stable_routers``. The Service spreads
    requests evenly over router pods, so each canary replica carries ``share`` of the service's
    rate: about what each of the ``replicas`` colocated replicas it is judged for would carry."""

    replicas: int
    engines: int
    routers: int
    stable_routers: int

    @property
    def share(self) -> float:
        """Each canary replica's share of the whole service's requests."""
        return self.routers / (self.stable_routers + self.routers) / self.engines


def colocated_canary(
    replicas: int, stable_routers: int, tolerance: float = TOLERANCE
) -> ColocatedCanary | None:
    """The canary whose replicas each carry what one of ``replicas`` colocated replicas would: a
    share of the service's requests between ``1 - SIZING_SLACK`` and ``1 + tolerance`` times
    ``1 / replicas`` (one at or above the exact share first, then one below it), on the fewest
    engines, then the fewest of at most :data:`MAX_CANARY_ROUTERS` router pods; None when none does
    (one replica beside a one-pod router would need nearly all the traffic)."""
    routers = max(1, stable_routers)
    exact = 1.0 / replicas
    fits = [
        canary
        for engines in range(1, replicas + 1)
        for pods in range(1, MAX_CANARY_ROUTERS + 1)
        if (1 - SIZING_SLACK) * exact
        <= (canary := ColocatedCanary(replicas, engines, pods, routers)).share
        <= (1 + tolerance) * exact
    ]
    return min(fits, key=lambda c: (c.share < exact * (1 - 1e-9), c.engines, c.routers), default=None)


def _pools_settled(snap: Snapshot) -> bool:
    """Both pools and the router run all their replicas, none rolling out (the operator's status)."""
    topology = snap.status.topology
    if topology is None or topology.mode != TopologyMode.DISAGGREGATED:
        return False
    parts = (topology.prefill, topology.decode, topology.router)
    return all(
        part is not None
        and part.desired_replicas
        and part.replicas == part.desired_replicas
        and (part.ready_replicas or 0) >= part.desired_replicas
        for part in parts
    )


def _stable_routers(snap: Snapshot) -> int:
    return max(1, snap.isvc.spec.router.replicas)


def _colocated_trials(snap: Snapshot) -> list[TuningTrial]:
    return [t for t in snap.trials if t.spec.tries_colocated]


def colocated_gate(plan: Plan) -> Gate | None:
    """Whether the planner's proposal of colocated replicas (``status.scaling.proposal``) is tried as
    a colocated topology trial now; None: nothing to say.

    Tried in ``scaling.mode: Auto`` with ``allowTopologyChange``, on a service that runs pools a
    topology trial promoted (declared pools stay), once they run settled, at most once every
    :data:`RETRY_COLOCATED_S`; on a canary that can draw the share of the traffic one of the
    proposed replicas would carry.
    """
    snap = plan.snap
    spec = snap.isvc.spec
    if not spec.autotune.allow_topology_change or not spec.scaling.acts or not snap.runs_promoted_pools():
        return None
    proposal = current_proposal(plan)
    if proposal is None or proposal.topology != TopologyMode.COLOCATED.value or not proposal.replicas:
        return None
    ended = [t.status.finished_at for t in _colocated_trials(snap) if t.status and t.status.finished_at]
    if ended and (snap.now - max(ended)).total_seconds() < RETRY_COLOCATED_S:
        return None
    if not _pools_settled(snap):
        return None  # tried beside pools that serve as they are
    replicas = proposal.replicas
    what = f"the proposed {replicas} colocated replica(s) of {snap.incumbent.summary()}"
    canary = colocated_canary(replicas, _stable_routers(snap))
    if canary is None:
        return Gate(
            None,
            TopologyReason.UNSUPPORTED,
            f"not trying {what}: a canary beside the router's {_stable_routers(snap)} pod(s) cannot draw "
            f"the share of the traffic one of them would carry with {MAX_CANARY_ROUTERS} canary router "
            "pods; to switch, set autotune.allowTopologyChange false (the service runs colocated on "
            "spec.replicas)",
        )
    try:
        build_canary_colocated(snap.isvc, as_declared(snap.isvc, snap.body), snap.incumbent, 1, 1)
    except RenderError as error:
        return Gate(None, TopologyReason.UNSUPPORTED, f"not trying {what}: the engine refuses it: {error}")
    return Gate(TopologySpec(mode=TopologyMode.COLOCATED), proposed=proposal.message, replicas=replicas)


def consider_colocated(plan: Plan) -> None:
    """A service that runs pools a topology trial promoted: start a colocated topology trial of the
    planner's proposal, or say why not."""
    found = colocated_gate(plan)
    if found is None:
        return
    if found.topology is None:
        refuse(plan, found)
        return
    create_colocated(plan, found)


def create_colocated(plan: Plan, found: Gate) -> None:
    """The colocated topology trial: ``found.replicas`` colocated replicas of the stable config (the
    one the service ran before its pools), in the service's current round."""
    round_ = max((rec.trial_round(t) for t in plan.snap.trials), default=0)
    colocated = TopologySpec(mode=TopologyMode.COLOCATED)
    trial = new_trial(plan, colocated, round_, proposed=True, replicas=found.replicas)
    label = rec.trial_label(trial)
    said = (
        f"trying the proposed {label} as a canary beside the pools (trial {trial.spec.number}); the "
        f"pools serve on (the planner: {found.proposed})"
    )
    start(plan, trial, label, said)


def remove_colocated_canary(plan: Plan, current: TuningTrial | None, *, keep_parked: bool = False) -> None:
    """The canary Deployment no active trial owns: a finished colocated topology trial's engines
    quietly, once the canary router in front of them is gone (it goes first); any other as an orphan
    (a parked one stays with ``keep_parked``, see :func:`~chunkpilot.tuner.decide.canary.remove_orphan`)."""
    canary = plan.canary
    owner = canary_owner(canary)
    finished = {t.metadata.name for t in plan.trials if t.spec.tries_colocated and not rec.is_active(t)}
    if canary is None or is_terminating(canary) or owner not in finished:
        remove_orphan(plan, current, keep_parked=keep_parked)
    elif plan.snap.topology_canary.get(ROUTER) is None:
        delete_canary(plan)
        plan.do(Log(f"deleted the canary engines of finished topology trial {owner}"))


def advance_colocated(plan: Plan, trial: TuningTrial, settings: TunerSettings) -> None:
    """The active colocated topology trial's step: roll out (engines, then router), wait for Ready,
    measure, judge."""
    snap = plan.snap
    phase = rec.trial_phase(trial)
    number = trial.spec.number
    plan.status["currentTrial"] = trial.metadata.name
    plan.condition(
        ConditionType.TUNING,
        ConditionStatus.TRUE,
        "TrialRunning",
        f"topology trial {number} {phase.value}: {rec.trial_label(trial)}",
    )
    plan.do(CurrentTrialGauge(number))
    spec = snap.isvc.spec
    if not spec.autotune.allow_topology_change or not spec.scaling.acts:
        abort(plan, trial, "autotune.allowTopologyChange or scaling.mode Auto was turned off")
        return
    if not snap.runs_promoted_pools():
        abort(plan, trial, "the service no longer runs the pools a topology trial promoted")
        return
    changed = spec_changed(trial, snap.isvc)
    if changed is not None:
        abort(plan, trial, changed)
        return
    if phase is TrialPhase.PENDING or snap.canary is None:
        roll_out_colocated(plan, trial)  # new, or lost (deleted by hand, or never applied before a restart)
        return
    pods = (*snap.canary_pods, *snap.topology_pods)
    crashed = lifecycle.crash_message(pods, settings.crash_restarts)
    if crashed is not None:
        abort(plan, trial, crashed)
        return
    if phase is TrialPhase.ROLLING_OUT or snap.topology_canary.get(ROUTER) is None:
        check_colocated_rollout(plan, trial, settings)
    elif snap.stable_reading.down:
        lifecycle.metrics_gap(plan, trial, None, settings)
    else:
        measure_colocated(plan, trial, settings)


def _colocated_manifests(
    plan: Plan, trial: TuningTrial
) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """The canary engines' Deployment and the canary router's objects; None: the trial aborted."""
    snap = plan.snap
    replicas = trial.spec.replicas or 1
    canary = colocated_canary(replicas, _stable_routers(snap))
    if canary is None:
        abort(plan, trial, f"no canary beside the router's {_stable_routers(snap)} pod(s) draws its share")
        return None
    try:
        engines, *router = build_canary_colocated(
            snap.isvc, as_declared(snap.isvc, snap.body), trial.spec.params, canary.engines, canary.routers
        )
    except ValueError as error:
        abort(plan, trial, f"the engine refuses the colocated config: {error}")
        return None
    engines.setdefault("metadata", {}).setdefault("annotations", {})[rec.ANNOTATION_TRIAL] = (
        trial.metadata.name or ""
    )
    return adopt(engines, snap.body), [adopt(manifest, snap.body) for manifest in router]


def roll_out_colocated(plan: Plan, trial: TuningTrial) -> None:
    """Apply the canary engines (again, if they went missing); the router follows once they are Ready."""
    found = _colocated_manifests(plan, trial)
    if found is None:
        return
    plan.do(ApplyCanary(found[0]))
    rolling_out(plan, trial)
    if rec.trial_phase(trial) is TrialPhase.PENDING:
        plan.emit(
            EventType.NORMAL,
            "TopologyTrialStarted",
            f"trial {trial.spec.number}: colocated canary {rec.trial_label(trial)} started; its canary "
            "router follows once it is Ready and takes a share of the traffic; the pools serve on",
        )


def check_colocated_rollout(plan: Plan, trial: TuningTrial, settings: TunerSettings) -> None:
    """The canary engines Ready: apply the router; it Ready too: start the warm-up; else time out."""
    snap = plan.snap
    engines = DeploymentState.from_manifest(snap.canary) if snap.canary is not None else None
    router = snap.topology_canary.get(ROUTER)
    routed = DeploymentState.from_manifest(router) if router is not None else None
    if engines is not None and lifecycle.ready(engines) and routed is None:
        found = _colocated_manifests(plan, trial)
        if found is not None:
            plan.do(*(ApplyCanary(manifest) for manifest in found[1]))
            rolling_out(plan, trial)
        return
    if engines is not None and routed is not None and lifecycle.ready(engines) and lifecycle.ready(routed):
        plan.do(*lifecycle.start_warmup(plan, trial, rec.trial_progress(trial)))
        return
    since = trial.status.started_at if trial.status is not None else None
    states = [state for state in (engines, routed) if state is not None]
    failed = lifecycle.rollout_failure(states, "the colocated canary", since, snap.now, settings)
    if failed is not None:
        abort(plan, trial, failed)


def measure_colocated(plan: Plan, trial: TuningTrial, settings: TunerSettings) -> None:
    """Measuring: wait out the warm-up and the window, then judge (a thin window widens to its deadline)."""
    snap = plan.snap
    replicas = trial.spec.replicas or 1
    judge_window(
        plan,
        trial,
        settings,
        Judging(
            snap.window,
            "the colocated canary",
            "no measurement of the colocated canary's window",
            lambda window: window.canary,
            lambda window, least: judge_colocated(window, snap.slo, least, replicas),
            conclude_colocated,
        ),
    )


def conclude_colocated(
    plan: Plan, trial: TuningTrial, decision: Decision, reason: str, window: WindowMeasurement
) -> None:
    """Record the verdict with the canary's and the pools' measurements; the canary goes (the router
    first); a winner is promoted."""
    if record(plan, trial, decision, reason, window) is TrialVerdict.PROMOTED:
        promote_colocated(plan, trial, reason)


def promoted_colocated(plan: Plan, replicas: int, trial: str) -> dict[str, Any]:
    """``status.scaling`` once a colocated topology trial is promoted: the planner's decision is the
    trial's colocated replicas, which the operator runs in place of the pools until the planner
    sizes them."""
    reason = f"the colocated topology trial {trial} promoted, until the planner sizes the replicas"
    return promoted_decision(plan, TopologyMode.COLOCATED, replicas, reason, [])


def promote_colocated(plan: Plan, trial: TuningTrial, reason: str) -> None:
    """Run colocated again: ``status.bestTopology`` cleared (naming the trial that cleared it) and the
    planner's decision at the trial's replicas; the operator replaces the pools."""
    name = trial.metadata.name or ""
    plan.status["bestTopology"] = None
    plan.status["bestTopologyTrial"] = name
    plan.status["scaling"] = promoted_colocated(plan, trial.spec.replicas or 1, name)
    plan.emit(
        EventType.NORMAL,
        "TopologyPromoted",
        f"promoted topology trial {trial.spec.number}: {rec.trial_label(trial)} replace the prefill/decode "
        f"pools; {reason}"[:1024],
    )
