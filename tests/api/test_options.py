"""extraArgs read as each engine's parser reads them: what they may set and what they may not.

The tables are the engines' own (dumped from vLLM's and SGLang's parsers, recorded from
``trtllm-serve``'s source); that the engines really read the refused variants as managed options
is checked with their parsers in ``tests/engine/vllm_plugin/test_real_argv.py`` and
``tests/engine/sglang/test_real_argv.py``. Here: the reading rules against Python's argparse on the
same tables, the variant tables per engine, and the CEL rule against the authoritative check.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re

import pytest
from chunkpilot.engine.trtllm.options import TRTLLM_OPTIONS_VERSION
from chunkpilot.engine.vllm_plugin.config import ADDITIONAL_CONFIG_KEY
from pydantic import ValidationError

from chunkpilot.api import EngineSpec, options
from chunkpilot.api.inferenceservice import _managed_flag_pattern
from chunkpilot.testing.extra_args import ALLOWED, REFUSED


def _cases(table: dict[str, list[tuple[list[str], str]]]) -> list[tuple[str, list[str], str]]:
    return [(kind, tokens, said) for kind, rows in table.items() for tokens, said in rows]


@pytest.mark.parametrize(("kind", "tokens", "said"), _cases(REFUSED), ids=lambda v: str(v))
def test_a_managed_option_under_any_spelling_is_refused_naming_it(
    kind: str, tokens: list[str], said: str
) -> None:
    problems = options.extra_args_problems(kind, ["--dummy-flag-nobody-has", *tokens])
    assert len(problems) == 1, problems
    assert problems[0].startswith("extraArgs[1]: "), problems
    assert said in problems[0], problems
    # What the CRD's CEL rule catches the apiserver refuses with its static message; the rest the
    # model refuses with the operator's.
    cel = re.compile(_managed_flag_pattern(options.ENGINES[kind].dialect))
    message = "extraArgs must not repeat" if any(cel.match(t) for t in tokens) else re.escape(said)
    with pytest.raises(ValidationError, match=message):
        EngineSpec.model_validate({"kind": kind, "extraArgs": tokens})


@pytest.mark.parametrize("kind", list(ALLOWED))
def test_other_options_pass(kind: str) -> None:
    assert options.extra_args_problems(kind, ALLOWED[kind]) == []
    EngineSpec.model_validate({"kind": kind, "extraArgs": ALLOWED[kind]})


def test_after_a_double_dash_nothing_is_an_option() -> None:
    assert options.extra_args_problems("vllm", ["--", "--port"]) == []


def test_the_simulator_is_held_to_the_vllm_table() -> None:
    assert options.extra_args_problems("sim", ["--max-num-seq=7"]) == options.extra_args_problems(
        "vllm", ["--max-num-seq=7"]
    )


def test_the_message_names_the_spec_field_to_use() -> None:
    (problem,) = options.extra_args_problems("vllm", ["--max_num_seq=7"])
    assert problem == (
        "extraArgs[0]: '--max_num_seq=7' sets --max-num-seqs (as vLLM's vllm serve reads it):"
        " set spec.engine.maxNumSeqs instead"
    )


# --------------------------------------------------------------------------- the reading rules


def _argparse_reading(table: options.OptionTable, token: str) -> tuple[str, ...] | str:
    """What Python's argparse makes of ``token`` with ``table``'s options: the option set, or an error."""
    parser = argparse.ArgumentParser(allow_abbrev=table.abbreviations, add_help=False)
    for row in table.rows:
        parser.add_argument(*row.names, dest=row.name, nargs="?", const=True, default=None)
    if table.underscores_are_dashes and token.startswith("--"):
        key, eq, value = token.partition("=")
        token = key.replace("_", "-") + eq + value
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            namespace, _ = parser.parse_known_args([token])
    except SystemExit:
        return "ambiguous" if "ambiguous" in stderr.getvalue() else "error"
    return tuple(name for name, value in vars(namespace).items() if value is not None)


def _probes(dialect: str) -> list[str]:
    """Every guarded spelling, its prefixes and its ``=`` form, plus the variant tables' tokens."""
    probes = {t for kind, rows in REFUSED.items() if kind == dialect for tokens, _ in rows for t in tokens}
    probes |= set(ALLOWED[dialect])
    for spelling in options.guarded_spellings(dialect):
        probes.add(spelling + "=1")
        probes |= {spelling[:cut] for cut in range(3, len(spelling) + 1)}
    return sorted(p for p in probes if p.startswith("-") and "." not in p and p != "--")


@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
def test_the_reading_rules_are_argparses_on_the_same_table(dialect: str) -> None:
    table = options.table(dialect)
    differ = []
    for token in _probes(dialect):
        reading = table.read(token)
        ours: tuple[str, ...] | str = () if reading is None else reading.options
        if isinstance(ours, tuple) and len(ours) > 1:
            ours = "ambiguous"
        theirs = _argparse_reading(table, token)
        if theirs == "error":
            theirs = ()
        if ours != theirs:
            differ.append((token, ours, theirs))
    assert not differ, differ[:10]


def test_click_takes_exact_names_only() -> None:
    table = options.table("trtllm")
    assert table.read("--max_num_tokens=8") == options.Reading("--max_num_tokens=8", ("--max_num_tokens",))
    assert table.read("--max_num") == options.Reading("--max_num", ())
    assert table.read("--max-num-tokens") == options.Reading("--max-num-tokens", ())


# --------------------------------------------------------------------------- tables and the CEL rule


@pytest.mark.parametrize("dialect", ["vllm", "sglang", "trtllm"])
def test_the_cel_rule_catches_every_exact_spelling(dialect: str) -> None:
    pattern = re.compile(_managed_flag_pattern(dialect))
    for spelling in options.guarded_spellings(dialect):
        assert pattern.match(spelling) and pattern.match(spelling + "=1"), spelling
        assert options.extra_args_problems(dialect, [spelling]), spelling
    assert not pattern.match("--seed=1")


def test_the_cel_rule_takes_underscores_where_vllm_does() -> None:
    assert re.match(_managed_flag_pattern("vllm"), "--max_num_seqs=7")
    assert not re.match(_managed_flag_pattern("sglang"), "--max_running_requests=7")


def test_every_knob_flag_and_server_flag_is_in_its_engines_table() -> None:
    missing = {
        dialect: [name for name in options.guarded(dialect) if name not in options.table(dialect).names]
        for dialect in ("vllm", "sglang", "trtllm")
    }
    # vLLM's partial-prefill flags are rendered for the releases that still have them (the plugin
    # takes them over later); they stay guarded, prefixes included.
    assert missing == {
        "vllm": ["--max-num-partial-prefills", "--max-long-partial-prefills"],
        "sglang": [],
        "trtllm": [],
    }
    assert options.extra_args_problems("vllm", ["--max-long-partial=2"])


def test_tables_name_their_release() -> None:
    assert options.table("trtllm").engine == f"TensorRT-LLM {TRTLLM_OPTIONS_VERSION}"
    assert options.table("vllm").engine.startswith("vLLM ")
    assert options.table("sglang").engine.startswith("SGLang ")


def test_the_plugin_section_is_the_plugins() -> None:
    assert options.PLUGIN_SECTION == ADDITIONAL_CONFIG_KEY
