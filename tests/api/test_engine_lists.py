"""Every list of engines, pinned: the kinds, their names, versions, images, paths, CEL rules and CRD enum.

Each list is derived from the engine registry; this test pins what each says for the engines the
product ships, so deriving them changes nothing a user or the apiserver sees.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from chunkpilot.engine.metrics_names import engine_metrics
from chunkpilot.engine.sim.flags import ENGINE_NAMES as SIM_ENGINE_NAMES
from chunkpilot.operator.engines import default_image, metrics_path, support
from chunkpilot.operator.engines.sim import SIMULATED_KINDS

from chunkpilot.api import EngineKind, EngineSpec, InferenceServiceSpec
from chunkpilot.api.inferenceservice import DEFAULT_ENGINE_VERSIONS, _managed_flag_pattern
from chunkpilot.api.knobs import DIALECTS, ENGINE_NAMES, SERVER_FLAGS, dialect_of
from chunkpilot.demo.scenario import DEMO_ENGINES

REPO = Path(__file__).resolve().parents[2]
KINDS = ["vllm", "sglang", "trtllm", "sim"]


def _pattern(dialect: str) -> str:
    # The pattern itself is tested in tests/api/test_options.py; here, which kinds each rule guards.
    return _managed_flag_pattern(dialect)


def test_engine_kinds_and_their_names() -> None:
    assert [str(kind) for kind in EngineKind] == KINDS
    assert DIALECTS == ("vllm", "sglang", "trtllm")
    assert dict(ENGINE_NAMES) == {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}
    assert {kind: str(dialect_of(kind)) for kind in KINDS} == {
        "vllm": "vllm",
        "sglang": "sglang",
        "trtllm": "trtllm",
        "sim": "vllm",
    }
    assert list(SERVER_FLAGS) == ["vllm", "sglang", "trtllm"]


def test_default_versions_images_and_metrics_paths() -> None:
    assert DEFAULT_ENGINE_VERSIONS == {
        "vllm": "0.33.0",
        "sim": "0.33.0",
        "sglang": "0.5.23",
        "trtllm": "1.2.1",
    }
    assert [support(kind).render.__module__ for kind in KINDS] == [
        f"chunkpilot.operator.engines.{kind}" for kind in KINDS
    ]
    assert [metrics_path(kind) for kind in KINDS] == [
        "/metrics",
        "/metrics",
        "/prometheus/metrics",
        "/metrics",
    ]
    assert default_image(EngineKind.SGLANG, "0.5.23") == "lmsysorg/sglang:v0.5.23"
    assert default_image(EngineKind.TRTLLM, "1.2.1") == "nvcr.io/nvidia/tensorrt-llm/release:1.2.1"
    assert default_image(EngineKind.VLLM, "0.7.3") == "vllm/vllm-openai:v0.7.3"
    assert default_image(EngineKind.SIM, "0.33.0").startswith("ghcr.io/chunkpilot/chunkpilot:")


def test_simulator_demo_and_metric_tables() -> None:
    assert tuple(SIMULATED_KINDS) == ("sglang", "trtllm")
    assert tuple(DEMO_ENGINES) == ("sim", "sglang", "trtllm")
    assert tuple(SIM_ENGINE_NAMES) == ("vllm", "sglang", "trtllm")
    assert {kind: engine_metrics(kind).engine for kind in KINDS} == {
        "vllm": "vllm",
        "sim": "vllm",
        "sglang": "sglang",
        "trtllm": "trtllm",
    }


def _rules_naming_kinds(rules: Any) -> list[tuple[str, str, str]]:
    return [(r.rule, r.message, r.field_path) for r in rules if ".kind" in r.rule or "self.kind" in r.rule]


def test_cel_rules_that_name_engine_kinds() -> None:
    assert _rules_naming_kinds(EngineSpec.cel_rules) == [
        (
            "!has(self.pluginInstalled) || self.kind in ['vllm']",
            "pluginInstalled applies to kind vllm only (Chunkpilot's scheduler plugin is vLLM's): remove it",
            ".pluginInstalled",
        ),
        (
            f"self.kind in ['sglang', 'trtllm'] || self.extraArgs.all(a, !a.matches('{_pattern('vllm')}'))",
            "extraArgs must not repeat flags rendered from the spec (e.g. --max-num-batched-tokens):"
            " set the corresponding spec.engine field instead",
            ".extraArgs",
        ),
        (
            f"self.kind != 'sglang' || self.extraArgs.all(a, !a.matches('{_pattern('sglang')}'))",
            "extraArgs must not repeat SGLang flags rendered from the spec (e.g. --chunked-prefill-size):"
            " set the corresponding spec.engine field instead",
            ".extraArgs",
        ),
        (
            f"self.kind != 'trtllm' || self.extraArgs.all(a, !a.matches('{_pattern('trtllm')}'))",
            "extraArgs must not repeat trtllm-serve flags rendered from the spec (e.g. --max_num_tokens):"
            " set the corresponding spec.engine field instead",
            ".extraArgs",
        ),
    ]
    spec_rules = _rules_naming_kinds(InferenceServiceSpec.cel_rules)
    assert [rule for rule, _, _ in spec_rules] == [
        "self.engine.kind != 'sglang' || !has(self.model.servedName) || !self.model.servedName.contains(':')",
        "!has(self.topology) || self.topology.mode != 'disaggregated' || self.engine.kind in ['vllm', 'sim']",
        "!has(self.topology) || self.topology.mode != 'disaggregated' || !has(self.engine.version)"
        " || !(self.engine.kind in ['vllm', 'sim'])"
        " || !self.engine.version.matches('^v?0[.][0-8]([^0-9]|$)')",
    ]
    assert spec_rules[0][1] == (
        "model.servedName must not contain ':' on SGLang (it reserves 'model:adapter' for LoRA):"
        " choose another servedName"
    )


def test_crd_engine_kind_field() -> None:
    for crd_path in (
        REPO / "crds/inferenceservices.chunkpilot.io.yaml",
        REPO / "charts/chunkpilot/crds/inferenceservices.chunkpilot.io.yaml",
    ):
        crd = yaml.safe_load(crd_path.read_text())
        spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        engine = spec["properties"]["engine"]["properties"]
        assert engine["kind"] == {
            "description": "Engine: vllm, sglang or trtllm (TensorRT-LLM's trtllm-serve) on GPUs, or sim"
            " (the CPU simulator with vLLM's API).",
            "type": "string",
            "enum": KINDS,
            "default": "vllm",
        }
        assert engine["version"]["description"] == (
            "Engine version the flags are rendered for, e.g. 0.33.0; unset: vLLM 0.33.0 (also for sim),"
            " SGLang 0.5.23, TensorRT-LLM 1.2.1."
        )
