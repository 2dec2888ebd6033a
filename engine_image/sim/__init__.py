"""CPU engine simulator: vLLM V1 scheduling semantics with a roofline step-time model.

Its hot modules run compiled when a build of these sources exists (see
:mod:`chunkpilot.engine.sim.compiled`); otherwise, and with ``CHUNKPILOT_SIM_CORE=python``, as Python.
"""

from chunkpilot.engine.sim.compiled import activate

activate(__path__)
