"""Measuring a track (stable or canary) of a service from Prometheus.

Queries, for a window ``W`` ending at one instant ``t`` shared by both tracks
(so load drift between them cancels out):

- latency quantile: ``histogram_quantile(q, sum by (le) (rate(<hist>_bucket{sel}[W])))``
- samples:          ``sum(increase(<hist>_count{sel}[W]))``
- throughput:       ``sum(rate(vllm:generation_tokens_total{sel}[W]))`` (+ prompt tokens)
- request rate:     ``sum(rate(vllm:request_success_total{sel}[W]))`` (completions)
- in the engines:   ``sum(delta(vllm:num_requests_running{sel}[W]))`` plus the same of
  ``vllm:num_requests_waiting``: their growth added to the completions is the arrivals' rate
- token mix:        prompt and generated token rates over the request rate (tokens per request)
- replicas:         ``count(up{sel} == 1)``

Every engine's own latency histograms are coarse or missing where SLOs are set (vLLM's ITL
buckets jump 25 -> 50 ms, SGLang's 40 -> 60 ms; TensorRT-LLM has no ITL histogram at all), so
Chunkpilot's fine per-token histograms (``chunkpilot:inter_token_latency_seconds``,
``chunkpilot:time_to_first_token_seconds``) are read first when the pods export them (the
simulator does for every engine, vLLM with the Chunkpilot scheduler plugin), the engine's own
ones otherwise (``TunerMetrics.fine_latency_first``). Tracks measured to be compared (canary and
stable; a topology trial's pools and stable) are all read from one family (:func:`window_source`):
the fine histograms when every one of them has at least the judging threshold of fine samples in
the window, the engine's own for all of them otherwise, since one histogram's bucket interpolation
against another's is a difference in measurement, not in the engines. On TensorRT-LLM without
them the ITL objective can only be judged from the per-request time-per-output-token histogram,
which averages each request's stalls over its tokens: :data:`TPOT_ITL_FACTOR` times its quantile is
taken as the ITL quantile (:class:`ItlSource`), and every reason and condition built on it says so
(``itl_note``).

Target labels: every engine target carries ``service``, ``namespace`` and
``track`` labels (the local runtime writes them into its file_sd targets; in a
cluster the operator's PodMonitor relabels the pod labels ``chunkpilot.io/service``
and ``chunkpilot.io/track`` onto them).  The names are configurable through
:class:`LabelScheme` for a Prometheus whose own scrape configuration keeps others.

A query with no series or a NaN result is "no data", never zero; a quantile over
fewer samples than required is not judged (see :class:`TrackMeasurement`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Final

from chunkpilot.engine.metrics_names import (
    FINE_INTER_TOKEN_LATENCY,
    FINE_TIME_TO_FIRST_TOKEN,
    tuner_metrics,
)
from chunkpilot.operator.config import PrometheusAuth, redacted_url

from chunkpilot.api import Measurement, Track, parse_duration
from chunkpilot.api.knobs import ENGINE_NAMES, dialect_of

ITL_HISTOGRAM = "vllm:inter_token_latency_seconds"
TTFT_HISTOGRAM = "vllm:time_to_first_token_seconds"
GENERATION_TOKENS = "vllm:generation_tokens_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
REQUEST_SUCCESS = "vllm:request_success_total"


#: On an engine that exports only per-request TPOT (TensorRT-LLM without Chunkpilot's histogram),
#: the ITL quantile is taken as this many times the TPOT quantile. A request's TPOT is the mean of
#: its inter-token gaps, so a stall is divided by its length: on the simulator's TensorRT-LLM
#: semantics, ITL p99 / TPOT p99 was 1.3-3.4 over the bundled code and conversation traces at
#: budgets 512-8192 and 2.3-4 requests/s (docs/tuning.md). A margin above that, not a bound: no
#: factor bounds the ratio (one long stall in a long answer hides in its mean).
TPOT_ITL_FACTOR: Final = 4.0


class ItlSource(StrEnum):
    """Where a track's ITL quantile comes from (its TTFT quantile comes from the same family)."""

    #: The engine's own per-token inter-token-latency histogram (and its TTFT histogram).
    ENGINE = "engine"
    #: Chunkpilot's fine per-token histograms (``chunkpilot:inter_token_latency_seconds``, and
    #: ``chunkpilot:time_to_first_token_seconds`` for TTFT).
    FINE = "fine"
    #: :data:`TPOT_ITL_FACTOR` x the engine's per-request time-per-output-token quantile (TTFT:
    #: the engine's own histogram).
    TPOT = "tpot"


