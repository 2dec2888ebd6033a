"""The twin in the tuning loop: read its inputs from Prometheus, calibrate, rank, check a canary.

Three steps, each a plain function of plain values (so it can run in a worker process):

* :func:`read_inputs` (blocking I/O, observe only): the stable track's step telemetry and workload
  over the SLO window, the fine latency quantiles it measured, and the steps of the latest
  canary, queried as instant vectors;
* :func:`calibrate` (CPU): fit the step-time model to all those steps, synthesise the captured
  workload, predict the stable track's quantiles at its live load (the twin's error) and, when
  asked, rank the search space on the twin (:func:`chunkpilot.tuner.twin.search.search_on_twin`);
* :func:`check_canary` (CPU, one simulation): the twin's quantiles for a canary's config at the
  canary's live load, against what the canary measured.

The step-time model describes the hardware, not the configuration, so a canary's steps refit the
same model: each finished trial's steps enter the next calibration (``refit_trial``).
"""

from __future__ import annotations

import logging
import math
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from pathlib import Path
from typing import Final, Protocol

from chunkpilot.engine import metrics_names as names
from chunkpilot.engine.sim.capacity import retime
from chunkpilot.engine.sim.metrics import StepTotals
from chunkpilot.engine.sim.offline import SLO, simulate
from chunkpilot.engine.sim.scheduler import (
    SchedulerConfig,
)
from chunkpilot.operator.engines import support
from chunkpilot.tuner.measure import MetricsUnavailableError, Selector, VectorFn
from chunkpilot.tuner.policy import AGREEMENT_FLOOR
from chunkpilot.tuner.space import SearchSpace, TunedConfig
from chunkpilot.tuner.twin.capture import (
    MIN_REQUESTS,
    MIN_SEGMENTS,
    SEGMENT_S,
    CaptureError,
    StepDurations,
    WorkloadWindow,
    durations_from_vector,
    segment_queries,
    segments_from_results,
    step_duration_query,
    step_queries,
    steps_from_vectors,
    synthesize,
    workload_from_vectors,
    workload_queries,
)
from chunkpilot.tuner.twin.fit import MIN_STEPS, TwinFit, fit_steps
from chunkpilot.tuner.twin.predict import ARRIVAL_SAMPLES, Twin, arrival_seeds
from chunkpilot.tuner.twin.search import (
    ERROR_POINTS,
    Candidate,
    evaluate_on_twin,
    robust_ranking,
    scheduler_of,
    search_on_twin,
)

from chunkpilot.api import EngineSpec, Objective

log = logging.getLogger(__name__)

__all__ = [
    "TOLERANCE",
    "Calibration",
    "CanaryCheck",
    "Inputs",
    "Request",
    "TwinBudget",
    "band_quantiles",
    "build_twin",
    "calibrate",
    "capacity_unit",
    "check_canary",
    "fine_quantiles_ms",
    "merge_steps",
    "pods_changed",
    "predict_ms",
    "quantile_error",
    "read_inputs",
    "read_steps",
    "read_workload",
    "unsteady_reason",
    "waiting_reason",
    "widened",
]

#: The twin's error (the larger relative error of its ITL and TTFT quantiles beyond the measurement's
#: sampling band, :func:`quantile_error`) up to which its prediction counts as confirmed: above it,
#: nothing is promoted on the prediction alone.
TOLERANCE: Final = 0.15
#: Largest share of an SLO target the engine's latency outside its steps may take (:func:`latency_offsets`).
MAX_OFFSET_SHARE: Final = 0.25
#: CPU seconds one ranking may spend (one tick of one service) unless the tuner's settings say
#: otherwise (``CHUNKPILOT_TWIN_CPU_SECONDS``, :class:`chunkpilot.tuner.config.TunerConfig`).
DEFAULT_CPU_SECONDS: Final = 30.0
#: Requests of the synthetic workload (the capacity search simulates these per probed rate).
WORKLOAD_REQUESTS: Final = 400
#: Requests of the larger sample a sustained capacity is planned on (:meth:`Twin.for_planning
#: <chunkpilot.tuner.twin.predict.Twin.for_planning>`). TTFT p95 over 400 requests rests on the 20
#: longest prompts: on a code-completion trace the planned capacity of one configuration moved from
#: 1.05 to 1.68 req/s with the sample's seed (the truth: 1.26); over 1,000 it stayed within 1.16-1.39.
SUSTAINED_REQUESTS: Final = 1000
#: Candidates kept on the service status.
MAX_CANDIDATES: Final = 8


