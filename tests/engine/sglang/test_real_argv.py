"""The SGLang argument vectors the operator renders are accepted by SGLang's own parser.

Every SGLang example and golden case is rendered with the operator's renderer and parsed by
``sglang.launch_server``'s parser and ``ServerArgs.from_cli_args`` at the pinned release,
inside the cached SGLang environment (:mod:`chunkpilot.engine.sglang.env`); the values SGLang
resolves must be the spec's. Broken vectors must be refused, so the check can fail.
"""

from __future__ import annotations

from typing import Any

import pytest
from chunkpilot.engine.sglang import argcheck
from chunkpilot.engine.sglang.env import SGLANG_VERSION, SGLangEnv, ensure
from chunkpilot.operator.engines import EngineRender, render_engine

from chunkpilot.api import EngineKind, InferenceServiceSpec, options
from chunkpilot.testing.extra_args import ALLOWED, REFUSED
from chunkpilot.testing.processes import json_through
from chunkpilot.testing.services import specs_of_kind

pytestmark = [pytest.mark.sglang, pytest.mark.timeout(1800)]


def sglang_specs() -> dict[str, InferenceServiceSpec]:
    return specs_of_kind(EngineKind.SGLANG)


def vectors() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name, spec in sglang_specs().items():
        rendered = render_engine(spec)
        assert isinstance(rendered, EngineRender), f"{name}: {rendered}"
        assert rendered.command == ["python3", "-m", "sglang.launch_server"]
        out[name] = list(rendered.args)
    return out


BAD = {
    "bad-unknown-flag": ["--model-path", "org/model", "--max-num-seqs", "8"],
    "bad-policy": ["--model-path", "org/model", "--schedule-policy", "shortest-job-first"],
    "bad-chunk-not-a-number": ["--model-path", "org/model", "--chunked-prefill-size", "lots"],
}


@pytest.fixture(scope="module")
def sglang_env() -> SGLangEnv:
    return ensure()


@pytest.fixture(scope="module")
def results(sglang_env: SGLangEnv) -> dict[str, dict[str, Any]]:
    parsed: dict[str, dict[str, Any]] = json_through(
        [str(sglang_env.python), argcheck.__file__], {**vectors(), **BAD}
    )
    return parsed


def test_the_environment_is_the_pinned_release(results: dict[str, Any]) -> None:
    assert results["__version__"] == SGLANG_VERSION


def test_there_are_sglang_examples() -> None:
    names = sglang_specs()
    assert any(name.startswith("examples/") for name in names) and len(names) >= 3


@pytest.mark.parametrize("name", sorted(sglang_specs()))
def test_rendered_argv_is_accepted_and_means_the_spec(results: dict[str, Any], name: str) -> None:
    result = results[name]
    assert result["ok"], result
    values = result["values"]
    spec = sglang_specs()[name]
    engine = spec.engine
    chunk = engine.max_num_batched_tokens if engine.enable_chunked_prefill else -1
    assert values["chunked_prefill_size"] == chunk
    assert values["max_running_requests"] == engine.max_num_seqs
    assert values["enable_mixed_chunk"] is engine.enable_mixed_chunk
    assert values["disable_radix_cache"] is (not engine.enable_prefix_caching)
    assert values["tp_size"] == engine.tensor_parallel_size
    assert values["mem_fraction_static"] == pytest.approx(engine.gpu_memory_utilization)
    assert values["enable_metrics"] is True and values["port"] == 8000
    if engine.max_prefill_tokens is not None:
        assert values["max_prefill_tokens"] == engine.max_prefill_tokens
    if engine.schedule_policy is not None:
        assert values["schedule_policy"] == str(engine.schedule_policy)
    if spec.model.max_model_len is not None:
        assert values["context_length"] == spec.model.max_model_len


@pytest.mark.parametrize("name", sorted(BAD))
def test_broken_vectors_are_refused(results: dict[str, Any], name: str) -> None:
    assert not results[name]["ok"], results[name]


# --------------------------------------------------------------------------- extraArgs

_BASE = ["--model-path", "org/model", "--chunked-prefill-size", "512", "--max-running-requests", "64"]
GUARDED_DESTS = {option.lstrip("-").replace("-", "_") for option in options.guarded("sglang")}


@pytest.fixture(scope="module")
def extra_args_results(sglang_env: SGLangEnv) -> dict[str, Any]:
    vectors = {"base": _BASE, "allowed": [*_BASE, *ALLOWED["sglang"]]}
    for index, (tokens, _) in enumerate(REFUSED["sglang"]):
        vectors[f"refused-{index}"] = [*_BASE, *tokens]
    parsed: dict[str, Any] = json_through([str(sglang_env.python), argcheck.__file__], vectors)
    return parsed


def _changed(results: dict[str, Any], name: str) -> set[str]:
    base = results["base"]["namespace"]
    assert "namespace" in results[name], results[name]
    return {dest for dest, value in results[name]["namespace"].items() if base.get(dest) != value}


@pytest.mark.parametrize(
    "index", range(len(REFUSED["sglang"])), ids=lambda i: " ".join(REFUSED["sglang"][i][0])
)
def test_each_refused_variant_is_read_by_sglang_as_a_managed_option(
    extra_args_results: dict[str, Any], index: int
) -> None:
    tokens, _ = REFUSED["sglang"][index]
    assert options.extra_args_problems("sglang", tokens)
    assert _changed(extra_args_results, f"refused-{index}") & GUARDED_DESTS, extra_args_results[
        f"refused-{index}"
    ]


def test_the_allowed_variants_leave_every_managed_option_alone(extra_args_results: dict[str, Any]) -> None:
    changed = _changed(extra_args_results, "allowed")
    assert {"random_seed", "disable_cuda_graph"} <= changed
    assert not changed & GUARDED_DESTS, changed & GUARDED_DESTS
    assert options.extra_args_problems("sglang", ALLOWED["sglang"]) == []
