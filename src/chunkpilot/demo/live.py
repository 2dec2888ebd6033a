"""The demo's terminal view and its verdict, computed from the objects kubectl would show.

Everything here is pure: it takes an :class:`InferenceService` and its :class:`TuningTrial` objects
(as read from the API server) and returns rich renderables or plain facts, so the same code drives
the live view, the final summary and the unit tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from rich.console import Group, RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from chunkpilot.api import InferenceService, TuningTrial
from chunkpilot.api.common import parse_duration
from chunkpilot.api.tuningtrial import TrialPhase, TrialVerdict
from chunkpilot.report.history import trial_rows
from chunkpilot.report.render import format_ms, render_table
from chunkpilot.tuner.policy import StopReason

#: Reasons of ``Tuning=False`` that mean the tuning run has ended (paused or waiting does not).
ENDED_TUNING_REASONS = frozenset({*(reason.value for reason in StopReason), "InvalidSearchSpace"})


@dataclass(frozen=True)
class Outcome:
    """How the tuning run stands: finished or not, and what it achieved."""

    finished: bool
    trials_finished: int
    promoted: TuningTrial | None
    meets_slos: bool
    infeasible: bool
    reason: str


def condition(service: InferenceService, kind: str) -> tuple[str | None, str, str]:
    """``(status, reason, message)`` of condition ``kind``; status None when absent."""
    status = service.status
    for cond in status.conditions if status and status.conditions else []:
        if cond.type == kind:
            return str(cond.status), cond.reason or "", cond.message or ""
    return None, "", ""


def _finished(trial: TuningTrial) -> bool:
    phase = trial.status.phase if trial.status else None
    return phase is not None and TrialPhase(phase).finished


def _meets(service: InferenceService, trial: TuningTrial) -> bool:
    slo = service.spec.slo
    canary = trial.status.canary if trial.status else None
    if slo is None or canary is None or canary.itl_ms is None or canary.ttft_ms is None:
        return False
    if math.isnan(canary.itl_ms) or math.isnan(canary.ttft_ms):
        return False
    return canary.itl_ms <= slo.itl.max_ms and canary.ttft_ms <= slo.ttft.max_ms


def promoted_trial(trials: list[TuningTrial]) -> TuningTrial | None:
    """The most recently promoted trial, if any."""
    promoted = [
        t
        for t in trials
        if t.status is not None
        and (t.status.verdict == TrialVerdict.PROMOTED or t.status.phase == TrialPhase.PROMOTED)
    ]
    return max(promoted, key=lambda t: t.spec.number) if promoted else None


def assess(service: InferenceService, trials: list[TuningTrial]) -> Outcome:
    """Whether the tuning run has ended and whether it left a promoted config that meets both SLOs."""
    done = [t for t in trials if _finished(t)]
    running = [t for t in trials if not _finished(t)]
    promoted = promoted_trial(trials)
    meets = promoted is not None and _meets(service, promoted)
    infeasible_status, _, infeasible_message = condition(service, "SLOInfeasible")
    tuning_status, tuning_reason, tuning_message = condition(service, "Tuning")
    max_trials = service.spec.autotune.max_trials
    if infeasible_status == "True":
        return Outcome(True, len(done), promoted, meets, True, infeasible_message or "SLOs infeasible")
    if running:
        return Outcome(False, len(done), promoted, meets, False, f"trial {running[0].spec.number} running")
    if len(done) >= max_trials:
        return Outcome(True, len(done), promoted, meets, False, f"all {max_trials} trials finished")
    if tuning_status == "False" and tuning_reason in ENDED_TUNING_REASONS:
        return Outcome(True, len(done), promoted, meets, False, tuning_message or tuning_reason)
    return Outcome(False, len(done), promoted, meets, False, tuning_message or "waiting for the next trial")


def trial_progress(trial: TuningTrial, service: InferenceService, now: datetime) -> tuple[str, float] | None:
    """``(label, completed fraction)`` of a running trial's warm-up plus window; None when not timed."""
    status = trial.status
    if status is None or status.started_at is None or _finished(trial):
        return None
    autotune = service.spec.autotune
    total = parse_duration(autotune.trial_window)
    warmup = parse_duration(autotune.warmup)
    elapsed = max(0.0, (now - status.started_at).total_seconds())
    stage = "warm-up" if elapsed < warmup else "measuring"
    label = f"trial {trial.spec.number} {status.phase or 'Pending'} ({stage}) {elapsed:.0f}/{total:.0f}s"
    return label, min(1.0, elapsed / total) if total > 0 else 1.0


