"""The simulator parses every flag of the knob table, with vLLM's defaults."""

from __future__ import annotations

import argparse

import pytest
from chunkpilot.engine.sim.flags import add_engine_flags, sim_config_from_args

from chunkpilot.api import EngineSpec
from chunkpilot.api.knobs import KNOBS, VLLM, KnobSpec


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_engine_flags(parser)
    return parser


#: The knobs of the vLLM dialect (the others are SGLang's or TensorRT-LLM's only).
VLLM_KNOBS = [knob for knob in KNOBS if VLLM in knob.flags]


@pytest.mark.parametrize("knob", VLLM_KNOBS, ids=lambda k: k.name)
def test_every_knob_flag_parses(knob: KnobSpec) -> None:
    value = {"int": ["3"], "float": ["0.5"], "bool": [], "json": ['{"num_speculative_tokens": 2}']}[knob.kind]
    flag = knob.flag(VLLM)
    parsed = vars(_parser().parse_args([flag.flag, *value]))
    expected = {"int": 3, "float": 0.5, "bool": True, "json": {"num_speculative_tokens": 2}}[knob.kind]
    assert parsed[flag.name.replace("-", "_")] == expected


@pytest.mark.parametrize("knob", VLLM_KNOBS, ids=lambda k: k.name)
def test_defaults_are_the_apis_except_where_vllm_picks_from_the_hardware(knob: KnobSpec) -> None:
    parsed = vars(_parser().parse_args([]))
    default = parsed[knob.flag(VLLM).name.replace("-", "_")]
    assert default == (None if knob.hardware_default else EngineSpec.model_fields[knob.name].get_default())


def test_switches_take_the_negated_and_the_old_spelling() -> None:
    argv = ["--no-enable-prefix-caching", "--enable-chunked-prefill=false", "-tp", "2"]
    parsed = _parser().parse_args(argv)
    assert not parsed.enable_prefix_caching and not parsed.enable_chunked_prefill
    assert parsed.tensor_parallel_size == 2


SCHEDULER_ARGV = [
    *("--max-num-batched-tokens", "2048", "--max-num-seqs", "64", "--max-num-active-seqs", "32"),
    *("--long-prefill-token-threshold", "512", "--max-num-partial-prefills", "2"),
    *("--max-long-partial-prefills", "1"),
]


def test_scheduler_knobs_reach_the_simulated_scheduler() -> None:
    scheduler = sim_config_from_args("llama-3.1-8b", _parser().parse_args(SCHEDULER_ARGV)).scheduler
    assert (scheduler.max_num_batched_tokens, scheduler.max_num_seqs, scheduler.max_num_active_seqs) == (
        2048,
        64,
        32,
    )
    assert scheduler.long_prefill_token_threshold == 512
    assert (scheduler.max_num_partial_prefills, scheduler.max_long_partial_prefills) == (2, 1)
