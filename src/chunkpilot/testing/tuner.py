"""The tuner's inputs and what a step decides: measurements, snapshots, study records, a fitted twin,
and readers of a plan."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from chunkpilot.api import TuningTrial, TwinState
from chunkpilot.engine import metrics_names as names
from chunkpilot.engine.sim.engine import SimConfig
from chunkpilot.engine.sim.metrics import StepTelemetry, StepTotals
from chunkpilot.engine.sim.offline import simulate
from chunkpilot.engine.sim.scheduler import SchedulerConfig
from chunkpilot.engine.sim.workload import Workload, load_trace
from chunkpilot.operator.builders import incumbent
from chunkpilot.testing.services import NOW, a_service, a_service_body
from chunkpilot.tuner.decide.plan import Action, Emit, PatchTrial, Plan
from chunkpilot.tuner.measure import TrackMeasurement
from chunkpilot.tuner.observe.snapshot import Snapshot, TwinReading
from chunkpilot.tuner.space import Knob, KnobRange, SearchSpace, TunedConfig
from chunkpilot.tuner.study import RecordState, TrialRecord
from chunkpilot.tuner.twin import Twin, TwinFit, fit_steps
from chunkpilot.tuner.twin.capture import WorkloadWindow, histogram_of
from chunkpilot.tuner.twin.online import Calibration

A = TypeVar("A")
#: What a space's untuned knobs run at unless told.
FIXED = TunedConfig(2048, 128)


# --------------------------------------------------------------------------- builders


def a_measurement(
    track: str,
    itl_ms: float | None,
    ttft_ms: float | None = 500.0,
    *,
    samples: float = 500.0,
    window: str = "60s",
    time: datetime = NOW,
    generation_tok_s: float = 1000.0,
    prompt_tok_s: float = 2000.0,
    request_rate: float = 5.0,
    replicas: int = 1,
) -> TrackMeasurement:
    """One track over ``window`` ending at ``time``: ITL p99 and TTFT p95 (ms) of ``samples`` requests
    (50 ITL samples each), the token and request rates, on ``replicas``."""
    return TrackMeasurement(
        track=track,
        window=window,
        time=time,
        itl_quantile=0.99,
        ttft_quantile=0.95,
        itl_ms=itl_ms,
        ttft_ms=ttft_ms,
        itl_samples=samples * 50,
        ttft_samples=samples,
        generation_tok_s=generation_tok_s,
        prompt_tok_s=prompt_tok_s,
        request_rate=request_rate,
        replicas=replicas,
    )


def a_snapshot(
    body: dict[str, Any] | None = None,
    trials: Iterable[TuningTrial] = (),
    *,
    now: datetime = NOW,
    **fields: Any,
) -> Snapshot:
    """What observing ``body`` (default :func:`a_service_body`) and ``trials`` delivers at ``now``.

    The service, its status and incumbent come from ``body``; ``fields`` set the rest (the stable
    rollout, Prometheus and its readings, the canary, the twin, …), which is otherwise unobserved.
    """
    body = a_service_body() if body is None else body
    isvc = a_service(body)
    if isvc.status is None:
        raise ValueError("the service has no status")
    return Snapshot(
        body=body,
        isvc=isvc,
        status=isvc.status,
        trials=tuple(trials),
        now=now,
        incumbent=incumbent(isvc),
        **fields,
    )


def a_space(
    budget: tuple[int, int] = (256, 8192), seqs: tuple[int, int] = (16, 256), fixed: TunedConfig = FIXED
) -> SearchSpace:
    """A search space over the token budget and max_num_seqs (inclusive, log-scaled), the rest ``fixed``."""
    return SearchSpace(
        ranges={Knob.MAX_NUM_BATCHED_TOKENS: KnobRange(*budget), Knob.MAX_NUM_SEQS: KnobRange(*seqs)},
        fixed=fixed,
    )


def a_record(
    number: int, params: Mapping[str, Any], objective: float | None, constraints: Mapping[str, float] | None
) -> TrialRecord:
    """A COMPLETE study record when an objective and constraints exist, else FAILED."""
    if objective is None or constraints is None or not math.isfinite(objective):
        return TrialRecord(
            number=number, params={k: int(v) for k, v in params.items()}, state=RecordState.FAILED
        )
    return TrialRecord(
        number=number,
        params={k: int(v) for k, v in params.items()},
        state=RecordState.COMPLETE,
        objective=float(objective),
        constraints=dict(constraints),
    )


def a_sim_twin(directory: Path, *, max_num_seqs: int = 256) -> tuple[TwinFit, Twin]:
    """A real fit of the simulator's steps and the twin built on it in ``directory``.

    The simulator runs llama-3.1-8b on its datasheet H100 (1024 tokens a step, ``max_num_seqs``)
    through 80 requests of azure_conv_2023 at 2 req/s; the twin replays that workload.
    """
    engine = SimConfig(
        model="llama-3.1-8b",
        accelerator="h100",
        scheduler=SchedulerConfig(max_num_batched_tokens=1024, max_num_seqs=max_num_seqs),
    )
    telemetry = StepTelemetry()
    workload = load_trace("azure_conv_2023", rate=2.0, limit=80)
    simulate(engine, workload, telemetry=telemetry)
    fit = fit_steps(telemetry.totals(), "llama-3.1-8b", "h100")
    return fit, Twin.build(fit, workload, directory)


def pool_steps(
    truth: Twin, *, decode_only: bool = False, requests: int | None = None
) -> dict[str, StepTotals]:
    """The steps ``truth`` takes serving its twin's workload (1024 tokens a step, 64 sequences): as
    a prefill pool's stand-in, all of it; ``decode_only``, as a decode pool's, its prompts cut to 16
    tokens (almost every step decodes); ``requests``: only that many of them."""
    workload = truth.workload
    if decode_only:
        workload = replace(workload, requests=tuple(replace(r, prompt_tokens=16) for r in workload.requests))
    if requests is not None:
        workload = replace(workload, requests=workload.requests[:requests])
    telemetry = StepTelemetry()
    scheduler = SchedulerConfig(max_num_batched_tokens=1024, max_num_seqs=64)
    simulate(truth.config(scheduler), workload, telemetry=telemetry)
    return telemetry.totals()


def a_workload_window(
    prompts: Sequence[int], outputs: Sequence[int], rate: float, hit_rate: float = 0.0, max_len: int = 8192
) -> WorkloadWindow:
    """What the engine's request-length histograms show over a window of these requests at ``rate``."""
    bounds = names.request_tokens_buckets(max_len)
    queried = float(sum(prompts))
    return WorkloadWindow(
        duration_s=len(prompts) / rate,
        prompt_tokens=histogram_of(prompts, bounds),
        generation_tokens=histogram_of(outputs, bounds),
        prefix_cache_queries=queried,
        prefix_cache_hits=queried * hit_rate,
    )


