"""Entry module of the operator: ``kopf run -m chunkpilot.operator.main`` or ``chunkpilot operator``.

Importing it registers the operator's handlers and, when installed, the
autotuner's (``chunkpilot.tuner.handlers``).
"""

from __future__ import annotations

import importlib
import logging
import os

from chunkpilot.operator import (
    handlers,  # registers the handlers
    probejob,  # noqa: F401  (probe Job handlers with CHUNKPILOT_PROBE_JOBS=on)
)

logger = logging.getLogger(__name__)
TUNER_HANDLERS = "chunkpilot.tuner.handlers"
#: Set to ``off`` to run the operator without the autotuner (``chunkpilot operator --no-autotuner``).
ENV_AUTOTUNER = "CHUNKPILOT_AUTOTUNER"


def load_tuner_handlers() -> bool:
    """Import the autotuner's handlers if that module exists; log clearly either way."""
    if os.environ.get(ENV_AUTOTUNER, "").lower() == "off":
        logger.info("autotuner disabled (%s=off): InferenceServices are served but not tuned", ENV_AUTOTUNER)
        return False
    try:
        importlib.import_module(TUNER_HANDLERS)
    except ModuleNotFoundError as error:
        if error.name != TUNER_HANDLERS:
            raise
        logger.info(
            "%s is not available: running without the autotuner (InferenceServices are still served)",
            TUNER_HANDLERS,
        )
        return False
    logger.info("autotuner handlers loaded from %s", TUNER_HANDLERS)
    return True


TUNER_LOADED = load_tuner_handlers()

__all__ = ["TUNER_LOADED", "handlers", "load_tuner_handlers"]
