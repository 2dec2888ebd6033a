"""Ask the twin: capacity at SLO of a configuration, and latency quantiles at a given load.

The twin is the simulator with the fitted step profile (:class:`~chunkpilot.tuner.twin.fit.TwinFit`)
and the captured workload. Capacity comes from the simulator's own search
(:func:`~chunkpilot.engine.sim.capacity.find_capacity`) over the captured request lengths; the cost of
one answer is set by ``requests`` (simulated per probed rate) and ``tolerance`` (bisection width).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Final

import numpy as np
from chunkpilot.engine.sim.capacity import DEFAULT_GROWTH, CapacityResult, find_capacity, retime
from chunkpilot.engine.sim.engine import SimConfig
from chunkpilot.engine.sim.metrics import StepTelemetry
from chunkpilot.engine.sim.offline import SLO, EngineRun, Summary, new_request, quantile, simulate
from chunkpilot.engine.sim.scheduler import SchedulerConfig
from chunkpilot.engine.sim.workload import Workload
from chunkpilot.tuner.twin.fit import TwinFit, step_spread

from chunkpilot.api.knobs import TUNABLE_NAMES

__all__ = [
    "ARRIVAL_SAMPLES",
    "CAPACITY_REQUESTS",
    "CAPACITY_TOLERANCE",
    "SAMPLE_GROWTH",
    "SUSTAINED_SAMPLES",
    "LatencyQuantiles",
    "Twin",
    "arrival_seeds",
    "relative_errors",
]

#: Requests simulated per probed rate and the bisection's relative width in a capacity prediction:
#: about 1 CPU second for an 8B model on H100 (the accuracy/cost trade-off is in docs/tuning.md).
CAPACITY_REQUESTS: Final = 400
CAPACITY_TOLERANCE: Final = 0.03
#: Arrival samples the operator's twin averages each ranked capacity over. On one sample a
#: configuration's capacity moves by up to 30% with the draw, as much as near-tied configurations
#: differ; on two, the hidden-truth benchmark reaches its goal (docs/benchmarks.md).
ARRIVAL_SAMPLES: Final = 2
#: Arrival samples a capacity the replica planner sizes with is averaged over (:meth:`Twin.for_planning`).
SUSTAINED_SAMPLES: Final = 8
#: The first seed of a twin's own arrival samples when it averages several (:func:`arrival_seeds`).
OWN_SEEDS: Final = 1000
#: The bracket's growth per probe on the samples after the first, which start at the first's capacity.
SAMPLE_GROWTH: Final = 1.1
#: Windows of a measurement's length :meth:`Twin.window_spread` simulates (after one to warm up), and
#: the share of them left out at each end of the range it states.
SPREAD_WINDOWS: Final = 12
SPREAD_TAIL: Final = 0.1
#: Requests those windows may simulate in all: fewer windows (never under :data:`MIN_SPREAD_WINDOWS`)
#: at a high rate over long windows, so a check stays within a fraction of a CPU second.
SPREAD_REQUESTS: Final = 20_000
MIN_SPREAD_WINDOWS: Final = 4
#: The arrival seed of those windows (none of a benchmark's ground truth uses it).
SPREAD_SEED: Final = 2000
#: The fitted profile with the dispersion of single step times, beside the twin's own.
SPREAD_PROFILE: Final = "twin-step-profile-spread.json"


@dataclass(frozen=True, slots=True)
class LatencyQuantiles:
    """The quantiles the twin's error is stated in (milliseconds)."""

    itl_p50_ms: float
    itl_p99_ms: float
    ttft_p50_ms: float
    ttft_p95_ms: float

    @classmethod
    def of(cls, summary: Summary) -> LatencyQuantiles:
        """The quantiles of an offline simulation."""
        return cls(summary.itl_ms.p50, summary.itl_ms.p99, summary.ttft_ms.p50, summary.ttft_ms.p95)


def relative_errors(predicted: LatencyQuantiles, measured: LatencyQuantiles) -> dict[str, float]:
    """``predicted / measured - 1`` per quantile (NaN where nothing was measured)."""
    out: dict[str, float] = {}
    for f in fields(LatencyQuantiles):
        name = f.name
        p, m = getattr(predicted, name), getattr(measured, name)
        out[name] = p / m - 1 if m and math.isfinite(m) and math.isfinite(p) else math.nan
    return out


