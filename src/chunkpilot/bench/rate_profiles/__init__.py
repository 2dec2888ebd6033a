"""Rate profiles shipped with ``chunkpilot bench autoscale`` (see :mod:`chunkpilot.bench.rate_profile`)."""
