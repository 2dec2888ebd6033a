"""The twin's step-time fit against a hidden truth: the simulator on slower-than-datasheet hardware."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from importlib.resources import files
from pathlib import Path

import numpy as np
import pytest
from chunkpilot.engine.sim.engine import SimConfig
from chunkpilot.engine.sim.metrics import StepShape, StepTelemetry, StepTotals
from chunkpilot.engine.sim.offline import simulate
from chunkpilot.engine.sim.scheduler import SchedulerConfig
from chunkpilot.engine.sim.steptime import ForwardPass, StepProfile, StepTimeModel
from chunkpilot.engine.sim.workload import Workload, load_trace
from chunkpilot.tuner.twin.fit import (
    FADE_OCTAVES,
    MIN_STEPS,
    PRIOR_SIGMA,
    STRUCTURE_SIGMA,
    TwinFit,
    TwinFitError,
    _points,
    duration_quantile,
    fit_steps,
    predict_mean_step,
    step_spread,
)
from chunkpilot.tuner.twin.predict import Twin

from chunkpilot.bench.twin_truth import Perturbation, write_truth

MODEL, GPU = "llama-3.1-8b", "h100"
SCHED = SchedulerConfig(max_num_batched_tokens=1024, max_num_seqs=256, max_model_len=8192)


@pytest.fixture(scope="module")
def lengths() -> Workload:
    return load_trace("azure_conv_2023", rate=4.0, limit=200)


def _telemetry(config: SimConfig, workload: Workload) -> dict[str, StepTotals]:
    telemetry = StepTelemetry()
    simulate(config, workload, telemetry=telemetry)
    return telemetry.totals()


@pytest.mark.parametrize(
    "perturbation", [Perturbation(0.75, 0.85, 2.0), Perturbation(0.6, 0.7, 3.0)], ids=lambda p: p.label
)
def test_fit_recovers_the_hardware_and_the_step_time_curve(
    perturbation: Perturbation, lengths: Workload, tmp_path: Path
) -> None:
    truth = write_truth(tmp_path, perturbation, model=MODEL, accelerator=GPU, scheduler=SCHED)
    fit = fit_steps(_telemetry(truth, lengths), MODEL, GPU)
    # Compute is identified by the prefill chunks (compute-bound at 1024 tokens), memory by the decode
    # context the steps read; per-step overhead and weight streaming both add a constant to every small
    # step, so the fit may trade some memory bandwidth for overhead (a weak direction the prior settles):
    # the bounds are the measured recoveries (compute < 1 %, memory < 10 %) with a margin.
    assert fit.scales.compute == pytest.approx(perturbation.compute, rel=0.03)
    assert fit.scales.memory == pytest.approx(perturbation.memory, rel=0.12)
    assert fit.rms_relative_error < 0.01 < fit.prior_rms_relative_error


def test_fitted_profile_predicts_step_times_the_window_did_not_contain(
    lengths: Workload, tmp_path: Path
) -> None:
    perturbation = Perturbation(0.75, 0.85, 2.0)
    truth = write_truth(tmp_path / "truth", perturbation, model=MODEL, accelerator=GPU, scheduler=SCHED)
    fit = fit_steps(_telemetry(truth, lengths), MODEL, GPU)
    profile = StepProfile.load(fit.write_profile(tmp_path / "twin.json"))
    twin_core = SimConfig(
        model=MODEL, accelerator=GPU, scheduler=SCHED, step_profile=str(tmp_path / "twin.json")
    )
    twin_model = twin_core.build().step_model
    truth_model = truth.build().step_model
    datasheet = replace(twin_core, step_profile=None).build().step_model
    assert profile.accelerator == GPU
    shapes = [
        ForwardPass(4096, 1, 1, 4096 * 4097 / 2, 4096, 0),  # a 4096-token prefill, never seen at 1024
        ForwardPass(512, 512, 512, 0.0, 0, 512 * 1500),  # 512 decodes, more than ever ran at once
        ForwardPass(2048 + 64, 65, 65, 2048 * 3000.0, 3000, 64 * 900),  # mixed step
        ForwardPass(8, 8, 8, 0.0, 0, 8 * 300),  # a light decode step
    ]
    for shape in shapes:
        truth_s, twin_s, prior_s = (m.step_time(shape) for m in (truth_model, twin_model, datasheet))
        assert twin_s == pytest.approx(truth_s, rel=0.03), shape
        assert abs(prior_s / truth_s - 1) > 0.1  # the datasheet alone is far off: the fit did the work


def test_without_perturbation_the_fit_stays_at_the_datasheet(lengths: Workload) -> None:
    config = SimConfig(model=MODEL, accelerator=GPU, scheduler=SCHED)
    fit = fit_steps(_telemetry(config, lengths), MODEL, GPU)
    for value in (fit.scales.compute, fit.scales.memory, fit.scales.step_overhead):
        assert value == pytest.approx(1.0, rel=0.05)


def test_too_few_steps_is_an_error_that_says_how_many(lengths: Workload) -> None:
    config = SimConfig(model=MODEL, accelerator=GPU, scheduler=SCHED)
    telemetry = _telemetry(config, replace(lengths, requests=lengths.requests[:1]))
    some = dict(list(telemetry.items())[:1])
    steps = sum(t.steps for t in some.values())
    assert steps < MIN_STEPS
    with pytest.raises(TwinFitError, match=rf"{steps:g} engine steps in the window, {MIN_STEPS} needed"):
        fit_steps(some, MODEL, GPU)


def test_thin_data_leans_on_the_datasheet_prior(lengths: Workload, tmp_path: Path) -> None:
    truth = write_truth(
        tmp_path, Perturbation(0.75, 0.85, 2.0), model=MODEL, accelerator=GPU, scheduler=SCHED
    )
    full = _telemetry(truth, lengths)
    # One step per bucket, as if the window had just opened: the estimate moves less far from 1.
    thin = {
        label: StepTotals(*(getattr(t, f) / t.steps for f in StepTotals.__dataclass_fields__))
        for label, t in full.items()
    }
    fit_full = fit_steps(full, MODEL, GPU)
    fit_thin = fit_steps(thin, MODEL, GPU, min_steps=1)

    def distance_from_datasheet(fit: TwinFit) -> float:
        """The prior's penalty: squared log scales over their prior spreads."""
        logs = [math.log(v) / sigma for v, sigma in zip(fit.scales.as_array(), PRIOR_SIGMA, strict=True)]
        return sum(x * x for x in logs)

    assert distance_from_datasheet(fit_thin) < distance_from_datasheet(fit_full)


