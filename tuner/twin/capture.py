"""Capture what the twin needs from an engine's metrics over a window (pure: no I/O here).

Two sources give the same objects: PromQL results of the queries :func:`workload_queries` and
:func:`step_queries` write (the tuner, per track), and two scrapes of ``/metrics`` some seconds apart
(:func:`parse_exposition` and :func:`window_between`, for tests and direct checks).

* :class:`WorkloadWindow`: the request-length histograms (``vllm:request_prompt_tokens``,
  ``vllm:request_generation_tokens``), the arrival rate and the prefix-cache hit rate;
  :func:`synthesize` turns it into a :class:`~chunkpilot.engine.sim.workload.Workload` that
  reproduces them: each request's lengths drawn from the histograms (the bucket counts exactly, the
  mean matched by the shape of the draw within each bucket), Poisson arrivals at the measured rate,
  and a shared prompt prefix sized so that the hit rate matches.
* The step telemetry per scheduled-token bucket as :class:`~chunkpilot.engine.sim.metrics.StepTotals`
  (what :func:`chunkpilot.tuner.twin.fit.fit_steps` fits).

The histograms carry no joint distribution: where the engine exports the sum of prompt x output
tokens, the draws are re-paired so that its mean matches (a rank copula), else they are independent.

Nor do they carry the order: live traffic comes in runs (a tenant's batch of long documents, a
session of short turns), and near saturation a run of long prompts is what a replica's latency
quantile rests on. The window can also be read as consecutive :data:`SEGMENT` segments
(:func:`segment_queries`, :attr:`WorkloadWindow.segments`); ``synthesize(..., by_segment=True)``
then draws each block of requests from its own segment's histograms, in the segments' order.

The prefix-cache counters are the engine kind's (:func:`chunkpilot.engine.metrics_names.tuner_metrics`:
vLLM's ``vllm:prefix_cache_*``, SGLang's prompt and cached tokens); where the engine exports none
(TensorRT-LLM) or the series is missing, the hit rate is 0.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Final

from chunkpilot.engine import metrics_names as names
from chunkpilot.engine.sim.kvcache import BLOCK_SIZE
from chunkpilot.engine.sim.metrics import StepTotals
from chunkpilot.engine.sim.workload import RequestSpec, Workload, prefix_hashes
from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "STEP_FIELDS",
    "CaptureError",
    "HistogramWindow",
    "Scrape",
    "WorkloadWindow",
    "histogram_of",
    "parse_exposition",
    "segment_queries",
    "segments_from_results",
    "step_queries",
    "steps_from_results",
    "steps_from_vectors",
    "synthesize",
    "window_between",
    "workload_from_vectors",
    "workload_queries",
]

#: The metric behind each :class:`StepTotals` field (``steps`` and ``duration_s`` are the
#: step-duration histogram's ``_count`` and ``_sum``).
STEP_FIELDS: Final[dict[str, str]] = {
    "steps": f"{names.STEP_DURATION}_count",
    "duration_s": f"{names.STEP_DURATION}_sum",
    **names.STEP_SHAPE_FIELDS,
}
#: Fewer finished requests than this in the window: no workload (the caller waits).
MIN_REQUESTS: Final = 20
#: The segments a window's mix is read over (:attr:`WorkloadWindow.segments`), and the fewest
#: segments with requests that a segmented synthesis needs (fewer: the window's mix throughout).
SEGMENT: Final = "1m"
SEGMENT_S: Final = 60.0
MIN_SEGMENTS: Final = 2


class CaptureError(ValueError):
    """The window holds too little data to describe the workload."""


StepDurations = dict[str, tuple[float, ...]]
"""Steps per step-duration slot by token-bucket label: one count per bound of
``names.STEP_DURATION_BUCKETS`` (the steps in ``(previous bound, bound]``) and one above the last."""


@dataclass(frozen=True, slots=True)
class HistogramWindow:
    """Increase of one histogram over a window: per-bucket counts (not cumulative), sum and count."""

    bounds: tuple[float, ...]  # finite upper bounds, ascending; the last bucket is (bounds[-1], +Inf)
    counts: tuple[float, ...]  # len(bounds) + 1
    total: float
    count: float

    @classmethod
    def from_cumulative(cls, buckets: Mapping[float, float], total: float, count: float) -> HistogramWindow:
        """From ``{le: cumulative count}`` (``+Inf`` included or not) as Prometheus reports them."""
        finite = sorted(le for le in buckets if math.isfinite(le))
        cumulative = [max(0.0, buckets[le]) for le in finite]
        top = buckets.get(math.inf, cumulative[-1] if cumulative else count)
        counts: list[float] = []
        previous = 0.0
        for value in [*cumulative, top]:
            counts.append(max(0.0, value - previous))
            previous = max(previous, value)
        return cls(tuple(finite), tuple(counts), total, count)

    @property
    def mean(self) -> float:
        """Mean observation (NaN when empty)."""
        return self.total / self.count if self.count > 0 else math.nan

    def __sub__(self, other: HistogramWindow) -> HistogramWindow:
        if self.bounds != other.bounds:
            raise CaptureError("histogram buckets changed between the two scrapes")
        counts = tuple(a - b for a, b in zip(self.counts, other.counts, strict=True))
        return HistogramWindow(self.bounds, counts, self.total - other.total, self.count - other.count)


@dataclass(frozen=True, slots=True)
class WorkloadWindow:
    """The workload one track saw over ``duration_s`` seconds."""

    duration_s: float
    prompt_tokens: HistogramWindow
    generation_tokens: HistogramWindow
    prefix_cache_queries: float = 0.0
    prefix_cache_hits: float = 0.0
    #: Sum over the window's requests of prompt x generated tokens (NaN: the engine does not export it).
    tokens_product: float = math.nan
    #: The same window as consecutive segments, oldest first, each with its own length histograms
    #: (empty: not read): how the mix moved within the window.
    segments: tuple[WorkloadWindow, ...] = ()

    @property
    def arrival_rate(self) -> float:
        """Finished requests per second (equal to the arrival rate in a steady state)."""
        return self.prompt_tokens.count / self.duration_s if self.duration_s > 0 else math.nan

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Share of the prompt tokens queried that hit the prefix cache."""
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries > 0 else 0.0


