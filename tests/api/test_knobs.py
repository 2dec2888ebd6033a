"""The knob table and the API models agree exactly: a knob added in one place only fails here."""

from __future__ import annotations

import dataclasses

import pytest
from chunkpilot.engine.live_adjust import LiveLimits
from pydantic import ValidationError

from chunkpilot.api import EngineConfig, EngineSpec, TuningBounds, knobs
from chunkpilot.api.inferenceservice import MANAGED_FLAGS
from chunkpilot.api.knobs import KNOBS, TUNABLE, TUNABLE_NAMES, EngineVersion

#: EngineSpec fields that are not engine settings: what runs, not how it schedules.
NOT_KNOBS = ("kind", "image", "plugin_installed", "version", "extra_args", "run_as_user")


def test_every_engine_spec_setting_is_one_row_in_field_order() -> None:
    fields = [name for name in EngineSpec.model_fields if name not in NOT_KNOBS]
    assert fields == [k.name for k in KNOBS]


@pytest.mark.parametrize("row", KNOBS, ids=lambda k: k.name)
def test_row_names_and_docs_are_the_models(row: knobs.KnobSpec) -> None:
    spec_field = EngineSpec.model_fields[row.name]
    assert spec_field.alias == row.camel
    assert spec_field.description == row.doc
    if row.tunable:
        config_field = EngineConfig.model_fields[row.name]
        assert config_field.alias == row.camel and config_field.description == row.doc
        bounds_field = TuningBounds.model_fields[row.name]
        assert bounds_field.alias == row.camel and bounds_field.description == row.bounds_doc
        assert row.label
    assert row.flags, "every knob is honoured by some engine"
    for flag in row.flags.values():
        assert flag.yaml or flag.flag.startswith("--")


def test_engine_config_and_bounds_hold_exactly_the_tunable_knobs() -> None:
    assert tuple(EngineConfig.model_fields) == TUNABLE_NAMES == EngineConfig.KNOBS
    assert tuple(TuningBounds.model_fields) == TUNABLE_NAMES


def test_bounds_of_every_tuned_knob_are_read_from_the_resource() -> None:
    bounds = TuningBounds.model_validate({k.camel: {"min": 1, "max": 4} for k in TUNABLE})
    assert all(getattr(bounds, k.name) is not None for k in TUNABLE)
    assert bounds.max_long_partial_prefills is not None


#: Every command-line flag of every dialect (options-file keys cannot appear in extraArgs).
CLI_FLAGS = [(dialect, row) for row in KNOBS for dialect, flag in row.flags.items() if not flag.yaml]


@pytest.mark.parametrize(("dialect", "row"), CLI_FLAGS, ids=lambda v: v if isinstance(v, str) else v.name)
def test_extra_args_may_not_repeat_a_knob_flag(dialect: str, row: knobs.KnobSpec) -> None:
    flag = row.flag(dialect)
    assert flag.name in knobs.managed_flags(dialect)
    if dialect == knobs.VLLM:
        assert flag.name in MANAGED_FLAGS
    with pytest.raises(ValidationError, match="extraArgs must not repeat"):
        EngineSpec.model_validate({"kind": dialect, "extraArgs": [f"{flag.flag}=1"]})
    spec = EngineSpec.model_validate({"kind": dialect, "extraArgs": ["--dtype=half"]})
    assert not spec.long_prefill_token_threshold


def test_every_dialect_names_its_engine_and_the_vllm_rows_keep_their_flags() -> None:
    assert set(knobs.DIALECTS) == set(knobs.ENGINE_NAMES) == set(knobs.SERVER_FLAGS)
    assert all(knobs.VLLM in k.flags for k in TUNABLE)
    assert knobs.knob("max_num_batched_tokens").flag(knobs.SGLANG).flag == "--chunked-prefill-size"
    assert knobs.knob("max_num_batched_tokens").flag(knobs.TRTLLM).flag == "--max_num_tokens"
    policy = knobs.knob("capacity_scheduler_policy").flag(knobs.TRTLLM)
    assert policy.yaml and policy.where == "options file key scheduler_config.capacity_scheduler_policy"
    assert not knobs.honoured_natively("max_num_active_seqs", EngineVersion(0, 5, 23), knobs.SGLANG)
    assert knobs.dialect_of("sim") == knobs.VLLM and knobs.dialect_of("trtllm") == knobs.TRTLLM


