"""Engine renderers: turn an InferenceService spec into an engine container recipe.

One renderer per engine kind of the API's registry (:data:`RENDERERS`). Each returns an
:class:`EngineRender` or, when the spec asks for something the engine version cannot do, an
:class:`UnsupportedKnob` / :class:`UnsupportedEngineVersion` naming the knob,
the version and the fix.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
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

from chunkpilot.api import InferenceServiceSpec
from chunkpilot.api.engines import ENGINES, SGLANG_ENGINE, SIM_ENGINE, TRTLLM_ENGINE, VLLM_ENGINE, engine

Renderer = Callable[[InferenceServiceSpec], RenderResult]


@dataclass(frozen=True)
class EngineRenderer:
    """One engine kind's renderer: its container recipe, and its default image for a version."""

    render: Renderer
    default_image: Callable[[str], str]


#: Each registered kind's renderer (the API's registry, :data:`chunkpilot.api.engines.ENGINES`,
#: names the kinds; :func:`check_covers` runs at import).
RENDERERS: Final[dict[str, EngineRenderer]] = {
    VLLM_ENGINE.kind: EngineRenderer(render_vllm, default_vllm_image),
    SGLANG_ENGINE.kind: EngineRenderer(render_sglang, default_sglang_image),
    TRTLLM_ENGINE.kind: EngineRenderer(render_trtllm, default_trtllm_image),
    SIM_ENGINE.kind: EngineRenderer(render_sim, lambda _version: default_sim_image()),
}


def check_covers() -> None:
    """Raise unless every kind of the API's registry has a renderer here, and nothing else does."""
    missing = [kind for kind in ENGINES if kind not in RENDERERS]
    unknown = [kind for kind in RENDERERS if kind not in ENGINES]
    if missing or unknown:
        raise RuntimeError(
            f"chunkpilot.operator.engines.RENDERERS does not match the API's engines:"
            f" missing {missing}, unknown {unknown}"
        )


check_covers()


def render_engine(spec: InferenceServiceSpec) -> RenderResult:
    """Render the engine container for ``spec`` with the renderer of its engine kind."""
    return simulated(spec, RENDERERS[str(spec.engine.kind)].render(spec))


def default_image(kind: str, version: str) -> str:
    """The image used when ``spec.engine.image`` is empty."""
    return RENDERERS[str(kind)].default_image(version)


def metrics_path(kind: str) -> str:
    """The path the PodMonitor scrapes for an engine kind (the registry's)."""
    return engine(str(kind)).metrics_path


__all__ = [
    "ENGINE_PORT",
    "ENGINE_PORT_NAME",
    "RENDERERS",
    "EngineRender",
    "EngineRenderer",
    "EngineVersion",
    "ModelVolume",
    "ProbeTiming",
    "RenderProblem",
    "RenderResult",
    "UnsupportedEngineVersion",
    "UnsupportedKnob",
    "check_covers",
    "default_image",
    "honours_partial_prefills",
    "metrics_path",
    "render_engine",
]
