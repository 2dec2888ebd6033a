"""The ``vllm.general_plugins`` entry point, loaded by vLLM in every engine process."""

from __future__ import annotations

import logging
import os

from chunkpilot.engine.vllm_plugin.config import load_plugin_config

logger = logging.getLogger("vllm.plugins.chunkpilot")


def register() -> None:
    """Check the ``CHUNKPILOT_*`` environment early, so a typo stops the server at start-up.

    The scheduler itself is chosen with ``--scheduler-cls``; it re-reads the
    configuration (``--additional-config`` included) in the engine-core process.
    """
    config = load_plugin_config(None, os.environ)
    logger.debug("Chunkpilot plugin loaded (environment configuration: %s)", config)
