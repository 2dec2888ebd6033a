"""``chunkpilot operator`` (run the operator) and ``chunkpilot render`` (print child manifests offline)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, TextIO
from urllib.parse import urlsplit

import yaml
from chunkpilot.operator.config import (
    DEFAULT_METRICS_PORT,
    ENV_AUTOTUNER,
    ENV_EXPECTED_REPLICAS,
    ENV_KUBECONFIG,
    ENV_METRICS_PORT,
    ENV_OPTUNA_STORAGE,
    ENV_POD_MONITOR,
    ENV_POD_MONITOR_LABELS,
    ENV_PROMETHEUS_URL,
    OperatorConfig,
    PodMonitorMode,
    parse_labels,
    parse_port,
)

#: The variable of the environment each flag overrides (by the configuration field both set).
FLAG_VARIABLES: Final = {
    "pod_monitor": ENV_POD_MONITOR,
    "pod_monitor_labels": ENV_POD_MONITOR_LABELS,
    "prometheus_url": ENV_PROMETHEUS_URL,
    "metrics_port": ENV_METRICS_PORT,
    "optuna_storage": ENV_OPTUNA_STORAGE,
    "autotuner": ENV_AUTOTUNER,
    "kubeconfig": ENV_KUBECONFIG,
}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``operator`` and ``render`` commands."""
    run = subparsers.add_parser(
        "operator",
        help="run the operator (reconciles InferenceServices)",
        description="Run the Chunkpilot operator against the cluster of the service account or kubeconfig.",
    )
    scope = run.add_mutually_exclusive_group()
    scope.add_argument(
        "-n", "--namespace", action="append", dest="namespaces", metavar="NS", help="watch NS (repeatable)"
    )
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace")
    peering = run.add_mutually_exclusive_group()
    peering.add_argument(
        "--peering", metavar="NAME", help="mandatory Kopf peering object: only one replica acts"
    )
    peering.add_argument("--standalone", action="store_true", help="no peering (a single replica only)")
    run.add_argument("--priority", type=int, help="peering priority (default: higher for older replicas)")
    run.add_argument(
        "--liveness", metavar="URL", help="serve a liveness endpoint, e.g. http://0.0.0.0:8081/healthz"
    )
    # A flag not given (None) leaves its setting to the environment, read once by run_operator.
    run.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then $KUBECONFIG)")
    run.add_argument(
        "--pod-monitor",
        choices=[mode.value for mode in PodMonitorMode],
        help="create PodMonitors: auto = when monitoring.coreos.com/v1 is served (default)",
    )
    run.add_argument(
        "--pod-monitor-labels",
        metavar="K=V,...",
        help="labels on each PodMonitor so Prometheus selects it, e.g. release=kube-prometheus-stack",
    )
    run.add_argument("--prometheus-url", help="Prometheus for the autotuner")
    run.add_argument(
        "--metrics-port",
        metavar="PORT",
        help=f"serve the operator's Prometheus metrics on PORT (default {DEFAULT_METRICS_PORT}; 0 = off)",
    )
    run.add_argument(
        "--optuna-storage",
        metavar="URL",
        help="Optuna RDB storage the autotuner mirrors its studies into, e.g. postgresql://... or"
        " sqlite:////data/optuna.db (default: $CHUNKPILOT_OPTUNA_STORAGE)",
    )
    run.add_argument(
        "--no-autotuner", action="store_true", help="serve InferenceServices without loading the autotuner"
    )
    run.add_argument("-v", "--verbose", action="store_true", help="log handler activity")
    run.add_argument("--debug", action="store_true", help="log everything, including API traffic")
    run.set_defaults(func=run_operator)
    # `chunkpilot operator bench` is added by chunkpilot.bench.operator_load: the product holds no benchmark.
    commands = run.add_subparsers(dest="operator_command", metavar="{release,bench}")
    release = commands.add_parser(
        "release",
        help="after `helm uninstall`: take the operator's finalizer off InferenceServices",
        description=(
            "Remove the operator's finalizer from InferenceServices, so that deleting them once the"
            " operator is uninstalled does not wait for it. Run it after `helm uninstall`; the services"
            " keep serving, unmanaged."
        ),
    )
    where = release.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "-n", "--namespace", action="append", dest="namespaces", metavar="NS", help="in NS (repeatable)"
    )
    where.add_argument("-A", "--all-namespaces", action="store_true", help="in every namespace")
    release.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then $KUBECONFIG)")
    release.set_defaults(func=run_release)

    render = subparsers.add_parser(
        "render",
        help="print the manifests the operator would create for an InferenceService",
        description="Validate InferenceService manifests and print their children (no cluster needed).",
    )
    render.add_argument(
        "-f", "--filename", required=True, help="YAML file with InferenceServices ('-' = stdin)"
    )
    render.add_argument(
        "--pod-monitor",
        action="store_true",
        help="include the PodMonitor (created when Prometheus Operator is installed)",
    )
    render.add_argument(
        "--pod-monitor-labels", default="", metavar="K=V,...", help="labels on the PodMonitor"
    )
    render.set_defaults(func=run_render)


