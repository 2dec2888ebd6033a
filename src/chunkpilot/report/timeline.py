"""A service's load, replicas and latency quantiles over time: the report's timeline.

The request rate and both SLO quantiles come from Prometheus (range queries over every engine pod of
the service, in the engine's own metric names, Chunkpilot's fine latency histograms first where the
pods export them: what the tuner reads); the stable and desired replica counts from the samples the
caller took of the InferenceService's status (the REPLICAS and DESIRED columns of ``kubectl get
cpis``), or, for a run nobody sampled, from Prometheus too (:func:`replica_samples`: the stable
engines it scrapes and the operator's ``chunkpilot_desired_replicas``). Pure apart from the
range-query callable it is given.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chunkpilot.api import SLOSpec, Track
from chunkpilot.tuner.measure import Selector, fine_latency_queries, track_queries

#: ``(promql, start, end, step_s) -> matrix``: :meth:`PrometheusServer.query_range`'s shape.
RangeQuery = Callable[[str, float, float, float], list[dict[str, Any]]]

#: The rate window of the timeline's queries: a few scrapes, short enough to show a step.
TIMELINE_WINDOW = "30s"
TIMELINE_STEP_S = 10.0
#: The timeline figure's file stem.
TIMELINE_PLOT = "timeline"


@dataclass(frozen=True)
class ReplicaSample:
    """The service's replica counts at one moment (Unix seconds), as its status showed them."""

    at: float
    replicas: int | None
    desired: int | None


@dataclass(frozen=True)
class TimelinePoint:
    """One step of the timeline; None where nothing was measured."""

    t_s: float
    rate_req_s: float | None
    replicas: int | None
    desired: int | None
    itl_ms: float | None
    ttft_ms: float | None


@dataclass(frozen=True)
class Timeline:
    """Points every ``step_s`` from ``start`` (Unix seconds), ``t_s`` counting from it, and a last
    one at the range's end where replica samples were taken after the last step."""

    start: float
    step_s: float
    points: tuple[TimelinePoint, ...]

    def summary(self, slo: SLOSpec) -> list[str]:
        """Markdown bullet lines: the rate's range, the replica counts, how often each SLO held."""
        rates = [p.rate_req_s for p in self.points if p.rate_req_s is not None]
        if not rates:
            return ["- No request rate was measured over the run."]
        served = [p for p in self.points if p.rate_req_s is not None and p.rate_req_s > 0]
        lines = [
            f"- Request rate: {rates[0]:.1f} req/s at the start, {max(rates):.1f} at the peak, "
            f"{rates[-1]:.1f} at the end ({_minutes(self.points[-1].t_s)} in all)",
            f"- Stable replicas: {count_runs([p.replicas for p in self.points])}; desired: "
            f"{count_runs([p.desired for p in self.points])}",
        ]
        for name, attr, quantile, target in (
            ("ITL", "itl_ms", slo.itl.quantile, slo.itl.max_ms),
            ("TTFT", "ttft_ms", slo.ttft.quantile, slo.ttft.max_ms),
        ):
            seen = [getattr(p, attr) for p in served if getattr(p, attr) is not None]
            met = sum(v <= target for v in seen)
            share = f"{met / len(seen):.0%}" if seen else "-"
            lines.append(
                f"- {name} p{quantile * 100:g} within {target:g} ms at {met} of {len(seen)} "
                f"{self.step_s:g}-s points with traffic ({share}; over the last {TIMELINE_WINDOW} each)"
            )
        return lines

    def rows(self) -> list[dict[str, Any]]:
        """The points as CSV rows."""
        return [
            {
                "t_s": p.t_s,
                "rate_req_s": p.rate_req_s,
                "replicas": p.replicas,
                "desired": p.desired,
                "itl_ms": p.itl_ms,
                "ttft_ms": p.ttft_ms,
            }
            for p in self.points
        ]


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def count_runs(values: Sequence[int | None]) -> str:
    """``1 -> 3 -> 1``: the distinct runs of a count, in order (``-`` when never known)."""
    runs: list[int] = []
    for value in values:
        if value is not None and (not runs or runs[-1] != value):
            runs.append(value)
    return " -> ".join(str(v) for v in runs) if runs else "-"


