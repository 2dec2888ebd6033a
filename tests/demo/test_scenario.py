"""The demo's embedded scenario: valid against the API, clear errors for bad options."""

from __future__ import annotations

import argparse

import pytest

from chunkpilot.api import InferenceService
from chunkpilot.demo.cli import register, scenario_from_args
from chunkpilot.demo.scenario import DemoScenario, build_inferenceservice


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["demo", *argv])


def test_default_manifest_is_a_valid_inferenceservice() -> None:
    manifest = build_inferenceservice(DemoScenario())
    service = InferenceService.from_manifest(manifest)
    assert service.spec.engine.max_num_batched_tokens == 8192
    assert service.spec.autotune.enabled
    assert service.spec.slo is not None
    assert service.spec.slo.itl.max_ms == 50


def test_fast_manifest_is_valid_and_shorter() -> None:
    default, fast = DemoScenario(), DemoScenario().fast()
    InferenceService.from_manifest(build_inferenceservice(fast))
    assert fast.trial_seconds < default.trial_seconds
    assert fast.time_scale >= default.time_scale
    assert fast.max_trials * fast.trial_seconds < 600, "--fast must finish in a few minutes"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"rate": 0}, "--rate must be > 0"),
        ({"itl_quantile": 99.0}, "--itl-quantile must be between 0 and 1"),
        ({"ttft_max_ms": -1}, "--ttft-ms must be a positive number"),
        ({"budget": 64, "max_num_seqs": 128}, "--budget (64) must be >= --max-num-seqs (128)"),
        ({"warmup": "2m", "trial_window": "1m"}, "--warmup (2m) must be shorter than --trial-window (1m)"),
        ({"trial_window": "1 minute"}, "invalid duration '1 minute'"),
        ({"time_scale": 0}, "--time-scale must be > 0"),
        ({"max_replicas": 0}, "--max-replicas (0) must be >= the starting replicas (1)"),
        ({"surge_max_factor": 0.5}, "the surge needs"),
    ],
)
def test_bad_options_name_the_option(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError) as error:
        DemoScenario(**changes)  # type: ignore[arg-type]
    assert message in str(error.value)


def test_options_override_the_fast_preset() -> None:
    scenario = scenario_from_args(
        parse("--fast", "--max-trials", "3", "--itl-ms", "40", "--trace", "azure_conv_2023")
    )
    assert scenario.max_trials == 3
    assert scenario.itl_max_ms == 40
    assert scenario.trace == "azure_conv_2023"
    assert scenario.trial_window == DemoScenario().fast().trial_window


def test_without_fast_the_defaults_apply() -> None:
    assert scenario_from_args(parse()) == DemoScenario()


@pytest.mark.parametrize("engine", ["sglang", "trtllm"])
def test_engine_services_run_on_the_simulator_in_their_own_dialect(
    engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator renders the demo's SGLang / TensorRT-LLM service on the simulator image as that
    engine's argument vector run by ``chunkpilot sim serve --engine KIND``, which parses it."""
    from chunkpilot.engine.sim.flags import config_for
    from chunkpilot.operator.engines import render_engine
    from chunkpilot.operator.engines.common import EngineRender
    from chunkpilot.tuner.records import service_facts, space_bounds
    from chunkpilot.tuner.space import Knob, build_space

    from chunkpilot.cli import build_parser

    spec = InferenceService.from_manifest(build_inferenceservice(DemoScenario(engine=engine))).spec
    render = render_engine(spec)
    assert isinstance(render, EngineRender) and render.gpus == 0
    assert f"chunkpilot sim serve --engine {engine}" in " ".join(render.command)
    for item in render.env:  # what the pod's launch script would write its options file from
        monkeypatch.setenv(item["name"], item["value"])
    args = build_parser().parse_args(["sim", "serve", "--engine", engine, *render.args])
    config = config_for(args.model, args)
    assert config.engine.value == engine
    assert config.scheduler.max_num_batched_tokens == DemoScenario().budget
    assert config.scheduler.max_num_seqs == DemoScenario().max_num_seqs
    isvc = InferenceService.from_manifest(build_inferenceservice(DemoScenario(engine=engine)))
    space = build_space(service_facts(isvc), space_bounds(isvc))
    assert Knob.LONG_PREFILL_TOKEN_THRESHOLD not in space.ranges, "a vLLM-only knob the tuner must not search"
    if engine == "sglang":
        assert config.scheduler.enable_mixed_chunk and args.enable_metrics
    else:
        assert config.scheduler.enable_chunked_prefill


def test_an_unknown_demo_engine_is_refused() -> None:
    with pytest.raises(ValueError, match="--engine must be one of sim, sglang, trtllm"):
        DemoScenario(engine="tgi")


def test_the_planner_runs_in_auto_up_to_max_replicas_and_one_turns_it_off() -> None:
    scenario = scenario_from_args(parse("--fast", "--max-replicas", "4"))
    spec = InferenceService.from_manifest(build_inferenceservice(scenario)).spec.scaling
    # It advises while the tuner runs; the demo turns it to Auto once the tuning has ended.
    assert (spec.mode, spec.min_replicas, spec.max_replicas) == ("Advise", 1, 4)
    assert spec.behavior is not None and spec.behavior.scale_down is not None
    assert spec.behavior.scale_down.stabilization_window_seconds == scenario.scale_down_window_s
    off = scenario_from_args(parse("--max-replicas", "1"))
    assert not off.scales
    assert "scaling" not in build_inferenceservice(off)["spec"]


@pytest.mark.parametrize(
    ("capacity", "expected"),
    [(12.0, 24.0), (4.0, 10.0), (1.0, 6.0)],  # capped at 4x the rate; 2.5 replicas' worth; never below it
)
def test_the_surge_is_about_two_and_a_half_replicas_worth_within_the_cap(
    capacity: float, expected: float
) -> None:
    assert DemoScenario(rate=6.0).surge_rate(capacity) == pytest.approx(expected)


def test_the_surge_length_is_an_option_longer_than_its_ramp() -> None:
    assert scenario_from_args(parse("--fast", "--surge-s", "90")).surge_s == 90
    with pytest.raises(ValueError, match="longer than the surge's ramp"):
        scenario_from_args(parse("--surge-s", "10"))
