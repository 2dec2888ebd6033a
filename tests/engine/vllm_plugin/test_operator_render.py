"""The operator renders the plugin for partial-prefill limits on V1 releases (pure, no vLLM)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from chunkpilot.engine.vllm_plugin.config import load_plugin_config
from chunkpilot.engine.vllm_plugin.render import SCHEDULER_CLS, engine_image
from chunkpilot.operator.engines import EngineRender, UnsupportedKnob, render_engine

from chunkpilot.api import InferenceService, InferenceServiceSpec

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "llama-70b-vllm.yaml"


def lanes_spec(**engine: Any) -> InferenceServiceSpec:
    """The 70B example (vLLM 0.33) with partial-prefill limits and the given engine fields."""
    manifest = yaml.safe_load(EXAMPLE.read_text())
    manifest["spec"]["engine"].update({"maxNumPartialPrefills": 4, "maxLongPartialPrefills": 1, **engine})
    return InferenceService.from_manifest(manifest).spec


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_engine_image_renders_the_scheduler_plugin() -> None:
    result = render_engine(lanes_spec(image=engine_image("0.33.0")))
    assert isinstance(result, EngineRender), result
    assert result.image == "ghcr.io/chunkpilot/engine-vllm:vllm-v0.33.0"
    assert flag(result.args, "--scheduler-cls") == SCHEDULER_CLS
    assert "--max-num-partial-prefills" not in result.args
    assert "--max-long-partial-prefills" not in result.args
    config = load_plugin_config(json.loads(flag(result.args, "--additional-config")), {})
    assert (config.max_num_partial_prefills, config.max_long_partial_prefills) == (4, 1)


def test_extra_additional_config_is_merged_not_repeated() -> None:
    result = render_engine(
        lanes_spec(
            image=engine_image("0.33.0"), extraArgs=["--additional-config", '{"other": 1}', "--seed=0"]
        )
    )
    assert isinstance(result, EngineRender), result
    assert result.args.count("--additional-config") == 1
    assert json.loads(flag(result.args, "--additional-config"))["other"] == 1
    assert result.args[-1] == "--seed=0"


def test_the_engine_image_is_the_default_for_its_release() -> None:
    result = render_engine(lanes_spec())
    assert isinstance(result, EngineRender), result
    assert result.image == engine_image("0.33.0")
    assert flag(result.args, "--scheduler-cls") == SCHEDULER_CLS


def test_upstream_image_still_refuses_with_the_remedy() -> None:
    result = render_engine(lanes_spec(image="vllm/vllm-openai:v0.33.0"))
    assert isinstance(result, UnsupportedKnob)
    assert "--max-num-partial-prefills" in result.message
    assert "ghcr.io/chunkpilot/engine-vllm" in result.message


OWN_IMAGE = "registry.internal:5000/ml/vllm-cuda12-extras:2026.11@sha256:" + "a" * 64


def test_an_image_of_ones_own_declared_with_the_plugin_is_run_like_the_engine_image() -> None:
    own = render_engine(lanes_spec(image=OWN_IMAGE, pluginInstalled=True))
    ours = render_engine(lanes_spec(image=engine_image("0.33.0")))
    assert isinstance(own, EngineRender) and isinstance(ours, EngineRender), (own, ours)
    assert own.image == OWN_IMAGE
    assert own.args == ours.args  # the same scheduler, lanes and telemetry
    assert own.env == ours.env


def test_an_image_of_ones_own_without_the_declaration_has_no_plugin() -> None:
    result = render_engine(lanes_spec(image=OWN_IMAGE))
    assert isinstance(result, UnsupportedKnob), result
    assert "pluginInstalled" in result.remedy
    assert isinstance(
        render_engine(lanes_spec(image=engine_image("0.33.0"), pluginInstalled=False)), UnsupportedKnob
    )


def test_the_engine_image_from_a_mirror_keeps_its_plugin() -> None:
    mirrored = "mirror.internal:5000/chunkpilot/engine-vllm:vllm-v0.33.0"
    result = render_engine(lanes_spec(image=mirrored))
    assert isinstance(result, EngineRender), result
    assert flag(result.args, "--scheduler-cls") == SCHEDULER_CLS
