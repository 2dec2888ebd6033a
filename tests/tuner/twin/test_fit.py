"""The twin's step-time fit against a hidden truth: the simulator on slower-than-datasheet hardware."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
from chunkpilot.engine.sim.engine import SimConfig
from chunkpilot.engine.sim.metrics import StepTelemetry, StepTotals
from chunkpilot.engine.sim.offline import simulate
from chunkpilot.engine.sim.scheduler import SchedulerConfig
from chunkpilot.engine.sim.steptime import ForwardPass, StepProfile
from chunkpilot.engine.sim.workload import Workload, load_trace
from chunkpilot.tuner.twin.fit import MIN_STEPS, TwinFitError, fit_steps

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
    assert abs(math.log(fit_thin.scales.compute)) < abs(math.log(fit_full.scales.compute))
