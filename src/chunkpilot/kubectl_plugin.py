"""``kubectl chunkpilot``: trials, status, pause, resume and what-if for InferenceServices.

Installed as the ``kubectl-chunkpilot`` console script, so kubectl finds it on PATH
as a plugin. It honours ``$KUBECONFIG`` like kubectl does.

Only the standard library is imported at start-up: rich, the Kubernetes client and the API
models are imported inside the commands, so ``--help`` and argument errors stay cheap.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from chunkpilot.pipes import quiet_broken_pipe

if TYPE_CHECKING:
    from rich.console import Console


class PluginError(Exception):
    """A failure to report as one line of text, as kubectl does."""


class NotFoundError(PluginError):
    """The API server has no such object."""


def _kubectl(args: argparse.Namespace, *argv: str) -> str:
    """Run the kubectl this plugin runs under and return its output.

    kubectl reads the kubeconfig (contexts, exec credential plugins, proxies) exactly as the
    user's other commands do, and costs a fraction of the Kubernetes client's import.
    """
    import shutil
    import subprocess

    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise PluginError("kubectl is not on PATH; kubectl chunkpilot runs as a kubectl plugin")
    config = ["--kubeconfig", args.kubeconfig] if args.kubeconfig else []
    done = subprocess.run([kubectl, *config, *argv], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        message = done.stderr.strip() or f"kubectl exited with status {done.returncode}"
        raise (NotFoundError if "(NotFound)" in message else PluginError)(message)
    return done.stdout


def _resource() -> str:
    from chunkpilot.api.names import GROUP, ISVC_PLURAL

    return f"{ISVC_PLURAL}.{GROUP}"


def _get_service(args: argparse.Namespace) -> dict[str, Any]:
    import json

    from chunkpilot.api.names import GROUP, ISVC_PLURAL, VERSION

    path = f"/apis/{GROUP}/{VERSION}/namespaces/{args.namespace}/{ISVC_PLURAL}/{args.name}"
    service: dict[str, Any] = json.loads(_kubectl(args, "get", "--raw", path))
    return service


def _config_text(config: dict[str, Any] | None) -> str:
    """A status config (camelCase keys) in the knob table's short form, e.g. ``budget=3072 seqs=256``."""
    if not config:
        return "-"
    from chunkpilot.api.knobs import TUNABLE, summary

    return summary({knob.name: config.get(knob.camel) for knob in TUNABLE})


def cmd_trials(args: argparse.Namespace, console: Console) -> int:
    """List a service's trials."""
    from kubernetes import config

    from chunkpilot.report.history import load_history, trial_rows
    from chunkpilot.report.render import render_table

    api = config.new_client_from_config(config_file=args.kubeconfig)  # type: ignore[no-untyped-call]
    service, trials = load_history(api, args.namespace, args.name)
    if not trials:
        console.print(f"{args.name} has no trials yet")
        return 0
    console.print(render_table(service, trial_rows(trials)))
    return 0


def _objective_text(objective: dict[str, Any]) -> str:
    return f"p{objective.get('quantile', 0) * 100:g} ≤ {objective.get('maxMs', '?')} ms"


def _number(value: Any, unit: str, digits: int = 1) -> str:
    return "no data" if value is None else f"{value:.{digits}f}{unit}"


def cmd_status(args: argparse.Namespace, console: Console) -> int:
    """Conditions, applied vs best config, last measurement.

    Rendered from the object's JSON with the knob table alone: no models, no Kubernetes client,
    so the command costs little more than the kubectl call it makes.
    """
    from rich.table import Table

    service = _get_service(args)
    spec: dict[str, Any] = service.get("spec", {})
    status: dict[str, Any] = service.get("status") or {}
    console.print(f"[bold]{args.namespace}/{args.name}[/]  phase: {status.get('phase') or 'Pending'}")
    slo = spec.get("slo")
    slo_text = (
        "none declared"
        if not slo
        else f"ITL {_objective_text(slo.get('itl', {}))}, TTFT {_objective_text(slo.get('ttft', {}))}"
    )
    autotune = spec.get("autotune", {})
    state = "paused" if autotune.get("paused") else "on" if autotune.get("enabled") else "off"
    console.print(f"SLOs: {slo_text}; autotune {state}")
    table = Table("condition", "status", "reason", "message")
    for cond in status.get("conditions", []):
        table.add_row(
            cond.get("type", ""), cond.get("status", ""), cond.get("reason", ""), cond.get("message", "")
        )
    console.print(table)
    console.print(f"applied: {_config_text(status.get('appliedConfig'))}")
    best_trial = status.get("bestTrial")
    console.print(
        f"best:    {_config_text(status.get('bestConfig'))}" + (f" ({best_trial})" if best_trial else "")
    )
    last = status.get("lastMeasurement")
    if last is None:
        console.print("last measurement: none yet")
    else:
        console.print(
            f"last measurement ({last.get('window') or '?'}): ITL {_number(last.get('itlMs'), ' ms')}, "
            f"TTFT {_number(last.get('ttftMs'), ' ms')}, {_number(last.get('throughputTokS'), ' tok/s')}, "
            f"{_number(last.get('requestRate'), ' req/s')}"
        )
    twin = status.get("twin")
    if twin is not None:
        console.print(f"twin: {twin.get('state')}: {twin.get('message', '')}")
        capacity = twin.get("capacityReqS")
        if capacity is not None:
            live = twin.get("liveRequestRate")
            console.print(
                f"predicted capacity at SLO (stable config): {capacity:.2f} req/s per replica; "
                f"live load {'?' if live is None else f'{live:.2f}'} req/s per replica"
            )
    if status.get("currentTrial"):
        console.print(f"current trial: {status['currentTrial']}")
    return 0