# ------------------------------------------------------------------------------------ PromQL side
def prefix_cache_series(engine: str = "vllm") -> dict[str, str]:
    """The engine kind's prefix-cache counters by :class:`WorkloadWindow` field (empty: none exported)."""
    tuner = names.tuner_metrics(engine)
    series = {
        "prefix_cache_queries": tuner.prefix_cache_queries,
        "prefix_cache_hits": tuner.prefix_cache_hits,
    }
    return {key: name for key, name in series.items() if name is not None}


def workload_queries(selector: str, window: str, engine: str = "vllm") -> dict[str, str]:
    """PromQL for a :class:`WorkloadWindow`; ``selector`` is a label matcher list without braces.

    ``fine_*`` are Chunkpilot's finer request-length histograms (prefer them when they return data).
    The prefix-cache queries are those of ``engine`` (an engine kind), left out where it has none.
    """
    sel = f"{{{selector}}}" if selector else ""
    queries = {
        key: f"sum(increase({name}{sel}[{window}]))" for key, name in prefix_cache_series(engine).items()
    }
    queries["tokens_product"] = f"sum(increase({names.REQUEST_TOKENS_PRODUCT}{sel}[{window}]))"
    for key, name in (
        ("prompt", names.REQUEST_PROMPT_TOKENS),
        ("generation", names.REQUEST_GENERATION_TOKENS),
        ("fine_prompt", names.FINE_REQUEST_PROMPT_TOKENS),
        ("fine_generation", names.FINE_REQUEST_GENERATION_TOKENS),
    ):
        queries[f"{key}_bucket"] = f"sum by (le) (increase({name}_bucket{sel}[{window}]))"
        queries[f"{key}_sum"] = f"sum(increase({name}_sum{sel}[{window}]))"
        queries[f"{key}_count"] = f"sum(increase({name}_count{sel}[{window}]))"
    return queries