def engine_source(engine: str) -> ItlSource:
    """Where the ITL comes from when the engine's own histograms are read."""
    return ItlSource.TPOT if tuner_metrics(engine).itl_per_request else ItlSource.ENGINE


@dataclass(frozen=True)
class FineSamples:
    """Observations in a track's fine histograms over a window (0: none, or not exported)."""

    itl: float
    ttft: float
    #: Whether the comparison reads this track's ITL (a prefill pool's is not read: its clients'
    #: tokens after the first come from the decode pool).
    judges_itl: bool = True
    #: Requests in the engine's own TTFT histogram over the window; read only for a track short of
    #: fine samples (None: not read).
    engine_ttft: float | None = None

    def enough(self, minimum: int) -> bool:
        """At least ``minimum`` (and at least one) observations in every histogram compared."""
        least = max(1, minimum)
        return self.ttft >= least and (self.itl >= least or not self.judges_itl)

    def short_on_both(self, minimum: int) -> bool:
        """Too few requests to be judged on either family: the track compares with nothing."""
        return (
            not self.enough(minimum) and self.engine_ttft is not None and self.engine_ttft < max(1, minimum)
        )


def window_source(tracks: Sequence[FineSamples | None], minimum: int, engine: str) -> ItlSource:
    """The one latency family every compared track is judged on in a window.

    The fine histograms when every track has at least ``minimum`` fine samples (the threshold a
    quantile is judged on, :meth:`TrackMeasurement.enough_samples`), or is too short of requests to
    be judged on the engine's own either (:meth:`FineSamples.short_on_both`: a quiet stable beside a
    busy canary; it is compared with nothing, so it cannot send the others to the coarser family);
    otherwise the engine's own for all of them (:func:`engine_source`). A track is None where the
    engine's fine histograms are not read at all. Never one track's quantile from one family against
    another's from the other: a vLLM canary whose tokens take 26-28 ms reads p99 49.75 ms by
    interpolation inside vLLM's 25-50 ms bucket and 32 ms on the fine histogram, a difference of
    measurement only.
    """
    present = [t for t in tracks if t is not None]
    if len(present) < len(tracks) or not any(t.enough(minimum) for t in present):
        return engine_source(engine)
    if all(t.enough(minimum) or t.short_on_both(minimum) for t in present):
        return ItlSource.FINE
    return engine_source(engine)


class MetricsUnavailableError(RuntimeError):
    """Prometheus could not be queried (unreachable, error response, malformed answer)."""


@dataclass(frozen=True)
class LabelScheme:
    """Names of the target labels that identify a service's engine pods in Prometheus."""

    service: str = "service"
    namespace: str = "namespace"
    track: str = "track"
    config_hash: str = "config_hash"
    #: A disaggregated pool's role (``prefill``/``decode``), as its PodMonitor keeps it.
    role: str = "role"


@dataclass(frozen=True)
class Selector:
    """Which series belong to one track of one service."""

    service: str
    namespace: str | None
    track: Track | str | None
    labels: LabelScheme = field(default_factory=LabelScheme)
    config_hash: str | None = None
    #: A disaggregated pool's ``role`` target label (``prefill``/``decode``).
    role: str | None = None

    def render(self) -> str:
        """The PromQL label matcher, e.g. ``{service="chat",namespace="default",track="canary"}``."""
        pairs = [(self.labels.service, self.service)]
        if self.namespace:
            pairs.append((self.labels.namespace, self.namespace))
        if self.track:
            pairs.append((self.labels.track, str(self.track)))
        if self.config_hash:
            pairs.append((self.labels.config_hash, self.config_hash))
        if self.role:
            pairs.append((self.labels.role, self.role))
        return "{" + ",".join(f'{name}="{_escape(value)}"' for name, value in pairs) + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def quantile_query(histogram: str, quantile: float, selector: Selector, window: str) -> str:
    """``histogram_quantile`` over the per-bucket rates of all pods of the selected track."""
    if not 0 < quantile < 1:
        raise ValueError(f"quantile must be in (0, 1), got {quantile}")
    return (
        f"histogram_quantile({quantile:g}, sum by (le) "
        f"(rate({histogram}_bucket{selector.render()}[{window}])))"
    )