@dataclass(frozen=True)
class TwinBudget:
    """What one ranking on the twin may spend (the tuner's settings, passed down to each request)."""

    #: CPU seconds (``CHUNKPILOT_TWIN_CPU_SECONDS``).
    cpu_s: float = DEFAULT_CPU_SECONDS
    #: Evaluations as well (``CHUNKPILOT_TWIN_MAX_EVALUATIONS``; None: the CPU seconds alone end it).
    #: A count ends the search alike on a busy and a quiet machine.
    max_evaluations: int | None = None


def capacity_unit(objective: Objective) -> str:
    return "tok/s/GPU" if objective is Objective.THROUGHPUT else "req/s/GPU"


Band = tuple[float, float]
"""The range (ms) a measured quantile's sampling error allows: the quantiles ``q -/+ delta``."""


def band_quantiles(q: float, samples: float, z: float = 2.0) -> tuple[float, float]:
    """The quantiles ``q -/+ z * sqrt(q (1 - q) / n)`` bracketing what ``n`` samples can tell apart."""
    delta = z * math.sqrt(q * (1 - q) / samples) if samples > 0 else 0.5
    return max(0.5, q - delta), min(0.9999, q + delta)


def widened(
    bands: tuple[Band | None, Band | None],
    measured: tuple[float | None, float | None],
    spread: tuple[tuple[float, float], tuple[float, float]],
) -> tuple[Band | None, Band | None]:
    """Each measured quantile's band widened by how far a window's quantile strays from the long
    run's (``spread``: :meth:`~chunkpilot.tuner.twin.predict.Twin.window_spread`, per quantile the
    low and high ratio of a window's value to the long run's): a long run that shows ``m / high``
    to ``m / low`` may show ``m`` in one window, so a prediction (of the long run) in that range
    cannot be told from it."""
    out: list[Band | None] = []
    for band, m, (low, high) in zip(bands, measured, spread, strict=True):
        if m is None or m <= 0 or (low, high) == (1.0, 1.0):
            out.append(band)
            continue
        lowest, highest = band if band is not None else (m, m)
        out.append((min(lowest, m / high), max(highest, m / low)))
    return out[0], out[1]


def quantile_errors(
    predicted: tuple[float, float],
    measured: tuple[float | None, float | None],
    bands: tuple[Band | None, Band | None] = (None, None),
) -> tuple[float, float]:
    """The relative error of the ITL and of the TTFT quantile; NaN where nothing compares.

    Where the measurement's sampling band is known, the error is how far the prediction lies outside
    it (``p / high - 1`` above, ``low / p - 1`` below, 0 inside): a quantile measured from a few
    samples cannot contradict a prediction within its own uncertainty.
    """
    errors = []
    for p, m, band in zip(predicted, measured, bands, strict=True):
        if m is None or m <= 0 or not math.isfinite(p) or p <= 0:
            errors.append(math.nan)
        elif band is None:
            errors.append(abs(p / m - 1.0))
        else:
            low, high = min(band[0], m), max(band[1], m)
            errors.append(max(0.0, p / high - 1.0, low / p - 1.0))
    return errors[0], errors[1]


def quantile_error(
    predicted: tuple[float, float],
    measured: tuple[float | None, float | None],
    bands: tuple[Band | None, Band | None] = (None, None),
) -> float:
    """The larger of :func:`quantile_errors`; NaN when nothing compares."""
    return largest_error(quantile_errors(predicted, measured, bands))