def _structural_truth() -> SimConfig:
    """A truth the roofline cannot describe: measured linear-layer curves, attention and overheads apart."""
    profile = files("chunkpilot.bench").joinpath("truths", "h100-vidur-l125-o5ms.json")
    return SimConfig(model=MODEL, accelerator=GPU, scheduler=SCHED, step_profile=str(profile))


def test_measured_buckets_correct_what_the_roofline_cannot_fit(lengths: Workload) -> None:
    telemetry = _telemetry(_structural_truth(), lengths)
    fit = fit_steps(telemetry, MODEL, GPU)
    points = sorted(_points(telemetry), key=lambda p: p.tokens)
    roofline, corrected = fit.roofline(), fit.step_model()

    def rms(model: StepTimeModel) -> float:
        errors = [(predict_mean_step(model, p) / p.mean_s - 1) ** 2 * p.steps for p in points]
        return math.sqrt(sum(errors) / sum(p.steps for p in points))

    assert [c.tokens for c in fit.corrections] == [p.tokens for p in points]
    # The seven scales leave a structural error the per-bucket corrections take out where measured.
    assert rms(roofline) > 0.01
    assert rms(corrected) < rms(roofline) / 2


def test_a_bucket_of_few_steps_keeps_less_of_its_residual(lengths: Workload) -> None:
    full = _telemetry(_structural_truth(), lengths)
    thin = {
        label: StepTotals(*(getattr(t, f) / t.steps for f in StepTotals.__dataclass_fields__))
        for label, t in full.items()
    }
    fit_full = fit_steps(full, MODEL, GPU)
    fit_thin = fit_steps(thin, MODEL, GPU, min_steps=1)
    full_kept = [abs(c.log_ratio) for c in fit_full.corrections]
    thin_kept = [abs(c.log_ratio) for c in fit_thin.corrections]
    # The same bucket means, weighed by 1 step instead of thousands: shrunk toward the roofline.
    assert sum(thin_kept) < sum(full_kept)
    assert all(t.sigma > f.sigma for t, f in zip(fit_thin.corrections, fit_full.corrections, strict=True))