def count_query(histogram: str, selector: Selector, window: str) -> str:
    """Observations of ``histogram`` in the window (samples behind the quantile)."""
    return f"sum(increase({histogram}_count{selector.render()}[{window}]))"


def rate_query(counter: str, selector: Selector, window: str) -> str:
    """Per-second rate of a counter summed over the track's pods."""
    return f"sum(rate({counter}{selector.render()}[{window}]))"


def in_flight_change_query(selector: Selector, window: str, engine: str = "vllm") -> str | None:
    """How many more requests the track's engines hold (running or waiting) at the window's end than
    at its start, summed over its pods (None: the engine exports no such gauges)."""
    gauges = tuner_metrics(engine).in_flight
    if not gauges:
        return None
    return " + ".join(f"sum(delta({gauge}{selector.render()}[{window}]))" for gauge in gauges)


def replicas_query(selector: Selector) -> str:
    """Targets of the track that Prometheus scrapes successfully right now."""
    return f"count(up{selector.render()} == 1)"


@dataclass(frozen=True)
class QuerySet:
    """Every query needed to measure one track."""

    itl: str
    itl_samples: str
    ttft: str
    ttft_samples: str
    generation_rate: str
    prompt_rate: str
    request_rate: str
    replicas: str


def track_queries(
    selector: Selector, window: str, itl_quantile: float, ttft_quantile: float, engine: str = "vllm"
) -> QuerySet:
    """The queries measuring ``selector`` over ``window``, in the metric names of ``engine`` (its kind)."""
    m = tuner_metrics(engine)
    return QuerySet(
        itl=quantile_query(m.itl_histogram, itl_quantile, selector, window),
        itl_samples=count_query(m.itl_histogram, selector, window),
        ttft=quantile_query(m.ttft_histogram, ttft_quantile, selector, window),
        ttft_samples=count_query(m.ttft_histogram, selector, window),
        generation_rate=rate_query(m.generation_tokens, selector, window),
        prompt_rate=rate_query(m.prompt_tokens, selector, window),
        request_rate=rate_query(m.request_success, selector, window),
        replicas=replicas_query(selector),
    )


@dataclass(frozen=True)
class FineLatencyQueries:
    """Chunkpilot's fine ITL and TTFT histograms of a track, read before the engine's own."""

    itl: str
    itl_samples: str
    ttft: str
    ttft_samples: str


def fine_latency_queries(
    selector: Selector, window: str, itl_quantile: float, ttft_quantile: float, engine: str = "vllm"
) -> FineLatencyQueries | None:
    """The fine-histogram queries for an engine that reads them first; None for one that does not."""
    if not tuner_metrics(engine).fine_latency_first:
        return None
    return FineLatencyQueries(
        itl=quantile_query(FINE_INTER_TOKEN_LATENCY, itl_quantile, selector, window),
        itl_samples=count_query(FINE_INTER_TOKEN_LATENCY, selector, window),
        ttft=quantile_query(FINE_TIME_TO_FIRST_TOKEN, ttft_quantile, selector, window),
        ttft_samples=count_query(FINE_TIME_TO_FIRST_TOKEN, selector, window),
    )


