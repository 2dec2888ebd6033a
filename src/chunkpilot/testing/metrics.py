"""Prometheus in the tests: exposition text as the fake engines serve it on ``/metrics``, and queries."""

from __future__ import annotations

from collections.abc import Iterable

from chunkpilot.devcluster.prometheus import PrometheusServer


def histogram_lines(family: str, les: Iterable[str], value: float, count: float) -> list[str]:
    """The exposition lines of histogram ``family`` after ``count`` observations, every one ``value``.

    ``les`` are its buckets' upper bounds as written (``+Inf`` last).
    """
    lines = [f"# TYPE {family} histogram"]
    lines += [f'{family}_bucket{{le="{le}"}} {count if float(le) >= value else 0.0}' for le in les]
    return [*lines, f"{family}_count {count}", f"{family}_sum {count * value}"]


def query_value(prometheus: PrometheusServer, promql: str) -> float:
    """The first sample of an instant query; 0 while the query has no result."""
    result = prometheus.query(promql)
    return float(result[0]["value"][1]) if result else 0.0