def segment_queries(selector: str, window: str, *, fine: bool, segment: str = SEGMENT) -> dict[str, str]:
    """PromQL subqueries for :attr:`WorkloadWindow.segments`: the request-length histograms over
    each ``segment`` of ``window`` (an instant query of each answers a matrix, one point per
    segment); ``fine``: Chunkpilot's finer histograms, else the engine's."""
    sel = f"{{{selector}}}" if selector else ""
    prefix = "fine_" if fine else ""
    queries: dict[str, str] = {}
    for key, name in (
        ("prompt", names.FINE_REQUEST_PROMPT_TOKENS if fine else names.REQUEST_PROMPT_TOKENS),
        ("generation", names.FINE_REQUEST_GENERATION_TOKENS if fine else names.REQUEST_GENERATION_TOKENS),
    ):
        over = f"[{window}:{segment}]"
        queries[f"{prefix}{key}_bucket"] = f"sum by (le) (increase({name}_bucket{sel}[{segment}])){over}"
        queries[f"{prefix}{key}_sum"] = f"sum(increase({name}_sum{sel}[{segment}])){over}"
        queries[f"{prefix}{key}_count"] = f"sum(increase({name}_count{sel}[{segment}])){over}"
    return queries


def segments_from_results(
    results: Mapping[str, Sequence[Mapping[str, object]]], segment_s: float = SEGMENT_S
) -> tuple[WorkloadWindow, ...]:
    """The segments from the matrices of :func:`segment_queries` (either family), oldest first;
    a segment without finished requests is left out, and an answer that is no matrix gives none."""
    by_time: dict[float, dict[str, dict[str, float]]] = {}
    for key, matrix in results.items():
        for item in matrix:
            metric, values = item.get("metric", {}), item.get("values")
            if not isinstance(metric, Mapping) or not isinstance(values, Sequence):
                continue
            le = str(metric.get("le", ""))
            for point in values:
                try:
                    at, number = float(point[0]), float(point[1])
                except (TypeError, ValueError, IndexError):
                    continue
                if math.isfinite(number):
                    series = by_time.setdefault(at, {}).setdefault(key, {})
                    series[le] = series.get(le, 0.0) + number
    segments: list[WorkloadWindow] = []
    for at in sorted(by_time):
        found = by_time[at]

        def histogram(key: str, found: dict[str, dict[str, float]] = found) -> HistogramWindow | None:
            buckets = {float(le): v for le, v in found.get(f"{key}_bucket", {}).items() if le}
            count = found.get(f"{key}_count", {}).get("", 0.0)
            if not buckets or count <= 0:
                return None
            return HistogramWindow.from_cumulative(buckets, found.get(f"{key}_sum", {}).get("", 0.0), count)

        for prefix in ("fine_", ""):
            prompts, generations = histogram(f"{prefix}prompt"), histogram(f"{prefix}generation")
            if prompts is not None and generations is not None:
                segments.append(WorkloadWindow(segment_s, prompts, generations))
                break
    return tuple(segments)


def step_queries(selector: str, window: str) -> dict[str, str]:
    """PromQL per :class:`StepTotals` field, each summed by scheduled-token bucket."""
    sel = f"{{{selector}}}" if selector else ""
    by = names.LABEL_SCHEDULED_TOKENS
    return {key: f"sum by ({by}) (increase({metric}{sel}[{window}]))" for key, metric in STEP_FIELDS.items()}


def step_duration_query(selector: str, window: str) -> str:
    """PromQL of the step-duration histogram over ``window``, by scheduled-token bucket and ``le``."""
    sel = f"{{{selector}}}" if selector else ""
    return (
        f"sum by ({names.LABEL_SCHEDULED_TOKENS}, le) (increase({names.STEP_DURATION}_bucket{sel}[{window}]))"
    )


def durations_from_vector(result: Sequence[Mapping[str, object]]) -> StepDurations:
    """:data:`StepDurations` from the instant vector of :func:`step_duration_query`."""
    cumulative: dict[str, dict[float, float]] = {}
    for item in result:
        metric, value = item.get("metric", {}), item.get("value", (0, "nan"))
        if not isinstance(metric, Mapping) or not isinstance(value, Sequence):
            continue
        label, le = metric.get(names.LABEL_SCHEDULED_TOKENS), metric.get("le")
        number = float(value[1])
        if label is None or le is None or not math.isfinite(number):
            continue
        per_le = cumulative.setdefault(str(label), {})
        per_le[float(str(le))] = per_le.get(float(str(le)), 0.0) + number
    return {label: slot_counts(per_le) for label, per_le in cumulative.items()}