@dataclass(frozen=True)
class TrackMeasurement:
    """What one track did in the window; ``None`` means Prometheus had no data."""

    track: str
    window: str
    time: datetime
    itl_quantile: float
    ttft_quantile: float
    itl_ms: float | None = None
    ttft_ms: float | None = None
    itl_samples: float = 0.0
    ttft_samples: float = 0.0
    generation_tok_s: float | None = None
    prompt_tok_s: float | None = None
    request_rate: float | None = None
    replicas: int = 0
    #: Where ``itl_ms`` comes from; with :attr:`ItlSource.TPOT` it is :data:`TPOT_ITL_FACTOR` x
    #: ``tpot_ms``, the measured per-request TPOT quantile.
    itl_source: ItlSource = ItlSource.ENGINE
    tpot_ms: float | None = None
    #: Engine kind measured (names the engine in :attr:`itl_note`).
    engine: str = "vllm"
    #: How many more requests the engines held at the window's end than at its start (None: the
    #: engine exports no running and waiting gauges, or Prometheus had none).
    in_flight_change: float | None = None

    @property
    def offered_rate(self) -> float | None:
        """The rate requests arrived at over the window (req/s): those completed plus the growth of
        those still in the engines. An overloaded track completes only what it serves, so its
        completion rate understates the load. A fall is not subtracted: requests a restarted engine
        dropped never completed, and a backlog being drained reads as its completions, the side
        that keeps replicas. The completion rate where the engine exports no running and waiting
        gauges (None without data)."""
        if self.request_rate is None or self.in_flight_change is None or self.in_flight_change <= 0:
            return self.request_rate
        seconds = self.window_s
        return self.request_rate + self.in_flight_change / seconds if seconds > 0 else self.request_rate

    @property
    def window_s(self) -> float:
        """The window's length in seconds (0 when it cannot be read)."""
        try:
            return float(parse_duration(self.window))
        except ValueError:
            return 0.0

    @property
    def itl_note(self) -> str | None:
        """How the ITL was judged when not from a per-token histogram (None when it was)."""
        if self.itl_source is not ItlSource.TPOT or self.tpot_ms is None:
            return None
        name = ENGINE_NAMES[dialect_of(self.engine)]
        quantile = f"p{self.itl_quantile * 100:g}"
        return (
            f"ITL judged from TPOT ({name} exports no ITL histogram): ITL {quantile} taken as "
            f"{TPOT_ITL_FACTOR:g} x TPOT {quantile} {self.tpot_ms:.1f}ms"
        )

    def enough_samples(self, minimum: int) -> bool:
        """True when both quantiles rest on at least ``minimum`` requests' observations.

        ITL observations come one per generated token, so requests are what TTFT counts.
        """
        return (
            self.itl_ms is not None
            and self.ttft_ms is not None
            and self.ttft_samples >= minimum
            and self.itl_samples >= minimum
        )

    @property
    def throughput_tok_s(self) -> float | None:
        """Generated plus prompt tokens per second (None without data)."""
        if self.generation_tok_s is None and self.prompt_tok_s is None:
            return None
        return (self.generation_tok_s or 0.0) + (self.prompt_tok_s or 0.0)

    @property
    def mean_prompt_tokens(self) -> float | None:
        """Prompt tokens per completed request in the window (None without data)."""
        return _per_request(self.prompt_tok_s, self.request_rate)

    @property
    def mean_output_tokens(self) -> float | None:
        """Generated tokens per completed request in the window (None without data)."""
        return _per_request(self.generation_tok_s, self.request_rate)

    def per_replica(self, value: float | None) -> float | None:
        """``value`` divided by the replicas seen (None without data or replicas)."""
        if value is None or self.replicas <= 0:
            return None
        return value / self.replicas

    def to_api(self, goodput_req_s: float | None = None) -> Measurement:
        """The API's Measurement (whole-track numbers, not per replica)."""
        return Measurement(
            itl_ms=_round(self.itl_ms),
            itl_quantile=self.itl_quantile,
            ttft_ms=_round(self.ttft_ms),
            ttft_quantile=self.ttft_quantile,
            throughput_tok_s=_round(self.throughput_tok_s),
            goodput_req_s=_round(goodput_req_s),
            request_rate=_round(self.request_rate, 3),
            samples=int(self.ttft_samples),
            window=self.window,
            time=self.time,
        )


def _per_request(token_rate: float | None, request_rate: float | None) -> float | None:
    """Tokens per request from two rates; None when either is missing or not positive."""
    if token_rate is None or request_rate is None or token_rate <= 0 or request_rate <= 0:
        return None
    return token_rate / request_rate


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


@dataclass(frozen=True)
class WindowMeasurement:
    """Canary and stable measured over the same window, plus the offered load."""

    canary: TrackMeasurement
    stable: TrackMeasurement

    @property
    def offered_request_rate(self) -> float | None:
        """Requests per second the service as a whole completed in the window."""
        rates = [m.request_rate for m in (self.canary, self.stable) if m.request_rate is not None]
        return sum(rates) if rates else None


QueryFn = Callable[[str, datetime], float | None]
"""Evaluate an instant PromQL query at a time; None for no data; raise MetricsUnavailableError."""

VectorFn = Callable[[str, datetime], list[dict[str, Any]]]
"""Evaluate an instant PromQL query at a time; the instant vector as Prometheus answers it."""


