"""SLO-constrained autotuner (import as ``chunkpilot.tuner``)."""
