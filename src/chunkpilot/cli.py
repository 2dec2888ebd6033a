"""The ``chunkpilot`` command line.

Each command group lives in its own module and exposes ``register(subparsers)``;
the module adds its sub-parser and sets ``func`` (a callable taking the parsed
namespace and returning an exit code) as the parser default.

Command modules are imported only when their command is dispatched: :data:`COMMANDS`
names each top-level command, its one-line help and the module that registers it, so
``chunkpilot --help`` is printed from the table alone, and ``chunkpilot sim run`` imports
the simulator's module but not Kopf, Optuna or the Kubernetes client. A new command is
one row in that table (its ``help`` must equal the one its module registers; the tests
compare them).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Collection, Sequence
from typing import NamedTuple

from chunkpilot import __version__
from chunkpilot.pipes import quiet_broken_pipe


class Command(NamedTuple):
    """A top-level command: its name, its one-line help and the module whose ``register`` adds it."""

    name: str
    help: str
    module: str
    # Modules whose ``register(subparsers)`` hang sub-commands under this command once ``module``
    # added it (imported, like ``module``, only when this command is dispatched).
    extensions: tuple[str, ...] = ()


# Every top-level command, in the order of --help. A module may register several
# commands (``load`` and ``local``; ``operator`` and ``render``): each gets a row. A
# sub-command that lives elsewhere (``operator bench``) is an extension of its command's row.
# Module names appear nowhere else, so moving a module is a change of this table only.
COMMANDS: tuple[Command, ...] = (
    Command("crds", "generate, check and document the CustomResourceDefinitions", "chunkpilot.api.commands"),
    Command(
        "cluster",
        "local Kubernetes control plane (etcd, kube-apiserver, controllers, KWOK GPU nodes)",
        "chunkpilot.devcluster.cli",
    ),
    Command(
        "report",
        "trial history of an InferenceService as a table, Markdown and PNG plots",
        "chunkpilot.report.cli",
    ),
    Command(
        "probe",
        "measure the accelerator's step-time curve for a model and fit the roofline",
        "chunkpilot.engine.probe.cli",
    ),
    Command(
        "sim",
        "CPU engine simulator: vLLM V1 chunked-prefill scheduling with a roofline step-time model",
        "chunkpilot.engine.sim.cli",
    ),
    Command("load", "replay a request trace against a service's Ready engines", "chunkpilot.localrun.cli"),
    Command(
        "local",
        "run Chunkpilot locally: control plane, Prometheus, operator and simulator engines",
        "chunkpilot.localrun.cli",
    ),
    Command(
        "operator",
        "run the operator (reconciles InferenceServices)",
        "chunkpilot.operator.cli",
        extensions=("chunkpilot.bench.operator_load",),
    ),
    Command(
        "render",
        "print the manifests the operator would create for an InferenceService",
        "chunkpilot.operator.cli",
    ),
    Command(
        "twin",
        "the service twin's work outside the operator (what a twin Job runs)",
        "chunkpilot.tuner.twin.cli",
    ),
    Command("bench", "benchmarks that print figures", "chunkpilot.bench.cli"),
    Command(
        "demo",
        "run the control plane, Prometheus, operator and simulated engines locally; tune a service",
        "chunkpilot.demo.cli",
    ),
)


def build_parser(load: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The root parser; the commands in ``load`` (every command when None) get their full sub-parser.

    The other commands are placeholders that carry their name and help, enough for the root
    ``--help`` and for argparse's "invalid choice" message; their modules are not imported.
    """
    parser = argparse.ArgumentParser(
        prog="chunkpilot",
        description="Run chunked-prefill LLM inference on Kubernetes within latency SLOs.",
    )
    parser.add_argument("--version", action="version", version=f"chunkpilot {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    loaded = [command for command in COMMANDS if load is None or command.name in load]
    modules = {command.module for command in loaded}
    for command in COMMANDS:
        if command.name in subparsers.choices:  # added by its module, with an earlier row
            continue
        if command.module not in modules:
            subparsers.add_parser(command.name, help=command.help)
            continue
        importlib.import_module(command.module).register(subparsers)
        missing = [
            c.name for c in COMMANDS if c.module == command.module and c.name not in subparsers.choices
        ]
        if missing:
            raise RuntimeError(f"{command.module}.register did not add the command(s) {', '.join(missing)}")
    for command in loaded:
        for extension in command.extensions:
            importlib.import_module(extension).register(subparsers)
    return parser


def dispatched_command(argv: Sequence[str]) -> str | None:
    """The top-level command ``argv`` names, when it is one of :data:`COMMANDS`.

    The root parser's options take no value, so the command is the first argument that is not
    an option (or the one after ``--``).
    """
    names = {command.name for command in COMMANDS}
    for index, arg in enumerate(argv):
        if arg == "--":
            following = argv[index + 1 : index + 2]
            return following[0] if following and following[0] in names else None
        if not arg.startswith("-"):
            return arg if arg in names else None
    return None


def _run(argv: Sequence[str]) -> int:
    command = dispatched_command(argv)
    parser = build_parser(() if command is None else (command,))
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    code: int = func(args)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``chunkpilot`` console script; ends quietly when stdout's reader goes away."""
    arguments = sys.argv[1:] if argv is None else list(argv)
    return quiet_broken_pipe(lambda: _run(arguments))


if __name__ == "__main__":
    sys.exit(main())
