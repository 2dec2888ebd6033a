"""The roofline-vs-measured table ``chunkpilot probe`` and ``chunkpilot probe report`` print."""

from __future__ import annotations

import pytest
from chunkpilot.engine.probe.cli import format_report
from chunkpilot.engine.probe.profile import StepProfile
from chunkpilot.engine.probe.roofline import linear_cost
from chunkpilot.engine.sim.profiles.loader import load_accelerator


def _rows(text: str) -> dict[int, list[str]]:
    return {
        int(cells[0]): cells for line in text.splitlines() if (cells := line.split()) and cells[0].isdigit()
    }


def test_table_has_the_datasheet_error_per_token_count(small_profile: StepProfile) -> None:
    text = format_report(small_profile)
    h200 = load_accelerator("h200")
    rows = _rows(text)
    assert sorted(rows) == [p.tokens for p in small_profile.points]
    for point in small_profile.points:
        _, measured, _, fit_err, datasheet, sheet_err = rows[point.tokens]
        assert float(measured) == pytest.approx(point.linear_ms, rel=1e-3)
        flops, moved = linear_cost(small_profile.shard.linears, point.tokens, 2)
        roof_ms = max(flops / h200.peak_flops, moved / h200.hbm_bytes_per_s) * 1000
        assert float(datasheet) == pytest.approx(roof_ms, rel=1e-3)
        assert float(sheet_err.rstrip("%")) == pytest.approx((roof_ms / point.linear_ms - 1) * 100, abs=0.06)
        assert float(fit_err.rstrip("%")) == pytest.approx(0.0, abs=0.06)  # a synthetic curve fits exactly
    # The measured knee (75 % compute, 70 % bandwidth) sits above the plain datasheet ridge.
    assert f"knee: {small_profile.knee_tokens} tokens (datasheet roofline: 221 tokens)" in text
    assert "ITL target 50 ms: feasible token budget" in text


def test_without_a_datasheet_the_table_says_how_to_compare(small_profile: StepProfile) -> None:
    cpu = small_profile.model_copy(update={"accelerator": "cpu"})
    text = format_report(cpu)
    assert all(len(cells) == 4 for cells in _rows(text).values())
    assert "no datasheet for accelerator 'cpu'; pass --accelerator" in text
    assert "datasheet roofline" not in text
    assert _rows(format_report(cpu, accelerator="h200"))[1][4]  # --accelerator h200 adds the columns
