"""The ``chunkpilot`` command line.

Each command group lives in its own module and exposes ``register(subparsers)``;
the module adds its sub-parser and sets ``func`` (a callable taking the parsed
namespace and returning an exit code) as the parser default.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from chunkpilot import __version__

# Modules that contribute sub-commands, in the order they appear in --help.
_COMMAND_MODULES: tuple[str, ...] = (
    "chunkpilot.api.commands",
    "chunkpilot.devcluster.cli",
    "chunkpilot.report.cli",
    "chunkpilot.engine.probe.cli",
    "chunkpilot.engine.sim.cli",
    "chunkpilot.localrun.cli",
    "chunkpilot.operator.cli",
    "chunkpilot.tuner.bench_cli",
    "chunkpilot.demo.cli",
)


def build_parser() -> argparse.ArgumentParser:
    """Return the root parser with every command group registered."""
    parser = argparse.ArgumentParser(
        prog="chunkpilot",
        description="Run chunked-prefill LLM inference on Kubernetes within latency SLOs.",
    )
    parser.add_argument("--version", action="version", version=f"chunkpilot {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in _COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``chunkpilot`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    code: int = func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
