"""Check ``vllm serve`` argument vectors with vLLM's own parser, in-process (no server).

Runs inside an environment with vLLM installed. Reads a JSON object
``{name: [arg, ...]}`` on stdin (the arguments after ``vllm serve``) and prints
``{name: {"ok": bool, "error": str | null, ...}}``. Each vector is

1. parsed by ``make_arg_parser(FlexibleArgumentParser())``, the parser behind
   ``vllm serve`` (unknown flags and bad values fail here);
2. turned into ``AsyncEngineArgs`` (``from_cli_args``);
3. checked against the scheduler's own validation by building its
   ``SchedulerConfig`` (budget >= max-num-seqs, active <= max-num-seqs, ...);
4. when it selects the Chunkpilot scheduler, its plugin configuration is loaded
   and the scheduler class resolved.

Model loading is not attempted: the model ids of the examples are not available offline.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from typing import Any


def check_argv(argv: list[str]) -> dict[str, Any]:
    """Return ``{"ok": ..., "error": ...}`` for one argument vector."""
    from chunkpilot.engine.vllm_plugin.config import load_plugin_config
    from vllm.config import SchedulerConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.utils.import_utils import resolve_obj_by_qualname

    stderr = io.StringIO()
    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    try:
        with contextlib.redirect_stderr(stderr):
            namespace = parser.parse_args(argv)
    except SystemExit:
        return {"ok": False, "stage": "parse", "error": stderr.getvalue().strip().splitlines()[-1:]}
    if namespace.model_tag is not None:
        namespace.model = namespace.model_tag
    # What the parser set, so a test can tell which option a token of extraArgs reached.
    parsed = json.loads(json.dumps(vars(namespace), default=str))
    try:
        engine_args = AsyncEngineArgs.from_cli_args(namespace)
        max_model_len = engine_args.max_model_len or 8192
        scheduler = SchedulerConfig(
            max_model_len=max_model_len,
            is_encoder_decoder=False,
            max_num_batched_tokens=engine_args.max_num_batched_tokens or 8192,
            max_num_seqs=engine_args.max_num_seqs or 256,
            max_num_active_seqs=engine_args.max_num_active_seqs,
            enable_chunked_prefill=(
                True if engine_args.enable_chunked_prefill is None else engine_args.enable_chunked_prefill
            ),
            long_prefill_token_threshold=engine_args.long_prefill_token_threshold or 0,
        )
    except Exception as exc:  # vLLM raises ValueError, pydantic ValidationError, TypeError
        return {
            "ok": False,
            "stage": "engine-args",
            "error": f"{type(exc).__name__}: {exc}",
            "namespace": parsed,
        }
    result: dict[str, Any] = {
        "ok": True,
        "error": None,
        "namespace": parsed,
        "model": engine_args.model,
        "max_num_batched_tokens": scheduler.max_num_batched_tokens,
        "max_num_seqs": scheduler.max_num_seqs,
        "scheduler_cls": engine_args.scheduler_cls,
    }
    if isinstance(engine_args.scheduler_cls, str) and engine_args.scheduler_cls.startswith("chunkpilot."):
        try:
            resolve_obj_by_qualname(engine_args.scheduler_cls)
            plugin = load_plugin_config(engine_args.additional_config or {}, {})
        except Exception as exc:
            return {"ok": False, "stage": "plugin", "error": f"{type(exc).__name__}: {exc}"}
        result["plugin"] = {
            "max_num_partial_prefills": plugin.max_num_partial_prefills,
            "max_long_partial_prefills": plugin.max_long_partial_prefills,
        }
    return result


def main() -> int:
    vectors: dict[str, list[str]] = json.load(sys.stdin)
    results = {name: check_argv(list(argv)) for name, argv in vectors.items()}
    json.dump(results, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