def operator_config(args: argparse.Namespace, environ: Mapping[str, str]) -> OperatorConfig:
    """The operator's configuration: each flag given, else its variable in ``environ``, else the default.

    ``environ`` is read here, once (a variable a flag overrides is not read). Raises
    :class:`ValueError` naming the flag or the variable of a value it cannot use.
    """
    flags: dict[str, Any] = {}
    if args.pod_monitor is not None:
        flags["pod_monitor"] = PodMonitorMode(args.pod_monitor)
    if args.pod_monitor_labels is not None:
        flags["pod_monitor_labels"] = parse_labels(args.pod_monitor_labels)
    if args.prometheus_url is not None:
        flags["prometheus_url"] = args.prometheus_url or None
    if args.metrics_port is not None:
        flags["metrics_port"] = parse_port(args.metrics_port)
    if args.optuna_storage is not None:
        flags["optuna_storage"] = args.optuna_storage.strip() or None
    if args.no_autotuner:
        flags["autotuner"] = False
    if args.kubeconfig:
        flags["kubeconfig"] = str(Path(args.kubeconfig).resolve())
    overridden = {FLAG_VARIABLES[name] for name in flags}
    config = OperatorConfig.from_env({k: v for k, v in environ.items() if k not in overridden})
    return dataclasses.replace(config, **flags)


def run_release(args: argparse.Namespace) -> int:
    """``chunkpilot operator release``: print each service released."""
    import asyncio

    from chunkpilot.operator.config import FIELD_MANAGER
    from chunkpilot.operator.kube import KubeClient, KubeError
    from chunkpilot.operator.release import release_finalizers

    async def release() -> list[str]:
        kube = KubeClient.from_environment(field_manager=FIELD_MANAGER, kubeconfig=args.kubeconfig)
        try:
            return await release_finalizers(kube, () if args.all_namespaces else args.namespaces)
        finally:
            await kube.close()

    try:
        released = asyncio.run(release())
    except (KubeError, RuntimeError) as error:
        print(f"chunkpilot operator release: {error}", file=sys.stderr)
        return 1
    for name in released:
        print(f"released {name}")
    print(f"{len(released)} InferenceService(s) released")
    return 0