def timeline_queries(
    service: str,
    namespace: str,
    engine: str,
    itl_quantile: float,
    ttft_quantile: float,
    window: str = TIMELINE_WINDOW,
) -> dict[str, str]:
    """PromQL of the service's request rate and ITL and TTFT quantiles over all its pods."""
    selector = Selector(service, namespace, None)
    engine_own = track_queries(selector, window, itl_quantile, ttft_quantile, engine)
    fine = fine_latency_queries(selector, window, itl_quantile, ttft_quantile, engine)
    latency = fine if fine is not None else engine_own
    return {"rate": engine_own.request_rate, "itl": latency.itl, "ttft": latency.ttft}


def replica_queries(service: str, namespace: str) -> dict[str, str]:
    """PromQL of the service's stable engines that Prometheus scrapes (0 when none) and the replicas
    the capacity planner asks for (the operator's gauge; its own ``namespace`` label is
    ``exported_namespace`` where the operator's target carries a ``namespace`` label of its own)."""
    stable = Selector(service, namespace, Track.STABLE).render()
    desired = [
        f'chunkpilot_desired_replicas{{{label}="{namespace}",service="{service}"}}'
        for label in ("namespace", "exported_namespace")
    ]
    return {
        "replicas": f"count(up{stable} == 1) or vector(0)",
        "desired": f"max({desired[0]} or {desired[1]})",
    }


def replica_samples(
    range_query: RangeQuery,
    queries: Mapping[str, str],
    start: float,
    end: float,
    step_s: float = TIMELINE_STEP_S,
) -> list[ReplicaSample]:
    """A replica sample at each step Prometheus answered ``queries`` (:func:`replica_queries`) for."""
    series = {
        name: _series(range_query(promql, start, end, step_s), start, step_s)
        for name, promql in queries.items()
    }
    replicas, desired = series.get("replicas", {}), series.get("desired", {})
    return [
        ReplicaSample(start + k * step_s, _count(replicas.get(k)), _count(desired.get(k)))
        for k in sorted(replicas.keys() | desired.keys())
    ]


def _count(value: float | None) -> int | None:
    return None if value is None else round(value)


def _series(matrix: list[dict[str, Any]], start: float, step_s: float) -> dict[int, float]:
    """The first series of a range answer by step index (NaN and infinities dropped)."""
    values: dict[int, float] = {}
    for t, raw in matrix[0]["values"] if matrix else []:
        value = float(raw)
        if math.isfinite(value):
            values[round((float(t) - start) / step_s)] = value
    return values


