"""Benchmarks and offline validation (``chunkpilot bench …``, ``chunkpilot operator bench``).

Not imported by the product: they measure the tuner against exhaustive search and hidden truths
(:mod:`chunkpilot.bench.truth`, :mod:`chunkpilot.bench.exhaustive`), colocated against
disaggregated serving (:mod:`chunkpilot.bench.disagg`), the twin against a hidden truth and a real
engine (:mod:`chunkpilot.bench.twin_validate`, :mod:`chunkpilot.bench.twin_real`), and the
operator's reaction time and memory (:mod:`chunkpilot.bench.operator_load`).
"""
