"""The twin against a real engine: fit at one operating point, predict others, compare.

Unlike :mod:`chunkpilot.bench.twin_validate`, the truth here is a running engine (vLLM with the
Chunkpilot scheduler plugin), not the simulator on perturbed hardware. A window is one burst of
Poisson traffic at one budget: the engine's ``/metrics`` is scraped before and after, and the
window keeps the step telemetry, the request-length histograms and the engine's own fine ITL and
TTFT histograms (server-side: streamed chunks reach a client in bursts, so client timings are not
the engine's latencies). The twin is fitted from one window's step telemetry alone, starting from
the datasheet prior, and predicts the quantiles of the others two ways:

* ``replay``: the fitted simulator on the requests the window actually sent (lengths and arrival
  times), i.e. the step-time model's and the scheduler model's share of the error;
* ``captured``: the twin end to end, on a workload synthesised from the fit window's length
  histograms and retimed to the other window's rate (what the tuner would predict).

``prior`` is ``replay`` with the unfitted datasheet scales: what the fit buys. The fitted twin's
TTFTs also carry the fit window's ingest time (arrival at the API server to the engine core's
queue, which the simulator does not model), measured from vLLM's own histograms.
"""

from __future__ import annotations

import asyncio
import math
import random
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Final

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from chunkpilot.engine import metrics_names as names
from chunkpilot.engine.sim.capacity import retime
from chunkpilot.engine.sim.metrics import StepTotals
from chunkpilot.engine.sim.offline import simulate
from chunkpilot.engine.sim.scheduler import SchedulerConfig
from chunkpilot.engine.sim.workload import RequestSpec, Workload
from chunkpilot.engine.vllm_plugin.client import prompt_ids, stream_completion
from chunkpilot.tuner.twin.capture import (
    HistogramWindow,
    StepDurations,
    WorkloadWindow,
    durations_between,
    parse_exposition,
    synthesize,
    window_between,
)
from chunkpilot.tuner.twin.fit import Scales, TwinFit, _points, predict_mean_step
from chunkpilot.tuner.twin.predict import LatencyQuantiles, Twin, relative_errors

__all__ = [
    "QUANTILES",
    "LatencyHistograms",
    "PointCheck",
    "RealWindow",
    "compare",
    "histogram_quantile",
    "latency_histograms",
    "lengths",
    "measured_quantiles",
    "observe",
    "poisson_requests",
    "scrape",
    "step_rms_error",
]

#: The quantiles the twin's error is stated in, as (field of LatencyQuantiles, histogram, q).
QUANTILES: Final = (
    ("itl_p50_ms", names.FINE_INTER_TOKEN_LATENCY, 0.5),
    ("itl_p99_ms", names.FINE_INTER_TOKEN_LATENCY, 0.99),
    ("ttft_p50_ms", names.FINE_TIME_TO_FIRST_TOKEN, 0.5),
    ("ttft_p95_ms", names.FINE_TIME_TO_FIRST_TOKEN, 0.95),
)

LatencyHistograms = dict[str, HistogramWindow]
#: vLLM's parts of a TTFT inside the engine core: waiting in its queue, then the prefill steps.
_ENGINE_TTFT: Final = (names.REQUEST_QUEUE_TIME, names.REQUEST_PREFILL_TIME)


# ------------------------------------------------------------------------------ measurement
def scrape(url: str, timeout_s: float = 30.0) -> str:
    """The engine's ``/metrics`` text."""
    with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=timeout_s) as response:
        text: str = response.read().decode()
        return text


def latency_histograms(text: str) -> LatencyHistograms:
    """The fine ITL and TTFT histograms and vLLM's queue- and prefill-time histograms of one scrape.

    Cumulative since start-up, series summed.
    """
    wanted = {
        names.FINE_INTER_TOKEN_LATENCY,
        names.FINE_TIME_TO_FIRST_TOKEN,
        names.REQUEST_QUEUE_TIME,
        names.REQUEST_PREFILL_TIME,
    }
    buckets: dict[str, dict[float, float]] = {}
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in wanted:
            continue
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                per = buckets.setdefault(family.name, {})
                le = float(sample.labels["le"])
                per[le] = per.get(le, 0.0) + sample.value
            elif sample.name.endswith(("_sum", "_count")):
                sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    return {
        name: HistogramWindow.from_cumulative(
            per, sums.get(f"{name}_sum", 0.0), sums.get(f"{name}_count", 0.0)
        )
        for name, per in buckets.items()
    }