def largest_error(errors: tuple[float, float]) -> float:
    """The larger of two quantiles' errors; NaN when neither compares (both NaN)."""
    return max((e for e in errors if not math.isnan(e)), default=math.nan)


# --------------------------------------------------------------------------- reading (observe)


@dataclass(frozen=True)
class Inputs:
    """What Prometheus holds for the twin over one window of the stable track."""

    #: The engine exports step telemetry at all (the series exist).
    exported: bool
    steps: Mapping[str, StepTotals] = field(default_factory=dict)
    workload: WorkloadWindow | None = None
    workload_error: str | None = None
    #: Fine-histogram quantiles (ITL, TTFT) the stable track measured, ms (None: no data), and
    #: their sampling bands.
    measured_ms: tuple[float | None, float | None] = (None, None)
    bands: tuple[Band | None, Band | None] = (None, None)
    #: Prometheus has the engine's other series (without them, nothing is known yet: not scraped).
    seen: bool = True
    #: The service's pods that came up, and went away, inside the window (see :func:`pods_changed`).
    pods_changed: tuple[int, int] = (0, 0)
    window: str = ""
    #: The step-duration histogram per token bucket (the spread of single steps).
    durations: StepDurations = field(default_factory=dict)

    @property
    def step_count(self) -> float:
        return sum(t.steps for t in self.steps.values())


def fine_quantiles_ms(
    vector: VectorFn,
    selector: Selector,
    window: str,
    at: datetime,
    quantiles: tuple[float, float],
    samples: tuple[float, float] = (0.0, 0.0),
) -> tuple[tuple[float | None, float | None], tuple[Band | None, Band | None]]:
    """ITL and TTFT quantiles from the engines' fine histograms (None: no data), with their bands.

    ``samples`` (ITL tokens, requests) size each band (:func:`band_quantiles`); 0: no band.
    """

    def at_quantile(name: str, q: float) -> float | None:
        query = f"histogram_quantile({q:g}, sum by (le) (rate({name}_bucket{selector.render()}[{window}])))"
        value = _first_value(vector, query, at)
        return value * 1000.0 if value is not None else None

    values: list[float | None] = []
    bands: list[Band | None] = []
    names_ = (names.FINE_INTER_TOKEN_LATENCY, names.FINE_TIME_TO_FIRST_TOKEN)
    for name, q, n in zip(names_, quantiles, samples, strict=True):
        value = at_quantile(name, q)
        values.append(value)
        low_q, high_q = band_quantiles(q, n)
        low, high = (at_quantile(name, low_q), at_quantile(name, high_q)) if n > 0 and value else (None, None)
        bands.append((low, high) if low is not None and high is not None else None)
    return (values[0], values[1]), (bands[0], bands[1])


def read_steps(vector: VectorFn, selector: Selector, window: str, at: datetime) -> dict[str, StepTotals]:
    """Step totals per scheduled-token bucket of ``selector`` over ``window`` ending at ``at``."""
    queries = step_queries(selector.render()[1:-1], window)
    return steps_from_vectors({key: vector(q, at) for key, q in queries.items()})


def read_workload(
    vector: VectorFn,
    selector: Selector,
    window: str,
    window_s: float,
    at: datetime,
    engine: str = "vllm",
    *,
    segments: bool = False,
) -> WorkloadWindow:
    """The workload ``selector``'s pods served over ``window`` (``window_s`` seconds) ending at ``at``;
    ``segments``: with its :attr:`~WorkloadWindow.segments` (the same family of length histograms
    over each minute; none where the window is shorter than two, or Prometheus answers no matrix).

    Raises :class:`CaptureError` when its histograms cannot describe one.
    """
    queries = workload_queries(selector.render()[1:-1], window, engine)
    workload = workload_from_vectors({key: vector(q, at) for key, q in queries.items()}, window_s)
    if not segments or window_s < MIN_SEGMENTS * SEGMENT_S:
        return workload
    fine = workload.prompt_tokens.bounds == tuple(names.FINE_REQUEST_TOKENS_BUCKETS)
    matrices = segment_queries(selector.render()[1:-1], window, fine=fine)
    # A subquery's points fall on whole minutes: the segments end at the last one before ``at``.
    try:
        answers = {key: vector(q, at) for key, q in matrices.items()}
    except MetricsUnavailableError as error:  # the whole window describes the workload without them
        log.info("the minutes of %s's workload not read: %s", selector.render(), error)
        return workload
    return replace(workload, segments=segments_from_results(answers))


