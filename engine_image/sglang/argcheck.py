"""Check argument vectors with SGLang's own parser; run inside the SGLang environment.

Reads ``{"name": [argv...], ...}`` as JSON on stdin and prints, per name, whether
``sglang.launch_server``'s parser (``ServerArgs.add_cli_args``) accepts the vector and
``ServerArgs.from_cli_args`` builds the server arguments from it, with the scheduling
values SGLang resolved or the parser's error. Standard library and SGLang only: the
script is run by path with the environment's interpreter.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from typing import Any

#: Server arguments reported back, so a test can compare them with the spec.
REPORTED = (
    "model_path",
    "served_model_name",
    "host",
    "port",
    "context_length",
    "chunked_prefill_size",
    "max_prefill_tokens",
    "max_running_requests",
    "schedule_policy",
    "enable_mixed_chunk",
    "disable_radix_cache",
    "mem_fraction_static",
    "tp_size",
    "enable_metrics",
    "revision",
)


def check(argv: list[str]) -> dict[str, Any]:
    """Parse ``argv`` as ``python -m sglang.launch_server`` would."""
    from sglang.srt.server_args import ServerArgs  # type: ignore[import-not-found]

    parser = argparse.ArgumentParser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            namespace = parser.parse_args(argv)
    except SystemExit:
        return {"ok": False, "error": stderr.getvalue().strip().splitlines()[-1:]}
    # What the parser set, so a test can tell which option a token of extraArgs reached.
    parsed = json.loads(json.dumps(vars(namespace), default=str))
    try:
        server_args = ServerArgs.from_cli_args(namespace)
    except Exception as error:  # the engine's own checks, whatever they raise
        return {"ok": False, "error": [f"{type(error).__name__}: {error}"], "namespace": parsed}
    values = {name: getattr(server_args, name, None) for name in REPORTED}
    return {"ok": True, "values": json.loads(json.dumps(values, default=str)), "namespace": parsed}


def main() -> int:
    vectors: dict[str, list[str]] = json.load(sys.stdin)
    import sglang  # type: ignore[import-not-found]

    results: dict[str, Any] = {"__version__": sglang.__version__}
    results.update({name: check(argv) for name, argv in vectors.items()})
    json.dump(results, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