def run_operator(args: argparse.Namespace) -> int:
    """Start Kopf with the operator's handlers; returns when the operator stops."""
    import kopf
    from chunkpilot.operator import ha, startup

    if not args.namespaces and not args.all_namespaces:
        print(
            "chunkpilot operator: choose what to watch: -n/--namespace NS (repeatable)"
            " or -A/--all-namespaces",
            file=sys.stderr,
        )
        return 2
    environ = os.environ  # read once, here: the settings below are handed down, never re-read
    try:
        config = operator_config(args, environ)
    except ValueError as error:
        print(f"chunkpilot operator: {error}", file=sys.stderr)
        return 2
    if config.metrics_port and args.liveness and urlsplit(args.liveness).port == config.metrics_port:
        print(
            f"chunkpilot operator: --metrics-port {config.metrics_port} is also the --liveness port:"
            " choose different ports",
            file=sys.stderr,
        )
        return 2
    problem = ha.check_peering_settings(
        expected_replicas=config.expected_replicas,
        standalone=args.standalone,
        mandatory=args.peering is not None,
    )
    if problem:
        print(f"chunkpilot operator: {problem}", file=sys.stderr)
        return 2
    priority = args.priority
    if args.peering and priority is None:
        priority = ha.start_time_priority()
    kopf.configure(verbose=args.verbose, debug=args.debug)
    namespaces: list[str] = list(args.namespaces or [])
    memo = kopf.Memo(namespaces=namespaces)
    try:
        startup.load(config, environ, memo)  # registers the handlers; the autotuner reads its settings
    except ValueError as error:
        print(f"chunkpilot operator: {error}", file=sys.stderr)
        return 2
    if config.metrics_port:
        from chunkpilot import telemetry

        try:
            telemetry.start_metrics_server(config.metrics_port)
        except OSError as error:
            print(
                f"chunkpilot operator: --metrics-port {config.metrics_port}: {error.strerror or error};"
                " choose a free port or 0 to turn the metrics endpoint off",
                file=sys.stderr,
            )
            return 2
    kopf.run(
        clusterwide=args.all_namespaces,
        namespaces=namespaces,
        standalone=True if args.standalone else None,
        peering_name=args.peering,
        priority=priority,
        liveness_endpoint=args.liveness,
        memo=memo,
    )
    return 0


def run_render(args: argparse.Namespace) -> int:
    """Print the child manifests of every InferenceService in the file, or the validation errors."""
    try:
        text = sys.stdin.read() if args.filename == "-" else Path(args.filename).read_text()
        labels = parse_labels(args.pod_monitor_labels)
    except (OSError, ValueError) as error:
        print(f"chunkpilot render: {error}", file=sys.stderr)
        return 1
    errors, manifests = render_text(text, pod_monitor=args.pod_monitor, pod_monitor_labels=labels)
    if errors:
        for message in errors:
            print(message, file=sys.stderr)
        return 1
    _dump(manifests, sys.stdout)
    return 0


def render_text(
    text: str, *, pod_monitor: bool = False, pod_monitor_labels: dict[str, str] | None = None
) -> tuple[list[str], list[dict[str, Any]]]:
    """(errors, manifests) for a YAML stream; documents of other kinds are skipped."""
    from chunkpilot.operator.builders import RenderError, build_children

    from chunkpilot.api import ISVC_KIND, InferenceService, ManifestError

    errors: list[str] = []
    manifests: list[dict[str, Any]] = []
    try:
        documents = [doc for doc in yaml.safe_load_all(text) if doc]
    except yaml.YAMLError as error:
        return [f"invalid YAML: {error}"], []
    for index, document in enumerate(documents):
        if not isinstance(document, dict) or document.get("kind") != ISVC_KIND:
            continue
        where = (document.get("metadata") or {}).get("name") or f"document {index + 1}"
        try:
            isvc = InferenceService.from_manifest(document)
            children = build_children(isvc, pod_monitor=pod_monitor, pod_monitor_labels=pod_monitor_labels)
        except ManifestError as error:
            errors.append(f"{where}: {error}")
            continue
        except RenderError as error:
            errors.append(f"{where}: {error.problem.reason}: {error}")
            continue
        except ValueError as error:
            errors.append(f"{where}: {error}")
            continue
        manifests.extend(children.manifests())
    if not documents or (not manifests and not errors):
        errors.append("no InferenceService found in the input")
    return errors, manifests


class _NoAliasDumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def _dump(manifests: list[dict[str, Any]], stream: TextIO) -> None:
    yaml.dump_all(manifests, stream, Dumper=_NoAliasDumper, sort_keys=False, default_flow_style=False)


__all__ = [
    "ENV_EXPECTED_REPLICAS",
    "FLAG_VARIABLES",
    "operator_config",
    "register",
    "render_text",
    "run_operator",
    "run_render",
]
