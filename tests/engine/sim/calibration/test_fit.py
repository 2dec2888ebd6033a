"""The bundled efficiency constants are the fit of the A100 reference, and the fit is good."""

from __future__ import annotations

from dataclasses import asdict

import pytest
from chunkpilot.engine.sim.calibration.fit import (
    ELEMENTWISE_OPERATORS,
    GEMM_OPERATORS,
    error_table,
    fit,
    load_reference,
)
from chunkpilot.engine.sim.steptime import Efficiency


def test_bundled_constants_are_the_fit_of_the_reference() -> None:
    fitted, bundled = asdict(fit()), asdict(Efficiency.calibrated())
    for name, value in fitted.items():
        assert bundled[name] == pytest.approx(value), name


def test_reference_covers_three_models_and_tensor_parallelism() -> None:
    rows = load_reference()
    assert {r.model for r in rows} == {"llama-2-7b", "llama-2-70b", "llama-3-8b"}
    assert {r.tp for r in rows} >= {1, 2, 4}


def _mean_error(operator: str) -> float:
    table = [row for row in error_table() if row.operator == operator]
    return sum(r.mean_abs_pct * r.samples for r in table) / sum(r.samples for r in table)


@pytest.mark.parametrize("operator", GEMM_OPERATORS)
def test_gemm_error_is_small(operator: str) -> None:
    assert _mean_error(operator) < 10.0


@pytest.mark.parametrize("operator", ELEMENTWISE_OPERATORS)
def test_elementwise_error_is_bounded(operator: str) -> None:
    assert _mean_error(operator) < 50.0  # microsecond kernels: the shared launch floor dominates
