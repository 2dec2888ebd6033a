"""Engine renderers: turn an InferenceService spec into an engine container recipe.

One renderer per engine kind. Each returns an :class:`EngineRender` or, when the
spec asks for something the engine version cannot do, an
:class:`UnsupportedKnob` / :class:`UnsupportedEngineVersion` naming the knob,
the version and the fix.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from chunkpilot.operator.engines.common import (
    ENGINE_PORT,
    ENGINE_PORT_NAME,
    EngineRender,
    ModelVolume,
    ProbeTiming,
    RenderProblem,
    RenderResult,
    UnsupportedEngineVersion,
    UnsupportedKnob,
)
from chunkpilot.operator.engines.sglang import default_sglang_image, render_sglang
from chunkpilot.operator.engines.sim import default_sim_image, render_sim, simulated
from chunkpilot.operator.engines.trtllm import default_trtllm_image, render_trtllm
from chunkpilot.operator.engines.versions import EngineVersion
from chunkpilot.operator.engines.vllm import default_vllm_image, honours_partial_prefills, render_vllm

from chunkpilot.api import EngineKind, InferenceServiceSpec

Renderer = Callable[[InferenceServiceSpec], RenderResult]

RENDERERS: Final[dict[EngineKind, Renderer]] = {
    EngineKind.VLLM: render_vllm,
    EngineKind.SGLANG: render_sglang,
    EngineKind.TRTLLM: render_trtllm,
    EngineKind.SIM: render_sim,
}

#: Where each engine serves Prometheus metrics (the PodMonitor's path).
METRICS_PATHS: Final[dict[EngineKind, str]] = {
    EngineKind.VLLM: "/metrics",
    EngineKind.SGLANG: "/metrics",
    EngineKind.TRTLLM: "/prometheus/metrics",
    EngineKind.SIM: "/metrics",
}


def render_engine(spec: InferenceServiceSpec) -> RenderResult:
    """Render the engine container for ``spec`` with the renderer of its engine kind."""
    return simulated(spec, RENDERERS[EngineKind(spec.engine.kind)](spec))


def default_image(kind: EngineKind, version: str) -> str:
    """The image used when ``spec.engine.image`` is empty."""
    if kind == EngineKind.VLLM:
        return default_vllm_image(version)
    if kind == EngineKind.SGLANG:
        return default_sglang_image(version)
    if kind == EngineKind.TRTLLM:
        return default_trtllm_image(version)
    return default_sim_image()


def metrics_path(kind: EngineKind | str) -> str:
    """The path the PodMonitor scrapes for an engine kind."""
    return METRICS_PATHS[EngineKind(kind)]


__all__ = [
    "ENGINE_PORT",
    "ENGINE_PORT_NAME",
    "METRICS_PATHS",
    "RENDERERS",
    "EngineRender",
    "EngineVersion",
    "ModelVolume",
    "ProbeTiming",
    "RenderProblem",
    "RenderResult",
    "UnsupportedEngineVersion",
    "UnsupportedKnob",
    "default_image",
    "honours_partial_prefills",
    "metrics_path",
    "render_engine",
]
