"""Observe the service's digital twin: read its inputs, fit and rank when due, check a finished canary.

Part of observing (:mod:`chunkpilot.tuner.observe.snapshot`): what it computes enters the snapshot as a
:class:`TwinReading`, and deciding stays pure. The costly parts run off the event loop, in one worker
process shared by all services (``inline`` runs them on the loop, for tests):

* a **fit** (seconds): the step-time model fitted to the stable track's steps over the SLO window
  plus the steps of the newest :data:`REFIT_WINDOWS` measured canaries of the round (the model
  describes the hardware, so every canary's steps inform it); cached in memory per ``key`` (stable
  config hash and the latest trial whose steps it includes), so it is redone only when either changes;
* a **ranking** (the :class:`~chunkpilot.tuner.twin.online.TwinBudget` it is given: at most
  ``CHUNKPILOT_TWIN_CPU_SECONDS`` CPU seconds, default 30, and at most
  ``CHUNKPILOT_TWIN_MAX_EVALUATIONS`` evaluations when set; at a lowered CPU priority): the search
  on the twin, only while no trial is active and the service status holds no ranking of the same key
  that is younger than :data:`RERANK_AFTER_S`; its result is written to ``status.twin`` (durable across
  restarts), so a restart does not search again;
* a **check** (one simulation) at the end of a trial's window: the twin's quantiles for the canary's
  config at the canary's live load;
* a **pool check** (one layout evaluation) at the end of a topology trial's window: each canary
  pool's own steps refit its step model and the layout's capacity is predicted on the two
  (:mod:`chunkpilot.tuner.topology.pools`); once a trial, kept in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import multiprocessing
import os
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Final, ParamSpec, TypeVar

from chunkpilot.engine.sim.offline import SLO
from chunkpilot.operator.kube import KubeError
from chunkpilot.tuner import records as rec
from chunkpilot.tuner.measure import MetricsUnavailableError, Selector, TrackMeasurement, VectorFn
from chunkpilot.tuner.observe.recommendation import kv_transfer, recommend_due, request
from chunkpilot.tuner.observe.snapshot import CanaryWindow, Snapshot, TwinReading, window_plan, window_text
from chunkpilot.tuner.observe.twinjobs import TwinJobs
from chunkpilot.tuner.planner import capacity_of, needed_replicas
from chunkpilot.tuner.space import SpaceError, TunedConfig, build_space
from chunkpilot.tuner.study import seed_for
from chunkpilot.tuner.topology.layouts import Layout, Pool, starting_layout
from chunkpilot.tuner.topology.pools import ROLES, PoolCheck, PoolCheckRequest, check_pools
from chunkpilot.tuner.topology.recommend import RecommendationResult, recommend
from chunkpilot.tuner.topology.sizing import (
    MeasuredPools,
    PoolCapacities,
    PoolSizingRequest,
    layout_capacities,
    pool_capacities,
)
from chunkpilot.tuner.twin import online
from chunkpilot.tuner.twin.capture import CaptureError, WorkloadWindow
from chunkpilot.tuner.twin.fit import TwinFitError
from chunkpilot.tuner.twin.jobs import JobPhase
from chunkpilot.tuner.twin.search import SUSTAINED_S, planning_capacity
from chunkpilot.tuner.twin.wire import with_ranking

from chunkpilot.api import (
    EngineConfig,
    PoolSpec,
    TopologySpec,
    Track,
    TrialVerdict,
    TuningTrial,
    TwinState,
    parse_duration,
)

if TYPE_CHECKING:
    from chunkpilot.engine.sim.metrics import StepTotals

log = logging.getLogger(__name__)

P = ParamSpec("P")

T = TypeVar("T")

#: A ranking older than this is redone even when nothing changed (the workload drifts).
RERANK_AFTER_S: Final = 900.0

#: Measured canary windows (newest first, of the latest trial's round) whose steps refit the twin.
REFIT_WINDOWS: Final = 4

#: How long the planner's forecast (the quantiles at a replica count, at the live rate) stands on one
#: fit before it is simulated again; a count it lacks is simulated at once.
FORECAST_EVERY: Final = timedelta(minutes=5)
#: A disaggregated service's pools are refitted (their capacities read again) at most this often,
#: and tried again no sooner than this after a try that found nothing to fit or failed.
POOL_SIZING_EVERY: Final = timedelta(minutes=10)
POOL_SIZING_RETRY: Final = timedelta(minutes=1)

NO_TELEMETRY: Final = (
    "the stable engine exports no step telemetry (chunkpilot:step_duration_seconds): an engine "
    "without the Chunkpilot scheduler plugin or an older simulator; tuning on measurements alone"
)


def sim_slo(snap: Snapshot) -> SLO:
    slo = snap.slo
    return SLO(slo.itl_ms, slo.itl_quantile, slo.ttft_ms, slo.ttft_quantile)


def refit_trials(trials: tuple[TuningTrial, ...], newest: int = REFIT_WINDOWS) -> list[TuningTrial]:
    """The newest finished colocated trials whose canary served a measured window, newest first, at
    most ``newest``, all of the latest one's round (the same workload): their steps refit the twin."""
    found: list[TuningTrial] = []
    for trial in sorted(trials, key=lambda t: t.spec.number, reverse=True):
        status = trial.status
        if rec.is_active(trial) or status is None or status.finished_at is None:
            continue
        if status.verdict is TrialVerdict.ABORTED or status.canary is None or trial.spec.is_topology:
            continue  # a topology trial's pools run other knobs and roles than the twin models
        if found and rec.trial_round(trial) != rec.trial_round(found[0]):
            break
        found.append(trial)
        if len(found) >= newest:
            break
    return found