def histogram_quantile(histogram: HistogramWindow, q: float) -> float:
    """Quantile ``q`` of a window's histogram, linear within a bucket (PromQL's interpolation)."""
    total = sum(histogram.counts)
    if total <= 0:
        return math.nan
    target = q * total
    lower, seen = 0.0, 0.0
    for bound, count in zip(histogram.bounds, histogram.counts, strict=False):
        if seen + count >= target and count > 0:
            return lower + (bound - lower) * (target - seen) / count
        lower, seen = bound, seen + count
    return histogram.bounds[-1] if histogram.bounds else math.nan


def measured_quantiles(histograms: Mapping[str, HistogramWindow]) -> LatencyQuantiles:
    """The four quantiles (ms) from a window's fine latency histograms."""
    values = {
        field: histogram_quantile(histograms[name], q) * 1e3 if name in histograms else math.nan
        for field, name, q in QUANTILES
    }
    return LatencyQuantiles(**values)


def lengths(count: int, seed: int, prompt: tuple[int, int], output: tuple[int, int]) -> list[tuple[int, int]]:
    """``count`` (prompt, output) pairs: prompts log-uniform in ``prompt``, outputs uniform in ``output``."""
    rng = random.Random(seed)
    low, high = math.log(prompt[0]), math.log(prompt[1])
    return [(round(math.exp(rng.uniform(low, high))), rng.randint(*output)) for _ in range(count)]


def poisson_requests(
    pairs: Sequence[tuple[int, int]], rate: float, seed: int, name: str = "real"
) -> Workload:
    """The requests ``pairs`` arriving as a Poisson process of ``rate`` per second (first at 0)."""
    rng = random.Random(seed)
    specs: list[RequestSpec] = []
    t = 0.0
    for prompt, output in pairs:
        specs.append(RequestSpec(t, prompt, output))
        t += rng.expovariate(rate)
    return Workload(f"{name}@{rate:g}", tuple(specs))