def read_inputs(
    vector: VectorFn,
    selector: Selector,
    window: str,
    window_s: float,
    at: datetime,
    quantiles: tuple[float, float],
    samples: tuple[float, float] = (0.0, 0.0),
    engine: str = "vllm",
    steadiness: bool = True,
    segments: bool = False,
) -> Inputs:
    """The stable track's twin inputs (raises :class:`MetricsUnavailableError` when Prometheus fails).

    ``engine``: the engine kind, whose prefix-cache series the workload is read from.
    ``steadiness``: also ask whether the service's pods changed in the window (:func:`pods_changed`);
    off where the answer is not used (a canary's verdict judges its own window). ``segments``: read
    the workload's minutes too (:func:`read_workload`), for the replica planner's sample.
    """
    exported = vector(f"count({names.STEP_DURATION}_count{selector.render()})", at)
    if not exported:
        seen = vector(f"count({names.REQUEST_SUCCESS}{selector.render()})", at)
        return Inputs(exported=False, seen=bool(seen))
    steps = read_steps(vector, selector, window, at)
    try:
        workload: WorkloadWindow | None = read_workload(
            vector, selector, window, window_s, at, engine, segments=segments
        )
        error = None
    except CaptureError as exc:
        workload, error = None, str(exc)
    measured, bands = fine_quantiles_ms(vector, selector, window, at, quantiles, samples)
    durations = durations_from_vector(vector(step_duration_query(selector.render()[1:-1], window), at))
    return Inputs(
        True,
        steps,
        workload,
        error,
        measured,
        bands,
        pods_changed=pods_changed(vector, selector, window, at) if steadiness else (0, 0),
        window=window,
        durations=durations,
    )


def pods_changed(vector: VectorFn, selector: Selector, window: str, at: datetime) -> tuple[int, int]:
    """Pods of ``selector``'s service (every track) that came up, and that went away, inside the window.

    Such a window is not one steady state: a promotion's new stable pods start inside it and take
    the whole load, a canary's start or end moves half of it, so the stable track's latencies mix
    two loads while its request rate averages them.
    """
    sel = replace(selector, track=None, config_hash=None, role=None).render()
    now, before = f"(up{sel} == 1)", f"(up{sel} offset {window} == 1)"
    came = _first_value(vector, f"count({now} unless {before})", at)
    went = _first_value(vector, f"count({before} unless {now})", at)
    return int(came or 0), int(went or 0)


def _first_value(vector: VectorFn, query: str, at: datetime) -> float | None:
    """The first finite value of an instant query's result (None: no data)."""
    values = (float(item["value"][1]) for item in vector(query, at) if "value" in item)
    return next((v for v in values if math.isfinite(v)), None)


def merge_steps(*telemetry: Mapping[str, StepTotals]) -> dict[str, StepTotals]:
    """Bucket-wise sums of several step telemetries."""
    out: dict[str, StepTotals] = {}
    for one in telemetry:
        for label, totals in one.items():
            before = out.get(label, StepTotals())
            out[label] = StepTotals(
                *(getattr(before, f.name) + getattr(totals, f.name) for f in fields(totals))
            )
    return out