def refit_trial(trials: tuple[TuningTrial, ...]) -> TuningTrial | None:
    """The latest finished trial whose canary served a measured window (it names the refit)."""
    found = refit_trials(trials, 1)
    return found[0] if found else None


def measured_pools(snap: Snapshot) -> MeasuredPools | None:
    """What the running pools measured over the SLO window, for the twin's error on them (None:
    not measured, or on fewer requests than a trial is judged on)."""
    pools = snap.pools_reading.value
    rate = pools.decode.request_rate if pools is not None else None
    if pools is None or rate is None or not rate > 0:
        return None
    least = rec.abort_rules(snap.isvc).min_samples  # a quantile of a few requests compares nothing
    if pools.prefill.ttft_samples < least or not pools.decode.enough_samples(least):
        return None
    return MeasuredPools(
        rate, pools.prefill.replicas, pools.decode.replicas, pools.prefill.ttft_ms, pools.decode.itl_ms
    )


def pool_workload(prefill: WorkloadWindow, decode: WorkloadWindow) -> WorkloadWindow:
    """A disaggregated service's workload: the request lengths the decode pool served (every request
    whole; the prefill pool serves each for one token), the prefix-cache hits of the prefill pool
    (where the prompts are computed)."""
    return replace(
        decode, prefix_cache_queries=prefill.prefix_cache_queries, prefix_cache_hits=prefill.prefix_cache_hits
    )


def pool_sizing_key(layout: Layout) -> str:
    """The fit a disaggregated service's pools are sized on (a learnt cap stands while it does):
    the pools' knobs, ``pools-<prefill budget>x<seqs>-<decode budget>x<seqs>``."""
    p, d = layout.prefill, layout.decode
    return f"pools-{p.max_num_batched_tokens}x{p.max_num_seqs}-{d.max_num_batched_tokens}x{d.max_num_seqs}"


def pool_layout(topology: TopologySpec, stable: TunedConfig) -> Layout:
    """A topology's pools as the layout search names them (an unset knob is the stable's)."""
    assert topology.prefill is not None and topology.decode is not None

    def pool(spec: PoolSpec) -> Pool:
        return Pool(
            spec.replicas,
            spec.max_num_batched_tokens or stable.max_num_batched_tokens,
            spec.max_num_seqs or stable.max_num_seqs,
        )

    return Layout(pool(topology.prefill), pool(topology.decode))


