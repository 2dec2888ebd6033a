"""The one step-time fitting core: residuals, a bounded Levenberg-Marquardt solver and its uncertainty.

The fitters that explain measured times with a step-time model share this core: the probe's roofline
(:mod:`chunkpilot.engine.probe.fit`) and the twin's fit to step telemetry
(:mod:`chunkpilot.tuner.twin.fit`). Each keeps its model (how a sample is predicted from parameters)
and its I/O; the core holds what they have in common:

* the objective: errors relative to the measurement (times span orders of magnitude, so an absolute
  fit would ignore the small steps), or log ratios, optionally weighted;
* :func:`solve`, nonlinear least squares over any number of named :class:`Parameter` s, each fitted on
  a log scale (positive factors: efficiencies, scales) or a linear one (fixed costs that may be zero),
  within bounds, optionally pulled toward its start by a Gaussian prior;
* :class:`LeastSquaresFit`, the fitted values with the residual rms and the parameter covariance from
  the Jacobian at the optimum.

Pure numpy; parameters should be of order one on their fitted scale (log parameters are; give linear
ones a unit that makes them so) because the Jacobian is taken by forward differences of fixed size.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = [
    "FloatArray",
    "LeastSquaresFit",
    "Parameter",
    "ResidualFunction",
    "StepFitError",
    "log_errors",
    "relative_errors",
    "solve",
    "weighted_rms",
]

FloatArray = npt.NDArray[np.float64]
#: Residuals (weighted, data only, no prior) of the model at natural-scale parameter values.
ResidualFunction = Callable[[FloatArray], FloatArray]


class StepFitError(ValueError):
    """A fit cannot run: no samples, non-finite values, bad bounds or fewer samples than parameters."""


def relative_errors(predicted: FloatArray, measured: FloatArray) -> FloatArray:
    """``(predicted - measured) / measured`` per sample: every sample counts in proportion to itself."""
    errors: FloatArray = (np.asarray(predicted, dtype=np.float64) - measured) / measured
    return errors


def log_errors(predicted: FloatArray, measured: FloatArray) -> FloatArray:
    """``log(predicted / measured)`` per sample: relative errors that treat too fast and too slow alike."""
    errors: FloatArray = np.log(np.asarray(predicted, dtype=np.float64) / measured)
    return errors


def weighted_rms(errors: FloatArray, weights: FloatArray | None = None) -> float:
    """Root mean square of ``errors``, each counted ``weights`` times (all once when None)."""
    return float(np.sqrt(np.average(np.square(errors), weights=weights)))


@dataclass(frozen=True, slots=True)
class Parameter:
    """One unknown of a model: where the fit starts, its bounds and its fitted scale.

    ``log`` fits ``log(value)`` (the value stays positive, so an unbounded one is bounded by zero,
    and its uncertainty is relative);
    ``prior_sigma`` adds a Gaussian prior centred on ``start`` with that width on the fitted scale
    (log-normal for a log parameter), so with little data the start wins and with much the data.
    """

    name: str
    start: float
    lower: float = -math.inf
    upper: float = math.inf
    log: bool = False
    prior_sigma: float | None = None

    def __post_init__(self) -> None:
        if not self.lower <= self.start <= self.upper or not math.isfinite(self.start):
            raise StepFitError(
                f"parameter {self.name}: start {self.start} must be finite "
                f"and within [{self.lower}, {self.upper}]"
            )
        if self.log and not (self.start > 0 and (self.lower >= 0 or self.lower == -math.inf)):
            raise StepFitError(
                f"parameter {self.name}: a log-scale parameter needs a positive start and no negative "
                f"bound, got start {self.start} and lower bound {self.lower}"
            )
        if self.prior_sigma is not None and not self.prior_sigma > 0:
            raise StepFitError(f"parameter {self.name}: prior_sigma must be positive, got {self.prior_sigma}")

    def to_fitted(self, value: float) -> float:
        """The value on the fitted scale (its log for a log parameter; a bound at zero becomes -inf)."""
        if not self.log:
            return value
        return math.log(value) if value > 0 else -math.inf


@dataclass(frozen=True, slots=True, eq=False)
class LeastSquaresFit:
    """The result of :func:`solve`.

    ``values`` are natural-scale; ``covariance`` is on the fitted scale (for a log parameter the
    variance of ``log(value)``, a relative uncertainty), zero in the rows of parameters held at a
    bound and infinite where the data and prior leave a direction undetermined. ``rms`` is that of
    the data residuals (as ``residuals`` weights them, priors left out), ``cost`` the minimised sum of
    squares (priors included).
    """

    names: tuple[str, ...]
    values: FloatArray
    covariance: FloatArray
    rms: float
    cost: float
    at_bound: tuple[bool, ...]
    iterations: int

    def value(self, name: str) -> float:
        """The fitted value of the parameter called ``name``."""
        return float(self.values[self.names.index(name)])

    def as_dict(self) -> dict[str, float]:
        """Parameter name to fitted value."""
        return {name: float(v) for name, v in zip(self.names, self.values, strict=True)}

    @property
    def standard_errors(self) -> FloatArray:
        """One standard deviation of each parameter on its fitted scale (relative for log parameters)."""
        errors: FloatArray = np.sqrt(np.diag(self.covariance))
        return errors


class _Problem:
    """The solver's view: fitted-scale vector in, data residuals plus prior rows out."""

    def __init__(self, residuals: ResidualFunction, parameters: Sequence[Parameter]) -> None:
        self.function = residuals
        self.log = np.array([p.log for p in parameters])
        self.lower = np.array([p.to_fitted(p.lower) for p in parameters], dtype=np.float64)
        self.upper = np.array([p.to_fitted(p.upper) for p in parameters], dtype=np.float64)
        self.start = np.array([p.to_fitted(p.start) for p in parameters], dtype=np.float64)
        self.prior = np.array([p.prior_sigma is not None for p in parameters])
        self.prior_sigma = np.array([p.prior_sigma or 1.0 for p in parameters], dtype=np.float64)[self.prior]

    def natural(self, x: FloatArray) -> FloatArray:
        values: FloatArray = np.where(self.log, np.exp(x), x)
        return values

    def data(self, x: FloatArray) -> FloatArray:
        return np.asarray(self.function(self.natural(x)), dtype=np.float64)

    def residuals(self, x: FloatArray) -> FloatArray:
        prior = (x - self.start)[self.prior] / self.prior_sigma
        return np.concatenate([self.data(x), prior])

    def jacobian(self, x: FloatArray, r: FloatArray, step: float) -> FloatArray:
        jacobian = np.empty((r.size, x.size))
        for j in range(x.size):
            shifted = x.copy()
            shifted[j] += step
            jacobian[:, j] = (self.residuals(shifted) - r) / step
        return jacobian


