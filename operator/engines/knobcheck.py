"""Refuse the knobs an engine cannot honour, from the knob table's flag dialects.

The same :class:`UnsupportedKnob` condition for every engine: a knob set in the spec
whose row has no flag in the engine's dialect (e.g. ``maxNumActiveSeqs`` on SGLang,
``enableMixedChunk`` on vLLM), or whose flag the engine version does not accept.
"""

from __future__ import annotations

from chunkpilot.operator.engines.common import UnsupportedKnob
from chunkpilot.operator.engines.versions import EngineVersion

from chunkpilot.api import InferenceServiceSpec
from chunkpilot.api.knobs import ENGINE_NAMES, KNOBS, KnobSpec, engine_honours


def _owners(row: KnobSpec) -> str:
    return ", ".join(ENGINE_NAMES[dialect] for dialect in row.flags) or "no engine"


def foreign_knob(row: KnobSpec, dialect: str, version: EngineVersion) -> UnsupportedKnob:
    """The condition for knob ``row``, which the ``dialect`` engine family has no setting for."""
    engine = ENGINE_NAMES[dialect]
    return UnsupportedKnob(
        knob=row.path,
        flag="(none)",
        engine=engine,
        version=str(version),
        detail=f"the knob table maps it to no {engine} setting (it is honoured by {_owners(row)})",
        remedy=f"unset {row.camel} or choose an engine kind that honours it",
    )


def versioned_knob(row: KnobSpec, dialect: str, version: EngineVersion) -> UnsupportedKnob:
    """The condition for knob ``row``, whose ``dialect`` flag ``version`` does not accept."""
    flag = row.flag(dialect)
    if flag.until is not None and version >= flag.until:
        detail = f"the setting was removed in {flag.until}"
        remedy = f"unset {row.camel} or pin spec.engine.version below {flag.until}"
    else:
        detail = f"the setting is only rendered for {ENGINE_NAMES[dialect]} {flag.since} and later"
        remedy = f"unset {row.camel} or raise spec.engine.version to {flag.since} or later"
    return UnsupportedKnob(
        knob=row.path,
        flag=flag.where,
        engine=ENGINE_NAMES[dialect],
        version=str(version),
        detail=detail,
        remedy=remedy,
    )


def first_unsupported(
    spec: InferenceServiceSpec, dialect: str, version: EngineVersion
) -> UnsupportedKnob | None:
    """The first knob set in ``spec`` (table order) that ``version`` of ``dialect`` cannot honour
    (the knob table's :func:`~chunkpilot.api.knobs.engine_honours`, which the tuner's search
    space judges by too)."""
    for row in KNOBS:
        if not row.is_set(getattr(spec.engine, row.name)) or engine_honours(dialect, row.name, version):
            continue
        if dialect not in row.flags:
            return foreign_knob(row, dialect, version)
        return versioned_knob(row, dialect, version)
    return None