def twin_request(
    snap: Snapshot,
    inputs: online.Inputs,
    key: str,
    rate: float,
    *,
    rank: bool,
    budget: online.TwinBudget | None = None,
) -> online.Request:
    """What the twin of ``snap``'s service is fitted (and, ``rank``, ranked) from: its stable
    track's ``inputs`` at ``rate`` requests/s per replica, its spec's engine, model, SLO and space."""
    budget = budget or online.TwinBudget()
    spec = snap.isvc.spec
    facts = rec.service_facts(snap.isvc)
    space = build_space(facts, rec.space_bounds(snap.isvc))
    tried = [rec.tuned_config(t.spec.params) for t in snap.trials]
    assert inputs.workload is not None
    return online.Request(
        key=key,
        model=spec.model.name,
        accelerator=str(spec.resources.accelerator),
        tensor_parallel_size=spec.engine.tensor_parallel_size,
        max_model_len=facts.max_model_len,
        gpu_memory_utilization=spec.engine.gpu_memory_utilization,
        steps=dict(inputs.steps),
        durations=dict(inputs.durations),
        workload=inputs.workload,
        slo=sim_slo(snap),
        space=space,
        incumbent=rec.tuned_config(snap.incumbent),
        stable_rate_req_s=rate,
        measured_ms=inputs.measured_ms,
        bands=inputs.bands,
        objective=rec.objective_kind(snap.isvc),
        seed=seed_for(snap.isvc.metadata.uid or snap.name, len(snap.trials) + 1),
        rank=rank,
        cpu_budget_s=budget.cpu_s,
        max_evaluations=budget.max_evaluations,
        exclude=tuple(dict.fromkeys(tried)),
        engine=online.engine_semantics(
            spec.engine, spec.model.name, str(spec.resources.accelerator), facts.max_model_len
        ),
    )


def _planning_errors(calibration: online.Calibration) -> tuple[float, float]:
    """The twin's error per quantile, or its one error for both where neither compared."""
    if any(math.isfinite(e) for e in calibration.errors):
        return calibration.errors
    return calibration.error, calibration.error


def rank_due(snap: Snapshot, key: str, refit: int | None) -> bool:
    """No trial is active and the service holds no recent ranking of this key."""
    if snap.active():
        return False
    twin = snap.status.twin
    if twin is None or twin.state is not TwinState.FITTED or twin.fitted_at is None:
        return True
    same = twin.config_hash == snap.incumbent.config_hash() and (twin.refit_trial or 0) == (refit or 0)
    return not same or snap.now - twin.fitted_at > timedelta(seconds=RERANK_AFTER_S)


