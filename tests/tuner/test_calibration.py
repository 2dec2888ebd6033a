"""Observing the twin: when to wait, when there is none, when to rank again (no Prometheus: stubs)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from chunkpilot.engine import metrics_names as names
from chunkpilot.operator.builders import incumbent
from chunkpilot.tuner import records as rec
from chunkpilot.tuner.measure import TrackMeasurement
from chunkpilot.tuner.observe.observer import parse_service
from chunkpilot.tuner.observe.snapshot import Reading, Snapshot
from chunkpilot.tuner.observe.twin import (
    NO_TELEMETRY,
    REFIT_WINDOWS,
    RERANK_AFTER_S,
    TwinObserver,
    rank_due,
    refit_trial,
    refit_trials,
)
from chunkpilot.tuner.twin import online

from chunkpilot.api import (
    EngineConfig,
    Measurement,
    ObjectMeta,
    ServiceTwin,
    TrialPhase,
    TrialVerdict,
    TuningTrial,
    TuningTrialSpec,
    TuningTrialStatus,
    TwinState,
    trial_labels,
    trial_name,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "chat-llama-8b-sim.yaml"
NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def snapshot(
    samples: float = 500.0, twin: ServiceTwin | None = None, trials: tuple[TuningTrial, ...] = ()
) -> Snapshot:
    body: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"].update(namespace="default", uid="uid-chat", generation=1)
    if twin is not None:
        body["status"] = {"twin": twin.to_k8s()}
    isvc = parse_service(body)
    assert isvc is not None and isvc.status is not None
    stable = TrackMeasurement(
        "stable", "60s", NOW, 0.99, 0.95, 30.0, 400.0, samples * 50, samples, 1000.0, 2000.0, 5.0, 1
    )
    return Snapshot(
        body=body,
        isvc=isvc,
        status=isvc.status,
        trials=trials,
        now=NOW,
        incumbent=incumbent(isvc),
        prometheus=True,
        stable_reading=Reading(stable),
    )


def finished(number: int, verdict: TrialVerdict, measured: bool = True) -> TuningTrial:
    return TuningTrial(
        metadata=ObjectMeta(
            name=trial_name("chat", number), namespace="default", labels=trial_labels("chat", number)
        ),
        spec=TuningTrialSpec(
            service_name="chat",
            number=number,
            params=EngineConfig(max_num_batched_tokens=1024, max_num_seqs=64),
        ),
        status=TuningTrialStatus(
            phase=TrialPhase.ROLLED_BACK,
            verdict=verdict,
            finished_at=NOW,
            canary=Measurement(itl_ms=30.0, window="60s") if measured else None,
        ),
    )


def observe(snap: Snapshot, series: set[str]) -> Any:
    asked: list[str] = []

    def vector(query: str, at: datetime) -> list[dict[str, Any]]:
        asked.append(query)
        return (
            [{"metric": {}, "value": [0, "1"]}] if any(query.startswith(f"count({s}") for s in series) else []
        )

    return asyncio.run(TwinObserver(vector, inline=True).observe(snap, None)), asked


def test_an_engine_prometheus_has_not_scraped_is_waited_for() -> None:
    reading, _ = observe(snapshot(), set())
    assert reading.state is TwinState.WAITING and "no series" in reading.message


def test_an_engine_without_step_telemetry_has_no_twin_and_says_why() -> None:
    reading, _ = observe(snapshot(), {names.REQUEST_SUCCESS})
    assert reading.state is TwinState.UNAVAILABLE and reading.message == NO_TELEMETRY


def test_too_few_stable_samples_wait_before_anything_is_queried() -> None:
    reading, asked = observe(snapshot(samples=10), {names.REQUEST_SUCCESS, names.STEP_DURATION})
    assert reading.state is TwinState.WAITING and "10 requests" in reading.message and asked == []


def test_steps_without_enough_data_wait_and_name_the_count() -> None:
    reading, _ = observe(snapshot(), {names.REQUEST_SUCCESS, names.STEP_DURATION})
    assert reading.state is TwinState.WAITING and "0 engine steps" in reading.message


def test_the_latest_measured_trial_refits_the_twin() -> None:
    trials = (
        finished(1, TrialVerdict.DISCARDED),
        finished(2, TrialVerdict.ABORTED),
        finished(3, TrialVerdict.PRUNED, measured=False),
    )
    found = refit_trial(trials)
    assert found is not None and found.spec.number == 1


def test_the_newest_measured_canaries_of_the_round_all_refit_the_twin() -> None:
    def in_round(trial: TuningTrial, round_: int) -> TuningTrial:
        labels = {**trial.metadata.labels, rec.LABEL_ROUND: str(round_)}
        return trial.model_copy(update={"metadata": trial.metadata.model_copy(update={"labels": labels})})

    earlier = [in_round(finished(n, TrialVerdict.DISCARDED), 0) for n in (1, 2)]
    later = [in_round(finished(n, TrialVerdict.DISCARDED), 1) for n in range(3, 9)]
    unmeasured = in_round(finished(9, TrialVerdict.ABORTED), 1)
    found = refit_trials((*earlier, *later, unmeasured))
    assert [t.spec.number for t in found] == [8, 7, 6, 5] and len(found) == REFIT_WINDOWS
    # A new round (another workload) refits from its own canaries only.
    assert [t.spec.number for t in refit_trials((*earlier, *later[:2]))] == [4, 3]


def test_a_ranking_is_redone_for_a_new_stable_config_a_new_refit_or_when_old() -> None:
    snap = snapshot()
    config_hash = snap.incumbent.config_hash()
    fresh = ServiceTwin(state=TwinState.FITTED, fitted_at=NOW, config_hash=config_hash, refit_trial=2)
    assert rank_due(snapshot(twin=None), "k", 2)
    assert not rank_due(snapshot(twin=fresh), "k", 2)
    assert rank_due(snapshot(twin=fresh), "k", 3)  # a later trial's steps are in the fit
    other = fresh.model_copy(update={"config_hash": "0000"})
    assert rank_due(snapshot(twin=other), "k", 2)
    old = fresh.model_copy(update={"fitted_at": NOW - timedelta(seconds=RERANK_AFTER_S + 1)})
    assert rank_due(snapshot(twin=old), "k", 2)
    active = finished(4, TrialVerdict.DISCARDED).model_copy(
        update={"status": TuningTrialStatus(phase=TrialPhase.MEASURING)}
    )
    assert rec.is_active(active) and not rank_due(snapshot(twin=None, trials=(active,)), "k", 2)


def test_the_rankings_evaluation_cap_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(online.ENV_MAX_EVALUATIONS, raising=False)
    assert online.max_evaluations() is None  # the CPU budget alone ends the search
    monkeypatch.setenv(online.ENV_MAX_EVALUATIONS, "12")
    assert online.max_evaluations() == 12
    for bad in ("0", "-3", "2.5", "many"):
        monkeypatch.setenv(online.ENV_MAX_EVALUATIONS, bad)
        with pytest.raises(ValueError, match="CHUNKPILOT_TWIN_MAX_EVALUATIONS"):
            online.max_evaluations()
