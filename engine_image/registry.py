"""What each engine kind does in the engine layer beyond its dialect: the twin's scheduling hook.

The API's registry (:data:`chunkpilot.api.engines.ENGINES`) says what an engine *is*; its flag
dialect already names the metric names it exports (``metrics_names.engine_metrics``) and the
simulator semantics it runs with (``sim --engine DIALECT``). This one maps each kind to what the
dialect does not say: :data:`BEHAVIOURS`, one line per kind, imported explicitly.
:func:`check_covers` runs at import, so a kind registered in the API without a line here fails the
first import of this module. The argv renderers live in the operator
(``chunkpilot.operator.engines.RENDERERS``, checked the same way).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from chunkpilot.engine.sim.semantics import SemanticsHook, sglang_semantics, trtllm_semantics

from chunkpilot.api.engines import ENGINES, SGLANG_ENGINE, SIM_ENGINE, TRTLLM_ENGINE, VLLM_ENGINE


@dataclass(frozen=True)
class EngineBehaviour:
    """One engine kind's behaviour in the engine layer."""

    #: The scheduler the twin simulates a service of this kind with; None: vLLM's (the twin's default).
    twin_semantics: SemanticsHook | None = None


#: Each registered kind's behaviour.
BEHAVIOURS: Final[dict[str, EngineBehaviour]] = {
    VLLM_ENGINE.kind: EngineBehaviour(),
    SGLANG_ENGINE.kind: EngineBehaviour(twin_semantics=sglang_semantics),
    TRTLLM_ENGINE.kind: EngineBehaviour(twin_semantics=trtllm_semantics),
    SIM_ENGINE.kind: EngineBehaviour(),
}


def behaviour(kind: str) -> EngineBehaviour:
    """The behaviour of a registered kind; KeyError naming the kinds otherwise."""
    try:
        return BEHAVIOURS[kind]
    except KeyError:
        raise KeyError(f"no engine behaviour for kind {kind!r}; known: {', '.join(BEHAVIOURS)}") from None


def check_covers() -> None:
    """Raise unless every kind of the API's registry has a behaviour here, and nothing else does."""
    missing = [kind for kind in ENGINES if kind not in BEHAVIOURS]
    unknown = [kind for kind in BEHAVIOURS if kind not in ENGINES]
    if missing or unknown:
        raise RuntimeError(
            "chunkpilot.engine.registry does not match the API's engines:"
            f" missing {missing}, unknown {unknown}"
        )


check_covers()

__all__ = ["BEHAVIOURS", "EngineBehaviour", "behaviour", "check_covers"]
