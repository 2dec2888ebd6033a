"""An engine family's command-line vocabulary, read from the knob table: renderers spell no flag.

A renderer decides *what* it renders: which settings, in which order, with which values (SGLang's
``-1`` budget with chunked prefill off, ``--disable-radix-cache`` when prefix caching is off). The
API's tables decide *how each is spelt* in the engine's flag dialect:

- a knob's flag is its row's entry for the dialect (:attr:`~chunkpilot.api.knobs.KnobSpec.flags`),
  and its value takes the form of the row's ``kind`` (a float as ``%g``, an enum as its value,
  JSON compact with sorted keys);
- a setting the engine has no flag for is a key of its options file (``EngineFlag.yaml``, dotted
  paths such as ``kv_cache_config.enable_block_reuse``): :meth:`Vocabulary.options_file`;
- a server flag (host, port, served model name, ...) is one of the dialect's
  :data:`~chunkpilot.api.knobs.SERVER_FLAGS`, named there without its dashes.

Every one of them is a managed flag (:func:`~chunkpilot.api.knobs.managed_flags`, which
``extraArgs`` may not repeat), so what the operator renders and what it refuses in ``extraArgs``
cannot drift apart. ``tests/operator/test_flag_vocabulary.py`` fails when a module of
``operator/engines`` spells a managed flag itself.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from chunkpilot.api import EngineSpec
from chunkpilot.api.knobs import KNOBS, SERVER_FLAGS, KnobSpec, knob

#: A value of an options file: a plain YAML scalar.
Scalar = bool | int | float | str
#: An options file: scalars and one level of sections.
OptionsFile = dict[str, Scalar | dict[str, Scalar]]


def value_text(row: KnobSpec, value: object) -> str:
    """``value`` of knob ``row`` on a command line, in the form of the row's kind."""
    if row.kind == "bool":
        raise TypeError(f"{row.name} is a switch: render it with switch() or present()")
    if row.kind == "float" and isinstance(value, int | float):
        return f"{value:g}"
    if row.kind == "json" and not isinstance(value, str):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return str(value)


def _options_value(row: KnobSpec, value: object) -> Scalar:
    """``value`` of knob ``row`` in an options file (an enum as its plain value)."""
    if row.kind == "enum":
        return str(value)
    if not isinstance(value, bool | int | float | str):
        raise TypeError(f"{row.name}: {value!r} is not a scalar an options file can hold")
    return value


@dataclass(frozen=True)
class Vocabulary:
    """The flags of one dialect (``vllm``, ``sglang``, ``trtllm``), each looked up in the API's tables."""

    dialect: str

    def flag(self, name: str) -> str:
        """Knob ``name``'s command-line flag, e.g. ``--max-num-seqs``.

        KeyError when the dialect has no setting for the knob (the renderers refuse it first),
        ValueError when its setting is an options-file key rather than a flag.
        """
        spelling = knob(name).flag(self.dialect)
        if spelling.yaml:
            raise ValueError(f"{name} is the options file key {spelling.flag} in {self.dialect}, not a flag")
        return spelling.flag

    def option(self, name: str, value: object) -> list[str]:
        """``[flag, value]`` of knob ``name``, the value in its row's form; nothing when it is None."""
        if value is None:
            return []
        return [self.flag(name), value_text(knob(name), value)]

    def switch(self, name: str, on: bool, *, negation: bool = True) -> list[str]:
        """Switch ``name`` rendered either way: ``--flag`` when on; when off ``--no-flag``, or
        ``--flag=false`` for releases without the negation."""
        flag = self.flag(name)
        if on:
            return [flag]
        return ["--no-" + flag.removeprefix("--") if negation else f"{flag}=false"]

    def present(self, name: str, on: bool) -> list[str]:
        """``[flag]`` of knob ``name`` when ``on``, nothing otherwise (a switch without a negation,
        e.g. SGLang's ``--enable-mixed-chunk``, or its ``--disable-radix-cache`` with on = caching off)."""
        return [self.flag(name)] if on else []

    def server(self, name: str) -> str:
        """Server flag ``name`` (spelt as in ``SERVER_FLAGS``, without dashes), e.g. ``--port``.

        KeyError when it is not one of the dialect's managed server flags.
        """
        if name not in SERVER_FLAGS[self.dialect]:
            known = ", ".join(SERVER_FLAGS[self.dialect])
            raise KeyError(f"{name!r} is not a {self.dialect} server flag of the API (known: {known})")
        return f"--{name}"

    def server_option(self, name: str, value: object) -> list[str]:
        """``[flag, value]`` of server flag ``name``; nothing when ``value`` is None."""
        return [] if value is None else [self.server(name), str(value)]

    def options_file(self, engine: EngineSpec, plain: Mapping[str, Scalar] | None = None) -> OptionsFile:
        """The options file of ``engine``: every knob whose setting in this dialect is an options-file
        key and whose value is set (not None), under its dotted key, in table order.

        ``plain`` adds keys that are no knob's (e.g. metrics switches); they follow the knobs'
        top-level keys. Sections come after every top-level scalar, so the file reads flat keys first.
        """
        document: dict[str, Scalar | dict[str, Scalar]] = {}
        for row in KNOBS:
            spelling = row.flags.get(self.dialect)
            value = getattr(engine, row.name)
            if spelling is None or not spelling.yaml or value is None:
                continue
            *parents, leaf = spelling.flag.split(".")
            if len(parents) > 1:
                raise ValueError(f"{row.name}: options file key {spelling.flag} is deeper than one section")
            section = document.setdefault(parents[0], {}) if parents else document
            if not isinstance(section, dict):
                raise ValueError(f"{row.name}: options file key {spelling.flag} is below a scalar")
            section[leaf] = _options_value(row, value)
        document.update(plain or {})
        scalars = {key: value for key, value in document.items() if not isinstance(value, dict)}
        sections = {key: value for key, value in document.items() if isinstance(value, dict)}
        return {**scalars, **sections}


__all__ = ["OptionsFile", "Scalar", "Vocabulary", "value_text"]