async def _send(url: str, model: str, workload: Workload, offset: int, deadline_s: float) -> None:
    timeout = aiohttp.ClientTimeout(total=deadline_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await asyncio.gather(
            *(
                stream_completion(
                    session,
                    url,
                    model,
                    prompt_ids(spec.prompt_tokens, offset + 31 * i),
                    spec.output_tokens,
                    spec.arrival_s,
                )
                for i, spec in enumerate(workload.requests)
            )
        )


@dataclass(frozen=True, slots=True)
class RealWindow:
    """One burst of traffic at one budget as the engine's ``/metrics`` saw it."""

    budget: int
    rate_req_s: float
    sent: Workload
    duration_s: float
    steps: dict[str, StepTotals]
    workload: WorkloadWindow
    histograms: LatencyHistograms
    #: The step-duration histogram per token bucket over the window.
    durations: StepDurations = field(default_factory=dict)

    @property
    def measured(self) -> LatencyQuantiles:
        """The engine's own quantiles over the window."""
        return measured_quantiles(self.histograms)

    @property
    def ingest_s(self) -> float:
        """Mean time from a request's arrival at the API server to the engine core's queue.

        TTFT counts from the arrival; the simulator's requests arrive in the engine's queue. This is
        the mean TTFT less vLLM's mean queue and prefill times (0 when the histograms are missing).
        """
        parts = [self.histograms.get(name) for name in (names.FINE_TIME_TO_FIRST_TOKEN, *_ENGINE_TTFT)]
        if any(part is None or part.count <= 0 for part in parts):
            return 0.0
        ttft, *inside = (part for part in parts if part is not None)
        return max(0.0, ttft.mean - sum(part.mean for part in inside))


def observe(
    url: str,
    model: str,
    budget: int,
    sent: Workload,
    rate: float,
    *,
    offset: int = 0,
    deadline_s: float = 120.0,
) -> RealWindow:
    """Send ``sent`` (loopback HTTP, streamed) and return what ``/metrics`` recorded meanwhile.

    The engine must already run at ``budget``; ``offset`` varies the prompt ids between windows.
    """
    loop = asyncio.new_event_loop()
    try:
        before_text = scrape(url)
        started = loop.time()
        loop.run_until_complete(_send(url, model, sent, offset, deadline_s))
        duration = loop.time() - started
        after_text = scrape(url)
    finally:
        loop.close()
    before, after = parse_exposition(before_text), parse_exposition(after_text)
    workload, steps = window_between(before, after, duration)
    first, last = latency_histograms(before_text), latency_histograms(after_text)
    histograms = {name: h - first[name] if name in first else h for name, h in last.items()}
    durations = durations_between(before.durations, after.durations)
    return RealWindow(budget, rate, sent, duration, steps, workload, histograms, durations)


# --------------------------------------------------------------------------------- comparison
def step_rms_error(fit: TwinFit, telemetry: Mapping[str, StepTotals], *, corrected: bool = True) -> float:
    """Step-weighted RMS relative error of ``fit``'s step model on the bucket means of ``telemetry``
    (``corrected=False``: of its fitted roofline alone, without the measured buckets' corrections).

    On a window other than the fit's, this is the step-time model's out-of-sample error.
    """
    model = fit.step_model() if corrected else fit.roofline()
    points = _points(telemetry)
    if not points:
        return math.nan
    weighted = sum(p.steps * (predict_mean_step(model, p) / p.mean_s - 1) ** 2 for p in points)
    return math.sqrt(weighted / sum(p.steps for p in points))


@dataclass(frozen=True, slots=True)
class PointCheck:
    """Predicted against measured quantiles at one operating point (errors: predicted/measured - 1)."""

    budget: int
    rate_req_s: float
    measured: LatencyQuantiles
    replay: LatencyQuantiles
    captured: LatencyQuantiles
    prior: LatencyQuantiles
    replay_errors: dict[str, float]
    captured_errors: dict[str, float]
    prior_errors: dict[str, float]
    #: The step-time model's error on this window's own step telemetry (fitted, and the prior's).
    step_rms: float
    prior_step_rms: float
    #: The fit window's ingest time, added to the fitted twin's TTFTs (not the prior's).
    ingest_ms: float
    #: The replay's errors with every step at its modelled time (no dispersion): what the spread adds.
    steady_errors: dict[str, float] = field(default_factory=dict)

    def worst(self, which: str = "replay") -> float:
        """The largest absolute error of ``replay``, ``captured`` or ``prior``."""
        errors: dict[str, float] = getattr(self, f"{which}_errors")
        return max(abs(e) for e in errors.values())


def _ingested(quantiles: LatencyQuantiles, ingest_s: float) -> LatencyQuantiles:
    return replace(
        quantiles,
        ttft_p50_ms=quantiles.ttft_p50_ms + ingest_s * 1e3,
        ttft_p95_ms=quantiles.ttft_p95_ms + ingest_s * 1e3,
    )


def compare(
    fit: TwinFit,
    fit_window: RealWindow,
    windows: Sequence[RealWindow],
    scheduler: SchedulerConfig,
    directory: Path,
    *,
    captured_requests: int = 400,
    spread: bool = True,
) -> list[PointCheck]:
    """Predict each window's quantiles from ``fit`` (and the fit window's workload) and compare.

    ``scheduler`` is the engine's configuration but for the budget, which each window sets. The
    fitted twin's TTFTs include the fit window's ingest time (:attr:`RealWindow.ingest_s`).
    ``spread``: its steps carry the fit window's dispersion of single step times
    (:meth:`Twin.with_dispersion`), so its tails are predicted too.
    """
    ingest = fit_window.ingest_s
    unfitted_fit = replace(fit, scales=Scales())
    twin = Twin.build(fit, fit_window.sent, directory / "fitted")
    if spread:
        fit_config = replace(scheduler, max_num_batched_tokens=fit_window.budget)
        twin = twin.with_dispersion(fit_window.durations, fit_config, fit_window.sent)
    prior = Twin.build(unfitted_fit, fit_window.sent, directory / "prior")
    captured = synthesize(fit_window.workload, captured_requests, max_model_len=scheduler.max_model_len)
    checks: list[PointCheck] = []
    for window in windows:
        config = replace(scheduler, max_num_batched_tokens=window.budget)
        measured = window.measured
        spread_config = twin.config(config, spread=True)
        replayed = _ingested(LatencyQuantiles.of(simulate(spread_config, window.sent)), ingest)
        steady = _ingested(LatencyQuantiles.of(simulate(twin.config(config), window.sent)), ingest)
        unfitted = LatencyQuantiles.of(simulate(prior.config(config), window.sent))
        end_to_end = _ingested(
            LatencyQuantiles.of(simulate(spread_config, retime(captured, window.rate_req_s))), ingest
        )
        checks.append(
            PointCheck(
                window.budget,
                window.rate_req_s,
                measured,
                replayed,
                end_to_end,
                unfitted,
                relative_errors(replayed, measured),
                relative_errors(end_to_end, measured),
                relative_errors(unfitted, measured),
                step_rms_error(fit, window.steps),
                step_rms_error(unfitted_fit, window.steps),
                ingest * 1e3,
                relative_errors(steady, measured),
            )
        )
    return checks