@dataclass(frozen=True, slots=True)
class Twin:
    """A service's twin: the fitted step profile (written to ``profile_path``) and its workload."""

    fit: TwinFit
    workload: Workload
    profile_path: Path
    gpu_memory_utilization: float = 0.92
    #: The engine's own scheduler (its kind's semantics and the knobs the tuner does not move); a
    #: configuration's tuned knobs replace its values. None: vLLM's defaults.
    engine: SchedulerConfig | None = None
    #: Seeds of the Poisson arrival samples a ranked capacity is averaged over
    #: (:func:`~chunkpilot.tuner.twin.search.evaluate_on_twin`; see :func:`arrival_seeds`).
    arrival_seeds: tuple[int, ...] = (0,)
    #: A larger sample of the same captured window that a sustained capacity is planned on
    #: (:meth:`for_planning`); None: :attr:`workload`.
    sustained_workload: Workload | None = None

    @classmethod
    def build(
        cls,
        fit: TwinFit,
        workload: Workload,
        directory: Path,
        *,
        gpu_memory_utilization: float = 0.92,
        engine: SchedulerConfig | None = None,
        arrival_seeds: tuple[int, ...] = (0,),
        sustained_workload: Workload | None = None,
    ) -> Twin:
        """Write the fitted profile under ``directory`` and return the twin that loads it."""
        path = fit.write_profile(directory / "twin-step-profile.json")
        if fit.dispersion:
            fit.write_profile(path.with_name(SPREAD_PROFILE), spread=True)
        return cls(fit, workload, path, gpu_memory_utilization, engine, arrival_seeds, sustained_workload)

    def for_planning(self) -> Twin:
        """This twin as the replica planner sizes with it: on its :attr:`sustained_workload`, where
        it has one, averaged over :data:`SUSTAINED_SAMPLES` arrival samples.

        Ranking compares configurations on the same draws, so their errors are shared; a planned
        capacity is an absolute number. At a TTFT quantile it rests on the few longest prompts, which
        the ranking's sample is too small to place (see
        :data:`~chunkpilot.tuner.twin.online.SUSTAINED_REQUESTS`), and near saturation on how the
        Poisson arrivals bunch: one configuration's capacity ranged over 1.73-2.15 req/s across
        twelve arrival samples of one workload.
        """
        workload = self.workload if self.sustained_workload is None else self.sustained_workload
        return replace(self, workload=workload, arrival_seeds=arrival_seeds(SUSTAINED_SAMPLES))

    def with_dispersion(
        self, measured: Mapping[str, Sequence[float]], scheduler: SchedulerConfig, workload: Workload
    ) -> Twin:
        """This twin with the spread of single step times ``measured`` (step-duration histograms per
        token bucket, :data:`~chunkpilot.tuner.twin.capture.StepDurations`) beyond what its own steps
        show replaying ``workload`` on ``scheduler`` (:func:`~chunkpilot.tuner.twin.fit.step_spread`).

        Latency predictions (:meth:`latency`, ``config(..., spread=True)``) then draw each step's
        time; capacities stay on the steps' modelled times (one deterministic search per sample).
        """
        replay = StepTelemetry()
        simulate(self.config(scheduler), workload, telemetry=replay)
        fit = replace(self.fit, dispersion=step_spread(measured, replay.duration_counts()))
        if fit.dispersion:
            fit.write_profile(self.profile_path.with_name(SPREAD_PROFILE), spread=True)
        return replace(self, fit=fit)

    def slowed(self, slowdown: float) -> Twin:
        """This twin with every step ``slowdown`` times longer (its profile written beside this one's)."""
        if slowdown == 1.0:
            return self
        path = self.profile_path.with_name(f"twin-step-profile-x{slowdown:.6f}.json")
        if not path.exists():
            self.fit.write_profile(path, slowdown)
        return replace(self, profile_path=path)

    def config(self, scheduler: SchedulerConfig, *, spread: bool = False) -> SimConfig:
        """The simulated engine of configuration ``scheduler`` on the fitted hardware (on :attr:`engine`);
        ``spread``: with the fit's dispersion of single step times, where it has one."""
        if self.engine is not None:
            tuned = {name: getattr(scheduler, name) for name in (*TUNABLE_NAMES, "max_model_len")}
            scheduler = replace(self.engine, **tuned)
        return SimConfig(
            model=self.fit.model,
            accelerator=self.fit.accelerator,
            tensor_parallel_size=self.fit.tensor_parallel_size,
            scheduler=scheduler,
            gpu_memory_utilization=self.gpu_memory_utilization,
            step_profile=str(
                self.profile_path.with_name(SPREAD_PROFILE)
                if spread and self.fit.dispersion
                else self.profile_path
            ),
        )

    def _requests(self, requests: int | None) -> Workload:
        if requests is None or requests >= len(self.workload.requests):
            return self.workload
        return replace(self.workload, requests=self.workload.requests[:requests])

    def capacity(
        self,
        scheduler: SchedulerConfig,
        slo: SLO,
        *,
        requests: int = CAPACITY_REQUESTS,
        tolerance: float = CAPACITY_TOLERANCE,
        start_rate: float | None = None,
        seed: int = 0,
        growth: float = DEFAULT_GROWTH,
        min_duration_s: float = 0.0,
    ) -> CapacityResult:
        """Predicted capacity at SLO (requests/s for one replica) of configuration ``scheduler``
        on one arrival sample (``seed``); the search starts at the captured arrival rate. With
        ``min_duration_s`` the capacity is one the replica sustains that long (see
        :func:`~chunkpilot.engine.sim.capacity.find_capacity`). A probe whose TTFT quantile has
        missed for certain stops there (the same verdicts, less simulation)."""
        workload = self._requests(requests)
        start = start_rate if start_rate is not None else _arrival_rate(self.workload)
        return find_capacity(
            self.config(scheduler),
            workload,
            slo,
            tolerance=tolerance,
            start_rate=start,
            seed=seed,
            growth=growth,
            min_duration_s=min_duration_s,
            stop_on_miss=True,
        )

    def latency(
        self,
        scheduler: SchedulerConfig,
        rate: float,
        slo: SLO | None = None,
        *,
        requests: int | None = None,
        seed: int = 0,
    ) -> LatencyQuantiles:
        """Predicted ITL and TTFT quantiles of ``scheduler`` at a Poisson load of ``rate`` requests/s
        (single steps spread as the engine's, where the fit has a dispersion)."""
        summary = simulate(
            self.config(scheduler, spread=True), retime(self._requests(requests), rate, seed), slo
        )
        return LatencyQuantiles.of(summary)

    def window_spread(
        self, scheduler: SchedulerConfig, rate: float, slo: SLO, window_s: float
    ) -> tuple[tuple[float, float], tuple[float, float]]:
        """How far the SLO quantiles a window of ``window_s`` seconds shows stray from those of a
        long run, at a Poisson load of ``rate`` requests/s: per quantile (ITL, TTFT), the
        :data:`SPREAD_TAIL` and ``1 -`` :data:`SPREAD_TAIL` quantiles of the windows' values over the
        value of all of them together, from :data:`SPREAD_WINDOWS` consecutive windows on the twin
        (fewer where they would simulate more than :data:`SPREAD_REQUESTS` requests).

        A window's ITL p99 rests on the few steps that carried a long prompt's prefill in it, and its
        TTFT quantile on a hundred or so requests, so a window's value strays from the long run far
        more than counting its tokens suggests. ``(1, 1)`` where too little arrived to tell.
        """
        none = ((1.0, 1.0), (1.0, 1.0))
        if not (rate > 0 and window_s > 0):
            return none
        affordable = int(SPREAD_REQUESTS / (rate * window_s)) - 1
        windows = max(MIN_SPREAD_WINDOWS, min(SPREAD_WINDOWS, affordable))
        workload = retime(self.workload, rate, SPREAD_SEED, min_duration_s=(windows + 1) * window_s)
        core = self.config(scheduler, spread=True).build()
        run = EngineRun(core, not core.steps_spread)
        max_len = core.scheduler.config.max_model_len
        requests = [
            new_request(i, r.arrival_s, r.prompt_tokens, r.output_tokens, r.block_hashes, max_len)
            for i, r in enumerate(workload.requests)
        ]
        run.add(requests)
        run.advance(window_s)
        run.take_itl()  # the first window warms the engine up
        itl: list[tuple[np.ndarray, np.ndarray]] = []
        for k in range(2, windows + 2):
            run.advance(k * window_s)
            itl.append(run.take_itl())
        run.advance()
        end = (windows + 1) * window_s
        firsts = [
            (r.first_token_s, r.first_token_s - r.arrival_s) for r in requests if r.first_token_s is not None
        ]
        ttft = [
            np.asarray([t for at, t in firsts if (k + 1) * window_s <= at < (k + 2) * window_s])
            for k in range(windows)
        ]
        whole_itl = quantile(
            np.concatenate([v for v, _ in itl]), slo.itl_quantile, np.concatenate([w for _, w in itl])
        )
        whole_ttft = quantile(np.asarray([t for at, t in firsts if window_s <= at < end]), slo.ttft_quantile)
        return (
            _spread([quantile(v, slo.itl_quantile, w) for v, w in itl], whole_itl),
            _spread([quantile(t, slo.ttft_quantile) for t in ttft], whole_ttft),
        )


