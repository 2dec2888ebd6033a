"""Report rendering from TuningTrial objects (pure: no cluster)."""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path

import pytest

from chunkpilot.api import InferenceService, TuningTrial
from chunkpilot.report import render_markdown, trial_rows, write_report
from chunkpilot.report.render import render_table
from chunkpilot.testing.services import LLAMA_8B, a_manifest
from chunkpilot.testing.trials import a_trial_manifest

SERVICE = a_manifest(
    "chat",
    "default",
    {
        "model": {"name": LLAMA_8B["name"]},
        "engine": {"kind": "sim", "maxNumBatchedTokens": 8192, "maxNumSeqs": 256},
        "slo": {"itl": {"quantile": 0.99, "maxMs": 50}, "ttft": {"quantile": 0.95, "maxMs": 2000}},
        "autotune": {"enabled": True},
    },
)


def _trial(number: int, budget: int, itl: float | None, verdict: str, tput: float) -> TuningTrial:
    status = {
        "phase": "Promoted" if verdict == "Promoted" else "RolledBack",
        "verdict": verdict,
        "reason": f"reason {number} | piped",
        "canary": {"itlMs": itl, "ttftMs": 900.0, "throughputTokS": tput, "requestRate": 4.0},
        "stable": {"itlMs": 80.0, "ttftMs": 700.0},
    }
    return TuningTrial.from_manifest(a_trial_manifest("chat", number, budget, status))


@pytest.fixture
def history() -> tuple[InferenceService, list[TuningTrial]]:
    trials = [_trial(2, 1024, 35.0, "Promoted", 2100.0), _trial(1, 4096, 72.0, "Discarded", 2500.0)]
    trials.append(_trial(3, 512, None, "Aborted", 0.0))
    return InferenceService.from_manifest(SERVICE), trials


def test_rows_are_ordered_and_flattened(history: tuple[InferenceService, list[TuningTrial]]) -> None:
    rows = trial_rows(history[1])
    assert [r.number for r in rows] == [1, 2, 3]
    assert rows[0].budget == 4096 and rows[0].itl_ms == 72.0 and rows[0].stable_itl_ms == 80.0
    assert rows[1].params == "budget=1024 seqs=128"
    assert rows[2].itl_ms is None


def test_table_marks_slo_breaches(history: tuple[InferenceService, list[TuningTrial]]) -> None:
    service, trials = history
    table = render_table(service, trial_rows(trials))
    assert table.row_count == 3
    itl_cells = list(table.columns[2].cells)
    assert itl_cells[0] == "[red]72/50ms[/]"
    assert itl_cells[1] == "[green]35/50ms[/]"
    assert itl_cells[2] == "[red]-/50ms[/]"


def test_markdown_escapes_pipes(history: tuple[InferenceService, list[TuningTrial]]) -> None:
    service, trials = history
    text = render_markdown(service, trial_rows(trials), [])
    assert "ITL p99 ≤ 50 ms" in text
    assert "reason 1 / piped" in text
    assert text.count("\n| ") == 4  # header + three trials


def test_write_report_creates_plots_and_csv(
    history: tuple[InferenceService, list[TuningTrial]], tmp_path: Path
) -> None:
    service, trials = history
    path = write_report(service, trial_rows(trials), tmp_path / "out")
    assert path.read_text().startswith("# Tuning report: default/chat")
    pngs = sorted(p.name for p in path.parent.glob("*.png"))
    assert pngs == ["budget_vs_latency.png", "throughput_per_trial.png", "tradeoff.png"]
    for png in path.parent.glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with (path.parent / "trials.csv").open() as handle:
        assert [row["budget"] for row in csv.DictReader(handle)] == ["4096", "1024", "512"]


def test_report_without_measurements_is_the_table_alone(tmp_path: Path) -> None:
    service = InferenceService.from_manifest(SERVICE)
    rows = trial_rows([_trial(1, 4096, None, "Aborted", 0.0)])
    rows = [replace(row, itl_ms=None, ttft_ms=None) for row in rows]
    path = write_report(service, rows, tmp_path)
    assert path.exists()
    assert not list(tmp_path.glob("*.png"))


def test_with_a_twin_the_report_shows_predicted_capacity_and_its_error(
    history: tuple[InferenceService, list[TuningTrial]], tmp_path: Path
) -> None:
    service, trials = history
    twin = {"capacityReqS": 9.96, "capacity": 586.0, "capacityUnit": "tok/s/GPU", "error": 0.13}
    with_twin = []
    for trial in trials:
        assert trial.status is not None
        block = twin if trial.spec.number == 2 else {**twin, "capacityReqS": 7.1, "error": 0.4}
        status = trial.status.model_copy(
            update={"twin": type(trial.status).model_validate({"twin": block}).twin}
        )
        with_twin.append(trial.model_copy(update={"status": status}))
    rows = trial_rows(with_twin)
    assert [(r.capacity_req_s, r.twin_error) for r in rows] == [(7.1, 0.4), (9.96, 0.13), (7.1, 0.4)]
    markdown = render_markdown(service, rows, [])
    assert "| 9.96 req/s (±13%) |" in markdown and "capacity (twin)" in markdown
    path = write_report(service, rows, tmp_path)
    pngs = sorted(p.name for p in path.parent.glob("*.png"))
    assert pngs == ["budget_vs_latency.png", "capacity_per_trial.png", "tradeoff.png"]
