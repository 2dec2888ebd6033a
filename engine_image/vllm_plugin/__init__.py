"""Chunkpilot's vLLM plugin: partial-prefill limits on the V1 scheduler and live limit adjustment.

The package is loaded by vLLM through the ``vllm.general_plugins`` entry point
(:func:`chunkpilot.engine.vllm_plugin.plugin.register`); the scheduler is chosen
with ``--scheduler-cls chunkpilot.engine.vllm_plugin.scheduler.ChunkpilotScheduler``.
Only :mod:`.config` and :mod:`.env` import without vLLM installed.
"""
