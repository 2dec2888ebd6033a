"""One table per vocabulary: the renderers spell no managed flag, the API's tables do.

A managed flag (a knob's flag in the knob table, or a server flag of ``SERVER_FLAGS``; see
:func:`chunkpilot.api.knobs.managed_flags`) or an options-file key of a knob written as a string
literal in a module of ``operator/engines`` fails here: render it through
:class:`chunkpilot.operator.engines.flags.Vocabulary` instead. And every flag the table gives a
dialect is rendered by that dialect's renderer.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
import yaml
from chunkpilot.operator.engines import EngineRender, render_engine
from chunkpilot.operator.engines.flags import Vocabulary
from chunkpilot.operator.engines.trtllm import OPTIONS_ENV

from chunkpilot.api import InferenceServiceSpec
from chunkpilot.api.knobs import DIALECTS, KNOBS, SGLANG, TRTLLM, VLLM, managed_flags

ENGINES = Path(__file__).resolve().parents[2] / "operator" / "engines"
MODULES = sorted(ENGINES.glob("*.py"))

#: Every managed command-line flag of every dialect, with its dashes.
MANAGED = frozenset(f"--{name}" for dialect in DIALECTS for name in managed_flags(dialect))
#: Every knob's options-file key (dotted), and the names its path is made of.
OPTION_KEYS = frozenset(flag.flag for row in KNOBS for flag in row.flags.values() if flag.yaml)
OPTION_KEY_PARTS = frozenset(part for key in OPTION_KEYS for part in key.split("."))
#: A knob's own name is how a renderer asks the vocabulary for it, even where it is also the
#: options-file key (TensorRT-LLM's ``enable_chunked_prefill``); as a mapping key it is still refused.
KNOB_NAMES = frozenset(row.name for row in KNOBS)


def _spells_a_flag(text: str) -> bool:
    """``--flag``, ``--no-flag`` or ``--flag=value`` of a managed flag."""
    flag = text.split("=", 1)[0]
    return flag in MANAGED or flag.replace("--no-", "--", 1) in MANAGED


def spelt_flags(source: str) -> list[str]:
    """The managed flags and options-file keys ``source`` writes as string literals (with line numbers)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        literal = node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None
        if literal is not None and (_spells_a_flag(literal) or literal in OPTION_KEYS - KNOB_NAMES):
            found.append(f"line {node.lineno}: {literal!r}")
        # An options-file key written as a mapping key: {"kv_cache_config": ...} or options["..."] = ...
        keys: list[ast.expr | None] = []
        if isinstance(node, ast.Dict):
            keys = list(node.keys)
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
            keys = [node.slice]
        for key in keys:
            if isinstance(key, ast.Constant) and key.value in OPTION_KEY_PARTS:
                found.append(f"line {key.lineno}: options file key {key.value!r}")
    return found


def test_the_renderers_are_found() -> None:
    names = {module.name for module in MODULES}
    assert {"vllm.py", "sglang.py", "trtllm.py", "sim.py", "common.py", "knobcheck.py"} <= names


@pytest.mark.parametrize("module", MODULES, ids=lambda path: path.name)
def test_no_renderer_spells_a_managed_flag(module: Path) -> None:
    found = spelt_flags(module.read_text())
    assert found == [], (
        f"{module.name} spells managed flags itself; render them from the knob table and SERVER_FLAGS"
        f" (chunkpilot.operator.engines.flags.Vocabulary): {found}"
    )


@pytest.mark.parametrize(
    "source",
    [
        'args = ["--max-num-batched-tokens", str(budget)]',
        'args.append("--chunked-prefill-size")',
        'args += ["--max_num_tokens", "8"]',
        'flag = "--no-enable-prefix-caching"',
        'flag = "--enable-chunked-prefill=false"',
        'args = ["--served-model-name", name]',
        'args = ["--model-path", model]',
        'options = {"kv_cache_config": {"enable_block_reuse": True}}',
        'scheduler["capacity_scheduler_policy"] = policy',
        'key = "kv_cache_config.free_gpu_memory_fraction"',
        'options = {"enable_chunked_prefill": engine.enable_chunked_prefill}',
    ],
)
def test_the_scan_catches_a_spelt_flag(source: str) -> None:
    assert spelt_flags(source) != []