def fine_samples(
    query: QueryFn, selector: Selector, window: str, at: datetime, engine: str = "vllm", *, itl: bool = True
) -> FineSamples | None:
    """The track's observations in its fine histograms; None where the engine's are not read.

    ``itl=False``: the comparison does not read the track's ITL (a prefill pool's).
    """
    if not tuner_metrics(engine).fine_latency_first:
        return None
    itl_count = query(count_query(FINE_INTER_TOKEN_LATENCY, selector, window), at) if itl else None
    ttft_count = query(count_query(FINE_TIME_TO_FIRST_TOKEN, selector, window), at)
    return FineSamples(itl_count or 0.0, ttft_count or 0.0, itl)


def _with_engine_requests(
    query: QueryFn,
    samples: FineSamples | None,
    selector: Selector,
    window: str,
    at: datetime,
    engine: str,
    minimum: int,
) -> FineSamples | None:
    """``samples`` with the engine's own request count where the fine ones fall short of ``minimum``."""
    if samples is None or samples.enough(minimum):
        return samples
    requests = query(count_query(tuner_metrics(engine).ttft_histogram, selector, window), at)
    return dataclasses.replace(samples, engine_ttft=requests or 0.0)


def measure_track(
    query: QueryFn,
    selector: Selector,
    window: str,
    at: datetime,
    itl_quantile: float,
    ttft_quantile: float,
    engine: str = "vllm",
    *,
    fine: bool | None = None,
) -> TrackMeasurement:
    """Run the queries of one track at instant ``at``.

    ``fine``: read the fine histograms (True) or the engine's own (False), as the window chose for
    every track it compares (:func:`window_source`); None, for a track judged on its own: the fine
    ones where the track exports both with observations in the window.
    """
    queries = track_queries(selector, window, itl_quantile, ttft_quantile, engine)
    fine_queries = fine_latency_queries(selector, window, itl_quantile, ttft_quantile, engine)
    if fine is None:
        samples = fine_samples(query, selector, window, at, engine)
        fine = window_source([samples], 1, engine) is ItlSource.FINE
    tpot_ms = None
    if fine and fine_queries is not None:
        source = ItlSource.FINE
        itl, itl_samples = _latency(query, at, fine_queries.itl, fine_queries.itl_samples)
        ttft, ttft_samples = _latency(query, at, fine_queries.ttft, fine_queries.ttft_samples)
    else:
        source = engine_source(engine)
        itl, itl_samples = _latency(query, at, queries.itl, queries.itl_samples)
        ttft, ttft_samples = _latency(query, at, queries.ttft, queries.ttft_samples)
        if itl is not None and source is ItlSource.TPOT:
            tpot_ms, itl = itl * 1000.0, itl * TPOT_ITL_FACTOR
    replicas = query(queries.replicas, at)
    in_flight = in_flight_change_query(selector, window, engine)
    return TrackMeasurement(
        track=str(selector.track),
        window=window,
        time=at,
        itl_quantile=itl_quantile,
        ttft_quantile=ttft_quantile,
        itl_ms=None if itl is None else itl * 1000.0,
        ttft_ms=None if ttft is None else ttft * 1000.0,
        itl_samples=itl_samples,
        ttft_samples=ttft_samples,
        generation_tok_s=query(queries.generation_rate, at),
        prompt_tok_s=query(queries.prompt_rate, at),
        request_rate=query(queries.request_rate, at),
        replicas=int(replicas or 0),
        itl_source=source,
        tpot_ms=tpot_ms,
        engine=engine,
        in_flight_change=None if in_flight is None else query(in_flight, at),
    )


def _latency(query: QueryFn, at: datetime, quantile: str, samples: str) -> tuple[float | None, float]:
    """A histogram's quantile (None without data) and its observations in the window."""
    return query(quantile, at), query(samples, at) or 0.0


#: The label by which a batched query (:func:`batched_query`) tells its parts' answers apart.
BATCH_LABEL: Final = "chunkpilot_query"


def batched_query(queries: Sequence[str]) -> str:
    """One PromQL expression answering every one of ``queries`` (each an aggregated instant vector of at
    most one series), the answer to the ``i``-th marked ``chunkpilot_query="i"``."""
    return " or ".join(f'label_replace({q}, "{BATCH_LABEL}", "{i}", "", "")' for i, q in enumerate(queries))


