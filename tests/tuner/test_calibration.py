"""Observing the twin: when to wait, when there is none, when to rank again (no Prometheus: stubs)."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

import pytest
from chunkpilot.engine import metrics_names as names
from chunkpilot.tuner import records as rec
from chunkpilot.tuner.config import ENV_TWIN_MAX_EVALUATIONS, TunerConfig
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

from chunkpilot.api import (
    Measurement,
    ServiceTwin,
    TrialPhase,
    TrialVerdict,
    TuningTrial,
    TuningTrialStatus,
    TwinState,
)
from chunkpilot.testing.services import NOW, a_service_body
from chunkpilot.testing.trials import a_trial
from chunkpilot.testing.tuner import a_measurement, a_snapshot


def snapshot(
    samples: float = 500.0, twin: ServiceTwin | None = None, trials: tuple[TuningTrial, ...] = ()
) -> Snapshot:
    """The chat example as it is, ``twin`` in its status; stable measured over ``samples`` requests."""
    body = a_service_body(
        trial_window=None,
        warmup=None,
        resource_version=None,
        status=None if twin is None else {"twin": twin.to_k8s()},
    )
    stable = a_measurement("stable", 30.0, 400.0, samples=samples)
    return a_snapshot(body, trials, prometheus=True, stable_reading=Reading(stable))


def finished(number: int, verdict: TrialVerdict, measured: bool = True) -> TuningTrial:
    """Trial ``number`` rolled back at :data:`NOW` (round unlabelled), its canary measured or not."""
    return a_trial(
        number,
        TrialPhase.ROLLED_BACK,
        round_=None,
        window=None,
        started_at=None,
        verdict=verdict,
        finished_at=NOW,
        canary=Measurement(itl_ms=30.0, window="60s") if measured else None,
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


def test_the_rankings_evaluation_cap_comes_from_the_environment() -> None:
    def max_evaluations(environ: dict[str, str]) -> int | None:  # as the tuner's settings read it
        return TunerConfig.from_env(environ).twin_max_evaluations

    assert max_evaluations({}) is None  # the CPU budget alone ends the search
    assert max_evaluations({ENV_TWIN_MAX_EVALUATIONS: "12"}) == 12
    for bad in ("0", "-3", "2.5", "many"):
        with pytest.raises(ValueError, match="CHUNKPILOT_TWIN_MAX_EVALUATIONS"):
            max_evaluations({ENV_TWIN_MAX_EVALUATIONS: bad})
