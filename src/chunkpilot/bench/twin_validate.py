"""The twin against a hidden truth, offline: calibrate at one operating point, predict at others.

The truth is the simulator on perturbed hardware (:mod:`chunkpilot.bench.twin_truth`). It serves the
real request lengths at one load and budget while its step telemetry and request-length histograms
are recorded exactly as ``/metrics`` exports them; the twin is fitted from that alone, starting from
the datasheet, and then predicts (a) ITL and TTFT quantiles at other loads and budgets and (b)
capacity at SLO across budgets, each compared with the truth's own answer.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from chunkpilot.bench.twin_truth import Perturbation, write_truth
from chunkpilot.engine import metrics_names as names
from chunkpilot.engine.sim.capacity import find_capacity, retime
from chunkpilot.engine.sim.engine import SimConfig
from chunkpilot.engine.sim.metrics import StepTelemetry
from chunkpilot.engine.sim.offline import SLO, Summary, simulate
from chunkpilot.engine.sim.scheduler import SchedulerConfig
from chunkpilot.engine.sim.workload import Workload, load_trace
from chunkpilot.tuner.twin.capture import SEGMENT_S, WorkloadWindow, histogram_of, synthesize
from chunkpilot.tuner.twin.fit import Scales, fit_steps
from chunkpilot.tuner.twin.predict import (
    CAPACITY_REQUESTS,
    CAPACITY_TOLERANCE,
    LatencyQuantiles,
    Twin,
    relative_errors,
)

__all__ = ["CapacityCheck", "LatencyCheck", "ValidationReport", "observe_window", "validate_twin"]


@dataclass(frozen=True, slots=True)
class LatencyCheck:
    """Predicted against true quantiles at one budget and load.

    ``errors``: the twin end to end (fitted profile, captured workload); ``fit_errors``: the fitted
    profile on the truth's own requests, i.e. the step-time model's share of the error.
    """

    budget: int
    rate_req_s: float
    predicted: LatencyQuantiles
    measured: LatencyQuantiles
    errors: dict[str, float]
    fit_errors: dict[str, float]


@dataclass(frozen=True, slots=True)
class CapacityCheck:
    """Predicted against true capacity at SLO of one budget (errors as in :class:`LatencyCheck`)."""

    budget: int
    predicted_req_s: float
    true_req_s: float
    error: float
    fit_error: float
    cpu_s: float


@dataclass(frozen=True, slots=True)
class ValidationReport:
    """Everything :func:`validate_twin` measured."""

    perturbation: Perturbation
    fitted: Scales
    fit_steps: float
    fit_rms_relative_error: float
    prior_rms_relative_error: float
    fit_cpu_s: float
    latency: tuple[LatencyCheck, ...]
    capacity: tuple[CapacityCheck, ...]
    notes: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready mapping."""
        return asdict(self)


