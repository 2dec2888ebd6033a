"""What the ``chunkpilot bench`` commands share: their overrides, their run and their output."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from chunkpilot.bench.exhaustive import BenchError


class BenchResult(Protocol):
    """What a benchmark command prints with ``--json``."""

    def to_dict(self) -> dict[str, Any]: ...


SettingsT = TypeVar("SettingsT")
ResultT = TypeVar("ResultT", bound=BenchResult)


def given_options(**options: Any) -> dict[str, Any]:
    """The settings a command line overrides: ``options`` less those left unset (None)."""
    return {key: value for key, value in options.items() if value is not None}


def run_bench_command(
    command: str,
    args: Any,
    settings_from: Callable[[Any], SettingsT],
    run: Callable[[SettingsT, Callable[[str], None]], ResultT],
    table: Callable[[ResultT], str],
) -> int:
    """``chunkpilot bench COMMAND``: run with the settings of ``args``, progress on stderr, then print
    the tables (one JSON object with ``--json``); bad settings are named on stderr, exit status 2."""
    try:
        result = run(settings_from(args), lambda msg: print(msg, file=sys.stderr, flush=True))
    except BenchError as exc:
        print(f"chunkpilot bench {command}: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result.to_dict(), indent=2) if args.json else table(result))
    return 0
