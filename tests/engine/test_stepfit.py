"""The step-time fitting core: recovery, bounds, priors, uncertainty and clear errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from chunkpilot.engine.stepfit import (
    FloatArray,
    Parameter,
    ResidualFunction,
    StepFitError,
    log_errors,
    relative_errors,
    solve,
    weighted_rms,
)

# A step-time curve of the kind the fitters explain: a power law in the work plus a fixed cost.
TRUE_SCALE, TRUE_EXPONENT, TRUE_OVERHEAD = 0.02, 1.3, 0.5


def _curve(tokens: FloatArray, scale: float, exponent: float, overhead: float) -> FloatArray:
    times: FloatArray = scale * tokens**exponent + overhead
    return times


def _samples(n: int, noise: float = 0.0, seed: int = 3) -> tuple[FloatArray, FloatArray]:
    tokens = np.geomspace(1, 4096, n)
    measured = _curve(tokens, TRUE_SCALE, TRUE_EXPONENT, TRUE_OVERHEAD)
    rng = np.random.default_rng(seed)
    return tokens, measured * (1 + noise * rng.standard_normal(n))


def _parameters(**overrides: Parameter) -> tuple[Parameter, ...]:
    defaults = {
        "scale": Parameter("scale", 1.0, log=True),
        "exponent": Parameter("exponent", 1.0, lower=0.5, upper=3.0),
        "overhead": Parameter("overhead", 0.1, lower=0.0),
    }
    return tuple({**defaults, **overrides}.values())


def _residuals(tokens: FloatArray, measured: FloatArray) -> ResidualFunction:
    def residuals(params: FloatArray) -> FloatArray:
        return relative_errors(_curve(tokens, *params), measured)

    return residuals


def test_noise_free_samples_give_back_the_parameters_that_made_them() -> None:
    tokens, measured = _samples(40)
    fit = solve(_residuals(tokens, measured), _parameters(), max_iterations=200)
    assert fit.value("scale") == pytest.approx(TRUE_SCALE, rel=1e-6)
    assert fit.value("exponent") == pytest.approx(TRUE_EXPONENT, rel=1e-6)
    assert fit.value("overhead") == pytest.approx(TRUE_OVERHEAD, rel=1e-6)
    assert fit.rms < 1e-8
    assert fit.as_dict() == {name: fit.value(name) for name in ("scale", "exponent", "overhead")}
    assert fit.at_bound == (False, False, False)


def test_noisy_samples_are_recovered_within_their_uncertainty() -> None:
    tokens, measured = _samples(400, noise=0.02)
    fit = solve(_residuals(tokens, measured), _parameters(), max_iterations=200)
    assert fit.rms == pytest.approx(0.02, rel=0.15)  # the residuals are the noise
    truth = {"scale": math.log(TRUE_SCALE), "exponent": TRUE_EXPONENT, "overhead": TRUE_OVERHEAD}
    fitted_scale = {"scale": math.log(fit.value("scale")), "exponent": fit.value("exponent")}
    fitted_scale["overhead"] = fit.value("overhead")
    for i, name in enumerate(fit.names):
        # The log parameter's standard error is relative: compare on its fitted (log) scale.
        assert abs(fitted_scale[name] - truth[name]) < 4 * fit.standard_errors[i], name
        assert 0 < fit.standard_errors[i] < 0.1 * max(abs(truth[name]), 1.0), name


def test_log_parameters_stay_positive_and_bounds_hold_where_the_data_pull_past_them() -> None:
    tokens, measured = _samples(40)
    capped = _parameters(exponent=Parameter("exponent", 1.0, lower=0.5, upper=1.2))
    fit = solve(_residuals(tokens, measured), capped, max_iterations=200)
    assert fit.value("exponent") == 1.2  # the data want 1.3
    assert fit.at_bound == (False, True, False)
    assert fit.value("scale") > 0
    assert fit.covariance[1, 1] == 0.0  # a parameter held on its bound is not estimated
    assert fit.rms > 1e-3  # the bound costs fit quality


def test_a_parameter_whose_best_value_is_zero_ends_exactly_on_its_lower_bound() -> None:
    tokens = np.geomspace(1, 4096, 30)
    measured = _curve(tokens, TRUE_SCALE, TRUE_EXPONENT, 0.0)
    fit = solve(_residuals(tokens, measured), _parameters(), max_iterations=200)
    assert fit.value("overhead") == 0.0
    assert fit.at_bound[2]
    assert fit.value("exponent") == pytest.approx(TRUE_EXPONENT, rel=1e-6)


def test_covariance_shrinks_as_samples_accumulate() -> None:
    few_tokens, few = _samples(20, noise=0.02)
    many_tokens, many = _samples(2000, noise=0.02)
    fit_few = solve(_residuals(few_tokens, few), _parameters(), max_iterations=200)
    fit_many = solve(_residuals(many_tokens, many), _parameters(), max_iterations=200)
    ratio = fit_many.standard_errors / fit_few.standard_errors
    # A hundred times the samples: about a tenth of the standard error.
    assert np.all(ratio < 0.2), ratio
    assert np.all(ratio > 0.05), ratio
    assert np.allclose(fit_few.covariance, fit_few.covariance.T)


def test_covariance_scales_with_the_noise_when_weights_are_relative() -> None:
    tokens, quiet = _samples(200, noise=0.01)
    _, loud = _samples(200, noise=0.04)  # the same draws, four times as large
    fit_quiet = solve(_residuals(tokens, quiet), _parameters(), max_iterations=200)
    fit_loud = solve(_residuals(tokens, loud), _parameters(), max_iterations=200)
    ratio = fit_loud.standard_errors / fit_quiet.standard_errors
    assert np.all((ratio > 3.0) & (ratio < 5.0)), ratio
    # With absolute weights the residuals are taken as already normalised: no rescaling by their size.
    absolute = solve(_residuals(tokens, loud), _parameters(), max_iterations=200, absolute_weights=True)
    assert np.all(absolute.standard_errors > 10 * fit_loud.standard_errors)


def test_a_prior_holds_thin_data_near_the_start_and_yields_to_plenty() -> None:
    def parameters(sigma: float) -> tuple[Parameter, ...]:
        return (Parameter("factor", 1.0, lower=0.0, log=True, prior_sigma=sigma),)

    def residuals_for(samples: int) -> ResidualFunction:
        measured = np.full(samples, 2.0)  # the data say the factor is 2
        error = 0.1  # each sample's relative error: weighted residuals

        def residuals(params: FloatArray) -> FloatArray:
            weighted: FloatArray = relative_errors(np.full(samples, params[0]), measured) / error
            return weighted

        return residuals

    thin = solve(residuals_for(1), parameters(0.05), absolute_weights=True)
    plenty = solve(residuals_for(1000), parameters(0.05), absolute_weights=True)
    assert 1.0 < thin.value("factor") < 1.2
    assert plenty.value("factor") == pytest.approx(2.0, rel=0.02)
    # With absolute weights the posterior is narrower than the prior, and narrower with more data.
    assert plenty.standard_errors[0] < thin.standard_errors[0] < 0.05


def test_an_unidentified_direction_reports_infinite_uncertainty() -> None:
    tokens, measured = _samples(20)

    def residuals(params: FloatArray) -> FloatArray:  # only the product of a and b matters
        return relative_errors(_curve(tokens, params[0] * params[1], TRUE_EXPONENT, TRUE_OVERHEAD), measured)

    fit = solve(residuals, (Parameter("a", 1.0, log=True), Parameter("b", 1.0, log=True)), max_iterations=200)
    assert fit.value("a") * fit.value("b") == pytest.approx(TRUE_SCALE, rel=1e-6)
    assert np.all(np.isinf(fit.covariance))


def test_empty_or_degenerate_input_is_a_value_error_that_names_the_problem() -> None:
    tokens, measured = _samples(10)
    residuals = _residuals(tokens, measured)
    with pytest.raises(StepFitError, match="no parameters"):
        solve(residuals, ())
    with pytest.raises(StepFitError, match="no samples"):
        solve(lambda params: np.empty(0), _parameters())
    with pytest.raises(StepFitError, match="not all finite"):
        solve(_residuals(tokens, np.where(tokens > 100, np.nan, measured)), _parameters())
    with pytest.raises(StepFitError, match="need at least 3 samples"):
        solve(_residuals(tokens[:2], measured[:2]), _parameters())
    with pytest.raises(StepFitError, match="positive start"):
        Parameter("scale", 0.0, log=True)
    with pytest.raises(StepFitError, match=r"within \[0.5, 3.0\]"):
        Parameter("exponent", 4.0, lower=0.5, upper=3.0)
    with pytest.raises(StepFitError, match="prior_sigma must be positive"):
        Parameter("scale", 1.0, prior_sigma=0.0)
    assert issubclass(StepFitError, ValueError)


def test_too_few_samples_are_fine_when_a_prior_covers_every_parameter() -> None:
    fit = solve(
        lambda params: relative_errors(params[:1], np.array([2.0])),
        (Parameter("x", 1.0, log=True, prior_sigma=1.0), Parameter("y", 1.0, log=True, prior_sigma=1.0)),
        absolute_weights=True,
    )
    assert fit.value("x") > 1.0
    assert fit.value("y") == pytest.approx(1.0)


def test_the_objective_helpers() -> None:
    predicted, measured = np.array([1.1, 0.5, 2.0]), np.array([1.0, 1.0, 2.0])
    assert relative_errors(predicted, measured) == pytest.approx([0.1, -0.5, 0.0])
    assert log_errors(predicted, measured) == pytest.approx([math.log(1.1), math.log(0.5), 0.0])
    assert weighted_rms(np.array([3.0, 4.0])) == pytest.approx(math.sqrt(12.5))
    assert weighted_rms(np.array([3.0, 4.0]), np.array([1.0, 0.0])) == pytest.approx(3.0)