def observe_window(summary: Summary, max_model_len: int, *, fine: bool = True) -> WorkloadWindow:
    """What the engine's request-length histograms and counters report for one offline run, with
    each minute of arrivals as a segment (:attr:`WorkloadWindow.segments`).

    ``fine``: Chunkpilot's finer length histograms (what the simulator and the plugin export), else
    vLLM's 1-2-5 series (what an engine without them offers).
    """
    records = summary.records
    bounds = names.FINE_REQUEST_TOKENS_BUCKETS if fine else names.request_tokens_buckets(max_model_len)
    arrivals = sorted(r.arrival_s for r in records)
    span = arrivals[-1] - arrivals[0] if len(arrivals) > 1 else 1.0
    duration = span * len(arrivals) / max(1, len(arrivals) - 1)
    queried = float(sum(r.prompt_tokens for r in records))
    # Each minute of arrivals as Prometheus would show it (``increase(...[1m])`` every minute).
    minutes: dict[int, list[tuple[int, int]]] = {}
    for record in records:
        minute = int((record.arrival_s - arrivals[0]) // SEGMENT_S)
        minutes.setdefault(minute, []).append((record.prompt_tokens, record.output_tokens))
    segments = tuple(
        WorkloadWindow(
            SEGMENT_S,
            histogram_of([p for p, _o in minutes[m]], bounds),
            histogram_of([o for _p, o in minutes[m]], bounds),
            tokens_product=float(sum(p * o for p, o in minutes[m])),
        )
        for m in sorted(minutes)
    )
    return WorkloadWindow(
        duration_s=duration,
        prompt_tokens=histogram_of([r.prompt_tokens for r in records], bounds),
        generation_tokens=histogram_of([r.output_tokens for r in records], bounds),
        prefix_cache_queries=queried,
        prefix_cache_hits=float(sum(r.cached_tokens for r in records)),
        tokens_product=float(sum(r.prompt_tokens * r.output_tokens for r in records)),
        segments=segments,
    )


def _error(predicted: float, true: float) -> float:
    return predicted / true - 1 if true > 0 else math.nan


def _config(base: SchedulerConfig, budget: int) -> SchedulerConfig:
    return replace(base, max_num_batched_tokens=budget)


@dataclass(frozen=True)
class _Checks:
    """The truth and the two twins the predictions are checked with, on the truth's requests."""

    truth: SimConfig
    base: SchedulerConfig
    lengths: Workload
    twin: Twin
    fitted_only: Twin
    slo: SLO

    def latency(self, points: Sequence[tuple[int, float]]) -> tuple[LatencyCheck, ...]:
        """Predicted against true quantiles at each ``(budget, rate)`` of ``points``."""
        checks: list[LatencyCheck] = []
        for budget, rate in points:
            cfg = _config(self.base, budget)
            measured = LatencyQuantiles.of(
                simulate(replace(self.truth, scheduler=cfg), retime(self.lengths, rate), self.slo)
            )
            predicted = self.twin.latency(cfg, rate, self.slo)
            fit_only = self.fitted_only.latency(cfg, rate, self.slo)
            checks.append(
                LatencyCheck(
                    budget,
                    rate,
                    predicted,
                    measured,
                    relative_errors(predicted, measured),
                    relative_errors(fit_only, measured),
                )
            )
        return tuple(checks)

    def capacity(
        self, budgets: Sequence[int], start_rate: float, requests: int, tolerance: float
    ) -> tuple[CapacityCheck, ...]:
        """Predicted against true capacity at SLO of each budget, with the prediction's CPU seconds."""
        slo = self.slo
        checks: list[CapacityCheck] = []
        for budget in budgets:
            cfg = _config(self.base, budget)
            true = find_capacity(
                replace(self.truth, scheduler=cfg), self.lengths, slo, tolerance=0.02, start_rate=start_rate
            ).capacity_req_s
            same = self.fitted_only.capacity(
                cfg, slo, requests=len(self.lengths.requests), tolerance=0.02, start_rate=start_rate
            ).capacity_req_s
            started = time.process_time()
            predicted = self.twin.capacity(
                cfg, slo, requests=requests, tolerance=tolerance, start_rate=start_rate
            ).capacity_req_s
            cpu = time.process_time() - started
            checks.append(
                CapacityCheck(budget, predicted, true, _error(predicted, true), _error(same, true), cpu)
            )
        return tuple(checks)


def validate_twin(
    perturbation: Perturbation = Perturbation(0.75, 0.85, 2.0),  # noqa: B008  (frozen dataclass)
    *,
    workload: Workload | None = None,
    model: str = "llama-3.1-8b",
    accelerator: str = "h100",
    scheduler: SchedulerConfig | None = None,
    slo: SLO | None = None,
    fit_budget: int = 1024,
    fit_rate: float = 4.0,
    latency_points: Sequence[tuple[int, float]] = ((512, 2.5), (2048, 6.0)),
    capacity_budgets: Sequence[int] = (256, 512, 1024, 2048, 4096),
    capacity_requests: int = CAPACITY_REQUESTS,
    capacity_tolerance: float = CAPACITY_TOLERANCE,
    directory: Path | None = None,
) -> ValidationReport:
    """Calibrate the twin on the truth at ``(fit_budget, fit_rate)`` and compare its predictions."""
    slo = slo or SLO()
    base = scheduler or SchedulerConfig(max_num_seqs=256, max_model_len=8192)
    lengths = workload or load_trace("azure_conv_2023", rate=1.0, limit=400)
    with tempfile.TemporaryDirectory(prefix="twin-") as tmp:
        root = directory or Path(tmp)
        truth = write_truth(
            root / "truth", perturbation, model=model, accelerator=accelerator, scheduler=base
        )
        # The calibration window: the truth at the live configuration and load.
        telemetry = StepTelemetry()
        observed = simulate(
            replace(truth, scheduler=_config(base, fit_budget)),
            retime(lengths, fit_rate),
            slo,
            keep_records=True,
            telemetry=telemetry,
        )
        started = time.process_time()
        fit = fit_steps(telemetry.totals(), model, accelerator)
        window = observe_window(observed, base.max_model_len)
        captured = synthesize(window, len(lengths.requests), max_model_len=base.max_model_len)
        twin = Twin.build(fit, captured, root / "twin")
        fit_cpu = time.process_time() - started
        # The same profile on the truth's own requests isolates the step-time model's error.
        fitted_only = Twin(fit, lengths, twin.profile_path)
        checks = _Checks(truth, base, lengths, twin, fitted_only, slo)
        latency = checks.latency(latency_points)
        capacity = checks.capacity(capacity_budgets, fit_rate, capacity_requests, capacity_tolerance)
    return ValidationReport(
        perturbation=perturbation,
        fitted=fit.scales,
        fit_steps=fit.steps,
        fit_rms_relative_error=fit.rms_relative_error,
        prior_rms_relative_error=fit.prior_rms_relative_error,
        fit_cpu_s=fit_cpu,
        latency=latency,
        capacity=capacity,
        notes={
            "workload": lengths.name,
            "requests": len(lengths.requests),
            "fit_budget": fit_budget,
            "fit_rate_req_s": fit_rate,
            "capacity_requests": capacity_requests,
            "capacity_tolerance": capacity_tolerance,
            "slo": asdict(slo),
        },
    )
