"""Chunkpilot: run chunked-prefill LLM inference on Kubernetes within latency SLOs."""

__version__ = "0.1.0"
