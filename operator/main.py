"""Entry module of ``kopf run -m chunkpilot.operator.main``: the operator configured by its environment.

Importing it reads the environment once (:meth:`OperatorConfig.from_env`) and registers the
operator's handlers and, when installed and not turned off, the autotuner's
(:func:`chunkpilot.operator.startup.load`). ``chunkpilot operator`` does the same with its flags
over the environment and does not import this module.
"""

from __future__ import annotations

import os

import kopf
from chunkpilot.operator.config import OperatorConfig
from chunkpilot.operator.startup import load

CONFIG = OperatorConfig.from_env(os.environ)
MEMO = kopf.Memo()
TUNER_LOADED = load(CONFIG, os.environ, MEMO)

__all__ = ["CONFIG", "MEMO", "TUNER_LOADED"]
