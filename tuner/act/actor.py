"""Act: the only code of the tuner that writes to the cluster.

:class:`Actor` carries out a :class:`~chunkpilot.tuner.decide.plan.Plan` in order (trial
writes, canary applies and deletions, live adjustment, Events, gauges, the study
mirror) and then writes the plan's service status fields and conditions in one
conditional patch, merged into the fresh object (the write also happens when an
action failed, so what was decided before is not lost). It never writes, patches or deletes an
object of a canary's name that is not the service's own (:func:`~chunkpilot.operator.objects.owned_by`):
such an object is left as it is (the decide phase reports the conflict).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from chunkpilot.operator.events import EventSpec
from chunkpilot.operator.kube import KubeError, object_path
from chunkpilot.operator.objects import (
    canary_topology_paths,
    deployment_path,
    owned_by,
    parse_status,
    trial_path,
    write_service_status,
)
from chunkpilot.operator.status import set_conditions
from chunkpilot.tuner.act.live_adjust import HttpLiveAdjuster, LiveAdjuster, LiveAdjustError
from chunkpilot.tuner.decide.plan import (
    Action,
    AdjustLive,
    AnnotateCanary,
    ApplyCanary,
    CountFinished,
    CreateTrial,
    CurrentTrialGauge,
    DeleteCanary,
    DeleteCanaryTopology,
    Emit,
    Log,
    MirrorStudy,
    PatchTrial,
    Plan,
    ScalingGauges,
)
from chunkpilot.tuner.observe.watched import Kube
from chunkpilot.tuner.space import SearchSpace
from chunkpilot.tuner.study import TrialRecord

from chunkpilot import telemetry
from chunkpilot.api import ConditionOwner, InferenceServiceStatus, Track

logger = logging.getLogger(__name__)


PostEvent = Callable[[Mapping[str, Any], EventSpec], None]
Mirror = Callable[
    [str, str, SearchSpace, list[TrialRecord], Mapping[int, Mapping[str, Any]]], Awaitable[object]
]
"""Copies the finished trials of a service somewhere (e.g. an Optuna RDB for optuna-dashboard)."""


class _StopPlanError(Exception):
    """The rest of the plan no longer applies (its trial was made by an earlier step)."""


class Actor:
    """Carries out plans through one API client."""

    def __init__(
        self,
        kube: Kube,
        *,
        post_event: PostEvent | None = None,
        mirror: Mirror | None = None,
        live_adjuster: LiveAdjuster | None = None,
    ) -> None:
        self.kube = kube
        self.post_event = post_event
        self.mirror = mirror
        self.live_adjuster = live_adjuster or HttpLiveAdjuster()

    async def act(self, plan: Plan) -> None:
        """Run the plan's actions, then write its service status (also after a failed action)."""
        try:
            with contextlib.suppress(_StopPlanError):
                await self.run(plan, plan.actions)
        finally:
            await self.write_status(plan)

    async def run(self, plan: Plan, actions: Sequence[Action]) -> None:
        for action in actions:
            await self.one(plan, action)

    async def one(self, plan: Plan, action: Action) -> None:
        snap = plan.snap
        ns, name = snap.namespace, snap.name
        canary_path = deployment_path(ns, name, Track.CANARY)
        match action:
            case CreateTrial(manifest, status):
                try:
                    await self.kube.create(trial_path(ns), manifest)
                except KubeError as error:
                    if error.conflict:
                        raise _StopPlanError from None  # created by an earlier step that did not finish
                    raise
                await self.kube.merge_patch(trial_path(ns, manifest["metadata"]["name"], "status"), status)
            case PatchTrial(trial, patch):
                await self.kube.merge_patch(trial_path(ns, trial, "status"), patch)
            case ApplyCanary(manifest):
                if await self._ours(plan, object_path(manifest)):
                    await self.kube.apply(manifest)
            case AnnotateCanary(annotations):
                if await self._ours(plan, canary_path):
                    await self.kube.merge_patch(canary_path, {"metadata": {"annotations": dict(annotations)}})
            case DeleteCanary():
                if await self._ours(plan, canary_path):
                    await self.kube.delete(canary_path)
            case DeleteCanaryTopology(pools):
                for path in canary_topology_paths(ns, name, pools=pools):
                    if await self._ours(plan, path):
                        await self.kube.delete(path)
            case AdjustLive(pods, token, limits, on_success, on_failure):
                try:
                    await self.live_adjuster.adjust(pods, token, limits)
                except (LiveAdjustError, KubeError, OSError) as error:
                    await self.run(plan, on_failure(str(error)))
                else:
                    await self.run(plan, on_success)
            case Emit(event):
                if self.post_event is not None:
                    self.post_event(snap.body, event)
            case CurrentTrialGauge(number):
                telemetry.CURRENT_TRIAL.labels(ns, name).set(number)
            case ScalingGauges(desired, capacity):
                telemetry.record_scaling(ns, name, desired, capacity)
            case CountFinished(verdict):
                telemetry.TRIALS_FINISHED.labels(ns, name, verdict.value).inc()
            case MirrorStudy(space, records, attrs):
                if self.mirror is None:
                    return
                try:
                    await self.mirror(ns, name, space, list(records), attrs)
                except Exception as error:  # a read-only copy must never stop tuning
                    logger.warning("%s/%s: mirroring the study failed: %s", ns, name, error)
            case Log(message):
                logger.info("%s/%s: %s", ns, name, message)

    async def _ours(self, plan: Plan, path: str) -> bool:
        """Whether the object at ``path`` may be written for the service: absent, or its own."""
        current = await self.kube.get(path)
        if current is None or owned_by(current, plan.snap.body):
            return True
        logger.warning(
            "%s/%s: not writing %s: it exists and does not belong to the service",
            plan.snap.namespace,
            plan.snap.name,
            path,
        )
        return False

    async def write_status(self, plan: Plan) -> None:
        """Merge the plan's status fields and conditions into the service (conditional, retried)."""
        if not plan.status and not plan.conditions:
            return
        now: datetime = plan.snap.now.replace(microsecond=0)

        def patcher(fresh: Mapping[str, Any]) -> dict[str, Any] | None:
            raw = dict(fresh.get("status") or {})
            current = parse_status(raw) or InferenceServiceStatus()
            generation = int(fresh["metadata"].get("generation") or 0)
            conditions = set_conditions(
                current.conditions, plan.conditions, generation, now, owner=ConditionOwner.TUNER
            )
            patch: dict[str, Any] = dict(plan.status)
            new_conditions = [c.to_k8s() for c in conditions]
            if new_conditions != [c.to_k8s() for c in current.conditions]:
                patch["conditions"] = new_conditions
            return {k: v for k, v in patch.items() if _merged(raw.get(k), v) != raw.get(k)}

        await write_service_status(
            self.kube, plan.snap.namespace, plan.snap.name, patcher, read=plan.snap.body
        )


def _merged(current: Any, patch: Any) -> Any:
    """``current`` after the JSON merge patch ``patch`` (RFC 7386): a field written as part of a larger
    object changes nothing when the stored object already holds it, whatever else it holds."""
    if not isinstance(patch, dict):
        return patch
    out = dict(current) if isinstance(current, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merged(out.get(key), value)
    return out
