"""What an operator process does once, at start-up, with the configuration it read.

The environment is read once, before this, into frozen settings: by ``chunkpilot operator`` (its
flags over the environment, :mod:`chunkpilot.operator.cli`) or by ``kopf run -m
chunkpilot.operator.main`` (the environment alone). :func:`load` registers the handlers that
configuration runs and puts the settings into the memo Kopf hands every handler: the operator's
:class:`~chunkpilot.operator.config.OperatorConfig` under ``config``, the autotuner's settings under
the key of :mod:`chunkpilot.tuner.handlers` (which parses them from the same mapping, once). The
handlers pass the values down as arguments; nothing reads the environment later.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import kopf
from chunkpilot.operator import probejob
from chunkpilot.operator.config import ENV_AUTOTUNER, OperatorConfig

logger = logging.getLogger(__name__)

#: The autotuner's handlers: loaded when this module exists and the configuration wants them.
TUNER_HANDLERS: Final = "chunkpilot.tuner.handlers"
#: Memo key of the operator's :class:`OperatorConfig`.
MEMO_CONFIG: Final = "config"


def load(config: OperatorConfig, environ: Mapping[str, str], memo: kopf.Memo) -> bool:
    """Register the handlers ``config`` runs and put the settings into ``memo``; True: the tuner's too.

    ``environ`` is the environment the configuration was read from (the autotuner reads its own
    variables from it, here, once). Raises :class:`ValueError` naming a variable it cannot use.
    Call it once per process, before ``kopf.run``.
    """
    memo[MEMO_CONFIG] = config
    # First of the startup handlers (Kopf runs them in the order they are registered): `kopf run`
    # hands the handlers a memo of its own, empty; `chunkpilot operator` passes `memo` itself.
    kopf.on.startup(id="settings")(_hand_over(memo))
    from chunkpilot.operator import handlers  # noqa: F401  # registers the operator's handlers

    if config.probe_jobs:
        probejob.register_handlers()
    return load_tuner_handlers(config, environ, memo)


def _hand_over(settings: Mapping[str, Any]) -> Callable[..., Awaitable[None]]:
    async def hand_over_settings(memo: kopf.Memo, **_: Any) -> None:
        """The settings read at start-up, into the memo Kopf hands the handlers."""
        for key, value in settings.items():
            memo.setdefault(key, value)

    return hand_over_settings


def load_tuner_handlers(config: OperatorConfig, environ: Mapping[str, str], memo: kopf.Memo) -> bool:
    """Load the autotuner's handlers with their settings if wanted and installed; log clearly either way."""
    if not config.autotuner:
        logger.info(
            "autotuner disabled (%s=off or --no-autotuner): InferenceServices are served but not tuned",
            ENV_AUTOTUNER,
        )
        return False
    try:
        module = importlib.import_module(TUNER_HANDLERS)
    except ModuleNotFoundError as error:
        if error.name != TUNER_HANDLERS:
            raise
        logger.info(
            "%s is not available: running without the autotuner (InferenceServices are still served)",
            TUNER_HANDLERS,
        )
        return False
    module.load(config, environ, memo)
    logger.info("autotuner handlers loaded from %s", TUNER_HANDLERS)
    return True


__all__ = ["MEMO_CONFIG", "TUNER_HANDLERS", "load", "load_tuner_handlers"]