def waiting_reason(inputs: Inputs) -> str | None:
    """Why the twin cannot be fitted yet from ``inputs`` (None: it can)."""
    if inputs.step_count < MIN_STEPS:
        return (
            f"{inputs.step_count:g} engine steps in the window, {MIN_STEPS} needed to fit the step-time model"
        )
    if inputs.workload is None:
        return inputs.workload_error or "no workload captured"
    if inputs.workload.prompt_tokens.count < MIN_REQUESTS:
        seen = inputs.workload.prompt_tokens.count
        return f"{seen:.0f} finished requests in the window, {MIN_REQUESTS} needed to capture the workload"
    return None


def unsteady_reason(inputs: Inputs) -> str | None:
    """Why the window is not one steady state (:func:`pods_changed`); None: it is."""
    came, went = inputs.pods_changed
    if not (came or went):
        return None
    return (
        f"the service's pods changed in the last {inputs.window or 'window'} ({came} came up, {went} "
        "went away: a roll-out, a canary's start or end)"
    )


# --------------------------------------------------------------------------- computing


@dataclass(frozen=True)
class Request:
    """Everything one calibration needs (picklable: it may run in a worker process)."""

    key: str
    model: str
    accelerator: str
    tensor_parallel_size: int
    max_model_len: int
    gpu_memory_utilization: float
    steps: Mapping[str, StepTotals]
    workload: WorkloadWindow
    slo: SLO
    space: SearchSpace
    incumbent: TunedConfig
    stable_rate_req_s: float
    measured_ms: tuple[float | None, float | None]
    objective: Objective
    seed: int
    rank: bool
    cpu_budget_s: float = DEFAULT_CPU_SECONDS
    #: At most this many evaluations as well (None: the CPU budget alone ends the search).
    max_evaluations: int | None = None
    exclude: tuple[TunedConfig, ...] = ()
    warm: tuple[TunedConfig, ...] = ()
    directory: str | None = None
    bands: tuple[Band | None, Band | None] = (None, None)
    #: The service's engine scheduling semantics (:func:`engine_semantics`); None: vLLM's.
    engine: SchedulerConfig | None = None
    #: The stable track's step-duration histograms (the twin's dispersion; empty: none).
    durations: StepDurations = field(default_factory=dict)


def engine_semantics(
    spec: EngineSpec, model: str, accelerator: str, max_model_len: int
) -> SchedulerConfig | None:
    """The scheduler the twin simulates the service's engine with: its kind's hook
    (:attr:`EngineSupport.twin_semantics <chunkpilot.operator.engines.EngineSupport>`; SGLang's,
    TensorRT-LLM's), None for vLLM's."""
    hook = support(spec.kind).twin_semantics
    return None if hook is None else hook(spec, model, accelerator, max_model_len)


@dataclass(frozen=True)
class Calibration:
    """A fitted twin and what it says about the stable track (and the space, when ranked)."""

    key: str
    fit: TwinFit
    twin: Twin
    predicted_ms: tuple[float, float]
    error: float
    ranked: tuple[Candidate, ...] = ()
    incumbent: Candidate | None = None
    evaluations: int = 0
    cpu_seconds: float = 0.0
    #: What the engine adds to ITL and TTFT outside its steps (ms), from the stable track.
    offset_ms: tuple[float, float] = (0.0, 0.0)
    #: ``error`` per quantile (ITL, TTFT; NaN where nothing compares): the replica planner tightens
    #: each target by its own.
    errors: tuple[float, float] = (math.nan, math.nan)


def predict_ms(
    twin: Twin,
    config: TunedConfig,
    rate: float,
    slo: SLO,
    max_model_len: int,
    offset_ms: tuple[float, float] = (0.0, 0.0),
) -> tuple[float, float]:
    """The twin's ITL and TTFT at the SLO quantiles for ``config`` at ``rate`` requests/s (one replica),
    plus the latency the engine adds outside its steps (``offset_ms``)."""
    if not rate > 0:
        return math.nan, math.nan
    scheduler = scheduler_of(config, max_model_len)
    summary = simulate(twin.config(scheduler, spread=True), retime(twin.workload, rate, 0), slo)
    return summary.itl_at_slo_quantile_ms + offset_ms[0], summary.ttft_at_slo_quantile_ms + offset_ms[1]


