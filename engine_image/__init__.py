"""Engines: the CPU simulator, the vLLM plugin and the GPU probe (import as ``chunkpilot.engine``)."""
