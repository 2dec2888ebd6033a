"""The demo's verdict, live view and log lines, from InferenceService and TuningTrial objects."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from rich.console import Console

from chunkpilot.api import InferenceService, TuningTrial
from chunkpilot.demo.live import assess, render_view, trial_progress
from chunkpilot.demo.run import DemoResult, transition_lines
from chunkpilot.demo.scenario import DemoScenario, build_inferenceservice
from chunkpilot.testing.trials import a_trial_manifest

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def service(conditions: list[dict[str, str]] | None = None, max_trials: int = 4) -> InferenceService:
    manifest = build_inferenceservice(DemoScenario(max_trials=max_trials))
    manifest["status"] = {"phase": "Tuning", "conditions": conditions or []}
    return InferenceService.from_manifest(manifest)


def trial(
    number: int,
    phase: str,
    verdict: str | None = None,
    itl: float = 40,
    ttft: float = 300,
    started: datetime | None = None,
) -> TuningTrial:
    status: dict[str, Any] = {"phase": phase, "canary": {"itlMs": itl, "ttftMs": ttft, "throughputTokS": 900}}
    if verdict:
        status["verdict"] = verdict
    if started:
        status["startedAt"] = started.isoformat()
    return TuningTrial.from_manifest(a_trial_manifest("code-assist", number, 1024 * (number + 1), status))


def test_running_trial_means_not_finished() -> None:
    outcome = assess(service(), [trial(0, "RolledBack", "Discarded"), trial(1, "Measuring")])
    assert not outcome.finished
    assert outcome.trials_finished == 1


def test_all_trials_finished_with_a_promotion_that_meets_both_slos() -> None:
    trials = [trial(n, "RolledBack", "Discarded", itl=80) for n in range(3)] + [
        trial(3, "Promoted", "Promoted")
    ]
    outcome = assess(service(max_trials=4), trials)
    assert outcome.finished and outcome.meets_slos
    assert outcome.promoted is not None and outcome.promoted.spec.number == 3


def test_promoted_config_missing_the_itl_target_is_not_a_success() -> None:
    trials = [trial(0, "Promoted", "Promoted", itl=75)]
    outcome = assess(service(max_trials=1), trials)
    assert outcome.finished and not outcome.meets_slos


def test_infeasible_condition_ends_the_run() -> None:
    conditions = [
        {
            "type": "SLOInfeasible",
            "status": "True",
            "reason": "NoFeasibleConfig",
            "message": "best ITL p99 61 ms > 50 ms: add replicas",
        }
    ]
    outcome = assess(service(conditions), [trial(0, "RolledBack", "Discarded", itl=61)])
    assert outcome.finished and outcome.infeasible
    assert "add replicas" in outcome.reason


def test_tuning_stopped_early_by_convergence_ends_the_run() -> None:
    conditions = [{"type": "Tuning", "status": "False", "reason": "Converged", "message": "no improvement"}]
    outcome = assess(service(conditions, max_trials=10), [trial(0, "Promoted", "Promoted")])
    assert outcome.finished


def test_paused_tuning_does_not_end_the_run() -> None:
    conditions = [{"type": "Tuning", "status": "False", "reason": "Paused", "message": "autotune.paused"}]
    assert not assess(service(conditions, max_trials=10), [trial(0, "RolledBack", "Discarded")]).finished


def test_progress_covers_warmup_then_measurement() -> None:
    svc = service()
    window = DemoScenario().trial_seconds
    early = trial_progress(trial(0, "Measuring", started=NOW - timedelta(seconds=5)), svc, NOW)
    late = trial_progress(trial(0, "Measuring", started=NOW - timedelta(seconds=window - 1)), svc, NOW)
    assert early is not None and "warm-up" in early[0]
    assert late is not None and "measuring" in late[0]
    assert early[1] < late[1] <= 1.0
    assert trial_progress(trial(0, "RolledBack", "Discarded", started=NOW), svc, NOW) is None


def test_view_shows_every_trial_against_the_targets() -> None:
    console = Console(width=160, record=True)
    console.print(
        render_view(
            service(), [trial(0, "RolledBack", "Discarded", itl=80), trial(1, "Measuring", started=NOW)], NOW
        )
    )
    text = console.export_text()
    assert "80/50ms" in text
    assert "budget=2048" in text
    assert "trial 1 Measuring" in text


def test_each_phase_is_reported_once() -> None:
    seen: set[str] = set()
    first = transition_lines([trial(0, "Measuring")], seen)
    assert first == ["trial 0 budget=1024 seqs=128: Measuring ITL 40 ms, TTFT 300 ms"]
    assert transition_lines([trial(0, "Measuring")], seen) == []
    done = transition_lines([trial(0, "Pruned", "Pruned", itl=120), trial(1, "RollingOut")], seen)
    assert done[0].endswith("Pruned ITL 120 ms, TTFT 300 ms -> Pruned")
    assert done[1].startswith("trial 1 budget=2048")


def test_exit_code_says_how_it_ended() -> None:
    assert DemoResult(outcome=None, report=None, interrupted=True).exit_code == 130
    assert DemoResult(outcome=None, report=None, interrupted=False, failure="operator died").exit_code == 1
    assert DemoResult(outcome=None, report=None, interrupted=False).exit_code == 1


def test_the_view_shows_replicas_desired_and_the_load() -> None:
    manifest = build_inferenceservice(DemoScenario())
    manifest["status"] = {
        "stableReplicas": 1,
        "scaling": {"mode": "Auto", "desiredReplicas": 3, "liveRateReqS": 14.2, "capacityLowReqS": 7.9},
    }
    console = Console(width=160, record=True)
    console.print(render_view(InferenceService.from_manifest(manifest), [], NOW, "load surge: 18 req/s"))
    text = console.export_text()
    assert "replicas 1, desired 3 (Auto): live 14.2 req/s, 7.9 req/s per replica planned with" in text
    assert "load surge: 18 req/s" in text