@pytest.mark.parametrize(
    "source",
    [
        'args += ["--shutdown-timeout", "30", "--gpu", "h100", "--kv-transfer-config", config]',
        'config["model"] = draft',  # not a flag: a key of the speculative JSON
        'FLAGS.option("capacity_scheduler_policy", engine.capacity_scheduler_policy)',  # a knob's name
        'FLAGS.switch("enable_chunked_prefill", engine.enable_chunked_prefill)',
        'row = KNOB_BY_NAME["context_chunking_policy"]',
        '"""Docs may name ``--max-num-seqs``."""',
    ],
)
def test_the_scan_leaves_other_strings_alone(source: str) -> None:
    assert spelt_flags(source) == []


# --------------------------------------------------------------------------- every flag is rendered

SPECULATIVE = {"method": "ngram", "numSpeculativeTokens": 3}
#: Specs that together set every knob each dialect has a setting for.
FULL_SPECS: dict[str, list[dict[str, Any]]] = {
    VLLM: [
        {
            "kind": "vllm",
            "version": "0.8.5",
            "maxNumPartialPrefills": 2,
            "maxLongPartialPrefills": 1,
            "longPrefillTokenThreshold": 512,
            "speculative": SPECULATIVE,
        },
        {
            "kind": "vllm",
            "version": "0.33.0",
            "maxNumActiveSeqs": 64,
            "longPrefillTokenThresholdAdaptive": True,
        },
    ],
    SGLANG: [
        {
            "kind": "sglang",
            "version": "0.5.23",
            "maxPrefillTokens": 16384,
            "schedulePolicy": "lpm",
            "enableMixedChunk": True,
            "enablePrefixCaching": False,
        }
    ],
    TRTLLM: [
        {
            "kind": "trtllm",
            "version": "1.2.1",
            "capacitySchedulerPolicy": "MAX_UTILIZATION",
            "contextChunkingPolicy": "EQUAL_PROGRESS",
        }
    ],
}


def _renders(engine: dict[str, Any]) -> EngineRender:
    spec = InferenceServiceSpec.model_validate(
        {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "maxModelLen": 8192}, "engine": engine}
    )
    result = render_engine(spec)
    assert isinstance(result, EngineRender), result
    return result


def _option_keys(document: dict[str, Any], prefix: str = "") -> set[str]:
    keys: set[str] = set()
    for key, value in document.items():
        keys |= _option_keys(value, f"{prefix}{key}.") if isinstance(value, dict) else {prefix + key}
    return keys


@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_setting_of_a_dialect_is_rendered(dialect: str) -> None:
    renders = [_renders(engine) for engine in FULL_SPECS[dialect]]
    argv = {arg.split("=", 1)[0].replace("--no-", "--", 1) for render in renders for arg in render.args}
    keys: set[str] = set()
    for render in renders:
        keys |= {
            key
            for item in render.env
            if item["name"] == OPTIONS_ENV
            for key in _option_keys(yaml.safe_load(item["value"]))
        }
    for row in KNOBS:
        if dialect not in row.flags:
            continue
        flag = row.flag(dialect)
        assert flag.flag in (keys if flag.yaml else argv), f"{row.name}: {flag.where} is never rendered"


def test_the_vocabulary_refuses_what_the_tables_do_not_hold() -> None:
    with pytest.raises(KeyError, match="server flag"):
        Vocabulary(VLLM).server("shutdown-timeout")
    with pytest.raises(KeyError):
        Vocabulary(VLLM).flag("max_prefill_tokens")  # SGLang only
    with pytest.raises(ValueError, match="options file key"):
        Vocabulary(TRTLLM).flag("enable_prefix_caching")
    with pytest.raises(TypeError, match="switch"):
        Vocabulary(VLLM).option("enable_chunked_prefill", True)


def test_values_take_the_form_of_their_kind() -> None:
    flags = Vocabulary(VLLM)
    assert flags.option("gpu_memory_utilization", 0.9) == ["--gpu-memory-utilization", "0.9"]
    assert flags.option("speculative", {"b": 1, "a": "x"}) == ["--speculative-config", '{"a":"x","b":1}']
    assert flags.option("max_num_active_seqs", None) == []
    assert flags.switch("enable_chunked_prefill", False, negation=False) == ["--enable-chunked-prefill=false"]
    assert flags.switch("enable_prefix_caching", False) == ["--no-enable-prefix-caching"]
