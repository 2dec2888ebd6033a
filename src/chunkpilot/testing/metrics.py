"""Prometheus exposition text, as the fake engines of the tests serve it on ``/metrics``."""

from __future__ import annotations

from collections.abc import Iterable


def histogram_lines(family: str, les: Iterable[str], value: float, count: float) -> list[str]:
    """The exposition lines of histogram ``family`` after ``count`` observations, every one ``value``.

    ``les`` are its buckets' upper bounds as written (``+Inf`` last).
    """
    lines = [f"# TYPE {family} histogram"]
    lines += [f'{family}_bucket{{le="{le}"}} {count if float(le) >= value else 0.0}' for le in les]
    return [*lines, f"{family}_count {count}", f"{family}_sum {count * value}"]
