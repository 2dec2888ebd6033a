"""The options ``trtllm-serve serve`` and its LLM-API options file accept, and a check against them.

TensorRT-LLM's command line cannot be imported here: its wheel is served only from
pypi.nvidia.com (PyPI holds a stub that downloads it) and it loads CUDA libraries at import.
The rendered arguments are therefore checked against the option definitions read from its
source instead (a source-level check, not the engine's parser): the ``click`` options of
the ``serve`` command in ``tensorrt_llm/commands/serve.py`` and the pydantic fields of
``tensorrt_llm/llmapi/llm_args.py`` for the options-file keys, recorded as data (names, value
types, choices) with the release they were taken for: the command's options in the API's table
``chunkpilot/api/options/trtllm.json``, the options-file keys below. Only the option names and
types are kept, not TensorRT-LLM's code.

What the check proves: every flag is one ``serve`` defines, takes a value of the right
type (or none, for its boolean flags), the model is the one positional argument, and every
options-file key is a field of the LLM-API arguments with a value of its type or enum. It
does not run TensorRT-LLM's model-dependent validation (e.g. against the checkpoint).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

from chunkpilot.api.knobs import TRTLLM
from chunkpilot.api.options import OptionRow
from chunkpilot.api.options import table as options_table

#: The release the tables describe, and where they were read.
TRTLLM_OPTIONS_VERSION: Final = "1.2.1"
SOURCE: Final = (
    "NVIDIA/TensorRT-LLM: tensorrt_llm/commands/serve.py (serve command options),"
    " tensorrt_llm/llmapi/llm_args.py (TorchLlmArgs, KvCacheConfig, SchedulerConfig fields)"
)

#: One ``click`` option of ``trtllm-serve serve``: its names, value kind and choices.
CliOption = OptionRow

#: The options of ``trtllm-serve serve`` (besides the positional MODEL): the API's table of them,
#: which also decides what ``extraArgs`` may not set (:mod:`chunkpilot.api.options`).
SERVE_OPTIONS: Final[tuple[CliOption, ...]] = options_table(TRTLLM).rows


ValueType = Literal["bool", "int", "float", "str"]
KeySpec = ValueType | tuple[str, ...] | Mapping[str, "KeySpec"]

_CAPACITY_POLICIES = ("MAX_UTILIZATION", "GUARANTEED_NO_EVICT", "STATIC_BATCH")
_CHUNKING_POLICIES = ("FIRST_COME_FIRST_SERVED", "EQUAL_PROGRESS")

#: Options-file keys (a subset of the LLM-API fields: those this project renders, and the scalar
#: fields beside them that trtllm-serve also sets from its flags), with their types or enums.
LLM_API_KEYS: Final[Mapping[str, KeySpec]] = {
    "max_batch_size": "int",
    "max_num_tokens": "int",
    "max_seq_len": "int",
    "max_beam_width": "int",
    "tensor_parallel_size": "int",
    "pipeline_parallel_size": "int",
    "trust_remote_code": "bool",
    "revision": "str",
    "enable_chunked_prefill": "bool",
    "enable_iter_perf_stats": "bool",
    "return_perf_metrics": "bool",
    "kv_cache_config": {
        "enable_block_reuse": "bool",
        "free_gpu_memory_fraction": "float",
        "max_tokens": "int",
    },
    "scheduler_config": {
        "capacity_scheduler_policy": _CAPACITY_POLICIES,
        "context_chunking_policy": _CHUNKING_POLICIES,
    },
}

_BY_NAME: Final[Mapping[str, CliOption]] = {name: opt for opt in SERVE_OPTIONS for name in opt.names}


def _value_problem(name: str, kind: str, value: str, choices: Sequence[str]) -> str | None:
    if kind == "int":
        try:
            int(value)
        except ValueError:
            return f"{name}: {value!r} is not a valid integer"
    elif kind == "float":
        try:
            float(value)
        except ValueError:
            return f"{name}: {value!r} is not a valid float"
    elif kind == "choice" and value not in choices:
        return f"{name}: {value!r} is not one of {', '.join(choices)}"
    return None


def check_serve_argv(argv: Sequence[str]) -> list[str]:
    """Problems with ``trtllm-serve`` arguments ``argv`` (``serve MODEL [options]``); empty when none."""
    if not argv or argv[0] != "serve":
        return ["the first argument must be the serve command"]
    problems: list[str] = []
    positional: list[str] = []
    seen: set[str] = set()
    rest = list(argv[1:])
    while rest:
        arg = rest.pop(0)
        if not arg.startswith("--"):
            positional.append(arg)
            continue
        name, has_value, inline = arg.partition("=")
        option = _BY_NAME.get(name)
        if option is None:
            problems.append(f"no such option: {name}")
            continue
        if option.names[0] in seen and not option.multiple:
            problems.append(f"{name} is given twice")
        seen.add(option.names[0])
        if option.kind == "flag":
            if has_value:
                problems.append(f"{name} takes no value")
            continue
        if has_value:
            value = inline
        elif rest:
            value = rest.pop(0)
        else:
            problems.append(f"{name} requires a value")
            continue
        problem = _value_problem(name, option.kind, value, option.choices)
        if problem is not None:
            problems.append(problem)
    if len(positional) != 1:
        problems.append(f"expected exactly one MODEL argument, got {positional}")
    return problems


def _type_problem(path: str, spec: KeySpec, value: Any) -> list[str]:
    if isinstance(spec, Mapping):
        if not isinstance(value, Mapping):
            return [f"{path}: expected a mapping"]
        problems: list[str] = []
        for key, item in value.items():
            if key not in spec:
                problems.append(f"{path}.{key}: not a field of the LLM-API arguments")
            else:
                problems += _type_problem(f"{path}.{key}", spec[key], item)
        return problems
    if isinstance(spec, tuple):
        return [] if value in spec else [f"{path}: {value!r} is not one of {', '.join(spec)}"]
    ok = {
        "bool": isinstance(value, bool),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, int | float) and not isinstance(value, bool),
        "str": isinstance(value, str),
    }[spec]
    return [] if ok else [f"{path}: {value!r} is not a {spec}"]


def check_options(options: Mapping[str, Any]) -> list[str]:
    """Problems with an options-file mapping (already parsed from YAML); empty when none."""
    problems: list[str] = []
    for key, value in options.items():
        if key not in LLM_API_KEYS:
            problems.append(f"{key}: not a field of the LLM-API arguments")
        else:
            problems += _type_problem(key, LLM_API_KEYS[key], value)
    return problems


__all__ = [
    "LLM_API_KEYS",
    "SERVE_OPTIONS",
    "SOURCE",
    "TRTLLM_OPTIONS_VERSION",
    "CliOption",
    "check_options",
    "check_serve_argv",
]