def window_of(workload: Workload, rate: float) -> WorkloadWindow:
    """:func:`a_workload_window` of ``workload``'s requests."""
    requests = workload.requests
    return a_workload_window([r.prompt_tokens for r in requests], [r.output_tokens for r in requests], rate)


def a_fitted_reading(calibration: Calibration, **fields: Any) -> TwinReading:
    """Observing found the twin fitted as ``calibration`` says (under its key); ``fields`` add the rest."""
    values: dict[str, Any] = {
        "state": TwinState.FITTED,
        "calibration": calibration,
        "key": calibration.key,
        **fields,
    }
    return TwinReading(**values)


# --------------------------------------------------------------------------- reading a plan


def of_type(plan: Plan, kind: type[A]) -> list[A]:
    """The plan's actions of ``kind``, in order."""
    return [a for a in plan.actions if isinstance(a, kind)]


def trial_status(plan: Plan | Sequence[Action]) -> dict[str, Any]:
    """Every status field the plan (or the actions) writes to trials, merged in order."""
    merged: dict[str, Any] = {}
    actions = plan.actions if isinstance(plan, Plan) else plan
    for action in actions:
        if isinstance(action, PatchTrial):
            merged.update(action.patch["status"])
    return merged


def condition(plan: Plan, type_: str) -> tuple[str, str, str] | None:
    """The status, reason and message of the condition of ``type_`` the plan sets; None: it sets none."""
    found = next((c for c in plan.conditions if c.type == type_), None)
    return (found.status.value, found.reason, found.message) if found else None


def events(plan: Plan) -> list[tuple[str, str]]:
    """The reason and message of each Event the plan emits."""
    return [(a.event.reason, a.event.message) for a in of_type(plan, Emit)]