def read_timeline(
    range_query: RangeQuery,
    queries: Mapping[str, str],
    start: float,
    end: float,
    samples: Sequence[ReplicaSample],
    step_s: float = TIMELINE_STEP_S,
) -> Timeline:
    """The timeline from ``start`` to ``end``: ``queries`` (``rate``, ``itl``, ``ttft``, as
    :func:`timeline_queries` gives them) asked over the range, each point's replica counts the last
    sample taken at or before it. Samples taken after the last step give one more point at ``end``
    with their counts and no measurement (Prometheus answers on the steps only): what the replicas
    did in a run's last seconds is not cut off."""
    if not end > start:
        raise ValueError(f"the timeline's end ({end:.0f}) must come after its start ({start:.0f})")
    series = {
        name: _series(range_query(promql, start, end, step_s), start, step_s)
        for name, promql in queries.items()
    }
    ordered = sorted(samples, key=lambda s: s.at)
    times = [s.at for s in ordered]
    points = []
    for k in range(int((end - start) // step_s) + 1):
        at = start + k * step_s
        i = bisect.bisect_right(times, at) - 1
        sample = ordered[i] if i >= 0 else None
        itl, ttft = series.get("itl", {}).get(k), series.get("ttft", {}).get(k)
        points.append(
            TimelinePoint(
                t_s=k * step_s,
                rate_req_s=series.get("rate", {}).get(k),
                replicas=sample.replicas if sample else None,
                desired=sample.desired if sample else None,
                itl_ms=None if itl is None else itl * 1000.0,
                ttft_ms=None if ttft is None else ttft * 1000.0,
            )
        )
    last_step = start + (len(points) - 1) * step_s
    if ordered and ordered[-1].at > last_step and end > last_step:
        final = ordered[-1]
        points.append(TimelinePoint(end - start, None, final.replicas, final.desired, None, None))
    return Timeline(start, step_s, tuple(points))


def plot_timeline(plt: Any, timeline: Timeline, slo: SLOSpec, title: str, out_dir: Path) -> Path:
    """Rate with stable and desired replicas above, both SLO quantiles with their targets below."""
    minutes = [p.t_s / 60.0 for p in timeline.points]

    def column(attr: str) -> list[float]:
        return [math.nan if getattr(p, attr) is None else float(getattr(p, attr)) for p in timeline.points]

    fig, (ax_rate, ax_itl) = plt.subplots(2, 1, figsize=(10, 6.4), sharex=True)
    ax_rate.plot(minutes, column("rate_req_s"), color="tab:blue", label="request rate")
    ax_rate.set_ylabel("requests/s", color="tab:blue")
    ax_rate.grid(True, alpha=0.3)
    ax_replicas = ax_rate.twinx()
    ax_replicas.step(minutes, column("replicas"), where="post", color="tab:green", label="stable replicas")
    ax_replicas.step(
        minutes, column("desired"), where="post", color="tab:purple", linestyle="--", label="desired"
    )
    counts = [v for v in column("replicas") + column("desired") if math.isfinite(v)]
    ax_replicas.set_ylim(0, max([*counts, 1.0]) + 1)
    ax_replicas.set_ylabel("replicas")
    lines = ax_rate.get_legend_handles_labels()
    more = ax_replicas.get_legend_handles_labels()
    ax_rate.legend(lines[0] + more[0], lines[1] + more[1], loc="upper left", fontsize=8)

    itl_label = f"ITL p{slo.itl.quantile * 100:g}"
    ttft_label = f"TTFT p{slo.ttft.quantile * 100:g}"
    ax_itl.plot(minutes, column("itl_ms"), color="tab:orange", label=itl_label)
    ax_itl.axhline(slo.itl.max_ms, color="tab:orange", linestyle=":", label=f"{itl_label} target")
    ax_itl.set_ylabel(f"{itl_label} (ms)", color="tab:orange")
    ax_itl.grid(True, alpha=0.3)
    ax_ttft = ax_itl.twinx()
    ax_ttft.plot(minutes, column("ttft_ms"), color="tab:red", label=ttft_label)
    ax_ttft.axhline(slo.ttft.max_ms, color="tab:red", linestyle=":", label=f"{ttft_label} target")
    ax_ttft.set_ylabel(f"{ttft_label} (ms)", color="tab:red")
    lines = ax_itl.get_legend_handles_labels()
    more = ax_ttft.get_legend_handles_labels()
    ax_itl.legend(lines[0] + more[0], lines[1] + more[1], loc="upper left", fontsize=8)
    ax_itl.set_xlabel("minutes")
    fig.suptitle(title)
    fig.tight_layout()
    path = out_dir / f"{TIMELINE_PLOT}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


__all__ = [
    "TIMELINE_PLOT",
    "ReplicaSample",
    "Timeline",
    "TimelinePoint",
    "count_runs",
    "plot_timeline",
    "read_timeline",
    "replica_queries",
    "replica_samples",
    "timeline_queries",
]
