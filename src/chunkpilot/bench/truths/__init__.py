"""Perturbed accelerator profiles: hidden truths for ``chunkpilot bench tuner --truth-family``."""
