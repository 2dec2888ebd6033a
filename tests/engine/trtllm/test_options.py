"""The TensorRT-LLM command lines the operator renders pass the source-level check.

``trtllm-serve`` cannot be imported without its NVIDIA-hosted wheel and CUDA, so the rendered
arguments and options file are checked against the option definitions recorded from its
source (:mod:`chunkpilot.engine.trtllm.options`). Broken inputs must be refused.
"""

from __future__ import annotations

import pytest
import yaml
from chunkpilot.engine.trtllm import options
from chunkpilot.operator.engines import EngineRender, render_engine
from chunkpilot.operator.engines.trtllm import OPTIONS_ENV, PINNED_VERSION

from chunkpilot.api import EngineKind, InferenceServiceSpec
from chunkpilot.api.knobs import KNOBS, TRTLLM, managed_flags
from chunkpilot.testing.services import specs_of_kind

pytestmark = pytest.mark.trtllm


def trtllm_specs() -> dict[str, InferenceServiceSpec]:
    return specs_of_kind(EngineKind.TRTLLM)


def test_the_tables_describe_the_pinned_release() -> None:
    assert str(PINNED_VERSION) == options.TRTLLM_OPTIONS_VERSION


def test_there_are_trtllm_examples() -> None:
    names = trtllm_specs()
    assert any(name.startswith("examples/") for name in names) and len(names) >= 3


@pytest.mark.parametrize("name", sorted(trtllm_specs()))
def test_rendered_argv_and_options_file_pass_the_check(name: str) -> None:
    rendered = render_engine(trtllm_specs()[name])
    assert isinstance(rendered, EngineRender), rendered
    assert rendered.command[-1] == "trtllm-serve"
    assert options.check_serve_argv(rendered.args) == []
    (text,) = [item["value"] for item in rendered.env if item["name"] == OPTIONS_ENV]
    parsed = yaml.safe_load(text)
    assert options.check_options(parsed) == []
    assert parsed["enable_chunked_prefill"] is trtllm_specs()[name].engine.enable_chunked_prefill


def test_every_trtllm_setting_of_the_knob_table_is_defined_by_the_engine() -> None:
    flags = {name for opt in options.SERVE_OPTIONS for name in opt.names}
    for row in KNOBS:
        if TRTLLM not in row.flags:
            continue
        flag = row.flag(TRTLLM)
        if flag.yaml:
            section = options.LLM_API_KEYS
            *parents, leaf = flag.flag.split(".")
            for parent in parents:
                section = section[parent]  # type: ignore[assignment]
            assert leaf in section, flag.flag
        else:
            assert flag.flag in flags, flag.flag
    assert {f"--{name}" for name in managed_flags(TRTLLM)} <= flags


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["serve", "m", "--max-num-tokens", "8"], "no such option: --max-num-tokens"),
        (["serve", "m", "--max_num_tokens", "lots"], "not a valid integer"),
        (["serve", "m", "--backend", "onnx"], "not one of"),
        (["serve", "m", "--enable_chunked_prefill=true"], "takes no value"),
        (["serve", "--port", "8000"], "exactly one MODEL"),
        (["serve", "m", "--max_batch_size", "8", "--max_batch_size", "16"], "given twice"),
        (["m", "--port", "8000"], "serve command"),
    ],
)
def test_broken_argv_is_refused(argv: list[str], fragment: str) -> None:
    problems = options.check_serve_argv(argv)
    assert any(fragment in problem for problem in problems), problems


@pytest.mark.parametrize(
    ("document", "fragment"),
    [
        ({"enable_chunked_context": True}, "not a field"),
        ({"enable_chunked_prefill": "yes"}, "not a bool"),
        ({"scheduler_config": {"capacity_scheduler_policy": "FCFS"}}, "not one of"),
        ({"kv_cache_config": {"free_gpu_memory_fraction": "most"}}, "not a float"),
        ({"kv_cache_config": {"enable_prefix_caching": True}}, "not a field"),
    ],
)
def test_broken_options_are_refused(document: dict[str, object], fragment: str) -> None:
    problems = options.check_options(document)
    assert any(fragment in problem for problem in problems), problems