def latency_offsets(
    predicted: tuple[float, float], measured: tuple[float | None, float | None], slo: SLO
) -> tuple[float, float]:
    """What the engine adds to each token outside its steps (delivering it, its server's own loop).

    The stable track's measured minus predicted ITL quantile, never negative (the step model covers
    what the steps cost), at most :data:`MAX_OFFSET_SHARE` of the ITL target (a larger gap is not an
    offset), and none from an ITL above its target (an engine past its SLO is queueing or stalled:
    its gap says nothing about what it adds when it keeps up). The first token is delivered the same
    way, so TTFT gets the same offset (a TTFT quantile over a window rests on too few requests to
    calibrate its own).
    """
    p, m = predicted[0], measured[0]
    if m is None or m > slo.itl_ms or not math.isfinite(p):
        return 0.0, 0.0
    offset = min(max(0.0, m - p), MAX_OFFSET_SHARE * slo.itl_ms)
    return offset, offset


def offset_slo(slo: SLO, offset_ms: tuple[float, float]) -> SLO:
    """The SLO the simulated steps must meet so that, with the engine's offsets, the real one holds."""
    return replace(
        slo, itl_ms=max(1.0, slo.itl_ms - offset_ms[0]), ttft_ms=max(1.0, slo.ttft_ms - offset_ms[1])
    )