class TwinObserver:
    """Reads, fits, ranks and checks the twins of all services; keeps the fits in memory."""

    def __init__(
        self,
        vector: VectorFn | None,
        *,
        inline: bool = False,
        budget: online.TwinBudget | None = None,
        jobs: TwinJobs | None = None,
    ) -> None:
        self.vector = vector
        self._inline = inline
        #: What one ranking may spend (the tuner's settings; None: the defaults).
        self.budget = budget or online.TwinBudget()
        #: Where rankings beyond the operator's CPU budget run (None: all in the worker process).
        self.jobs = jobs
        self._pool: Executor | None = None
        self._fits: dict[tuple[str, str], online.Calibration] = {}
        self._canary_steps: dict[str, dict[str, StepTotals]] = {}
        self._pool_checks: dict[tuple[str, str], PoolCheck] = {}
        self._forecasts: dict[tuple[str, str], tuple[str, datetime, dict[int, tuple[float, float]]]] = {}
        self._planned: dict[tuple[str, str], tuple[str, tuple[float, float]]] = {}
        self._pool_sizes: dict[tuple[str, str], tuple[datetime, PoolCapacities]] = {}
        self._pool_sizing_failed: dict[tuple[str, str], datetime] = {}
        self._splits: dict[tuple[str, str], tuple[str, PoolCapacities | None]] = {}

    async def observe(self, snap: Snapshot, final: CanaryWindow | None) -> TwinReading:
        """The twin's reading for ``snap`` (nothing when there is nothing to measure with), with the
        active topology trial's pools checked once its window is final."""
        reading = await self._observe(snap, final)
        pools = await self._pools(snap)
        forecast = await self._forecast(snap, reading)
        planning = await self._planning(snap, reading)
        sizes = await self._pool_sizing(snap) or await self._split(snap, reading)
        return replace(
            reading, pools=pools or reading.pools, forecast=forecast, planning=planning, pool_capacities=sizes
        )

    async def _observe(self, snap: Snapshot, final: CanaryWindow | None) -> TwinReading:
        autotune, slo_spec = snap.isvc.spec.autotune, snap.isvc.spec.slo
        stable = snap.stable_reading.value
        if self.vector is None or slo_spec is None or not autotune.enabled or autotune.paused:
            return TwinReading()
        if snap.isvc.spec.disaggregated:  # its pools have a twin of their own (:meth:`_pool_sizing`)
            return TwinReading()
        if stable is None:
            return TwinReading()
        minimum = rec.abort_rules(snap.isvc).min_samples
        if not stable.enough_samples(minimum):
            return TwinReading(
                TwinState.WAITING,
                f"stable served {stable.ttft_samples:.0f} requests in {stable.window}; {minimum} needed to "
                "compare the twin with it",
            )
        selector = Selector(snap.name, snap.namespace, Track.STABLE, config_hash=snap.incumbent.config_hash())
        quantiles = (snap.slo.itl_quantile, snap.slo.ttft_quantile)
        window_s = float(parse_duration(slo_spec.window))
        try:
            inputs = await self._blocking(
                online.read_inputs,
                self.vector,
                selector,
                slo_spec.window,
                window_s,
                snap.now,
                quantiles,
                (stable.itl_samples, stable.ttft_samples),
                engine=str(snap.isvc.spec.engine.kind),
                steadiness=final is None,
                segments=snap.isvc.spec.scaling.plans,
            )
            if not inputs.exported and not inputs.seen:
                return TwinReading(TwinState.WAITING, "Prometheus has no series of the stable engine yet")
            if not inputs.exported:
                return TwinReading(TwinState.UNAVAILABLE, NO_TELEMETRY)
            refits = refit_trials(snap.trials)
            last = refits[0] if refits else None
            extra = online.merge_steps(*[await self._trial_steps(snap, t) for t in refits])
        except MetricsUnavailableError as error:
            return TwinReading(TwinState.WAITING, f"the twin's telemetry could not be read: {error}")
        refit = last.spec.number if last is not None else None
        key = f"{snap.incumbent.config_hash()}-{refit or 0}"
        rate = stable.per_replica(stable.request_rate)
        merged = replace(inputs, steps=online.merge_steps(inputs.steps, extra))
        base = TwinReading(key=key, refit_trial=refit, live_rate_req_s=rate, measured_ms=inputs.measured_ms)
        waiting = online.waiting_reason(merged)
        if waiting is not None or merged.workload is None or rate is None:
            return replace(base, state=TwinState.WAITING, message=waiting or "no live request rate yet")
        calibration = self._fits.get((snap.namespace, snap.name))
        unsteady = online.unsteady_reason(merged) if final is None else None
        if unsteady is not None:
            if calibration is None:
                return replace(base, state=TwinState.WAITING, message=unsteady)
            return replace(base, state=TwinState.FITTED, calibration=calibration, settling=unsteady)
        rank = rank_due(snap, key, refit)
        pending: str | None = None
        if rank or calibration is None or calibration.key != key:
            fitted = calibration if calibration is not None and calibration.key == key else None
            try:
                calibration, pending = await self._calibrate(
                    snap, twin_request(snap, merged, key, rate, rank=rank, budget=self.budget), fitted
                )
            except (TwinFitError, CaptureError, SpaceError) as error:
                return replace(base, state=TwinState.WAITING, message=str(error))
            self._fits[(snap.namespace, snap.name)] = calibration
        reading = replace(
            base,
            state=TwinState.FITTED,
            calibration=calibration,
            ranked=rank and pending is None,
            pending=pending or "",
        )
        if recommend_due(snap, key):
            reading = replace(reading, recommendation=await self.recommend(snap, key, calibration))
        if final is not None:
            canary_check, stable_check = await self._check(snap, calibration, final)
            reading = replace(reading, check=canary_check, stable_check=stable_check)
        return reading

    async def _forecast(self, snap: Snapshot, reading: TwinReading) -> Mapping[int, tuple[float, float]]:
        """The stable config's ITL and TTFT quantiles at the live rate over the replicas the planner
        may name (those running, its last decision, what the twin's capacity needs now): a count
        not yet simulated at once, all of them again after :data:`FORECAST_EVERY` or on a new fit."""
        scaling = snap.isvc.spec.scaling
        calibration = reading.calibration or self._fits.get((snap.namespace, snap.name))
        rate = snap.service_rate()
        twin = snap.status.twin
        if not scaling.plans or calibration is None or rate is None or not rate > 0:
            return {}
        counts = {snap.isvc.running_replicas()}
        if snap.status.scaling is not None and snap.status.scaling.desired_replicas:
            counts.add(snap.status.scaling.desired_replicas)
        if twin is not None and twin.capacity_req_s:
            capacity = capacity_of(twin.capacity_req_s, twin.error)
            counts.add(needed_replicas(rate * (1 + scaling.headroom), capacity, scaling))
        service = (snap.namespace, snap.name)
        cached = self._forecasts.get(service)
        forecast: dict[int, tuple[float, float]] = {}
        fresh = cached is not None and cached[0] == calibration.key and snap.now - cached[1] < FORECAST_EVERY
        if cached is not None and fresh:
            if counts <= cached[2].keys():
                return cached[2]
            forecast = dict(cached[2])  # only the counts it lacks are simulated
        config = rec.tuned_config(snap.incumbent)
        max_model_len = rec.service_facts(snap.isvc).max_model_len
        try:
            for count in sorted(c for c in counts if c > 0 and c not in forecast):
                forecast[count] = await self._compute(
                    online.predict_ms,
                    calibration.twin,
                    config,
                    rate / count,
                    sim_slo(snap),
                    max_model_len,
                    calibration.offset_ms,
                )
        except (TwinFitError, ValueError) as error:  # the planner goes on without the quantiles
            log.warning("forecast of %s/%s not simulated: %s", snap.namespace, snap.name, error)
            return {}
        since = cached[1] if cached is not None and fresh else snap.now
        self._forecasts[service] = (calibration.key, since, forecast)
        return forecast

    async def _planning(self, snap: Snapshot, reading: TwinReading) -> tuple[float, float] | None:
        """The stable config's sustained capacity at SLO and at the SLO tightened by the twin's error
        (:func:`~chunkpilot.tuner.twin.search.planning_capacity`), once per fit, for the planner."""
        calibration = reading.calibration or self._fits.get((snap.namespace, snap.name))
        if not snap.isvc.spec.scaling.plans or calibration is None:
            return None
        service = (snap.namespace, snap.name)
        cached = self._planned.get(service)
        if cached is not None and cached[0] == calibration.key:
            return cached[1]
        try:
            planned = await self._compute(
                planning_capacity,
                calibration.twin.for_planning(),
                rec.tuned_config(snap.incumbent),
                online.offset_slo(sim_slo(snap), calibration.offset_ms),
                _planning_errors(calibration),
                max_model_len=rec.service_facts(snap.isvc).max_model_len,
            )
        except (TwinFitError, ValueError) as error:  # the planner falls back on the ranking's capacity
            log.warning("planning capacity of %s/%s not simulated: %s", snap.namespace, snap.name, error)
            return None
        self._planned[service] = (calibration.key, planned)
        return planned

    async def _split(self, snap: Snapshot, reading: TwinReading) -> PoolCapacities | None:
        """A sized colocated service's replicas split into prefill and decode pools: one replica's
        capacity of each on the service's twin (the pools' knobs as the topology search starts
        them), once per fit; None: not sized, no fit yet, or not simulated. Read on the requests the
        planner sizes the colocated replicas on (:meth:`Twin.for_planning
        <chunkpilot.tuner.twin.predict.Twin.for_planning>`), so the proposal compares two counts of
        one sample: at a TTFT quantile both rest on the same longest prompts."""
        calibration = reading.calibration or self._fits.get((snap.namespace, snap.name))
        isvc, service = snap.isvc, (snap.namespace, snap.name)
        if not isvc.spec.scaling.plans or isvc.spec.disaggregated or calibration is None:
            self._splits.pop(service, None)
            return None
        cached = self._splits.get(service)
        if cached is not None and cached[0] == calibration.key:
            return cached[1]  # the same fit: its split (or its failure) stands
        stable = rec.tuned_config(snap.incumbent)
        bandwidth, latency = kv_transfer(snap)
        job = PoolCheckRequest(
            key=calibration.key,
            twin=calibration.twin.for_planning(),
            layout=starting_layout(1, 1, stable.max_num_seqs, stable.max_num_batched_tokens),
            steps_by_role={},  # no pools run: both on the service's step model
            slo=online.offset_slo(sim_slo(snap), calibration.offset_ms),
            kv_bandwidth_gbps=bandwidth,
            kv_latency_ms=latency,
            max_model_len=rec.service_facts(isvc).max_model_len,
            sustained_s=SUSTAINED_S,
        )
        try:
            found = await self._compute(layout_capacities, job)
        except (TwinFitError, ValueError, RuntimeError) as error:
            log.warning("pools of %s/%s not simulated: %s", snap.namespace, snap.name, error)
            self._splits[service] = (calibration.key, None)
            return None
        self._splits[service] = (calibration.key, found)
        return found

    async def _steps_by_role(
        self, snap: Snapshot, track: Track, window: str, at: datetime
    ) -> dict[str, dict[str, StepTotals]]:
        """Each pool's step telemetry of ``track`` over ``window`` ending at ``at``."""
        assert self.vector is not None
        return {
            role: await self._blocking(
                online.read_steps,
                self.vector,
                Selector(snap.name, snap.namespace, track, role=role),
                window,
                at,
            )
            for role in ROLES
        }

    async def _pool_sizing(self, snap: Snapshot) -> PoolCapacities | None:
        """A sized disaggregated service's pools: one replica's capacity of each, on a twin fitted to
        their own steps and their workload (:func:`pool_workload`) over the SLO window; read again after
        :data:`POOL_SIZING_EVERY` or when the pools' knobs change (None: not sized, or nothing to fit
        yet; the last reading stands while a refit fails, tried again after :data:`POOL_SIZING_RETRY`)."""
        isvc, service = snap.isvc, (snap.namespace, snap.name)
        slo_spec, topology = isvc.spec.slo, isvc.spec.topology
        if not (isvc.spec.disaggregated and isvc.spec.scaling.plans) or slo_spec is None or topology is None:
            self._pool_sizes.pop(service, None)
            self._pool_sizing_failed.pop(service, None)
            return None
        layout = pool_layout(topology, rec.tuned_config(snap.incumbent))
        key = pool_sizing_key(layout)
        cached = self._pool_sizes.get(service)
        if cached is not None and cached[1].key == key and snap.now - cached[0] < POOL_SIZING_EVERY:
            return cached[1]
        last = cached[1] if cached is not None and cached[1].key == key else None
        if self.vector is None or not isvc.spec.autotune.enabled or isvc.spec.autotune.paused:
            return last
        failed = self._pool_sizing_failed.get(service)
        if failed is not None and snap.now - failed < POOL_SIZING_RETRY:
            return last
        self._pool_sizing_failed[service] = snap.now  # until this try succeeds
        window_s = float(parse_duration(slo_spec.window))
        engine = str(isvc.spec.engine.kind)
        try:
            steps = await self._steps_by_role(snap, Track.STABLE, slo_spec.window, snap.now)
            served = {
                role: await self._blocking(
                    online.read_workload,
                    self.vector,
                    Selector(snap.name, snap.namespace, Track.STABLE, role=role),
                    slo_spec.window,
                    window_s,
                    snap.now,
                    engine,
                    segments=role == "decode",  # the pools' workload keeps the decode pool's minutes
                )
                for role in ROLES
            }
        except (MetricsUnavailableError, CaptureError) as error:
            log.info("pools of %s/%s not sized: %s", snap.namespace, snap.name, error)
            return last
        facts = rec.service_facts(isvc)
        bandwidth, latency = kv_transfer(snap)
        job = PoolSizingRequest(
            key=key,
            model=isvc.spec.model.name,
            accelerator=str(isvc.spec.resources.accelerator),
            tensor_parallel_size=isvc.spec.engine.tensor_parallel_size,
            max_model_len=facts.max_model_len,
            gpu_memory_utilization=isvc.spec.engine.gpu_memory_utilization,
            steps_by_role=steps,
            workload=pool_workload(served["prefill"], served["decode"]),
            layout=layout,
            slo=sim_slo(snap),
            kv_bandwidth_gbps=bandwidth,
            kv_latency_ms=latency,
            engine=online.engine_semantics(
                isvc.spec.engine,
                isvc.spec.model.name,
                str(isvc.spec.resources.accelerator),
                facts.max_model_len,
            ),
            colocated=rec.tuned_config(snap.incumbent),
            seed=seed_for(isvc.metadata.uid or snap.name, 0),
            measured=measured_pools(snap),
        )
        try:
            found = await self._compute(pool_capacities, job)
        except (TwinFitError, CaptureError, ValueError, RuntimeError) as error:
            log.info("pools of %s/%s not sized: %s", snap.namespace, snap.name, error)
            return last
        self._pool_sizes[service] = (snap.now, found)
        self._pool_sizing_failed.pop(service, None)
        return found

    async def _pools(self, snap: Snapshot) -> PoolCheck | None:
        """The active topology trial's layout predicted on its pools' own steps over its final window
        (computed once a trial, on the service's current fit; None: no such trial, no fit yet, or the
        pools' steps could not be read or fitted, when the verdict rests on the recommendation)."""
        active = snap.active()
        trial = active[0] if active and active[0].spec.is_topology else None
        service = (snap.namespace, snap.name)
        cached = self._pool_checks.get(service)
        if trial is None or trial.spec.topology is None or trial.spec.tries_colocated:
            self._pool_checks.pop(service, None)
            return None
        if cached is not None and cached.key == trial.metadata.name:
            return cached
        calibration = self._fits.get(service)
        if self.vector is None or calibration is None or snap.topology_window.value is None:
            return None
        window_s = parse_duration(snap.isvc.spec.autotune.trial_window)
        due = window_plan(rec.trial_progress(trial).measure_from, window_s, snap.now)
        if due is None or not due.final:
            return None
        at = due.widened_at or due.at
        window = window_text((at - due.measure_from).total_seconds())
        try:
            steps = await self._steps_by_role(snap, Track.CANARY, window, at)
        except MetricsUnavailableError as error:
            log.info("pool steps of %s/%s not read: %s", snap.namespace, snap.name, error)
            return None
        bandwidth, latency = kv_transfer(snap)
        job = PoolCheckRequest(
            key=trial.metadata.name or "",
            twin=calibration.twin,
            layout=pool_layout(trial.spec.topology, rec.tuned_config(snap.incumbent)),
            steps_by_role=steps,
            slo=online.offset_slo(sim_slo(snap), calibration.offset_ms),
            kv_bandwidth_gbps=bandwidth,
            kv_latency_ms=latency,
            max_model_len=rec.service_facts(snap.isvc).max_model_len,
        )
        try:
            check = await self._compute(check_pools, job)
        except (TwinFitError, ValueError) as error:
            log.warning("pools of %s/%s not refitted: %s", snap.namespace, snap.name, error)
            return None
        self._pool_checks[service] = check
        return check

    async def _calibrate(
        self, snap: Snapshot, request: online.Request, fitted: online.Calibration | None
    ) -> tuple[online.Calibration, str | None]:
        """The calibration of ``request`` and, while its ranking runs as a Job, what it waits for.

        A ranking within the operator's CPU budget (or with no Jobs configured) runs in the worker
        process; beyond it, the fit is made here (or ``fitted`` reused) and the ranking is a Job's,
        collected on a later tick. A Job that fails, or cannot be started, is replaced by the local
        ranking: the service is tuned either way.
        """
        jobs = self.jobs
        if not request.rank or jobs is None or jobs.offload.local(time.monotonic(), request.cpu_budget_s):
            return await self._calibrate_here(request), None
        fit = (
            fitted
            if fitted is not None
            else await self._compute(online.calibrate, replace(request, rank=False))
        )
        uid = snap.isvc.metadata.uid or ""
        try:
            job = await jobs.ranking(snap.namespace, snap.name, uid, request)
        except KubeError as error:
            log.warning(
                "twin Job for %s/%s could not start (%s); ranking here", snap.namespace, snap.name, error
            )
            return await self._calibrate_here(request), None
        if job.result is not None:
            return with_ranking(fit, job.result), None
        if job.state.phase is JobPhase.FAILED:
            log.warning("twin Job %s failed (%s); ranking here", job.job, job.state.message)
            return await self._calibrate_here(request), None
        return fit, f"the ranking on the twin runs as Job {job.job} ({job.state.message})"

    async def _calibrate_here(self, request: online.Request) -> online.Calibration:
        calibration = await self._compute(online.calibrate, request)
        if request.rank and self.jobs is not None:
            self.jobs.offload.spent(time.monotonic(), calibration.cpu_seconds)
        return calibration

    async def recommend(
        self, snap: Snapshot, key: str, calibration: online.Calibration
    ) -> RecommendationResult:
        """Prefill/decode splits of the service's replicas on the twin (in the worker process)."""
        job = request(snap, key, calibration, sim_slo(snap), cpu_budget_s=self.budget.cpu_s)
        try:
            return RecommendationResult(key, await self._compute(recommend, job))
        except (TwinFitError, ValueError) as error:
            return RecommendationResult(key, error=str(error))

    async def _trial_steps(self, snap: Snapshot, trial: TuningTrial) -> dict[str, StepTotals]:
        """The canary steps of a finished trial's window (read once per trial)."""
        name = f"{snap.namespace}/{trial.metadata.name}"
        if name not in self._canary_steps:
            assert self.vector is not None and trial.status is not None and trial.status.finished_at
            selector = Selector(
                snap.name, snap.namespace, Track.CANARY, config_hash=rec.canary_config_hash(trial)
            )
            window = (trial.status.canary.window if trial.status.canary else None) or trial.spec.window
            steps = await self._blocking(
                online.read_steps, self.vector, selector, window, trial.status.finished_at
            )
            self._canary_steps[name] = steps
        return self._canary_steps[name]

    async def _check(
        self, snap: Snapshot, calibration: online.Calibration, final: CanaryWindow
    ) -> tuple[online.CanaryCheck | None, online.CanaryCheck | None]:
        """The twin against the canary and against the stable track, over the trial's window."""
        window = snap.widened.value or snap.window.value
        if window is None:
            return None, None
        canary = await self._track_check(
            snap,
            calibration,
            window.canary,
            Track.CANARY,
            final.trial.spec.params,
            rec.canary_config_hash(final.trial),
        )
        stable = await self._track_check(
            snap, calibration, window.stable, Track.STABLE, snap.incumbent, snap.incumbent.config_hash()
        )
        return canary, stable

    async def _track_check(
        self,
        snap: Snapshot,
        calibration: online.Calibration,
        track: TrackMeasurement,
        name: Track,
        params: EngineConfig,
        config_hash: str,
    ) -> online.CanaryCheck | None:
        """Predict one track's quantiles at its live load in the window and compare."""
        rate = track.per_replica(track.request_rate)
        if rate is None or self.vector is None:
            return None
        selector = Selector(snap.name, snap.namespace, name, config_hash=config_hash)
        try:
            fine, bands = await self._blocking(
                online.fine_quantiles_ms,
                self.vector,
                selector,
                track.window,
                track.time,
                (snap.slo.itl_quantile, snap.slo.ttft_quantile),
                (track.itl_samples, track.ttft_samples),
            )
        except MetricsUnavailableError:
            return None
        measured = (fine[0] or track.itl_ms, fine[1] or track.ttft_ms)
        facts = rec.service_facts(snap.isvc)
        return await self._compute(
            online.check_canary,
            calibration,
            rec.tuned_config(params),
            rate,
            measured,
            sim_slo(snap),
            facts.max_model_len,
            bands,
            float(parse_duration(track.window)),
        )

    async def _blocking(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Blocking I/O (Prometheus) off the event loop."""
        if self._inline:
            return fn(*args, **kwargs)
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def _compute(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """CPU-bound work (fits, simulations, the search) in the worker process."""
        if self._inline:
            return fn(*args, **kwargs)
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                max_workers=1, mp_context=multiprocessing.get_context("spawn"), initializer=_lower_priority
            )
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, _call, fn, args, kwargs)
        except BrokenProcessPool as error:
            self._pool = None
            raise TwinFitError(f"the twin's worker process failed: {error}") from error

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def _call(fn: Callable[..., T], args: tuple[object, ...], kwargs: dict[str, object]) -> T:
    return fn(*args, **kwargs)


def _lower_priority() -> None:
    """The worker yields the CPU to everything else (engines sharing the node, the operator's loop)."""
    with contextlib.suppress(OSError):
        os.nice(10)
