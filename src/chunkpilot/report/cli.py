"""``chunkpilot report NAME``: the trial history of a service as a table, Markdown and plots; with
``--prometheus-url``, its request rate, replicas and SLO quantiles over time as well."""

from __future__ import annotations

import argparse
import os
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from chunkpilot.api import InferenceService, parse_duration
from chunkpilot.operator.config import ENV_PROMETHEUS_URL
from chunkpilot.report.history import load_history, trial_rows
from chunkpilot.report.render import render_table, write_report
from chunkpilot.report.timeline import (
    RangeQuery,
    Timeline,
    read_timeline,
    replica_queries,
    replica_samples,
    timeline_queries,
)

#: How far back ``--prometheus-url`` looks unless ``--since`` says otherwise.
DEFAULT_SINCE = "1h"


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
    timeline = None
    if args.prometheus_url:
        from chunkpilot.tuner.measure import MetricsUnavailableError, PrometheusClient

        try:
            since_s = float(parse_duration(args.since))
            timeline = service_timeline(
                service, PrometheusClient(args.prometheus_url).matrix, since_s, time.time()
            )
        except (MetricsUnavailableError, ValueError) as error:
            console.print(f"[yellow]the report has no timeline: {error}[/]")
    out_dir = Path(args.out or Path("reports") / args.name)
    path = write_report(service, rows, out_dir, timeline)
    console.print(f"report written to {path}")
    return 0


def service_timeline(
    service: InferenceService, range_query: RangeQuery, since_s: float, now: float
) -> Timeline:
    """The service's timeline over the last ``since_s`` seconds to ``now`` (from its creation if that
    is later), every quantity from Prometheus: the rate and SLO quantiles over all its engines, the
    stable engines it scrapes, the replicas the planner asks for."""
    name, namespace = service.metadata.name or "", service.metadata.namespace or "default"
    slo = service.spec.slo
    if slo is None:
        raise ValueError(f"InferenceService {namespace}/{name} has no spec.slo to draw against")
    if not since_s > 0:
        raise ValueError(f"--since must be a positive duration such as 30m or 2h, got {since_s:g} s")
    start = now - since_s
    created = (service.metadata.model_extra or {}).get("creationTimestamp")
    if isinstance(created, str):
        start = max(start, datetime.fromisoformat(created.replace("Z", "+00:00")).timestamp())
    start = float(int(start))  # Prometheus answers range queries on whole seconds
    queries = timeline_queries(
        name, namespace, str(service.spec.engine.kind), slo.itl.quantile, slo.ttft.quantile
    )
    samples = replica_samples(range_query, replica_queries(name, namespace), start, now)
    return read_timeline(range_query, queries, start, now, samples)


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
    parser.add_argument(
        "--prometheus-url",
        metavar="URL",
        default=os.environ.get(ENV_PROMETHEUS_URL),
        help=f"(default ${ENV_PROMETHEUS_URL}) "
        "also plot the request rate, stable and desired replicas and both SLO quantiles over time "
        "from this Prometheus (the one the operator reads)",
    )
    parser.add_argument(
        "--since",
        default=DEFAULT_SINCE,
        help=f"with --prometheus-url: how far back the timeline reaches (default {DEFAULT_SINCE}; never "
        "before the service was created)",
    )
    parser.set_defaults(func=run_report)
