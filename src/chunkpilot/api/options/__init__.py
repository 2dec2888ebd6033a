"""Each engine's server options and how its parser reads them: what ``extraArgs`` may not set.

The operator renders the managed options (the knobs' flags and the server flags) from the spec and
appends ``spec.engine.extraArgs`` after them. A token of ``extraArgs`` that the engine would read as
one of those options, under any spelling its parser accepts, would make the engine run something
other than what the tuner measures and promotes, so it is refused.

The tables (``vllm.json``, ``sglang.json``, ``trtllm.json`` beside this module) list every option of
the engine's server command with its aliases, and the rules its parser applies:

- argparse (vLLM, SGLang) accepts an unambiguous prefix of a long option (``--max-num-seq``) and of a
  short one (``-t`` for ``-tp``), and ``-xVALUE`` for a one-letter option ``-x``;
- vLLM's parser also reads ``_`` as ``-`` in a name (``--max_num_seqs``) and ``--option.key VALUE`` as
  one key of a JSON option (``--speculative-config.num_speculative_tokens 3``);
- click (TensorRT-LLM's ``trtllm-serve``) accepts exact names only.

A table describes one release (``engine``); ``dump.py`` regenerates the vLLM and SGLang tables from
the engines' own parsers. Options a newer release adds are unknown here and pass.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Final

from chunkpilot.api.engines import ENGINES, dialect_owner
from chunkpilot.api.knobs import KNOBS, SERVER_FLAGS

#: The ``--additional-config`` section the project's vLLM plugin reads its settings from.
PLUGIN_SECTION: Final = "chunkpilot"
_ADDITIONAL_CONFIG: Final = "--additional-config"
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


@dataclass(frozen=True)
class Reading:
    """How the engine reads one token: the option(s) it may name and the JSON key it sets, if any."""

    token: str
    #: The option the token names (one), the options an ambiguous abbreviation matches, or none.
    options: tuple[str, ...]
    #: ``key`` of ``--option.key=VALUE`` (vLLM's JSON sub-options); empty otherwise.
    sub_option: str = ""


@dataclass(frozen=True)
class OptionRow:
    """One option of a table: its strings (the first long one names it) and, where recorded, its value.

    The kind (``int``, ``float``, ``str``, ``flag``, ``choice``), choices and ``multiple`` are kept for
    TensorRT-LLM, whose rendered command lines are checked against them without its parser
    (:mod:`chunkpilot.engine.trtllm.options`); the dumped argparse tables leave them empty.
    """

    names: tuple[str, ...]
    kind: str = ""
    choices: tuple[str, ...] = ()
    multiple: bool = False

    @property
    def name(self) -> str:
        return next((s for s in self.names if s.startswith("--")), self.names[0])


@dataclass(frozen=True)
class OptionTable:
    """One engine's server options (every option string, mapped to its option's name) and parser rules."""

    engine: str
    command: str
    parser: str
    underscores_are_dashes: bool
    sub_options: bool
    abbreviations: bool
    rows: tuple[OptionRow, ...]

    @classmethod
    def from_json(cls, text: str) -> OptionTable:
        """A table as ``dump.py`` writes it: a row is a list of option strings or an object with
        ``names`` and the value's ``kind``, ``choices`` and ``multiple``."""
        raw = json.loads(text)
        rows = tuple(
            OptionRow(tuple(row))
            if isinstance(row, list)
            else OptionRow(
                tuple(row["names"]),
                row.get("kind", ""),
                tuple(row.get("choices", ())),
                bool(row.get("multiple", False)),
            )
            for row in raw["options"]
        )
        return cls(
            engine=raw["engine"],
            command=raw["command"],
            parser=raw["parser"],
            underscores_are_dashes=raw["underscores_are_dashes"],
            sub_options=raw["sub_options"],
            abbreviations=raw["abbreviations"],
            rows=rows,
        )

    @functools.cached_property
    def names(self) -> Mapping[str, str]:
        """Every option string (long and short, ``--no-`` forms too) -> its option's name, the first
        long string declared (``-tp`` -> ``--tensor-parallel-size``)."""
        return {string: row.name for row in self.rows for string in row.names}

    def aliases(self, name: str) -> tuple[str, ...]:
        """Every option string of option ``name`` (itself included)."""
        return tuple(s for s, n in self.names.items() if n == name) or (name,)

    def read(self, token: str) -> Reading | None:
        """How the engine's parser reads ``token``; None when it is not an option (a value, a number)."""
        if len(token) < 2 or not token.startswith("-") or _NEGATIVE_NUMBER.match(token):
            return None
        key = token.partition("=")[0]
        sub = ""
        if key.startswith("--"):
            if self.underscores_are_dashes:
                name, dot, rest = key[2:].partition(".")
                key = "--" + name.replace("_", "-") + dot + rest
            if self.sub_options and "." in key:
                key, _, sub = key.partition(".")
        if key in self.names:
            return Reading(token, (self.names[key],), sub)
        if not self.abbreviations and key.startswith("--"):
            return Reading(token, ())
        matches: dict[str, None] = {}
        if not key.startswith("--") and self.names.get(key[:2]):
            matches[self.names[key[:2]]] = None  # -xVALUE
        if self.abbreviations:
            matches.update(dict.fromkeys(n for s, n in self.names.items() if s.startswith(key)))
        return Reading(token, tuple(matches), sub)


