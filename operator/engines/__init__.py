"""Engine support: each registered engine kind's container recipe, default image and twin hook.

The API's registry (:data:`chunkpilot.api.engines.ENGINES`) says what an engine *is*. What the
product does for it lives in one module per kind, ``chunkpilot.operator.engines.<kind>``, which
defines ``SUPPORT`` (an :class:`EngineSupport`); :func:`support` finds it by the kind's name, so a
new engine is its descriptor plus its module. :func:`check_covers` runs at import. A renderer returns
an :class:`EngineRender` or, when the spec asks for something the engine version cannot do, an
:class:`UnsupportedKnob` / :class:`UnsupportedEngineVersion` naming the knob, the version and the fix.
"""

from __future__ import annotations

import importlib

from chunkpilot.operator.engines.common import (
    ENGINE_PORT,
    ENGINE_PORT_NAME,
    EngineRender,
    EngineSupport,
    ModelVolume,
    ProbeTiming,
    Renderer,
    RenderProblem,
    RenderResult,
    UnsupportedEngineVersion,
    UnsupportedKnob,
)
from chunkpilot.operator.engines.sim import simulated
from chunkpilot.operator.engines.versions import EngineVersion
from chunkpilot.operator.engines.vllm import honours_partial_prefills

from chunkpilot.api import InferenceServiceSpec
from chunkpilot.api.engines import ENGINES, engine


class EngineModuleError(RuntimeError):
    """A registered engine kind without its module, or a module without ``SUPPORT``."""


def support(kind: str) -> EngineSupport:
    """The support of a registered kind, from its module ``chunkpilot.operator.engines.<kind>``."""
    engine(kind)  # KeyError naming the registered kinds
    name = f"{__name__}.{kind}"
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name != name:
            raise
        raise EngineModuleError(
            f"engine kind {kind!r} is in chunkpilot.api.engines.ENGINES but has no module {name}"
        ) from None
    found = getattr(module, "SUPPORT", None)
    if not isinstance(found, EngineSupport):
        raise EngineModuleError(f"{name} defines no SUPPORT (an EngineSupport) for engine kind {kind!r}")
    return found


def check_covers() -> None:
    """Raise :class:`EngineModuleError` unless every kind of the API's registry has its module."""
    for kind in ENGINES:
        support(kind)


check_covers()


def render_engine(spec: InferenceServiceSpec) -> RenderResult:
    """Render the engine container for ``spec`` with the renderer of its engine kind."""
    return simulated(spec, support(str(spec.engine.kind)).render(spec))


def default_image(kind: str, version: str) -> str:
    """The image used when ``spec.engine.image`` is empty."""
    return support(str(kind)).default_image(version)


def metrics_path(kind: str) -> str:
    """The path the PodMonitor scrapes for an engine kind (the registry's)."""
    return engine(str(kind)).metrics_path


__all__ = [
    "ENGINE_PORT",
    "ENGINE_PORT_NAME",
    "EngineModuleError",
    "EngineRender",
    "EngineSupport",
    "EngineVersion",
    "ModelVolume",
    "ProbeTiming",
    "RenderProblem",
    "RenderResult",
    "Renderer",
    "UnsupportedEngineVersion",
    "UnsupportedKnob",
    "check_covers",
    "default_image",
    "honours_partial_prefills",
    "metrics_path",
    "render_engine",
    "support",
]
