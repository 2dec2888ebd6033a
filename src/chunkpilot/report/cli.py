"""``chunkpilot report NAME``: the trial history of a service as a table, Markdown and plots."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.console import Console

from chunkpilot.report.history import load_history, trial_rows
from chunkpilot.report.render import render_table, write_report


def _api_client(kubeconfig: str | None, context: str | None) -> Any:
    from kubernetes import config

    return config.new_client_from_config(config_file=kubeconfig, context=context)  # type: ignore[no-untyped-call]


def run_report(args: argparse.Namespace) -> int:
    """Print the trial table and write the report files."""
    console = Console()
    api = _api_client(args.kubeconfig, args.context)
    try:
        service, trials = load_history(api, args.namespace, args.name)
    except Exception as error:  # surfaced to the user verbatim
        reason = getattr(error, "reason", None) or error
        console.print(f"[red]cannot read InferenceService {args.namespace}/{args.name}: {reason}[/]")
        return 1
    rows = trial_rows(trials)
    console.print(render_table(service, rows))
    out_dir = Path(args.out or Path("reports") / args.name)
    path = write_report(service, rows, out_dir)
    console.print(f"report written to {path}")
    return 0


def register(subparsers: Any) -> None:
    """Add ``chunkpilot report``."""
    parser = subparsers.add_parser(
        "report",
        help="trial history of an InferenceService as a table, Markdown and PNG plots",
        description="Read an InferenceService and its TuningTrials and write reports/<name>/report.md "
        "with trials.csv and PNG plots (budget vs latency quantiles, throughput per trial, trade-off).",
    )
    parser.add_argument("name", help="InferenceService name")
    parser.add_argument("-n", "--namespace", default="default")
    parser.add_argument("--kubeconfig", default=None, help="defaults to $KUBECONFIG or ~/.kube/config")
    parser.add_argument("--context", default=None)
    parser.add_argument("--out", default=None, help="output folder (default reports/NAME)")
    parser.set_defaults(func=run_report)