def solve(
    residuals: ResidualFunction,
    parameters: Sequence[Parameter],
    *,
    absolute_weights: bool = False,
    max_iterations: int = 60,
    jacobian_step: float = 1e-5,
    cost_tolerance: float = 1e-10,
    step_tolerance: float = 1e-6,
) -> LeastSquaresFit:
    """Minimise the sum of squared ``residuals`` (plus the priors) over ``parameters``.

    ``residuals`` maps the natural-scale values (in the order of ``parameters``) to the model's
    weighted errors, one per sample. Levenberg-Marquardt with Marquardt's diagonal scaling; a step is
    projected onto the bounds and a parameter on a bound that the gradient pushes outward stays
    there. ``absolute_weights`` says the residuals are already divided by their measurement error, so
    the covariance is ``(J^T J)^-1`` as is; otherwise it is scaled by the residual variance (reduced
    chi-square). Stops when a step lowers the cost by less than ``cost_tolerance`` relatively or moves
    no parameter by more than ``step_tolerance`` on its fitted scale.

    Raises :class:`StepFitError` for no parameters, no residuals, non-finite residuals at the start,
    or (without priors on every parameter) fewer residuals than parameters.
    """
    if not parameters:
        raise StepFitError("no parameters to fit")
    problem = _Problem(residuals, parameters)
    x = problem.start.copy()
    data = problem.data(x)
    if data.size == 0:
        raise StepFitError("no samples to fit")
    if not np.all(np.isfinite(data)):
        raise StepFitError(
            "the residuals at the start are not all finite; check the samples for zeros and NaNs"
        )
    if data.size < int(np.count_nonzero(~problem.prior)):
        raise StepFitError(
            f"need at least {int(np.count_nonzero(~problem.prior))} samples to fit the parameters "
            f"without a prior, got {data.size}"
        )
    r = problem.residuals(x)
    cost = float(r @ r)
    damping = 1e-3
    iterations = max_iterations
    for iteration in range(1, max_iterations + 1):
        jacobian = problem.jacobian(x, r, jacobian_step)
        gradient = jacobian.T @ r
        free = _free(x, gradient, problem)
        if not free.any():
            iterations = iteration
            break
        normal = (jacobian.T @ jacobian)[np.ix_(free, free)]
        improved = converged = False
        while damping < 1e8:
            delta = np.zeros_like(x)
            delta[free] = np.linalg.solve(
                normal + damping * np.diag(np.diag(normal) + 1e-12), -gradient[free]
            )
            candidate = np.clip(x + delta, problem.lower, problem.upper)
            r_new = problem.residuals(candidate)
            cost_new = float(r_new @ r_new)
            if cost_new < cost:
                moved = float(np.abs(np.where(candidate == x + delta, delta, candidate - x)).max())
                converged = cost - cost_new < cost_tolerance * max(cost, 1e-12) or moved < step_tolerance
                x, r, cost = candidate, r_new, cost_new
                damping = max(damping / 3, 1e-9)
                improved = True
                break
            damping *= 4
        if not improved or converged:
            iterations = iteration
            break
    final_data = problem.data(x)
    at_bound = (x <= problem.lower) | (x >= problem.upper)
    covariance = _covariance(problem.jacobian(x, r, jacobian_step), at_bound)
    if not absolute_weights:
        dof = final_data.size - int(np.count_nonzero(~at_bound))
        if dof > 0:
            variance = float(final_data @ final_data) / dof
            finite = np.isfinite(covariance)
            covariance[finite] *= variance
        else:  # no degree of freedom left to estimate the residual variance from
            covariance = np.where(covariance == 0, 0.0, math.inf)
    return LeastSquaresFit(
        names=tuple(p.name for p in parameters),
        values=problem.natural(x),
        covariance=covariance,
        rms=weighted_rms(final_data),
        cost=cost,
        at_bound=tuple(bool(b) for b in at_bound),
        iterations=iterations,
    )


def _free(x: FloatArray, gradient: FloatArray, problem: _Problem) -> npt.NDArray[np.bool_]:
    """Parameters a step may move: all but those on a bound that descent would push through."""
    held = ((x <= problem.lower) & (gradient > 0)) | ((x >= problem.upper) & (gradient < 0))
    return ~held


def _covariance(jacobian: FloatArray, held: npt.NDArray[np.bool_]) -> FloatArray:
    """``(J^T J)^-1`` over the parameters off their bounds (zero for the rest, inf if singular)."""
    n = jacobian.shape[1]
    covariance = np.zeros((n, n))
    free = ~held
    if not free.any():
        return covariance
    normal = jacobian[:, free].T @ jacobian[:, free]
    scale = np.sqrt(np.diag(normal))
    if np.any(scale == 0) or np.linalg.cond(normal / np.outer(scale, scale)) > 1e12:
        covariance[np.ix_(free, free)] = math.inf
        return covariance
    inverse = np.linalg.inv(normal / np.outer(scale, scale)) / np.outer(scale, scale)
    covariance[np.ix_(free, free)] = inverse
    return covariance