@functools.cache
def table(dialect: str) -> OptionTable:
    """The option table of ``dialect``'s engine (``vllm``, ``sglang``, ``trtllm``)."""
    text = resources.files(__package__).joinpath(f"{dialect}.json").read_text(encoding="utf-8")
    return OptionTable.from_json(text)


@functools.cache
def _reading_table(dialect: str) -> OptionTable:
    """``dialect``'s table with the guarded options it lacks (flags of older releases) added."""
    options = table(dialect)
    missing = tuple(OptionRow((name,)) for name in guarded(dialect) if name not in options.names)
    return dataclasses.replace(options, rows=options.rows + missing) if missing else options


@functools.cache
def guarded(dialect: str) -> Mapping[str, str]:
    """The options ``extraArgs`` may not set in ``dialect``, each with what to do instead.

    The knobs' flags name their spec field; the server flags are rendered from the spec; the
    engine's :attr:`~chunkpilot.api.engines.EngineDescriptor.reserved_options` say why themselves.
    """
    options = table(dialect)

    def name(flag: str) -> str:
        return options.names.get("--" + flag, "--" + flag)

    why: dict[str, str] = {}
    for row in KNOBS:  # the first row of a flag two knobs share names the field
        if dialect in row.flags and not row.flag(dialect).yaml:
            why.setdefault(name(row.flag(dialect).name), f"set spec.engine.{row.camel} instead")
    for flag, reason in dialect_owner(dialect).reserved_options:
        why.setdefault(name(flag), reason)
    for flag in SERVER_FLAGS[dialect]:
        why.setdefault(name(flag), "the operator renders it from the spec (model, port, parallelism)")
    return why


def guarded_spellings(dialect: str) -> tuple[str, ...]:
    """Every exact spelling of a guarded option (aliases, ``--no-`` forms), for the CEL rule."""
    options = table(dialect)
    spellings = (s for name in guarded(dialect) for s in options.aliases(name))
    return tuple(sorted(set(spellings)))


def extra_args_problems(kind: str, args: Sequence[str]) -> list[str]:
    """Why each token of ``extraArgs`` that the engine of ``kind`` reads as a guarded option is refused.

    Each message names the token's index, the option it resolves to and the spec field (or fix) to
    use instead; an empty list when ``args`` set no guarded option.
    """
    descriptor = ENGINES.get(kind)
    if descriptor is None:
        return []
    options = _reading_table(descriptor.dialect)
    why = guarded(descriptor.dialect)
    label = f"{dialect_owner(descriptor.dialect).display_name}'s {options.command}"
    problems: list[str] = []
    for index, token in enumerate(args):
        if token == "--":
            break  # the rest are positional arguments
        reading = options.read(token)
        if reading is None:
            continue
        hit = [option for option in reading.options if option in why]
        if len(reading.options) > 1 and hit:
            problems.append(
                f"extraArgs[{index}]: {token!r} is an ambiguous abbreviation for {label}"
                f" ({', '.join(reading.options)}) and may set {hit[0]}, which the spec manages:"
                " spell the option out"
            )
        elif hit:
            option = hit[0] + (f".{reading.sub_option}" if reading.sub_option else "")
            said = "" if token.partition("=")[0] == hit[0] else f" (as {label} reads it)"
            problems.append(f"extraArgs[{index}]: {token!r} sets {option}{said}: {why[hit[0]]}")
        elif reading.options == (_ADDITIONAL_CONFIG,) and reading.sub_option.split(".")[0] == PLUGIN_SECTION:
            problems.append(_plugin_section_problem(index, token))
    problems += _plugin_sections(args)
    return problems


def _plugin_section_problem(index: int, token: str) -> str:
    return (
        f"extraArgs[{index}]: {token!r} sets the {PLUGIN_SECTION!r} section of {_ADDITIONAL_CONFIG},"
        " which the operator renders from the spec (autotune lanes, live adjustment): remove it"
    )


def _plugin_sections(args: Sequence[str]) -> list[str]:
    """An ``--additional-config`` JSON object of ``args`` with the plugin's section in it."""
    problems = []
    for index, token in enumerate(args):
        if token.startswith(_ADDITIONAL_CONFIG + "="):
            value = token.partition("=")[2]
        elif token == _ADDITIONAL_CONFIG and index + 1 < len(args):
            value = args[index + 1]
        else:
            continue
        try:
            parsed = json.loads(value)
        except ValueError:
            continue  # refused by the JSON-object rule
        if isinstance(parsed, dict) and PLUGIN_SECTION in parsed:
            problems.append(_plugin_section_problem(index, token))
    return problems


__all__ = [
    "PLUGIN_SECTION",
    "OptionRow",
    "OptionTable",
    "Reading",
    "extra_args_problems",
    "guarded",
    "guarded_spellings",
    "table",
]