def _spread(values: Sequence[float], whole: float) -> tuple[float, float]:
    """The :data:`SPREAD_TAIL` range of ``values`` relative to ``whole``; ``(1, 1)`` if unknown."""
    known = np.asarray([v for v in values if math.isfinite(v)])
    if known.size < MIN_SPREAD_WINDOWS or not (math.isfinite(whole) and whole > 0):
        return 1.0, 1.0
    low, high = np.quantile(known, (SPREAD_TAIL, 1 - SPREAD_TAIL))
    return min(1.0, float(low) / whole), max(1.0, float(high) / whole)


def arrival_seeds(samples: int) -> tuple[int, ...]:
    """The seeds of ``samples`` arrival samples: seed 0 alone (the twin's single draw), or the
    twin's own from :data:`OWN_SEEDS` on, none of which a benchmark's ground truth uses."""
    if samples < 1:
        raise ValueError("a capacity needs at least one arrival sample")
    return (0,) if samples == 1 else tuple(OWN_SEEDS + k for k in range(samples))


def _arrival_rate(workload: Workload) -> float:
    arrivals = [r.arrival_s for r in workload.requests]
    span = arrivals[-1] - arrivals[0] if len(arrivals) > 1 else 0.0
    return (len(arrivals) - 1) / span if span > 0 else 1.0