def prefetch(vector: VectorFn, query: QueryFn, queries: Sequence[str], at: datetime) -> QueryFn:
    """A :data:`QueryFn` that answers ``queries`` at ``at`` from one request to Prometheus (``query``
    answers any other), with :func:`parse_instant_result`'s semantics for each."""
    parts: dict[str, list[dict[str, Any]]] = {str(i): [] for i in range(len(queries))}
    for series in vector(batched_query(queries), at):
        labels = dict(series.get("metric") or {})
        index = labels.pop(BATCH_LABEL, None)
        if index in parts:
            parts[index].append({**series, "metric": labels})
    answers = {q: parts[str(i)] for i, q in enumerate(queries)}

    def answer(promql: str, when: datetime) -> float | None:
        if when != at or promql not in answers:
            return query(promql, when)
        return parse_instant_result(answers[promql])

    return answer


def measure_track_batched(
    vector: VectorFn,
    query: QueryFn,
    selector: Selector,
    window: str,
    at: datetime,
    itl_quantile: float,
    ttft_quantile: float,
    engine: str = "vllm",
    *,
    fine: bool | None = None,
) -> TrackMeasurement:
    """:func:`measure_track` with every query it may ask (both latency families) in one request."""
    queries = list(dataclasses.astuple(track_queries(selector, window, itl_quantile, ttft_quantile, engine)))
    fine_queries = fine_latency_queries(selector, window, itl_quantile, ttft_quantile, engine)
    if fine_queries is not None:
        queries += dataclasses.astuple(fine_queries)
    in_flight = in_flight_change_query(selector, window, engine)
    if in_flight is not None:
        queries.append(in_flight)
    prefetched = prefetch(vector, query, list(dict.fromkeys(queries)), at)
    return measure_track(prefetched, selector, window, at, itl_quantile, ttft_quantile, engine, fine=fine)


def measure_window(
    query: QueryFn,
    service: str,
    namespace: str | None,
    window: str,
    at: datetime,
    itl_quantile: float,
    ttft_quantile: float,
    labels: LabelScheme | None = None,
    config_hashes: Mapping[Track, str | None] | None = None,
    engine: str = "vllm",
    *,
    min_samples: int,
) -> WindowMeasurement:
    """Canary and stable of ``service`` over the same ``window`` ending at ``at``, on one family.

    ``config_hashes`` narrows a track to the pods running one config (e.g. leaves out
    stable pods still running the previous config during a rollout). Both tracks are read from the
    fine histograms when both have ``min_samples`` fine samples, from the engine's own otherwise
    (:func:`window_source`).
    """
    scheme = labels or LabelScheme()
    hashes = config_hashes or {}
    selectors = {
        track: Selector(service, namespace, track, scheme, hashes.get(track))
        for track in (Track.CANARY, Track.STABLE)
    }
    counts = [fine_samples(query, sel, window, at, engine) for sel in selectors.values()]
    if any(c is not None and c.enough(min_samples) for c in counts):
        counts = [
            _with_engine_requests(query, c, sel, window, at, engine, min_samples)
            for c, sel in zip(counts, selectors.values(), strict=True)
        ]
    fine = window_source(counts, min_samples, engine) is ItlSource.FINE
    results = {
        track: measure_track(query, sel, window, at, itl_quantile, ttft_quantile, engine, fine=fine)
        for track, sel in selectors.items()
    }
    return WindowMeasurement(canary=results[Track.CANARY], stable=results[Track.STABLE])


def parse_instant_result(result: Any) -> float | None:
    """The single scalar of an instant-vector answer; None for no series or NaN/Inf.

    Several series (a query that was meant to aggregate but did not) are an error.
    """
    if not isinstance(result, list):
        raise MetricsUnavailableError(f"unexpected Prometheus answer {result!r}: expected a vector")
    if not result:
        return None
    if len(result) > 1:
        raise MetricsUnavailableError(f"query returned {len(result)} series; expected one aggregated series")
    try:
        value = float(result[0]["value"][1])
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise MetricsUnavailableError(f"malformed sample {result[0]!r}") from exc
    return value if math.isfinite(value) else None


