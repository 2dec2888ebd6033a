"""The API model: parsing, defaults, round trips, durations, the knob config and its hash."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from chunkpilot.api import (
    EngineConfig,
    EngineKind,
    EngineSpec,
    InferenceService,
    InferenceServiceStatus,
    ManifestError,
    SpeculativeSpec,
    TrialPhase,
    TuningTrial,
    format_duration,
    parse_duration,
)


def _load(path: Path) -> dict[str, object]:
    document = yaml.safe_load(path.read_text())
    assert isinstance(document, dict)
    return document


def _parse(document: dict[str, object]) -> InferenceService | TuningTrial:
    if document["kind"] == "TuningTrial":
        return TuningTrial.from_manifest(document)
    return InferenceService.from_manifest(document)


def test_examples_are_valid_and_round_trip(example_path: Path) -> None:
    service = InferenceService.from_manifest(_load(example_path))
    again = InferenceService.from_manifest(service.to_manifest())
    assert again == service


def test_valid_manifests_round_trip(valid_path: Path) -> None:
    parsed = _parse(_load(valid_path))
    assert type(parsed).from_manifest(parsed.to_manifest()) == parsed


def test_minimal_manifest_gets_defaults() -> None:
    service = InferenceService.from_manifest(
        {
            "apiVersion": "chunkpilot.io/v1alpha1",
            "kind": "InferenceService",
            "spec": {"model": {"name": "m/x"}},
        }
    )
    engine = service.spec.engine
    assert engine.kind is EngineKind.VLLM
    assert (engine.max_num_batched_tokens, engine.max_num_seqs) == (8192, 256)
    assert engine.enable_chunked_prefill and engine.enable_prefix_caching
    assert service.spec.replicas == 1
    assert service.spec.slo is None
    assert not service.spec.autotune.enabled
    assert service.spec.autotune.abort.itl_factor == 2.0


def test_snake_case_names_and_camel_case_aliases_both_accepted() -> None:
    by_name = EngineSpec(max_num_batched_tokens=4096, max_num_seqs=64)
    by_alias = EngineSpec.model_validate({"maxNumBatchedTokens": 4096, "maxNumSeqs": 64})
    assert by_name == by_alias
    assert by_name.to_k8s()["maxNumBatchedTokens"] == 4096


def test_error_names_the_field_path() -> None:
    manifest = {"spec": {"model": {"name": "m/x"}, "engine": {"maxNumSeqs": 0}}}
    with pytest.raises(ManifestError) as caught:
        InferenceService.from_manifest(manifest)
    assert caught.value.problems[0][0] == "spec.engine.maxNumSeqs"
    assert "spec.engine.maxNumSeqs: Input should be greater than or equal to 1" in str(caught.value)


def test_cross_field_error_names_the_field_and_the_fix() -> None:
    manifest = {"spec": {"model": {"name": "m/x"}, "engine": {"maxNumBatchedTokens": 64, "maxNumSeqs": 128}}}
    with pytest.raises(ManifestError) as caught:
        InferenceService.from_manifest(manifest)
    assert caught.value.problems == [
        (
            "spec.engine.maxNumBatchedTokens",
            "maxNumBatchedTokens must be >= maxNumSeqs: raise maxNumBatchedTokens or lower maxNumSeqs",
        )
    ]


def test_every_problem_is_reported() -> None:
    manifest = {
        "spec": {
            "model": {"name": "m/x"},
            "engine": {"maxNumSeqs": 0, "kind": "tgi"},
            "slo": {"itl": {"maxMs": 0}, "ttft": {"maxMs": 1}},
        }
    }
    with pytest.raises(ManifestError) as caught:
        InferenceService.from_manifest(manifest)
    paths = [path for path, _ in caught.value.problems]
    assert paths == ["spec.engine.kind", "spec.engine.maxNumSeqs", "spec.slo.itl.maxMs"]


@pytest.mark.parametrize(
    ("text", "seconds"), [("30s", 30), ("5m", 300), ("1h", 3600), ("90s", 90), ("007m", 420)]
)
def test_parse_duration(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5", "5min", "1h30m", "-5m", "0s", "00m", "5M", " 5m", "1.5h", "5d"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


@pytest.mark.parametrize(("seconds", "text"), [(30, "30s"), (300, "5m"), (7200, "2h"), (90, "90s")])
def test_format_duration_inverts_parse(seconds: int, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(format_duration(seconds)) == seconds


# --------------------------------------------------------------------------- EngineConfig


def _config(**knobs: int) -> EngineConfig:
    return EngineConfig.model_validate({"max_num_batched_tokens": 3072, "max_num_seqs": 256, **knobs})


def test_config_hash_is_stable_across_releases() -> None:
    # A pinned value: changing the hash function relabels every running pod, so it must be deliberate.
    assert _config().config_hash() == "00d7ee3d"  # sha256 of the sorted camelCase JSON


def test_config_hash_is_short_hex_and_ignores_construction_order() -> None:
    a = EngineConfig(max_num_batched_tokens=3072, max_num_seqs=256, long_prefill_token_threshold=0)
    b = EngineConfig.model_validate(
        {"longPrefillTokenThreshold": 0, "maxNumSeqs": 256, "maxNumBatchedTokens": 3072}
    )
    assert a.config_hash() == b.config_hash()
    assert len(a.config_hash()) == 8
    int(a.config_hash(), 16)


@pytest.mark.parametrize(
    "change",
    [
        {"max_num_batched_tokens": 4096},
        {"max_num_seqs": 128},
        {"long_prefill_token_threshold": 512},
        {"max_num_active_seqs": 200},
        {"max_num_partial_prefills": 2},
    ],
)
def test_config_hash_changes_with_every_knob(change: dict[str, int]) -> None:
    assert _config(**change).config_hash() != _config().config_hash()


def test_apply_to_sets_the_knobs_and_keeps_the_rest() -> None:
    engine = EngineSpec(
        kind=EngineKind.SIM, max_num_batched_tokens=8192, max_num_seqs=256, tensor_parallel_size=2
    )
    tuned = _config(max_num_active_seqs=128).apply_to(engine)
    assert (tuned.max_num_batched_tokens, tuned.max_num_seqs, tuned.max_num_active_seqs) == (3072, 256, 128)
    assert tuned.kind is EngineKind.SIM and tuned.tensor_parallel_size == 2
    assert engine.max_num_batched_tokens == 8192, "apply_to must not modify its argument"
    assert EngineConfig.from_engine(tuned) == _config(max_num_active_seqs=128)


def test_apply_to_rejects_a_config_the_engine_cannot_run() -> None:
    engine = EngineSpec(max_num_seqs=256, speculative=SpeculativeSpec(num_speculative_tokens=16))
    with pytest.raises(ValueError, match=r"maxNumSeqs \* \(1 \+ speculative.numSpeculativeTokens\): raise"):
        _config().apply_to(engine)


def test_from_engine_round_trips_through_apply_to() -> None:
    engine = EngineSpec(max_num_batched_tokens=2048, max_num_seqs=64, long_prefill_token_threshold=1024)
    assert EngineConfig.from_engine(engine).apply_to(engine) == engine


def test_config_summary() -> None:
    assert _config().summary() == "budget=3072 seqs=256"
    assert _config(long_prefill_token_threshold=512, max_num_active_seqs=64).summary() == (
        "budget=3072 seqs=256 active=64 lpt=512"
    )


def test_status_accepts_fields_from_newer_versions() -> None:
    status = InferenceServiceStatus.model_validate({"phase": "Ready", "futureField": 1})
    assert status.phase == "Ready"


def test_trial_phase_finished() -> None:
    assert not TrialPhase.MEASURING.finished
    assert TrialPhase.ROLLED_BACK.finished and TrialPhase.PROMOTED.finished
