"""The per-service tuning loop: observe, decide, act.

Every tick (a Kopf timer, see :mod:`chunkpilot.tuner.handlers`) calls
:meth:`TuningController.step` for one InferenceService. A step keeps no state of
its own; all of it lives in the cluster:

1. **observe** (:mod:`chunkpilot.tuner.observe.snapshot`): one frozen snapshot of the service,
   its TuningTrials, the stable and canary Deployments, the canary's pods and the
   measurements from Prometheus;
2. **decide** (:mod:`chunkpilot.tuner.decide.step`, :mod:`chunkpilot.tuner.decide.phases`,
   :mod:`chunkpilot.tuner.decide.canary`): a pure function of the snapshot, one function
   per phase, returning a plan of typed actions;
3. **act** (:mod:`chunkpilot.tuner.act.actor`): the only code that writes (trials, the canary
   Deployment, Events, the service's tuner status fields).

The stable Deployment is not the tuner's: a promotion writes ``status.bestConfig``
and the operator rolls the stable track to it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime

from chunkpilot.operator.kube import KubeError
from chunkpilot.tuner.act.actor import Actor, Mirror, PostEvent
from chunkpilot.tuner.act.live_adjust import LiveAdjuster
from chunkpilot.tuner.decide.lifecycle import TunerSettings, crash_message
from chunkpilot.tuner.decide.step import TuningReason, decide, round_token_mix, with_token_mix
from chunkpilot.tuner.measure import QueryFn, VectorFn
from chunkpilot.tuner.observe.observer import Observer
from chunkpilot.tuner.observe.twinjobs import TwinJobs
from chunkpilot.tuner.observe.watched import Kube, WatchedKube
from chunkpilot.tuner.twin.online import TwinBudget

Clock = Callable[[], datetime]
logger = logging.getLogger(__name__)

__all__ = [
    "Clock",
    "Kube",
    "Mirror",
    "PostEvent",
    "TunerSettings",
    "TuningController",
    "TuningReason",
    "crash_message",
    "round_token_mix",
    "utc_now",
    "with_token_mix",
]


def utc_now() -> datetime:
    return datetime.now(UTC)


class TuningController:
    """Advances the tuning of one InferenceService per :meth:`step`; keeps no state between steps."""

    def __init__(
        self,
        kube: Kube,
        query: QueryFn | None,
        *,
        post_event: PostEvent | None = None,
        clock: Clock = utc_now,
        settings: TunerSettings | None = None,
        inline: bool = False,
        mirror: Mirror | None = None,
        live_adjuster: LiveAdjuster | None = None,
        vector: VectorFn | None = None,
        live_adjust: bool = True,
        image_registry: str | None = None,
        twin_budget: TwinBudget | None = None,
        twin_jobs: TwinJobs | None = None,
        batch: VectorFn | None = None,
    ) -> None:
        self.kube = kube
        self.clock = clock
        self.settings = settings or TunerSettings()
        #: ``vector``: instant-vector queries for the digital twin (None: no twin, tuning as before);
        #: ``live_adjust``: the installation allows ``autotune.liveAdjust``; ``image_registry``: the one
        #: its default images come from; ``twin_budget``: what one
        #: ranking on the twin may spend (the tuner's settings, :class:`chunkpilot.tuner.config.TunerConfig`);
        #: ``twin_jobs``: where rankings beyond the operator's CPU budget run (None: all here);
        #: ``batch``: instant-vector queries that measure a track in one request (None: one by one).
        #: Deployment reads from the operator's watch (its index is handed over by the timer).
        self.watched = WatchedKube(kube)
        if twin_jobs is not None:
            twin_jobs.kube = self.watched  # a ranking Job's progress from the watch too
        self.observer = Observer(
            self.watched,
            query,
            inline=inline,
            vector=vector,
            live_adjust=live_adjust,
            image_registry=image_registry,
            twin_budget=twin_budget,
            twin_jobs=twin_jobs,
            batch=batch,
        )
        self.actor = Actor(self.watched, post_event=post_event, mirror=mirror, live_adjuster=live_adjuster)
        self._inline = inline  # decide on the loop itself (tests); else in a thread (the sampler is slow)

    @property
    def live_adjuster(self) -> LiveAdjuster:
        return self.actor.live_adjuster

    @live_adjuster.setter
    def live_adjuster(self, adjuster: LiveAdjuster) -> None:
        self.actor.live_adjuster = adjuster

    async def step(self, namespace: str, name: str) -> None:
        """One transition of the service's tuning loop."""
        snap = await self.observer.observe(namespace, name, self.clock())
        if snap is None:
            return
        if self._inline:
            plan = decide(snap, self.settings)
        else:
            plan = await asyncio.to_thread(decide, snap, self.settings)
        try:
            await self.actor.act(plan)
        except KubeError as error:
            if not error.namespace_terminating:
                raise
            # The namespace is being deleted and takes the service and its trials with it.
            logger.info("not tuning %s/%s: its namespace is being deleted", namespace, name)