def steps_from_results(results: Mapping[str, Mapping[str, float]]) -> dict[str, StepTotals]:
    """Step totals per bucket from ``{StepTotals field: {bucket label: value}}`` (missing = 0)."""
    labels = sorted({label for values in results.values() for label in values})
    out: dict[str, StepTotals] = {}
    for label in labels:
        values = {f.name: float(results.get(f.name, {}).get(label, 0.0)) for f in fields(StepTotals)}
        if values["steps"] > 0:
            out[label] = StepTotals(**values)
    return out


def _vector(result: Sequence[Mapping[str, object]], label: str | None = None) -> dict[str, float]:
    """``{label value: sample value}`` of a Prometheus instant vector (``""`` without ``label``)."""
    out: dict[str, float] = {}
    for item in result:
        metric = item.get("metric", {})
        value = item.get("value", (0, "nan"))
        key = str(metric.get(label, "")) if label and isinstance(metric, Mapping) else ""
        number = float(value[1]) if isinstance(value, Sequence) else math.nan
        if math.isfinite(number):
            out[key] = out.get(key, 0.0) + number
    return out


def steps_from_vectors(results: Mapping[str, Sequence[Mapping[str, object]]]) -> dict[str, StepTotals]:
    """Step totals from the Prometheus instant vectors of :func:`step_queries` (by field)."""
    return steps_from_results(
        {key: _vector(vector, names.LABEL_SCHEDULED_TOKENS) for key, vector in results.items()}
    )


def workload_from_vectors(
    results: Mapping[str, Sequence[Mapping[str, object]]], duration_s: float
) -> WorkloadWindow:
    """The :class:`WorkloadWindow` from the instant vectors of :func:`workload_queries`.

    Uses Chunkpilot's fine length histograms when they have data, else vLLM's; missing
    prefix-cache results count as no queries (hit rate 0).
    """

    def histogram(key: str) -> HistogramWindow | None:
        buckets = {float(le): v for le, v in _vector(results.get(f"{key}_bucket", ()), "le").items() if le}
        count = _vector(results.get(f"{key}_count", ())).get("", 0.0)
        if not buckets or count <= 0:
            return None
        return HistogramWindow.from_cumulative(
            buckets, _vector(results.get(f"{key}_sum", ())).get("", 0.0), count
        )

    for prefix in ("fine_", ""):
        prompts, generations = histogram(f"{prefix}prompt"), histogram(f"{prefix}generation")
        if prompts is not None and generations is not None:
            return WorkloadWindow(
                duration_s,
                prompts,
                generations,
                _vector(results.get("prefix_cache_queries", ())).get("", 0.0),
                _vector(results.get("prefix_cache_hits", ())).get("", 0.0),
                _vector(results.get("tokens_product", ())).get("", math.nan),
            )
    raise CaptureError("no finished requests in the window's request-length histograms")


# ---------------------------------------------------------------------------------- scrape side
@dataclass(frozen=True, slots=True)
class Scrape:
    """The twin's metrics in one ``/metrics`` text (cumulative since the engine started)."""

    histograms: dict[str, HistogramWindow]
    #: Counters by name; the prefix-cache ones under vLLM's names whatever the engine.
    counters: dict[str, float]
    steps: dict[str, StepTotals] = field(default_factory=dict)
    #: Step-duration histogram per token bucket: :data:`StepDurations`, cumulative since the start.
    durations: StepDurations = field(default_factory=dict)


