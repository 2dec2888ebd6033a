"""The trial window an observation measures, and how a service is read (pure parts of observe)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from chunkpilot.tuner.measure import TrackMeasurement, WindowMeasurement
from chunkpilot.tuner.observe.observer import parse_service
from chunkpilot.tuner.observe.snapshot import (
    MIN_EARLY_WINDOW_S,
    Reading,
    twin_checks,
    window_plan,
    window_text,
)
from chunkpilot.tuner.policy import AbortRules, SLOTargets

from chunkpilot.testing.tuner import a_measurement

T0 = datetime(2026, 1, 1, tzinfo=UTC)
WINDOW_S = 60.0


def test_nothing_is_measured_while_warming_up_or_before_the_shortest_early_window() -> None:
    assert window_plan(T0 + timedelta(seconds=1), WINDOW_S, T0) is None  # warming up
    assert window_plan(None, WINDOW_S, T0) is None  # no start recorded: it starts now
    assert window_plan(T0, WINDOW_S, T0 + timedelta(seconds=MIN_EARLY_WINDOW_S - 1)) is None


def test_an_open_window_ends_now_and_a_finished_one_at_its_end() -> None:
    open_ = window_plan(T0, WINDOW_S, T0 + timedelta(seconds=20))
    assert open_ is not None and not open_.final
    assert (open_.at, open_.span_s, open_.widened_at) == (T0 + timedelta(seconds=20), 20.0, None)
    over = window_plan(T0, WINDOW_S, T0 + timedelta(seconds=60))
    assert over is not None and over.final and over.at == T0 + timedelta(seconds=60)
    assert over.widened_at is None  # exactly at the end: nothing to widen yet


def test_past_the_end_the_window_widens_up_to_now_capped_at_the_deadline() -> None:
    late = window_plan(T0, WINDOW_S, T0 + timedelta(seconds=75))
    assert late is not None and late.final and late.at == T0 + timedelta(seconds=60)
    assert late.widened_at == T0 + timedelta(seconds=75)
    assert late.deadline == T0 + timedelta(seconds=120)  # twice the window
    capped = window_plan(T0, WINDOW_S, T0 + timedelta(seconds=500))
    assert capped is not None and capped.widened_at == capped.deadline


def test_window_text_and_reading() -> None:
    assert window_text(0.4) == "1s" and window_text(75.9) == "75s"
    assert Reading(error="refused").down and not Reading(value=1.0).down and not Reading[float]().down


def test_an_invalid_status_reads_as_empty_and_an_invalid_spec_as_none() -> None:
    body = {
        "apiVersion": "chunkpilot.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "chat", "namespace": "default"},
        "spec": {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}},
        "status": {"bestConfig": {"maxNumBatchedTokens": "lots"}},
    }
    isvc = parse_service(body)
    assert isvc is not None and isvc.status is not None and isvc.status.best_config is None
    assert parse_service({**body, "spec": {"model": {}}}) is None


def test_the_tuner_reads_a_service_with_the_installations_default_images() -> None:
    body = {
        "apiVersion": "chunkpilot.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "chat", "namespace": "default"},
        "spec": {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, "engine": {"kind": "sim"}},
    }
    mirrored = parse_service(body, image_registry="mirror.local")
    assert mirrored is not None and (mirrored.spec.engine.image or "").startswith("mirror.local/chunkpilot/")
    plain = parse_service(body)
    assert plain is not None and plain.spec.engine.image is None


def _window(canary_itl_ms: float) -> WindowMeasurement:
    def track(name: str, itl_ms: float) -> TrackMeasurement:
        return a_measurement(name, itl_ms, 400.0, samples=200.0, window="20s", time=T0)

    return WindowMeasurement(track("canary", canary_itl_ms), track("stable", 40.0))


def test_the_twin_checks_a_canary_at_the_end_of_its_window_or_when_it_is_pruned_early() -> None:
    slo, abort = SLOTargets(50.0, 2000.0), AbortRules(itl_factor=2.0, ttft_factor=2.0, min_samples=100)
    open_ = window_plan(T0, WINDOW_S, T0 + timedelta(seconds=20))
    over = window_plan(T0, WINDOW_S, T0 + timedelta(seconds=60))
    assert open_ is not None and over is not None
    assert twin_checks(over, _window(30.0), slo, abort)  # the window is over
    assert not twin_checks(open_, _window(30.0), slo, abort)  # open, within the abort limits
    assert twin_checks(open_, _window(150.0), slo, abort)  # open, but pruned on it: 150 > 2 x 50 ms
    assert not twin_checks(over, None, slo, abort)  # nothing measured
