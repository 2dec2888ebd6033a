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