def parse_exposition(text: str, engine: str = "vllm") -> Scrape:
    """Read the request-length histograms, prefix-cache counters and step telemetry of one scrape.

    The prefix-cache counters are ``engine``'s (an engine kind), kept under vLLM's names.
    """
    canonical = {
        "prefix_cache_queries": names.PREFIX_CACHE_QUERIES,
        "prefix_cache_hits": names.PREFIX_CACHE_HITS,
    }
    # One engine series may stand for both (SGLang's prompt tokens are its cache queries).
    counter_keys: dict[str, list[str]] = {names.REQUEST_TOKENS_PRODUCT: [names.REQUEST_TOKENS_PRODUCT]}
    for key, name in prefix_cache_series(engine).items():
        counter_keys.setdefault(name, []).append(canonical[key])
    buckets: dict[str, dict[float, float]] = {}
    sums: dict[str, float] = {}
    counters: dict[str, float] = {}
    step_values: dict[str, dict[str, float]] = {key: {} for key in STEP_FIELDS}
    step_metric = {metric: key for key, metric in STEP_FIELDS.items()}
    wanted = (
        names.REQUEST_PROMPT_TOKENS,
        names.REQUEST_GENERATION_TOKENS,
        names.FINE_REQUEST_PROMPT_TOKENS,
        names.FINE_REQUEST_GENERATION_TOKENS,
    )
    durations: dict[str, dict[float, float]] = {}
    duration_bucket = f"{names.STEP_DURATION}_bucket"
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            label = sample.labels.get(names.LABEL_SCHEDULED_TOKENS)
            if label is not None and sample.name == duration_bucket:
                per_le = durations.setdefault(label, {})
                le = float(sample.labels["le"])
                per_le[le] = per_le.get(le, 0.0) + sample.value
            elif label is not None and sample.name in step_metric:
                values = step_values[step_metric[sample.name]]
                values[label] = values.get(label, 0.0) + sample.value
            elif family.name in wanted:
                if sample.name.endswith("_bucket"):
                    le = float(sample.labels["le"])
                    per = buckets.setdefault(family.name, {})
                    per[le] = per.get(le, 0.0) + sample.value
                else:
                    sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
            elif sample.name in counter_keys:
                for key in counter_keys[sample.name]:
                    counters[key] = counters.get(key, 0.0) + sample.value
    histograms = {
        name: HistogramWindow.from_cumulative(
            per, sums.get(f"{name}_sum", 0.0), sums.get(f"{name}_count", 0.0)
        )
        for name, per in buckets.items()
    }
    return Scrape(
        histograms,
        counters,
        steps_from_results(step_values),
        {label: slot_counts(per_le) for label, per_le in durations.items()},
    )


def slot_counts(cumulative: Mapping[float, float]) -> tuple[float, ...]:
    """Per-slot counts of a cumulative histogram ``{le: count}`` on the step-duration bounds
    (a bound the exposition lacks counts as the one below it)."""
    out: list[float] = []
    below = 0.0
    for bound in (*names.STEP_DURATION_BUCKETS, math.inf):
        at = max((count for le, count in cumulative.items() if le <= bound), default=below)
        out.append(max(0.0, at - below))
        below = max(below, at)
    return tuple(out)


def durations_between(before: StepDurations, after: StepDurations) -> StepDurations:
    """The step-duration histograms of the steps between two scrapes."""
    out: StepDurations = {}
    for label, counts in after.items():
        earlier = before.get(label, (0.0,) * len(counts))
        delta = tuple(max(0.0, a - b) for a, b in zip(counts, earlier, strict=True))
        if sum(delta) > 0:
            out[label] = delta
    return out


def window_between(
    before: Scrape, after: Scrape, duration_s: float
) -> tuple[WorkloadWindow, dict[str, StepTotals]]:
    """The workload and step totals between two scrapes ``duration_s`` apart.

    The request lengths come from Chunkpilot's fine histograms where the engine exports them, else
    from vLLM's.
    """
    fine = names.FINE_REQUEST_PROMPT_TOKENS in after.histograms
    prompt_name, generation_name = (
        (names.FINE_REQUEST_PROMPT_TOKENS, names.FINE_REQUEST_GENERATION_TOKENS)
        if fine
        else (names.REQUEST_PROMPT_TOKENS, names.REQUEST_GENERATION_TOKENS)
    )
    try:
        prompts = after.histograms[prompt_name]
        generations = after.histograms[generation_name]
    except KeyError as exc:
        raise CaptureError(f"the engine exports no {exc.args[0]} histogram") from exc
    if prompt_name in before.histograms and generation_name in before.histograms:
        prompts = prompts - before.histograms[prompt_name]
        generations = generations - before.histograms[generation_name]

    def delta(name: str) -> float:
        return after.counters.get(name, 0.0) - before.counters.get(name, 0.0)

    workload = WorkloadWindow(
        duration_s,
        prompts,
        generations,
        delta(names.PREFIX_CACHE_QUERIES),
        delta(names.PREFIX_CACHE_HITS),
        delta(names.REQUEST_TOKENS_PRODUCT) if names.REQUEST_TOKENS_PRODUCT in after.counters else math.nan,
    )
    steps = {
        label: totals - before.steps.get(label, StepTotals())
        for label, totals in after.steps.items()
        if totals.steps > before.steps.get(label, StepTotals()).steps
    }
    return workload, steps