def test_uncertainty_grows_beyond_the_observed_token_counts(lengths: Workload) -> None:
    fit = fit_steps(_telemetry(_structural_truth(), lengths), MODEL, GPU)
    observed = fit.observed_tokens()
    assert observed is not None
    low, high = observed
    inside = fit.step_sigma(math.sqrt(low * high))
    beyond = fit.step_sigma(high * 8)
    assert inside < beyond
    assert beyond >= STRUCTURE_SIGMA  # the roofline's shape is only a guess out there
    # Past the fade the correction is gone: the roofline alone extrapolates.
    assert fit.linear_factor(high * 2 ** (FADE_OCTAVES + 1)) == 1.0


def _lognormal_counts(median_s: float, sigma: float, steps: int = 4000, seed: int = 5) -> tuple[float, ...]:
    """Per-slot counts of ``steps`` log-normal step durations on the step-duration bounds."""
    draws = np.random.default_rng(seed).lognormal(math.log(median_s), sigma, steps)
    telemetry = StepTelemetry()
    decode = StepShape(8, 0, 8, 8, 8, 8, 0.0, 0, 8 * 512)  # eight sequences decoding
    for d in draws:
        telemetry.observe(decode, float(d))
    return telemetry.duration_counts()["8"]


def test_the_spread_beyond_the_models_own_is_recovered_from_coarse_duration_slots() -> None:
    model_only = _lognormal_counts(0.012, 0.05)
    noisy = _lognormal_counts(0.012, 0.4)
    assert duration_quantile(noisy, 0.5) == pytest.approx(0.012, rel=0.1)
    ((tokens, sigma),) = step_spread({"8": noisy}, {"8": model_only})
    assert tokens == 8 and sigma == pytest.approx(0.4, abs=0.08)
    # What the model's own steps already spread is not counted twice; too few steps count nothing.
    assert step_spread({"8": model_only}, {"8": model_only}) == ((8, 0.0),)
    assert step_spread({"8": tuple(c / 1000 for c in noisy)}, {}) == ()


def test_a_twin_with_dispersion_predicts_the_tail_the_engine_shows(lengths: Workload, tmp_path: Path) -> None:
    # The "engine": the datasheet simulator with single steps spread by 0.35 everywhere.
    fit = fit_steps(_telemetry(SimConfig(model=MODEL, accelerator=GPU, scheduler=SCHED), lengths), MODEL, GPU)
    document = fit.profile_document()
    document["step_log_sigma"] = {"1": 0.35, "65536": 0.35}
    engine_profile = tmp_path / "engine.json"
    engine_profile.write_text(json.dumps(document), encoding="utf-8")
    engine = SimConfig(model=MODEL, accelerator=GPU, scheduler=SCHED, step_profile=str(engine_profile))
    telemetry = StepTelemetry()
    measured = simulate(engine, lengths, telemetry=telemetry)
    twin = Twin.build(fit, lengths, tmp_path / "twin")
    steady = simulate(twin.config(SCHED, spread=True), lengths)
    spread_twin = twin.with_dispersion(telemetry.duration_counts(), SCHED, lengths)
    assert spread_twin.fit.dispersion and all(0.2 < s < 0.5 for _, s in spread_twin.fit.dispersion if _ <= 64)
    predicted = simulate(spread_twin.config(SCHED, spread=True), lengths)
    # Without the spread the ITL p90 is far under the engine's; with it, close.
    assert steady.itl_ms.p90 < measured.itl_ms.p90 * 0.85
    assert predicted.itl_ms.p90 == pytest.approx(measured.itl_ms.p90, rel=0.15)
    # Capacities stay on the modelled step times.
    assert spread_twin.config(SCHED).step_profile == twin.config(SCHED).step_profile