def _set_paused(args: argparse.Namespace, console: Console, paused: bool) -> int:
    import json

    body = json.dumps({"spec": {"autotune": {"paused": paused}}})
    _kubectl(args, "patch", _resource(), args.name, "-n", args.namespace, "--type", "merge", "-p", body)
    console.print(f"{args.namespace}/{args.name}: autotuning {'paused' if paused else 'resumed'}")
    return 0


def cmd_whatif(args: argparse.Namespace, console: Console) -> int:
    """The service's twin, fitted on its telemetry, at ``--rate`` over ``--replicas`` with ``--set``."""
    import os
    from datetime import UTC, datetime

    url = args.prometheus_url or os.environ.get(PROMETHEUS_ENV)
    if not url:
        raise PluginError(
            "whatif fits the service's twin on its telemetry: give --prometheus-url (the Prometheus the"
            f" operator reads) or set {PROMETHEUS_ENV}"
        )
    settings: dict[str, str] = {}
    for item in args.set or []:
        knob, sep, value = item.partition("=")
        if not sep or not knob:
            raise PluginError(f"--set {item!r}: expected KNOB=VALUE, e.g. maxNumBatchedTokens=4096")
        settings[knob.strip()] = value.strip()
    body = _get_service(args)
    from chunkpilot.tuner.measure import PrometheusClient
    from chunkpilot.tuner.whatif import what_if

    client = PrometheusClient(url)
    answer = what_if(
        body,
        client.query,
        client.vector,
        datetime.now(UTC),
        rate_req_s=args.rate,
        replicas=args.replicas,
        settings=settings,
    )
    console.print(answer.text(), highlight=False)
    return 0


#: Where ``whatif`` finds the Prometheus the operator reads, when ``--prometheus-url`` is not given.
PROMETHEUS_ENV = "CHUNKPILOT_PROMETHEUS_URL"


def build_parser() -> argparse.ArgumentParser:
    """The plugin's argument parser."""
    parser = argparse.ArgumentParser(prog="kubectl chunkpilot", description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", default=None, help="defaults to $KUBECONFIG or ~/.kube/config")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, help_text in (
        ("trials", "list the service's tuning trials"),
        ("status", "conditions, applied vs best config, last measurement"),
        ("pause", "pause autotuning (the applied config keeps serving)"),
        ("resume", "resume autotuning"),
    ):
        cmd = sub.add_parser(name, help=help_text)
        cmd.add_argument("name", help="InferenceService name")
        cmd.add_argument("-n", "--namespace", default="default")
    whatif = sub.add_parser(
        "whatif", help="predicted latency and capacity at another rate, replica count or knobs (the twin)"
    )
    whatif.add_argument("name", help="InferenceService name")
    whatif.add_argument("-n", "--namespace", default="default")
    whatif.add_argument("--rate", type=float, required=True, help="requests/s over the whole service")
    whatif.add_argument("--replicas", type=int, help="stable replicas (default: those running)")
    whatif.add_argument(
        "--set",
        action="append",
        metavar="KNOB=VALUE",
        help="a knob, e.g. maxNumBatchedTokens=4096 (repeatable)",
    )
    whatif.add_argument(
        "--prometheus-url", help=f"the Prometheus the operator reads (default ${PROMETHEUS_ENV})"
    )
    return parser


def _run(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    from rich.console import Console

    class PluginConsole(Console):
        def on_broken_pipe(self) -> None:
            # rich's default exits 1; main ends every vanished reader the same way (141).
            raise BrokenPipeError

    console = PluginConsole()
    handlers = {
        "trials": lambda: cmd_trials(args, console),
        "status": lambda: cmd_status(args, console),
        "pause": lambda: _set_paused(args, console, True),
        "resume": lambda: _set_paused(args, console, False),
        "whatif": lambda: cmd_whatif(args, console),
    }
    try:
        return handlers[args.command]()
    except BrokenPipeError:  # stdout's reader went away: not an error to print (see main)
        raise
    except NotFoundError:
        console.print(f"[red]InferenceService {args.namespace}/{args.name} not found[/]")
        return 1
    except Exception as error:  # kubectl plugins report errors as text
        if getattr(error, "status", None) == 404:  # the Kubernetes client's (trials)
            console.print(f"[red]InferenceService {args.namespace}/{args.name} not found[/]")
            return 1
        console.print(f"[red]error: {getattr(error, 'reason', None) or error}[/]")
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``kubectl-chunkpilot``; ends quietly when stdout's reader goes away."""
    return quiet_broken_pipe(lambda: _run(argv))


if __name__ == "__main__":
    sys.exit(main())
