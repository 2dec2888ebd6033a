"""Client-side latency records of a load run and their summary."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

QUANTILES: tuple[tuple[str, float], ...] = (("p50", 0.50), ("p90", 0.90), ("p95", 0.95), ("p99", 0.99))


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of already sorted values, linearly interpolated (NaN when empty)."""
    if not sorted_values:
        return math.nan
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} must lie in [0, 1]")
    position = q * (len(sorted_values) - 1)
    lower = math.floor(position)
    upper = min(lower + 1, len(sorted_values) - 1)
    weight = position - lower
    return sorted_values[lower] * (1.0 - weight) + sorted_values[upper] * weight


@dataclass(frozen=True, slots=True)
class Distribution:
    """Quantiles of a latency distribution in milliseconds."""

    count: int
    p50: float
    p90: float
    p95: float
    p99: float
    max: float
    mean: float

    @classmethod
    def of_seconds(cls, values: Sequence[float], scale: float = 1.0) -> Distribution:
        """Summarise ``values`` (seconds) as milliseconds, each multiplied by ``scale``."""
        ordered = sorted(value * 1000.0 * scale for value in values)
        if not ordered:
            return cls(0, math.nan, math.nan, math.nan, math.nan, math.nan, math.nan)
        return cls(
            count=len(ordered),
            p50=quantile(ordered, 0.50),
            p90=quantile(ordered, 0.90),
            p95=quantile(ordered, 0.95),
            p99=quantile(ordered, 0.99),
            max=ordered[-1],
            mean=sum(ordered) / len(ordered),
        )


@dataclass(slots=True)
class RequestRecord:
    """What the client observed for one request (times in wall seconds)."""

    index: int
    scheduled_s: float
    prompt_tokens: int
    max_tokens: int
    pod: str | None = None
    track: str | None = None
    started_s: float | None = None
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    e2e_s: float | None = None
    output_tokens: int = 0
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the request completed without an error."""
        return self.error is None and self.e2e_s is not None


@dataclass(frozen=True, slots=True)
class LoadSummary:
    """Totals and client-side latency quantiles of a load run.

    Latencies are wall-clock milliseconds multiplied by the engines' time scale, so they are
    comparable with the SLOs and with the engines' own metrics.
    """

    requests: int
    completed: int
    failed: int
    errors: dict[str, int]
    by_track: dict[str, int]
    by_pod: dict[str, int]
    duration_s: float
    time_scale: float
    output_tokens: int
    throughput_tok_s: float
    request_rate: float
    ttft_ms: Distribution
    itl_ms: Distribution
    e2e_ms: Distribution

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary (missing quantiles are ``None``)."""
        document: dict[str, Any] = _without_nan(asdict(self))
        return document

    def format(self) -> str:
        """A few human-readable lines."""

        def line(name: str, dist: Distribution) -> str:
            return (
                f"  {name:<5} p50 {dist.p50:8.1f}  p90 {dist.p90:8.1f}  p95 {dist.p95:8.1f}  "
                f"p99 {dist.p99:8.1f}  max {dist.max:8.1f} ms  (n={dist.count})"
            )

        tracks = ", ".join(f"{track}={count}" for track, count in sorted(self.by_track.items())) or "-"
        errors = ", ".join(f"{kind}={count}" for kind, count in sorted(self.errors.items())) or "none"
        return "\n".join(
            [
                f"requests {self.requests}: {self.completed} completed, {self.failed} failed ({errors})",
                f"  by track: {tracks}",
                f"  {self.duration_s:.1f} s wall, {self.request_rate:.2f} req/s, "
                f"{self.throughput_tok_s:.1f} output tok/s (engine time, scale x{self.time_scale:g})",
                line("TTFT", self.ttft_ms),
                line("ITL", self.itl_ms),
                line("E2E", self.e2e_ms),
            ]
        )


def _without_nan(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _without_nan(item) for key, item in value.items()}
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def summarise(records: Sequence[RequestRecord], duration_s: float, time_scale: float = 1.0) -> LoadSummary:
    """Summarise request records of a run that lasted ``duration_s`` wall seconds."""
    completed = [record for record in records if record.ok]
    errors = Counter(record.error.split(":", 1)[0] for record in records if record.error is not None)
    by_track = Counter(record.track or "none" for record in records if record.pod is not None)
    by_pod = Counter(record.pod for record in records if record.pod is not None)
    output_tokens = sum(record.output_tokens for record in completed)
    engine_seconds = duration_s * time_scale
    return LoadSummary(
        requests=len(records),
        completed=len(completed),
        failed=len(records) - len(completed),
        errors=dict(errors),
        by_track=dict(by_track),
        by_pod={pod: count for pod, count in by_pod.items() if pod is not None},
        duration_s=duration_s,
        time_scale=time_scale,
        output_tokens=output_tokens,
        throughput_tok_s=output_tokens / engine_seconds if engine_seconds > 0 else math.nan,
        request_rate=len(completed) / engine_seconds if engine_seconds > 0 else math.nan,
        ttft_ms=Distribution.of_seconds([r.ttft_s for r in completed if r.ttft_s is not None], time_scale),
        itl_ms=Distribution.of_seconds([gap for r in completed for gap in r.itl_s], time_scale),
        e2e_ms=Distribution.of_seconds([r.e2e_s for r in completed if r.e2e_s is not None], time_scale),
    )
