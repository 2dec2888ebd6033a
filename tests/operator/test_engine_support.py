"""The engine registry: each of the API's kinds has its module, and a new engine is a descriptor and a module.

A throw-away "toy" engine (speaking vLLM's flag dialect) is registered for the length of a test (its
descriptor in the API's registry, its module ``chunkpilot.operator.engines.toy``) and shown validated by
the API, rendered into a Deployment, and run by the simulator.
"""

from __future__ import annotations

import argparse
import sys
import types
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

import pytest
from chunkpilot.engine.metrics_names import VLLM_METRICS, engine_metrics
from chunkpilot.engine.sim.flags import add_flags_for, config_for
from chunkpilot.engine.sim.offline import simulate
from chunkpilot.engine.sim.workload import poisson
from chunkpilot.operator import engines as operator_engines
from chunkpilot.operator.builders import build_deployment
from chunkpilot.operator.engines import (
    ENGINE_PORT,
    EngineModuleError,
    EngineRender,
    EngineSupport,
    RenderResult,
    render_engine,
    support,
)
from chunkpilot.operator.engines.flags import Vocabulary

from chunkpilot.api import InferenceService, InferenceServiceSpec
from chunkpilot.api.common import ManifestError
from chunkpilot.api.engines import ENGINES, VLLM_ENGINE, EngineDescriptor, ProbeTiming
from chunkpilot.api.knobs import VLLM
from chunkpilot.testing.services import a_service_body

TOY = EngineDescriptor(
    kind="toy",
    display_name="Toy",
    dialect=VLLM,
    kind_doc="toy (a throw-away engine)",
    default_version="1.0.0",
    image_repository="example.com/toy",
    probes=ProbeTiming(startup_period_s=5, startup_failure_threshold=12),
    server_flags=VLLM_ENGINE.server_flags,
    gpu=False,
)
#: The toy's flags: vLLM's dialect of the knob table.
TOY_FLAGS = Vocabulary(TOY.dialect)


def render_toy(spec: InferenceServiceSpec) -> RenderResult:
    """The toy's container: the simulator's server with the knobs in vLLM's flags, from the table."""
    engine = spec.engine
    args = [
        spec.model.name,
        *TOY_FLAGS.server_option("host", "0.0.0.0"),
        *TOY_FLAGS.server_option("port", ENGINE_PORT),
        *TOY_FLAGS.server_option("max-model-len", spec.model.max_model_len),
        *TOY_FLAGS.option("max_num_batched_tokens", engine.max_num_batched_tokens),
        *TOY_FLAGS.option("max_num_seqs", engine.max_num_seqs),
        *TOY_FLAGS.switch("enable_chunked_prefill", engine.enable_chunked_prefill),
        *TOY_FLAGS.switch("enable_prefix_caching", engine.enable_prefix_caching),
    ]
    return EngineRender(
        engine=TOY.display_name,
        version=engine.version,
        image=engine.image or f"{TOY.image_repository}:{engine.version}",
        command=["chunkpilot", "sim", "serve"],
        args=[*args, *engine.extra_args],
        probes=TOY.probes,
        metrics_path=TOY.metrics_path,
    )


@contextmanager
def registered(descriptor: EngineDescriptor, support_: EngineSupport) -> Iterator[None]:
    """``descriptor`` in the API's registry and its module with ``SUPPORT``; both removed after."""
    module = types.ModuleType(f"{operator_engines.__name__}.{descriptor.kind}")
    module.SUPPORT = support_  # type: ignore[attr-defined]
    ENGINES[descriptor.kind] = descriptor
    sys.modules[module.__name__] = module
    try:
        operator_engines.check_covers()
        yield
    finally:
        del ENGINES[descriptor.kind]
        del sys.modules[module.__name__]


def toy_registered() -> AbstractContextManager[None]:
    return registered(TOY, EngineSupport(render_toy, lambda version: f"{TOY.image_repository}:{version}"))


def toy_service() -> InferenceService:
    body = a_service_body(engine={"kind": TOY.kind, "maxNumBatchedTokens": 1024, "maxNumSeqs": 32})
    body["spec"]["model"]["name"] = "llama-3.1-8b"
    return InferenceService.from_manifest(body)


def test_every_kind_has_its_module() -> None:
    operator_engines.check_covers()
    assert [support(kind).render.__module__ for kind in ENGINES] == [
        f"chunkpilot.operator.engines.{kind}" for kind in ENGINES
    ]
    assert support("sglang").twin_semantics is not None and support("vllm").twin_semantics is None


def test_a_kind_without_its_module_is_refused() -> None:
    ENGINES[TOY.kind] = TOY
    try:
        with pytest.raises(EngineModuleError, match=r"has no module chunkpilot\.operator\.engines\.toy"):
            operator_engines.check_covers()
        sys.modules["chunkpilot.operator.engines.toy"] = types.ModuleType("chunkpilot.operator.engines.toy")
        with pytest.raises(EngineModuleError, match="defines no SUPPORT"):
            support(TOY.kind)
    finally:
        del ENGINES[TOY.kind]
        sys.modules.pop("chunkpilot.operator.engines.toy", None)


def test_a_toy_engine_is_validated_rendered_and_simulated() -> None:
    with pytest.raises(ManifestError, match="unknown engine kind 'toy'"):
        toy_service()
    with toy_registered():
        # Validated: the kind is registered, its version defaults to the descriptor's.
        service = toy_service()
        assert service.spec.engine.kind == "toy"
        assert service.spec.engine.version == TOY.default_version
        assert engine_metrics("toy") is VLLM_METRICS

        # Rendered: argv from the knob table's vLLM flags, into the Deployment.
        render = render_engine(service.spec)
        assert isinstance(render, EngineRender)
        assert render.args[render.args.index("--max-num-batched-tokens") + 1] == "1024"
        assert "--enable-chunked-prefill" in render.args
        deployment = build_deployment(service, "stable")
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        assert container["image"] == "example.com/toy:1.0.0"
        assert container["args"] == render.args

        # Simulated: the simulator parses the rendered argv in the toy's dialect and runs it.
        dialect = TOY.dialect
        assert support(TOY.kind).twin_semantics is None  # the twin simulates it as vLLM
        parser = argparse.ArgumentParser()
        add_flags_for(parser, dialect)
        args, server_options = parser.parse_known_args([*render.args[1:], "--gpu", "h100"])
        assert server_options == ["--host", "0.0.0.0", "--port", "8000"]  # `sim serve`'s own
        args.engine = dialect
        config = config_for(render.args[0], args)
        assert (config.scheduler.max_num_batched_tokens, config.scheduler.max_num_seqs) == (1024, 32)
        summary = simulate(config, poisson([(512, 64)] * 20, rate=5.0))
        assert summary.completed == summary.requests == 20
    assert TOY.kind not in ENGINES
    with pytest.raises(KeyError):
        support(TOY.kind)
