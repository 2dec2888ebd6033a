"""Search space per engine kind: only the knobs the kind and version honour, and what it proposes renders."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from chunkpilot.operator.builders import render_for
from chunkpilot.operator.engines import EngineRender, render_engine
from chunkpilot.tuner.records import engine_config, service_facts, space_bounds
from chunkpilot.tuner.space import (
    Knob,
    SearchSpace,
    ServiceFacts,
    SpaceError,
    TunedConfig,
    build_space,
    honours,
    honours_max_num_active_seqs,
    honours_partial_prefills,
)

from chunkpilot.api import InferenceService
from chunkpilot.api.knobs import TUNABLE, EngineVersion, engine_honours

EXAMPLES = Path(__file__).parents[2] / "examples"
SGLANG_EXAMPLE = EXAMPLES / "qwen-7b-sglang.yaml"
TRTLLM_EXAMPLE = EXAMPLES / "llama-8b-trtllm.yaml"
SIM_EXAMPLE = EXAMPLES / "chat-llama-8b-sim.yaml"
PINNED = {"sglang": "0.5.23", "trtllm": "1.2.1"}
#: Bounds a service may give for every tuned knob (the partial-prefill and active limits opt in).
EVERY_BOUND: dict[str, tuple[int, int]] = {
    "longPrefillTokenThreshold": (64, 4096),
    "maxNumActiveSeqs": (16, 256),
    "maxNumPartialPrefills": (1, 4),
    "maxLongPartialPrefills": (1, 2),
}


def facts(kind: str, **overrides: object) -> ServiceFacts:
    base: dict[str, object] = {
        "accelerator": "h100",
        "model": "llama-3.1-8b",
        "incumbent": TunedConfig(8192, 256),
        "itl_target_ms": 50.0,
        "engine_kind": kind,
        "engine_version": PINNED[kind],
    }
    base.update(overrides)
    return ServiceFacts(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["sglang", "trtllm"])
def test_only_the_budget_and_the_running_limit_are_searched(kind: str) -> None:
    opted_in = TunedConfig(8192, 256, max_num_active_seqs=128, max_num_partial_prefills=2)
    space = build_space(facts(kind, incumbent=opted_in), EVERY_BOUND)
    assert set(space.ranges) == {Knob.MAX_NUM_BATCHED_TOKENS, Knob.MAX_NUM_SEQS}
    assert any("long-prefill" in note for note in space.notes)
    config = space.to_config({"max_num_batched_tokens": 2048, "max_num_seqs": 64})
    assert config.long_prefill_token_threshold == 0


def test_the_vllm_space_still_searches_every_honoured_knob() -> None:
    opted_in = TunedConfig(8192, 256, max_num_active_seqs=128)
    space = build_space(facts("sglang", incumbent=opted_in, engine_kind="vllm", engine_version="0.33.0"))
    assert set(space.ranges) == {
        Knob.MAX_NUM_BATCHED_TOKENS,
        Knob.MAX_NUM_SEQS,
        Knob.MAX_NUM_ACTIVE_SEQS,
        Knob.LONG_PREFILL_TOKEN_THRESHOLD,
    }


def test_versions_are_read_in_the_kinds_own_numbering() -> None:
    # SGLang 0.5 and TensorRT-LLM 1.2 are not vLLM 0.5 / 1.2: neither has a partial-prefill limit.
    assert honours_partial_prefills("vllm", "0.5.23")
    assert not honours_partial_prefills("sglang", "0.5.23")
    assert not honours_partial_prefills("trtllm", "0.8.0")
    assert honours_max_num_active_seqs("vllm", "1.2.1")
    assert not honours_max_num_active_seqs("trtllm", "1.2.1")


@pytest.mark.parametrize("kind", ["vllm", "sglang", "trtllm"])
@pytest.mark.parametrize("version", ["0.8.5", "0.33.0", "0.5.23", "1.2.1"])
def test_the_judgement_is_the_knob_tables(kind: str, version: str) -> None:
    for row in TUNABLE:
        assert honours(kind, version, row.name) is engine_honours(
            kind, row.name, EngineVersion.parse(version)
        )


def test_the_budget_never_exceeds_sglangs_max_prefill_tokens() -> None:
    space = build_space(facts("sglang", max_prefill_tokens=2048))
    assert space.budget.high == 2048
    assert (
        space.to_config({"max_num_batched_tokens": 10**6, "max_num_seqs": 8}).max_num_batched_tokens == 2048
    )
    assert any("maxPrefillTokens 2048" in note for note in space.notes)


def test_a_derived_floor_above_max_prefill_tokens_comes_down_to_it() -> None:
    space = build_space(facts("sglang", max_prefill_tokens=128), {"maxNumSeqs": (8, 64)})
    assert (space.budget.low, space.budget.high) == (128, 128)


def test_max_prefill_tokens_caps_only_a_chunking_sglang() -> None:
    uncapped = build_space(facts("sglang")).budget.high
    assert uncapped > 2048
    assert (
        build_space(facts("sglang", max_prefill_tokens=2048, enable_chunked_prefill=False)).budget.high > 2048
    )
    assert build_space(facts("trtllm", max_prefill_tokens=2048)).budget.high > 2048
    assert build_space(facts("sglang", engine_kind="vllm", max_prefill_tokens=2048)).budget.high > 2048


def test_impossible_max_prefill_tokens_name_the_fields() -> None:
    with pytest.raises(SpaceError, match=r"spec\.engine\.maxPrefillTokens"):
        build_space(facts("sglang", max_prefill_tokens=64), {"maxNumSeqs": (128, 256)})
    with pytest.raises(SpaceError, match=r"bounds\.maxNumBatchedTokens.*maxPrefillTokens"):
        build_space(facts("sglang", max_prefill_tokens=2048), {"maxNumBatchedTokens": (4096, 8192)})


# --------------------------------------------------------------------------- through the real renderer


def _service(path: Path, engine: dict[str, Any], autotune: dict[str, Any]) -> InferenceService:
    manifest = yaml.safe_load(path.read_text())
    manifest = copy.deepcopy(manifest)
    manifest["spec"]["engine"].update(engine)
    manifest["spec"]["autotune"] = {"enabled": True, **autotune}
    return InferenceService.model_validate(manifest)


SERVICES = {
    "sglang": (SGLANG_EXAMPLE, {}, {}),
    "sglang-capped": (SGLANG_EXAMPLE, {"maxNumBatchedTokens": 1024, "maxPrefillTokens": 2048}, {}),
    "sglang-no-chunking": (
        SGLANG_EXAMPLE,
        {"enableChunkedPrefill": False, "enableMixedChunk": False, "maxNumBatchedTokens": 32768},
        {},
    ),
    "sglang-vllm-bounds": (
        SGLANG_EXAMPLE,
        {},
        {
            "bounds": {
                "longPrefillTokenThreshold": {"min": 64, "max": 2048},
                "maxNumSeqs": {"min": 4, "max": 64},
            }
        },
    ),
    "trtllm": (TRTLLM_EXAMPLE, {}, {}),
    "trtllm-vllm-bounds": (
        TRTLLM_EXAMPLE,
        {},
        {
            "bounds": {
                "longPrefillTokenThreshold": {"min": 64, "max": 2048},
                "maxNumActiveSeqs": {"min": 8, "max": 64},
            }
        },
    ),
}


def _proposals(space: SearchSpace, n: int = 150) -> list[TunedConfig]:
    """Random samples of the space plus every corner of its ranges."""
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=7))
    distributions = space.distributions()
    configs = [space.to_config(study.ask(distributions).params) for _ in range(n)]
    corners: list[dict[str, int]] = [{}]
    for knob, r in space.ranges.items():
        corners = [{**c, knob.value: v} for c in corners for v in (r.low, r.high)]
    return configs + [space.to_config(c) for c in corners]


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_proposal_renders_on_the_engine(name: str) -> None:
    path, engine, autotune = SERVICES[name]
    isvc = _service(path, engine, autotune)
    assert isinstance(render_engine(isvc.spec), EngineRender)
    space = build_space(service_facts(isvc), space_bounds(isvc))
    assert set(space.ranges) == {Knob.MAX_NUM_BATCHED_TOKENS, Knob.MAX_NUM_SEQS}
    for config in _proposals(space):
        # apply_to validates the CRD's rules; render_for raises on UnsupportedKnob.
        rendered = render_for(isvc, engine_config(config))
        assert isinstance(rendered, EngineRender), config
    if isvc.spec.engine.max_prefill_tokens is not None and isvc.spec.engine.enable_chunked_prefill:
        assert space.budget.high <= isvc.spec.engine.max_prefill_tokens


@pytest.mark.parametrize(("version", "searched"), [("0.32.0", False), ("0.33.0", True)])
def test_the_simulator_searches_max_num_active_seqs_exactly_where_it_renders_it(
    version: str, searched: bool
) -> None:
    """The simulator mirrors the vLLM release in spec.engine.version: before 0.33 render_sim refuses
    --max-num-active-seqs, so the space must not propose it; from 0.33 on it does both."""
    isvc = _service(
        SIM_EXAMPLE, {"version": version}, {"bounds": {"maxNumActiveSeqs": {"min": 8, "max": 64}}}
    )
    space = build_space(service_facts(isvc), space_bounds(isvc))
    assert (Knob.MAX_NUM_ACTIVE_SEQS in space.ranges) is searched
    for config in _proposals(space, n=40):
        assert isinstance(render_for(isvc, engine_config(config)), EngineRender), config