class PrometheusClient:
    """Instant queries against one Prometheus server (prometheus-api-client underneath).

    ``auth``: a bearer token or basic auth, and a CA bundle, each read from its file when a query is
    made (a rotated token is picked up). The URL is shown without the password of a ``user:pass@``
    part in every message.
    """

    def __init__(
        self,
        url: str,
        timeout_s: float = 10.0,
        headers: Mapping[str, str] | None = None,
        auth: PrometheusAuth | None = None,
    ) -> None:
        import requests
        from prometheus_api_client import PrometheusConnect

        self.url = redacted_url(url)
        self._timeout = timeout_s
        self._auth = auth or PrometheusAuth()
        self._headers = dict(headers or {})
        session = requests.Session()
        if self._auth.ca_file is not None:
            session.verify = self._auth.ca_file
        self._connect = PrometheusConnect(
            url=url, headers=dict(self._headers), disable_ssl=False, session=session
        )

    def _authorise(self) -> None:
        """The credentials as their files hold them now (a rotated token is picked up)."""
        self._connect.headers = {**self._headers, **self._auth.headers()}
        self._connect.auth = self._auth.basic()

    def _instant(self, promql: str, at: datetime | None) -> Any:
        """The raw answer to the instant query ``promql`` at ``at`` (now when None)."""
        params: dict[str, str] = {}
        if at is not None:
            params["time"] = f"{at.timestamp():.3f}"
        try:
            self._authorise()
            return self._connect.custom_query(query=promql, params=params, timeout=self._timeout)
        except Exception as exc:  # requests errors, PrometheusApiClientException and unreadable files
            raise MetricsUnavailableError(f"Prometheus at {self.url} did not answer: {exc}") from exc

    def query(self, promql: str, at: datetime | None = None) -> float | None:
        """Evaluate ``promql`` at ``at`` (now when None); None for no data."""
        return parse_instant_result(self._instant(promql, at))

    def matrix(self, promql: str, start: float, end: float, step_s: float) -> list[dict[str, Any]]:
        """Evaluate ``promql`` every ``step_s`` from ``start`` to ``end`` (Unix seconds); every series
        of the answer (``metric`` and ``values``)."""
        try:
            self._authorise()
            result = self._connect.custom_query_range(
                query=promql,
                start_time=datetime.fromtimestamp(start, UTC),
                end_time=datetime.fromtimestamp(end, UTC),
                step=f"{step_s:g}",
                timeout=self._timeout,
            )
        except Exception as exc:  # requests errors, PrometheusApiClientException and unreadable files
            raise MetricsUnavailableError(f"Prometheus at {self.url} did not answer: {exc}") from exc
        if not isinstance(result, list):
            raise MetricsUnavailableError(f"unexpected Prometheus answer {result!r}: expected a matrix")
        return [item for item in result if isinstance(item, dict)]

    def vector(self, promql: str, at: datetime | None = None) -> list[dict[str, Any]]:
        """Evaluate ``promql`` at ``at``; every series of the answer (``metric`` and ``value``)."""
        result = self._instant(promql, at)
        if not isinstance(result, list):
            raise MetricsUnavailableError(f"unexpected Prometheus answer {result!r}: expected a vector")
        return [item for item in result if isinstance(item, dict)]


@dataclass(frozen=True)
class PoolsMeasurement:
    """The prefill and decode pools of one track of a disaggregated service over the same window."""

    prefill: TrackMeasurement
    decode: TrackMeasurement

    def combined(self) -> TrackMeasurement:
        """The pools as their clients see them.

        ITL: the decode pool's (every token after the first comes from a decode step). TTFT: the
        prefill pool's TTFT quantile plus the decode pool's (the prompt's wait and prefill, then
        the KV hop, the decode replica's admission and its first step); the sum of two quantiles
        is at least the quantile of the sum when the two grow together, so it errs high.
        Throughput and requests: the decode pool's; prompt tokens: the prefill pool's; replicas and
        the requests in the engines: both pools' (a request arrives at the prefill pool and
        completes at the decode pool).
        """
        p, d = self.prefill, self.decode
        ttft = p.ttft_ms + d.ttft_ms if p.ttft_ms is not None and d.ttft_ms is not None else None
        in_flight = (
            p.in_flight_change + d.in_flight_change
            if p.in_flight_change is not None and d.in_flight_change is not None
            else None
        )
        return replace(
            d,
            track=p.track,
            ttft_ms=ttft,
            ttft_samples=min(p.ttft_samples, d.ttft_samples),
            prompt_tok_s=p.prompt_tok_s,
            replicas=p.replicas + d.replicas,
            in_flight_change=in_flight,
        )