class TwinJob(Protocol):
    """What a twin is built from: the steps and workload a window showed, and the service's facts."""

    @property
    def key(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def accelerator(self) -> str: ...
    @property
    def tensor_parallel_size(self) -> int: ...
    @property
    def max_model_len(self) -> int: ...
    @property
    def gpu_memory_utilization(self) -> float: ...
    @property
    def steps(self) -> Mapping[str, StepTotals]: ...
    @property
    def workload(self) -> WorkloadWindow: ...
    @property
    def engine(self) -> SchedulerConfig | None: ...
    @property
    def seed(self) -> int: ...
    @property
    def directory(self) -> str | None: ...


def build_twin(job: TwinJob, seeds: tuple[int, ...] = (0,), min_steps: int = MIN_STEPS) -> Twin:
    """The step model fitted to ``job``'s steps (the datasheet as its prior) and its workload
    synthesized from the window's histograms, written under ``job.directory`` (a temporary one when
    unset); ``seeds``: the Poisson arrival samples each prediction averages over.

    Raises :class:`TwinFitError` or :class:`CaptureError` when the data cannot be fitted.
    """
    fit = fit_steps(job.steps, job.model, job.accelerator, job.tensor_parallel_size, min_steps=min_steps)
    workload = synthesize(job.workload, WORKLOAD_REQUESTS, max_model_len=job.max_model_len, seed=job.seed)
    sustained = synthesize(
        job.workload, SUSTAINED_REQUESTS, max_model_len=job.max_model_len, seed=job.seed, by_segment=True
    )
    directory = Path(job.directory or tempfile.mkdtemp(prefix="chunkpilot-twin-"))
    return Twin.build(
        fit,
        workload,
        directory / job.key.replace("/", "-"),
        gpu_memory_utilization=job.gpu_memory_utilization,
        engine=job.engine,
        arrival_seeds=seeds,
        sustained_workload=sustained,
    )


def calibrate(request: Request) -> Calibration:
    """Fit, predict the stable track, and (``request.rank``) rank the space on the twin.

    Raises :class:`TwinFitError` or :class:`CaptureError` when the data cannot be fitted.
    """
    twin = build_twin(request, arrival_seeds(ARRIVAL_SAMPLES))
    fit, workload = twin.fit, twin.workload
    if request.durations and request.stable_rate_req_s > 0:
        twin = twin.with_dispersion(
            request.durations,
            scheduler_of(request.incumbent, request.max_model_len),
            retime(workload, request.stable_rate_req_s, 0),
        )
    raw = predict_ms(twin, request.incumbent, request.stable_rate_req_s, request.slo, request.max_model_len)
    offsets = latency_offsets(raw, request.measured_ms, request.slo)
    predicted = (raw[0] + offsets[0], raw[1] + offsets[1])
    # The sampling band only, not a window's spread (:func:`check_canary`): the planner sizes with
    # this error as its headroom, where a twin "within what a window can show" is no margin at all.
    errors = quantile_errors(raw, request.measured_ms, request.bands)
    error = largest_error(errors)
    calibration = Calibration(request.key, fit, twin, predicted, error, offset_ms=offsets, errors=errors)
    if not request.rank:
        return calibration
    slo = offset_slo(request.slo, offsets)
    result = search_on_twin(
        twin,
        request.space,
        slo,
        seed=request.seed,
        cpu_budget_s=request.cpu_budget_s,
        max_evaluations=request.max_evaluations,
        exclude=[c for c in request.exclude if c != request.incumbent],
        warm=[request.incumbent, *request.warm],
    )
    started = time.process_time()
    incumbent = next((c for c in result.ranked if c.config == request.incumbent), None)
    if incumbent is None:  # outside the space (or not reached): evaluated on its own
        incumbent = evaluate_on_twin(twin, request.incumbent, slo, max_model_len=request.max_model_len)
    ranked = robust_ranking(
        twin,
        [c for c in result.ranked if c.config != request.incumbent],
        slo,
        max_model_len=request.max_model_len,
    )
    return replace(
        calibration,
        ranked=tuple(ranked),
        incumbent=incumbent,
        evaluations=result.evaluations + len(ERROR_POINTS) * sum(c.robust_req_s is not None for c in ranked),
        cpu_seconds=result.cpu_seconds + time.process_time() - started,
    )


@dataclass(frozen=True)
class CanaryCheck:
    """The twin's quantiles for a canary at its live load against the canary's own."""

    rate_req_s: float
    predicted_ms: tuple[float, float]
    measured_ms: tuple[float | None, float | None]
    bands: tuple[Band | None, Band | None] = (None, None)

    @property
    def error(self) -> float:
        return quantile_error(self.predicted_ms, self.measured_ms, self.bands)

    def confirms(self, targets_ms: tuple[float, float], tolerance: float = TOLERANCE) -> bool:
        """Whether the measurement confirms the prediction: at least one quantile compared, and each
        within ``tolerance`` of it (:func:`quantile_errors`) or closer to it than
        :data:`~chunkpilot.tuner.policy.AGREEMENT_FLOOR` times its target (``targets_ms``: ITL, TTFT)."""
        errors = quantile_errors(self.predicted_ms, self.measured_ms, self.bands)
        compared = False
        for error, p, m, target in zip(errors, self.predicted_ms, self.measured_ms, targets_ms, strict=True):
            if math.isnan(error) or m is None:
                continue
            compared = True
            if not (error <= tolerance or abs(p - m) <= AGREEMENT_FLOOR * target):
                return False
        return compared


def check_canary(
    calibration: Calibration,
    config: TunedConfig,
    rate_req_s: float,
    measured_ms: tuple[float | None, float | None],
    slo: SLO,
    max_model_len: int,
    bands: tuple[Band | None, Band | None] = (None, None),
    window_s: float = 0.0,
) -> CanaryCheck:
    """Predict ``config`` at the canary's live load with the calibrated twin; ``window_s``: the
    seconds it was measured over, whose spread widens ``bands`` (:func:`widened`): a verdict asks
    whether the measurement contradicts the prediction, and one window's quantile cannot contradict
    what the twin predicts within that spread."""
    predicted = predict_ms(calibration.twin, config, rate_req_s, slo, max_model_len, calibration.offset_ms)
    spread = calibration.twin.window_spread(scheduler_of(config, max_model_len), rate_req_s, slo, window_s)
    return CanaryCheck(rate_req_s, predicted, measured_ms, widened(bands, measured_ms, spread))


def fit_error_text(error: float) -> str:
    return f"{error:.0%}" if math.isfinite(error) else "unknown"
