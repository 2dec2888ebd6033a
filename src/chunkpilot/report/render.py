"""Render a trial history as a terminal table, Markdown and PNG plots."""

from __future__ import annotations

import csv
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.table import Table

from chunkpilot.api import InferenceService, SLOSpec
from chunkpilot.report.history import TrialRow
from chunkpilot.report.timeline import TIMELINE_PLOT, Timeline, TimelinePoint, plot_timeline

_VERDICT_COLOURS = {
    "Promoted": "tab:green",
    "Discarded": "tab:gray",
    "Pruned": "tab:orange",
    "Aborted": "tab:red",
    "": "tab:blue",
}


def format_ms(value: float | None) -> str:
    """Milliseconds rounded for tables, ``-`` for no data (None or NaN)."""
    return "-" if value is None or math.isnan(value) else f"{value:.0f}"


def _slo(service: InferenceService) -> SLOSpec:
    if service.spec.slo is None:
        raise ValueError(f"InferenceService {service.metadata.name} declares no SLOs: nothing to report")
    return service.spec.slo


def _vs(value: float | None, target: float) -> str:
    return f"{format_ms(value)}/{target:.0f}ms"


def format_capacity(row: TrialRow) -> str:
    """``9.96 req/s (±13%)``: the twin's predicted capacity and its error on the canary; ``-``: none."""
    if row.capacity_req_s is None:
        return "-"
    error = "" if row.twin_error is None else f" (±{row.twin_error:.0%})"
    return f"{row.capacity_req_s:.2f} req/s{error}"


def render_table(service: InferenceService, rows: list[TrialRow]) -> Table:
    """A rich table of trials: parameters, ITL/TTFT against their targets, throughput, verdict."""
    slo = _slo(service)
    itl_q, ttft_q = slo.itl.quantile, slo.ttft.quantile
    table = Table(title=f"Trials of {service.metadata.name}", title_justify="left")
    table.add_column("#", justify="right")
    table.add_column("params")
    table.add_column(f"ITL p{itl_q * 100:g}", justify="right")
    table.add_column(f"TTFT p{ttft_q * 100:g}", justify="right")
    table.add_column("tok/s", justify="right")
    table.add_column("req/s", justify="right")
    table.add_column("capacity (twin)", justify="right")
    table.add_column("phase")
    table.add_column("verdict")
    for row in rows:
        itl_ok = row.itl_ms is not None and row.itl_ms <= slo.itl.max_ms
        ttft_ok = row.ttft_ms is not None and row.ttft_ms <= slo.ttft.max_ms
        table.add_row(
            str(row.number),
            row.params,
            f"[{'green' if itl_ok else 'red'}]{_vs(row.itl_ms, slo.itl.max_ms)}[/]",
            f"[{'green' if ttft_ok else 'red'}]{_vs(row.ttft_ms, slo.ttft.max_ms)}[/]",
            "-" if row.throughput_tok_s is None else f"{row.throughput_tok_s:.0f}",
            "-" if row.request_rate is None else f"{row.request_rate:.2f}",
            format_capacity(row),
            row.phase,
            row.verdict or "-",
        )
    return table