def test_an_unset_version_is_the_default_of_the_kind() -> None:
    assert EngineSpec().version == "0.33.0"
    assert EngineSpec.model_validate({"kind": "sim"}).version == "0.33.0"
    assert EngineSpec.model_validate({"kind": "sglang"}).version == str(knobs.SGLANG_PINNED)
    assert EngineSpec.model_validate({"kind": "trtllm"}).version == str(knobs.TRTLLM_PINNED)
    assert EngineSpec.model_validate({"kind": "trtllm", "version": "1.1.0"}).version == "1.1.0"
    # Like the apiserver (no per-kind default in the CRD), a defaulted version is not written back.
    assert "version" not in EngineSpec.model_validate({"kind": "sglang"}).to_k8s()
    assert EngineSpec.model_validate({"kind": "sglang", "version": "0.5.22"}).to_k8s()["version"] == "0.5.22"


def test_summary_is_in_table_order_and_leaves_out_unset_knobs() -> None:
    values = {k.name: None for k in TUNABLE} | {"max_num_batched_tokens": 3072, "max_num_seqs": 256}
    assert knobs.summary(values) == "budget=3072 seqs=256"
    values |= {"long_prefill_token_threshold": 0, "max_num_partial_prefills": 2, "max_num_active_seqs": 8}
    assert knobs.summary(values) == "budget=3072 seqs=256 active=8 partial=2"


def test_labels_and_camel_names_are_unique() -> None:
    labels = [k.label for k in TUNABLE]
    assert len(set(labels)) == len(labels)
    assert len({k.camel for k in KNOBS}) == len(KNOBS)


def test_version_columns() -> None:
    partial = knobs.knob("maxNumPartialPrefills").flag()
    assert partial.versioned and partial.plugin
    assert partial.supports(EngineVersion(0, 8, 5)) and not partial.supports(EngineVersion(0, 9, 0))
    active = knobs.knob("max_num_active_seqs").flag()
    assert not active.supports(EngineVersion(0, 32, 9)) and active.supports(EngineVersion(0, 33, 0))
    assert not knobs.knob("max_num_seqs").flag().versioned


def test_unknown_knob_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match="max_num_seqs"):
        knobs.knob("max_num_sequences")


def test_lenient_version_parse() -> None:
    assert EngineVersion.lenient("v0.8.5.post1") == EngineVersion(0, 8, 5)
    assert EngineVersion.lenient("0.33") == EngineVersion(0, 33, 0)
    assert EngineVersion.lenient("nightly") == EngineVersion(0, 0, 0)


def test_live_column_is_what_the_live_adjustment_route_accepts() -> None:
    assert tuple(f.name for f in dataclasses.fields(LiveLimits)) == knobs.LIVE_NAMES


def test_engine_kinds_and_trtllm_policies_are_one_vocabulary_with_the_simulators() -> None:
    """The API's engine kinds are the table's dialects plus the simulator; the simulator's engine
    and TensorRT-LLM policy enums are the table's own, not copies."""
    from chunkpilot.engine.sim import scheduler

    from chunkpilot import api
    from chunkpilot.api import inferenceservice
    from chunkpilot.api.knobs import (
        DIALECTS,
        CapacitySchedulerPolicy,
        ContextChunkingPolicy,
        Dialect,
        EngineKind,
        dialect_of,
    )

    assert {kind.value for kind in EngineKind} == {*DIALECTS, "sim"}
    assert [dialect_of(kind) for kind in EngineKind] == [
        Dialect.VLLM,
        Dialect.SGLANG,
        Dialect.TRTLLM,
        Dialect.VLLM,
    ]
    assert scheduler.Engine is Dialect and api.EngineKind is EngineKind
    assert (
        scheduler.CapacitySchedulerPolicy
        is CapacitySchedulerPolicy
        is inferenceservice.CapacitySchedulerPolicy
    )
    assert scheduler.ContextChunkingPolicy is ContextChunkingPolicy is inferenceservice.ContextChunkingPolicy
    assert set(CapacitySchedulerPolicy) > scheduler.SIMULATED_CAPACITY_POLICIES