@dataclass(frozen=True)
class TopologyWindow(PoolsMeasurement):
    """A topology trial's canary pools and the stable track over the same window."""

    stable: TrackMeasurement

    def window(self) -> WindowMeasurement:
        """The combined canary topology against stable, as a colocated trial's window."""
        return WindowMeasurement(self.combined(), self.stable)


def measure_pools(
    query: QueryFn,
    service: str,
    namespace: str | None,
    window: str,
    at: datetime,
    itl_quantile: float,
    ttft_quantile: float,
    engine: str = "vllm",
    *,
    min_samples: int,
    track: Track = Track.STABLE,
) -> PoolsMeasurement:
    """Measure the prefill and decode pools of ``track`` (``track`` and ``role`` labels), both on
    one family (:func:`window_source`): the fine histograms when the prefill pool's TTFT and the
    decode pool's ITL and TTFT have ``min_samples`` fine samples (the prefill pool's ITL is no
    part of what its clients see), the engine's own otherwise."""
    parts = {role: Selector(service, namespace, track, role=role) for role in ("prefill", "decode")}
    counts = {
        role: fine_samples(query, sel, window, at, engine, itl=role != "prefill")
        for role, sel in parts.items()
    }
    fine = window_source([counts["prefill"], counts["decode"]], min_samples, engine) is ItlSource.FINE
    found = {
        role: measure_track(query, sel, window, at, itl_quantile, ttft_quantile, engine, fine=fine)
        for role, sel in parts.items()
    }
    return PoolsMeasurement(prefill=found["prefill"], decode=found["decode"])


def measure_colocated_trial(
    query: QueryFn,
    service: str,
    namespace: str | None,
    window: str,
    at: datetime,
    itl_quantile: float,
    ttft_quantile: float,
    canary_hash: str | None,
    engine: str = "vllm",
    *,
    min_samples: int,
) -> WindowMeasurement:
    """Measure a colocated topology trial of a service that runs prefill/decode pools: its canary
    engines (``track="canary"``, the trial's config) and the stable pools as their clients see them
    (:meth:`PoolsMeasurement.combined`: what the canary is compared with, and its load).

    The canary is judged on its own: on the fine histograms when it has ``min_samples`` fine
    samples, the engine's own otherwise; the pools as :func:`measure_pools` reads them.
    """
    pools = measure_pools(
        query, service, namespace, window, at, itl_quantile, ttft_quantile, engine, min_samples=min_samples
    )
    selector = Selector(service, namespace, Track.CANARY, config_hash=canary_hash)
    counted = _with_engine_requests(
        query, fine_samples(query, selector, window, at, engine), selector, window, at, engine, min_samples
    )
    fine = window_source([counted], min_samples, engine) is ItlSource.FINE
    canary = measure_track(query, selector, window, at, itl_quantile, ttft_quantile, engine, fine=fine)
    return WindowMeasurement(canary=canary, stable=pools.combined())


def measure_topology(
    query: QueryFn,
    service: str,
    namespace: str | None,
    window: str,
    at: datetime,
    itl_quantile: float,
    ttft_quantile: float,
    stable_hash: str | None,
    engine: str = "vllm",
    *,
    min_samples: int,
) -> TopologyWindow:
    """Measure a topology trial: each canary pool (``track="canary"`` and its ``role``) and stable.

    The pools on one family (:func:`window_source`): the fine histograms when the prefill pool's TTFT
    and the decode pool's ITL and TTFT have ``min_samples`` fine samples (the prefill pool's ITL is no
    part of what its clients see), the engine's own otherwise. The stable, only reported beside them,
    is read on the same family where it has as many fine samples itself, on the engine's otherwise.
    """
    pools = measure_pools(
        query,
        service,
        namespace,
        window,
        at,
        itl_quantile,
        ttft_quantile,
        engine,
        min_samples=min_samples,
        track=Track.CANARY,
    )
    fine = pools.decode.itl_source is ItlSource.FINE
    selector = Selector(service, namespace, Track.STABLE, config_hash=stable_hash)
    counted = fine_samples(query, selector, window, at, engine, itl=True)
    fine = fine and window_source([counted], min_samples, engine) is ItlSource.FINE
    stable = measure_track(query, selector, window, at, itl_quantile, ttft_quantile, engine, fine=fine)
    return TopologyWindow(prefill=pools.prefill, decode=pools.decode, stable=stable)