def _config_line(service: InferenceService) -> Text:
    status = service.status
    applied = status.applied_config if status else None
    best = status.best_config if status else None
    text = Text()
    phase = status.phase if status and status.phase else "Pending"
    text.append(f"{service.metadata.name}: {phase}", style="bold")
    if applied is not None:
        text.append(f"   stable budget={applied.max_num_batched_tokens} seqs={applied.max_num_seqs}")
    if best is not None:
        text.append(f"   best budget={best.max_num_batched_tokens}", style="green")
    measured = status.last_measurement if status else None
    slo = service.spec.slo
    if measured is not None and slo is not None:
        text.append(
            f"\nstable ITL p{slo.itl.quantile * 100:g} {format_ms(measured.itl_ms)}/{slo.itl.max_ms:g}ms"
            f"   TTFT p{slo.ttft.quantile * 100:g} {format_ms(measured.ttft_ms)}/{slo.ttft.max_ms:g}ms"
        )
        if measured.throughput_tok_s is not None:
            text.append(f"   {measured.throughput_tok_s:.0f} tok/s")
    scaling = scaling_line(service)
    if scaling:
        text.append(f"\n{scaling}", style="cyan")
    for kind in ("Ready", "Tuning", "SLOMet", "MetricsUnavailable", "SLOInfeasible"):
        state, reason, _ = condition(service, kind)
        if state is not None:
            colour = "green" if (state == "True") == (kind in ("Ready", "Tuning", "SLOMet")) else "yellow"
            text.append(f"\n  {kind}={state}", style=colour)
            if reason:
                text.append(f" ({reason})")
    return text


def scaling_line(service: InferenceService) -> str:
    """``replicas 1, desired 3 (Auto): live 14.2 req/s, 7.9 req/s per replica planned with``; empty
    without a planner."""
    status = service.status
    scaling = status.scaling if status else None
    if scaling is None or scaling.mode is None:
        return ""
    replicas = status.stable_replicas if status and status.stable_replicas is not None else "-"
    desired = "-" if scaling.desired_replicas is None else scaling.desired_replicas
    line = f"replicas {replicas}, desired {desired} ({scaling.mode})"
    if scaling.live_rate_req_s is not None:
        line += f": live {scaling.live_rate_req_s:.3g} req/s"
    if scaling.capacity_low_req_s is not None:
        line += f", {scaling.capacity_low_req_s:.3g} req/s per replica planned with"
    elif scaling.reason:
        line += f"; {scaling.reason}"
    return line


def render_view(
    service: InferenceService, trials: list[TuningTrial], now: datetime, load: str = ""
) -> RenderableType:
    """The live view: service line, replicas and conditions, the trial table, a progress bar for the
    trial, and ``load`` (what the replayed load does)."""
    parts: list[RenderableType] = [_config_line(service)]
    if load:
        parts.append(Text(load, style="cyan"))
    parts.append(render_table(service, trial_rows(trials)))
    for trial in trials:
        progress = trial_progress(trial, service, now)
        if progress is not None:
            label, fraction = progress
            bar = Table.grid(padding=(0, 1))
            bar.add_row(ProgressBar(total=1.0, completed=fraction, width=40), Text(label))
            parts.append(bar)
    outcome = assess(service, trials)
    parts.append(
        Text(f"{outcome.trials_finished}/{service.spec.autotune.max_trials} trials: {outcome.reason}")
    )
    return Group(*parts)


__all__ = [
    "Outcome",
    "assess",
    "condition",
    "promoted_trial",
    "render_view",
    "scaling_line",
    "trial_progress",
]
