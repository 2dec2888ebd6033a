"""``kubectl chunkpilot``: trials, status, pause and resume for InferenceServices.

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

    from chunkpilot.api import EngineConfig


def _custom_api(args: argparse.Namespace) -> Any:
    from kubernetes import client, config

    return client.CustomObjectsApi(config.new_client_from_config(config_file=args.kubeconfig))  # type: ignore[no-untyped-call]


def _config_text(config: EngineConfig | None) -> str:
    if config is None:
        return "-"
    return config.summary()


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


def cmd_status(args: argparse.Namespace, console: Console) -> int:
    """Conditions, applied vs best config, last measurement."""
    from rich.table import Table

    from chunkpilot.api import GROUP, ISVC_PLURAL, VERSION, InferenceService

    raw = _custom_api(args).get_namespaced_custom_object(
        GROUP, VERSION, args.namespace, ISVC_PLURAL, args.name
    )
    service = InferenceService.from_manifest(raw)
    status = service.status
    slo = service.spec.slo
    console.print(f"[bold]{args.namespace}/{args.name}[/]  phase: {status.phase if status else 'Pending'}")
    slo_text = (
        "none declared"
        if slo is None
        else f"ITL p{slo.itl.quantile * 100:g} ≤ {slo.itl.max_ms:g} ms, "
        f"TTFT p{slo.ttft.quantile * 100:g} ≤ {slo.ttft.max_ms:g} ms"
    )
    autotune = service.spec.autotune
    state = "paused" if autotune.paused else "on" if autotune.enabled else "off"
    console.print(f"SLOs: {slo_text}; autotune {state}")
    table = Table("condition", "status", "reason", "message")
    for cond in status.conditions if status else []:
        table.add_row(str(cond.type), str(cond.status), cond.reason or "", cond.message or "")
    console.print(table)
    console.print(f"applied: {_config_text(status.applied_config if status else None)}")
    console.print(
        f"best:    {_config_text(status.best_config if status else None)}"
        + (f" ({status.best_trial})" if status and status.best_trial else "")
    )
    last = status.last_measurement if status else None
    if last is None:
        console.print("last measurement: none yet")
    else:

        def fmt(v: float | None, unit: str) -> str:
            return "no data" if v is None else f"{v:.1f}{unit}"

        console.print(
            f"last measurement ({last.window or '?'}): ITL {fmt(last.itl_ms, ' ms')}, "
            f"TTFT {fmt(last.ttft_ms, ' ms')}, {fmt(last.throughput_tok_s, ' tok/s')}, "
            f"{fmt(last.request_rate, ' req/s')}"
        )
    twin = status.twin if status else None
    if twin is not None:
        console.print(f"twin: {twin.state.value}: {twin.message}")
        if twin.capacity_req_s is not None:
            live = "?" if twin.live_request_rate is None else f"{twin.live_request_rate:.2f}"
            console.print(
                f"predicted capacity at SLO (stable config): {twin.capacity_req_s:.2f} req/s per replica; "
                f"live load {live} req/s per replica"
            )
    if status and status.current_trial:
        console.print(f"current trial: {status.current_trial}")
    return 0


def _set_paused(args: argparse.Namespace, console: Console, paused: bool) -> int:
    from chunkpilot.api import GROUP, ISVC_PLURAL, VERSION

    body = {"spec": {"autotune": {"paused": paused}}}
    _custom_api(args).patch_namespaced_custom_object(
        GROUP, VERSION, args.namespace, ISVC_PLURAL, args.name, body
    )
    console.print(f"{args.namespace}/{args.name}: autotuning {'paused' if paused else 'resumed'}")
    return 0


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
    }
    try:
        return handlers[args.command]()
    except BrokenPipeError:  # stdout's reader went away: not an error to print (see main)
        raise
    except Exception as error:  # kubectl plugins report errors as text
        status = getattr(error, "status", None)
        if status == 404:
            console.print(f"[red]InferenceService {args.namespace}/{args.name} not found[/]")
            return 1
        console.print(f"[red]error: {getattr(error, 'reason', None) or error}[/]")
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``kubectl-chunkpilot``; ends quietly when stdout's reader goes away."""
    return quiet_broken_pipe(lambda: _run(argv))


if __name__ == "__main__":
    sys.exit(main())