# ------------------------------------------------------------------------------------- synthesis
def _allocate(counts: Sequence[float], n: int) -> list[int]:
    """``n`` draws split over the buckets in proportion to ``counts`` (largest remainders)."""
    total = sum(counts)
    quotas = [n * c / total for c in counts]
    whole = [math.floor(q) for q in quotas]
    by_remainder = sorted(range(len(counts)), key=lambda i: quotas[i] - whole[i], reverse=True)
    for i in by_remainder[: n - sum(whole)]:
        whole[i] += 1
    return whole


def _lengths(hist: HistogramWindow, n: int, rng: random.Random, cap: int) -> list[int]:
    """``n`` integer lengths with the histogram's bucket shares and (as far as the buckets allow) mean."""
    if hist.count <= 0:
        raise CaptureError("the request-length histogram is empty")
    edges = [0.0, *hist.bounds]
    slots = [slot for slot, k in enumerate(_allocate(hist.counts, n)) for _ in range(k)]
    rng.shuffle(slots)
    within = [rng.random() for _ in range(n)]

    def build(power: float) -> list[int]:
        values: list[int] = []
        for slot, u in zip(slots, within, strict=True):
            low = edges[slot]
            high = hist.bounds[slot] if slot < len(hist.bounds) else max(low * 2, low + 1)
            high = min(high, float(cap))
            low = min(low, high - 1)
            value = max(math.floor(low) + 1, math.ceil(low + (high - low) * u**power))
            values.append(max(1, min(cap, value)))
        return values

    target = hist.mean
    if not math.isfinite(target):
        return build(1.0)
    # u**power: power < 1 pushes draws to the bucket tops, > 1 to the bottoms; bisect on log(power).
    low_log, high_log = -4.0, 4.0
    for _ in range(40):
        middle = (low_log + high_log) / 2
        mean = sum(build(math.exp(middle))) / n
        if mean > target:
            low_log = middle
        else:
            high_log = middle
    return build(math.exp((low_log + high_log) / 2))


def _pair(prompts: list[int], outputs: list[int], mean_product: float, rng: random.Random) -> list[int]:
    """``outputs`` re-paired with ``prompts`` so that the mean of prompt x output is ``mean_product``.

    A Gaussian copula on the ranks: correlation ``rho`` between the prompt's rank and its output's,
    bisected (-1 pairs the longest prompts with the shortest outputs, +1 with the longest).
    """
    n = len(prompts)
    by_prompt = sorted(range(n), key=prompts.__getitem__)
    ordered_outputs = sorted(outputs)
    anchors = sorted(rng.gauss(0.0, 1.0) for _ in range(n))
    noise = [rng.gauss(0.0, 1.0) for _ in range(n)]

    def paired(rho: float) -> list[int]:
        spread = math.sqrt(max(0.0, 1.0 - rho * rho))
        scores = [rho * anchors[r] + spread * noise[r] for r in range(n)]
        result = [0] * n
        for k, r in enumerate(sorted(range(n), key=scores.__getitem__)):
            result[by_prompt[r]] = ordered_outputs[k]
        return result

    def mean_of(candidate: list[int]) -> float:
        return sum(p * o for p, o in zip(prompts, candidate, strict=True)) / n

    low, high = -1.0, 1.0
    if mean_product <= mean_of(paired(low)):
        return paired(low)
    if mean_product >= mean_of(paired(high)):
        return paired(high)
    for _ in range(30):
        middle = (low + high) / 2
        if mean_of(paired(middle)) < mean_product:
            low = middle
        else:
            high = middle
    return paired((low + high) / 2)