def render_markdown(
    service: InferenceService, rows: list[TrialRow], plots: list[Path], timeline: Timeline | None = None
) -> str:
    """The report as Markdown: the service's SLOs and outcome, the trial table, the plots, and with a
    ``timeline`` the load, replicas and latency quantiles over the run."""
    slo = _slo(service)
    status = service.status
    lines = [
        f"# Tuning report: {service.metadata.namespace}/{service.metadata.name}",
        "",
        f"- SLOs: ITL p{slo.itl.quantile * 100:g} ≤ {slo.itl.max_ms:g} ms, "
        f"TTFT p{slo.ttft.quantile * 100:g} ≤ {slo.ttft.max_ms:g} ms",
        f"- Starting budget: {service.spec.engine.max_num_batched_tokens} tokens",
    ]
    if status and status.applied_config:
        lines.append(
            f"- Applied now: budget {status.applied_config.max_num_batched_tokens}, "
            f"max-num-seqs {status.applied_config.max_num_seqs} (hash {status.applied_config_hash})"
        )
    if status and status.best_trial:
        lines.append(f"- Best trial: {status.best_trial}")
    lines += [
        f"- Trials: {len(rows)} ({sum(r.verdict == 'Promoted' for r in rows)} promoted)",
        "",
        "| # | params | ITL ms | TTFT ms | stable ITL ms | tok/s | req/s | capacity (twin) | samples "
        "| verdict | reason |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        tput = "-" if r.throughput_tok_s is None else f"{r.throughput_tok_s:.0f}"
        rate = "-" if r.request_rate is None else f"{r.request_rate:.2f}"
        reason = r.reason.replace("|", "/").replace("\n", " ")
        lines.append(
            f"| {r.number} | {r.params} | {format_ms(r.itl_ms)} | {format_ms(r.ttft_ms)} "
            f"| {format_ms(r.stable_itl_ms)} "
            f"| {tput} | {rate} | {format_capacity(r)} | {r.samples if r.samples is not None else '-'} "
            f"| {r.verdict or r.phase} "
            f"| {reason} |"
        )
    lines.append("")
    lines += [f"![{p.stem}]({p.name})" for p in plots if p.stem != TIMELINE_PLOT]
    if timeline is not None:
        lines += ["", "## Load, replicas and latency over the run", "", *timeline.summary(slo), ""]
        lines += [f"![{p.stem}]({p.name})" for p in plots if p.stem == TIMELINE_PLOT]
    return "\n".join(lines) + "\n"


def _plot(
    service: InferenceService, rows: list[TrialRow], out_dir: Path, timeline: Timeline | None = None
) -> list[Path]:
    """Draw the report's figures (three of the trials, one of the timeline); returns the PNG paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    slo = _slo(service)
    drawn: list[Path] = []
    if timeline is not None and timeline.points:
        title = f"{service.metadata.name}: load, replicas and SLO quantiles over the run"
        drawn.append(plot_timeline(plt, timeline, slo, title, out_dir))
    measured = [r for r in rows if r.itl_ms is not None or r.ttft_ms is not None]
    if not measured:
        return drawn  # no trial measured yet: the report is the table (and the timeline)
    colours = [_VERDICT_COLOURS.get(r.verdict, "tab:blue") for r in measured]
    paths: list[Path] = []

    fig, (ax_itl, ax_ttft) = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, attr, target, label in (
        (ax_itl, "itl_ms", slo.itl.max_ms, f"ITL p{slo.itl.quantile * 100:g} (ms)"),
        (ax_ttft, "ttft_ms", slo.ttft.max_ms, f"TTFT p{slo.ttft.quantile * 100:g} (ms)"),
    ):
        xs = [r.budget for r in measured]
        ys = [getattr(r, attr) if getattr(r, attr) is not None else math.nan for r in measured]
        ax.scatter(xs, ys, c=colours, s=40, zorder=3)
        for r, y in zip(measured, ys, strict=True):
            ax.annotate(str(r.number), (r.budget, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
        ax.axhline(target, color="tab:red", linestyle="--", label="SLO")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("token budget (max-num-batched-tokens)")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best")
    fig.suptitle(f"{service.metadata.name}: latency quantiles vs budget (colour = verdict)")
    fig.tight_layout()
    path = out_dir / "budget_vs_latency.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)

    paths.append(_per_trial(plt, rows, out_dir))

    fig, ax = plt.subplots(figsize=(7, 4.5))
    pts = [
        (r, r.itl_ms, r.throughput_tok_s)
        for r in measured
        if r.itl_ms is not None and r.throughput_tok_s is not None
    ]
    ax.scatter(
        [itl for _, itl, _ in pts],
        [tput for _, _, tput in pts],
        c=[_VERDICT_COLOURS.get(r.verdict, "tab:blue") for r, _, _ in pts],
        s=40,
        zorder=3,
    )
    for r, itl, tput in pts:
        ax.annotate(
            f"{r.budget}",
            (itl, tput),
            fontsize=8,
            textcoords="offset points",
            xytext=(4, 4),
        )
    ax.axvline(slo.itl.max_ms, color="tab:red", linestyle="--", label="ITL SLO")
    ax.set_xlabel(f"ITL p{slo.itl.quantile * 100:g} (ms)")
    ax.set_ylabel("throughput (tokens/s)")
    ax.set_title("Measured trade-off: throughput vs ITL (labels = budget)")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best")
    fig.tight_layout()
    path = out_dir / "tradeoff.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)
    return paths + drawn


def _per_trial(plt: Any, rows: list[TrialRow], out_dir: Path) -> Path:
    """Predicted capacity per trial with the twin's error (with a twin); else measured throughput."""
    colours = [_VERDICT_COLOURS.get(r.verdict, "tab:blue") for r in rows]
    labels = [str(r.number) for r in rows]
    fig, ax = plt.subplots(figsize=(8, 3.8))
    if any(r.capacity_req_s is not None for r in rows):
        values = [r.capacity_req_s or 0.0 for r in rows]
        errors = [(r.twin_error or 0.0) * v for r, v in zip(rows, values, strict=True)]
        ax.bar(labels, values, color=colours, yerr=errors, capsize=4)
        for i, r in enumerate(rows):
            if r.twin_error is not None:
                ax.annotate(
                    f"±{r.twin_error:.0%}",
                    (i, values[i]),
                    ha="center",
                    xytext=(0, 6),
                    textcoords="offset points",
                    fontsize=8,
                )
        ax.set_ylabel("predicted capacity at SLO (req/s per replica)")
        ax.set_title("Twin's predicted capacity per trial, ± its error on the canary (colour = verdict)")
        name = "capacity_per_trial.png"
    else:
        ax.bar(labels, [r.throughput_tok_s or 0.0 for r in rows], color=colours)
        ax.set_ylabel("throughput (tokens/s)")
        ax.set_title("Throughput per trial (colour = verdict)")
        name = "throughput_per_trial.png"
    ax.set_xlabel("trial")
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    path = out_dir / name
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(
    service: InferenceService, rows: list[TrialRow], out_dir: Path, timeline: Timeline | None = None
) -> Path:
    """Write ``report.md``, ``trials.csv`` and the PNG plots to ``out_dir`` (with a ``timeline``, its
    plot and ``timeline.csv`` too); return the Markdown path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    note = ""
    try:
        plots = _plot(service, rows, out_dir, timeline)
    except ImportError:  # matplotlib is the optional ``report`` extra
        plots = []
        note = "Plots skipped: install the `report` extra (`pip install 'chunkpilot[report]'`).\n"
    with (out_dir / "trials.csv").open("w", newline="") as handle:
        fields = [*TrialRow.__dataclass_fields__]
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            writer.writerow(asdict(row))
    if timeline is not None:
        with (out_dir / "timeline.csv").open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=[*TimelinePoint.__dataclass_fields__])
            writer.writeheader()
            writer.writerows(timeline.rows())
    path = out_dir / "report.md"
    path.write_text(render_markdown(service, rows, plots, timeline) + note)
    return path
