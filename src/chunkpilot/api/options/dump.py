"""Dump an engine's server options as the table :mod:`chunkpilot.api.options` reads.

Run with the engine's own Python, not the project's (it imports the engine)::

    ENV/bin/python src/chunkpilot/api/options/dump.py vllm > src/chunkpilot/api/options/vllm.json
    ENV/bin/python src/chunkpilot/api/options/dump.py sglang > src/chunkpilot/api/options/sglang.json

It builds the parser the engine's server command builds and writes each option's strings (the
first long one names it) and the parsing rules that apply to them. TensorRT-LLM's ``trtllm-serve``
is a click command that needs a GPU to import; its table (``trtllm.json``) is kept by hand from
``tensorrt_llm/commands/serve.py`` of the release the registry pins.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any


def _vllm() -> tuple[argparse.ArgumentParser, dict[str, Any]]:
    flexible = importlib.import_module("vllm.utils.argparse_utils").FlexibleArgumentParser
    make_arg_parser = importlib.import_module("vllm.entrypoints.launchers.cli_args").make_arg_parser
    parser = make_arg_parser(flexible(prog="vllm serve"))
    meta = {
        "engine": f"vLLM {importlib.import_module('vllm').__version__}",
        "command": "vllm serve",
        "parser": "argparse (vLLM's FlexibleArgumentParser)",
        # FlexibleArgumentParser turns _ into - in a name, and --json-option.key VALUE into JSON.
        "underscores_are_dashes": True,
        "sub_options": True,
    }
    return parser, meta


def _sglang() -> tuple[argparse.ArgumentParser, dict[str, Any]]:
    server_args = importlib.import_module("sglang.srt.server_args").ServerArgs
    parser = argparse.ArgumentParser(prog="sglang serve")
    server_args.add_cli_args(parser)
    meta = {
        "engine": f"SGLang {importlib.import_module('sglang').__version__}",
        "command": "python -m sglang.launch_server",
        "parser": "argparse",
        "underscores_are_dashes": False,
        "sub_options": False,
    }
    return parser, meta


def main(argv: list[str]) -> int:
    builders = {"vllm": _vllm, "sglang": _sglang}
    if len(argv) != 1 or argv[0] not in builders:
        print(f"usage: dump.py {{{','.join(builders)}}}", file=sys.stderr)
        return 2
    parser, meta = builders[argv[0]]()
    options = sorted(
        list(action.option_strings)
        for action in parser._actions
        if action.option_strings and "-h" not in action.option_strings
    )
    header = json.dumps({**meta, "abbreviations": parser.allow_abbrev}, indent=1)[:-2]
    rows = ",\n".join(f"  {json.dumps(strings)}" for strings in options)
    sys.stdout.write(f'{header},\n "options": [\n{rows}\n ]\n}}\n')
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