def _drawn(
    window: WorkloadWindow, requests: int, rng: random.Random, max_model_len: int, mean_product: float
) -> tuple[list[int], list[int]]:
    """``requests`` prompt and output lengths from ``window``'s histograms, re-paired so that the
    mean of prompt x output is ``mean_product`` (NaN: unpaired)."""
    prompts = _lengths(window.prompt_tokens, requests, rng, max_model_len - 1)
    outputs = _lengths(window.generation_tokens, requests, rng, max_model_len)
    if math.isfinite(mean_product):
        outputs = _pair(prompts, outputs, mean_product, rng)
    return prompts, outputs


def _by_segment(
    window: WorkloadWindow, requests: int, rng: random.Random, max_model_len: int, mean_product: float
) -> tuple[list[int], list[int]] | None:
    """Lengths drawn block by block from the window's segments in their order, each block its
    segment's share of the requests (None: too few segments with requests).

    The pairing: a segment's own mean prompt x output where it has one, else the window's
    ``mean_product`` spread over the segments in proportion to the product of their means (the
    minutes' mix already carries the part of the dependence that lies between minutes).
    """
    parts = [s for s in window.segments if s.prompt_tokens.count > 0 and s.generation_tokens.count > 0]
    if len(parts) < MIN_SEGMENTS:
        return None
    seen = sum(p.prompt_tokens.count for p in parts)
    between = sum(
        p.prompt_tokens.count / seen * p.prompt_tokens.mean * p.generation_tokens.mean for p in parts
    )
    within = mean_product / between if between > 0 else math.nan
    prompts: list[int] = []
    outputs: list[int] = []
    for part, block in zip(parts, _allocate([p.prompt_tokens.count for p in parts], requests), strict=True):
        if block <= 0:
            continue
        own = part.tokens_product / part.prompt_tokens.count
        product = (
            own if math.isfinite(own) else within * part.prompt_tokens.mean * part.generation_tokens.mean
        )
        more_prompts, more_outputs = _drawn(part, block, rng, max_model_len, product)
        prompts += more_prompts
        outputs += more_outputs
    return prompts, outputs


def synthesize(
    window: WorkloadWindow,
    requests: int,
    *,
    max_model_len: int,
    seed: int = 0,
    min_requests: int = MIN_REQUESTS,
    name: str = "captured",
    by_segment: bool = False,
) -> Workload:
    """A workload of ``requests`` requests that reproduces the window's distributions and rates.

    ``by_segment``: the lengths drawn block by block from the window's :attr:`~WorkloadWindow.segments`
    in their order where it has at least :data:`MIN_SEGMENTS` with requests (a run of long prompts
    stays a run), else from the whole window's histograms.
    """
    seen = window.prompt_tokens.count
    if seen < min_requests:
        raise CaptureError(
            f"{seen:g} finished requests in the window, {min_requests} needed to capture the workload"
        )
    rate = window.arrival_rate
    if not rate > 0:
        raise CaptureError("no arrivals in the window")
    rng = random.Random(seed)
    product = window.tokens_product / seen if math.isfinite(window.tokens_product) and seen > 0 else math.nan
    drawn = _by_segment(window, requests, rng, max_model_len, product) if by_segment else None
    prompts, outputs = drawn or _drawn(window, requests, rng, max_model_len, product)
    hit_rate = window.prefix_cache_hit_rate
    specs: list[RequestSpec] = []
    t = 0.0
    for i, (prompt, output) in enumerate(zip(prompts, outputs, strict=True)):
        output = max(1, min(output, max_model_len - prompt))
        hashes: tuple[int, ...] = ()
        if hit_rate > 0:
            # One shared prefix (block-aligned): every request after the first hits its shared blocks.
            shared = min(prompt - 1, round(hit_rate * prompt / BLOCK_SIZE) * BLOCK_SIZE)
            hashes = prefix_hashes(prompt, max(0, shared), 0, i)
        specs.append(RequestSpec(t, prompt, output, hashes))
        t += rng.expovariate(rate)
    return Workload(name, tuple(specs))


def histogram_of(values: Sequence[float], bounds: Sequence[float]) -> HistogramWindow:
    """The histogram of ``values`` with upper bounds ``bounds`` (``le`` semantics)."""
    counts = [0.0] * (len(bounds) + 1)
    for value in values:
        counts[bisect.bisect_left(bounds, value)] += 1
    return HistogramWindow(
        tuple(float(b) for b in bounds), tuple(counts), float(sum(values)), float(len(values))
    )
