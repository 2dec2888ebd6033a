"""The engine registry of the API: the named kinds and dialects are registered, kinds validate by it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from chunkpilot.api import EngineKind, EngineSpec
from chunkpilot.api.engines import DEFAULT_KIND, ENGINES, dialects, engine, kinds
from chunkpilot.api.knobs import KNOBS, Dialect


def test_named_kinds_and_dialects_are_the_registrys() -> None:
    assert [str(kind) for kind in EngineKind] == list(ENGINES)
    assert [str(dialect) for dialect in Dialect] == list(dialects())
    assert next(iter(ENGINES)) == DEFAULT_KIND


def test_every_dialect_is_owned_and_speakers_agree_on_its_server_flags() -> None:
    for descriptor in ENGINES.values():
        assert descriptor.dialect in dialects()
        owner = next(e for e in ENGINES.values() if e.dialect == descriptor.dialect)
        assert descriptor.server_flags == owner.server_flags, descriptor.kind
    # Every knob row's flags are keyed by registered dialects.
    assert {dialect for row in KNOBS for dialect in row.flags} <= set(dialects())


def test_a_kind_validates_by_the_registry() -> None:
    assert EngineSpec(kind="sglang").kind is EngineKind.SGLANG
    with pytest.raises(ValidationError, match="unknown engine kind 'toy'; known: vllm, sglang, trtllm, sim"):
        EngineSpec(kind="toy")
    with pytest.raises(KeyError, match="unknown engine kind 'toy'"):
        engine("toy")


def test_capabilities_select_kinds() -> None:
    assert kinds() == tuple(ENGINES)
    assert kinds(where="disaggregation") == ("vllm", "sim")
    assert kinds(where="simulated") == ("sglang", "trtllm")
    assert kinds(where="demo") == ("sglang", "trtllm", "sim")
