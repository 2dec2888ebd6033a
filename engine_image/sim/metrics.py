"""A tiny Prometheus registry with the vLLM V1 metrics and the text exposition format (0.0.4).

With another engine's :class:`~chunkpilot.engine.metrics_names.EngineMetricTable` the same
observations are exported under that engine's names, labels and buckets instead; quantities the
engine does not export are dropped. The ``chunkpilot:*`` families are the same for every engine.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

import numpy as np
from chunkpilot.engine import metrics_names as names

if TYPE_CHECKING:
    from chunkpilot.engine.sim.engine import StepResult
    from chunkpilot.engine.sim.scheduler import SchedulerOutput

#: Simulator-only histogram (not a vLLM metric): tokens scheduled in each engine step, every step.
#: vLLM exposes no per-step count; :data:`~chunkpilot.engine.metrics_names.ITERATION_TOKENS` means
#: something else (see :meth:`EngineMetrics.iteration`).
SCHEDULED_TOKENS_PER_STEP = "chunkpilot_sim:scheduled_tokens_per_step"

_HELP = {
    names.TIME_TO_FIRST_TOKEN: "Histogram of time to first token in seconds.",
    names.INTER_TOKEN_LATENCY: "Histogram of inter-token latency in seconds.",
    names.E2E_REQUEST_LATENCY: "Histogram of e2e request latency in seconds.",
    names.REQUEST_QUEUE_TIME: "Histogram of time spent in WAITING phase for request.",
    names.REQUEST_PREFILL_TIME: "Histogram of time spent in PREFILL phase for request.",
    names.REQUEST_DECODE_TIME: "Histogram of time spent in DECODE phase for request.",
    names.ITERATION_TOKENS: "Histogram of number of tokens per engine_step.",
    names.PROMPT_TOKENS: "Number of prefill tokens processed.",
    names.GENERATION_TOKENS: "Number of generation tokens processed.",
    names.NUM_PREEMPTIONS: "Cumulative number of preemption from the engine.",
    names.PREFIX_CACHE_QUERIES: "Prefix cache queries, in terms of number of queried tokens.",
    names.PREFIX_CACHE_HITS: "Prefix cache hits, in terms of number of cached tokens.",
    names.REQUEST_SUCCESS: "Count of successfully processed requests.",
    names.NUM_REQUESTS_RUNNING: "Number of requests in model execution batches.",
    names.NUM_REQUESTS_WAITING: "Number of requests waiting to be processed.",
    names.KV_CACHE_USAGE: "KV-cache usage. 1 means 100 percent usage.",
    SCHEDULED_TOKENS_PER_STEP: "Histogram of tokens scheduled per engine step (simulator only).",
    names.REQUEST_PROMPT_TOKENS: "Number of prefill tokens processed.",
    names.REQUEST_GENERATION_TOKENS: "Number of generation tokens processed.",
    names.FINE_INTER_TOKEN_LATENCY: "Histogram of inter-token latency in seconds (fine buckets).",
    names.FINE_TIME_TO_FIRST_TOKEN: "Histogram of time to first token in seconds (fine buckets).",
    names.FINE_REQUEST_PROMPT_TOKENS: "Prompt tokens of finished requests (fine buckets).",
    names.FINE_REQUEST_GENERATION_TOKENS: "Generated tokens of finished requests (fine buckets).",
    names.REQUEST_TOKENS_PRODUCT: "Sum of prompt tokens x generated tokens over finished requests.",
    names.STEP_DURATION: "Histogram of engine step durations in seconds, by scheduled-token bucket.",
    **names.STEP_COUNTERS,
}

#: vLLM latency histograms mirrored into Chunkpilot's finer ones (same observations, finer buckets).
_FINE_MIRRORS = {
    names.INTER_TOKEN_LATENCY: names.FINE_INTER_TOKEN_LATENCY,
    names.TIME_TO_FIRST_TOKEN: names.FINE_TIME_TO_FIRST_TOKEN,
}


@dataclass(slots=True)
class Histogram:
    """Cumulative-bucket histogram."""

    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        """Add one observation."""
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.count += 1


@dataclass(frozen=True, slots=True)
class StepShape:
    """What one engine step computed: the per-step figures of the step telemetry."""

    tokens: int
    prefill_tokens: int
    decode_tokens: int
    sequences: int
    decode_sequences: int
    sampled_sequences: int
    prefill_attention_pairs: float
    prefill_context_tokens: int
    decode_context_tokens: int

    @classmethod
    def of(cls, output: SchedulerOutput) -> StepShape:
        """The shape of a scheduled batch."""
        prefill = decode = decoding = 0
        for item in output.scheduled:
            if item.is_prefill:
                prefill += item.num_new_tokens
            else:
                decode += item.num_new_tokens
                decoding += 1
        fp = output.forward_pass
        return cls(
            fp.num_tokens, prefill, decode, fp.num_sequences, decoding, fp.num_sampled,
            fp.prefill_attention_pairs, fp.prefill_context_tokens, fp.decode_context_tokens,
        )  # fmt: skip


#: The per-bucket counter of each :class:`StepTotals` sum (the same order as :data:`names.STEP_COUNTERS`).
_COUNTER_FIELDS = {
    names.STEP_PREFILL_TOKENS: "prefill_tokens",
    names.STEP_DECODE_TOKENS: "decode_tokens",
    names.STEP_SEQUENCES: "sequences",
    names.STEP_DECODE_SEQUENCES: "decode_sequences",
    names.STEP_SAMPLED_SEQUENCES: "sampled_sequences",
    names.STEP_PREFILL_ATTENTION_PAIRS: "prefill_attention_pairs",
    names.STEP_PREFILL_CONTEXT_TOKENS: "prefill_context_tokens",
    names.STEP_DECODE_CONTEXT_TOKENS: "decode_context_tokens",
}


@dataclass(frozen=True, slots=True)
class StepTotals:
    """Sums over the steps of one scheduled-token bucket (what ``increase()`` over a window gives)."""

    steps: float = 0.0
    duration_s: float = 0.0
    prefill_tokens: float = 0.0
    decode_tokens: float = 0.0
    sequences: float = 0.0
    decode_sequences: float = 0.0
    sampled_sequences: float = 0.0
    prefill_attention_pairs: float = 0.0
    prefill_context_tokens: float = 0.0
    decode_context_tokens: float = 0.0

    def __sub__(self, other: StepTotals) -> StepTotals:
        return StepTotals(*(getattr(self, f.name) - getattr(other, f.name) for f in fields(self)))

    def mean(self, name: str) -> float:
        """Mean of sum ``name`` per step (NaN without steps)."""
        return float(getattr(self, name)) / self.steps if self.steps > 0 else math.nan

    @property
    def mean_tokens(self) -> float:
        """Mean tokens scheduled per step."""
        return self.mean("prefill_tokens") + self.mean("decode_tokens")


class _StepBucket:
    __slots__ = ("duration", "sums")

    def __init__(self) -> None:
        self.duration = Histogram(names.STEP_DURATION_BUCKETS)
        self.sums = dict.fromkeys(_COUNTER_FIELDS.values(), 0.0)


class StepTelemetry:
    """Step durations and batch composition per scheduled-token bucket (``chunkpilot:step_*``).

    The buckets up to ``precreate_tokens`` are exported at zero from the start: a series born with a
    non-zero value loses that first value in Prometheus' ``increase()``, and a fresh canary's first
    steps would go missing from the twin's window.
    """

    def __init__(self, precreate_tokens: int = 0) -> None:
        self._buckets: dict[str, _StepBucket] = {}
        if precreate_tokens > 0:
            last = names.step_token_bucket(precreate_tokens)
            for bound in names.STEP_TOKEN_BUCKETS:
                self._bucket(bound)
                if str(bound) == last:
                    break

    def _bucket(self, num_tokens: int) -> _StepBucket:
        label = names.step_token_bucket(num_tokens)
        bucket = self._buckets.get(label)
        if bucket is None:
            bucket = self._buckets[label] = _StepBucket()
        return bucket

    def observe(self, shape: StepShape, duration_s: float) -> None:
        """Record one step."""
        bucket = self._bucket(shape.tokens)
        bucket.duration.observe(duration_s)
        sums = bucket.sums
        for key in sums:
            sums[key] += getattr(shape, key)

    def observe_decode_run(
        self, batch: int, context_tokens: int, steps: int, first_s: float, increment_s: float
    ) -> None:
        """Record ``steps`` pure-decode steps of ``batch`` sequences, advanced in bulk.

        Step ``i`` (from 0) reads ``context_tokens + i * batch`` KV tokens and lasts
        ``first_s + i * increment_s``.
        """
        if steps <= 0:
            return
        bucket = self._bucket(batch)
        durations = first_s + increment_s * np.arange(steps, dtype=np.float64)
        hist = bucket.duration
        slots = np.searchsorted(np.asarray(hist.buckets), durations, side="left")
        for slot, count in enumerate(np.bincount(slots, minlength=len(hist.counts)).tolist()):
            hist.counts[slot] += int(count)
        hist.total += float(durations.sum())
        hist.count += steps
        sums = bucket.sums
        for key in ("decode_tokens", "sequences", "decode_sequences", "sampled_sequences"):
            sums[key] += batch * steps
        sums["decode_context_tokens"] += steps * context_tokens + batch * steps * (steps - 1) // 2

    def duration_counts(self) -> dict[str, tuple[int, ...]]:
        """Steps per step-duration slot (``names.STEP_DURATION_BUCKETS`` and +Inf, not cumulative)
        per bucket label: the spread of single step times within each token bucket."""
        return {label: tuple(b.duration.counts) for label, b in self._buckets.items()}

    def totals(self) -> dict[str, StepTotals]:
        """Sums so far per bucket label (see :data:`names.LABEL_SCHEDULED_TOKENS`)."""
        return {
            label: StepTotals(float(b.duration.count), b.duration.total, **b.sums)
            for label, b in self._buckets.items()
        }

    def render(self, labels: str) -> list[str]:
        """Exposition lines of the step families (HELP/TYPE even before the first step)."""
        order = sorted(self._buckets.items(), key=lambda item: _bucket_order(item[0]))
        name = names.STEP_DURATION
        lines = [f"# HELP {name} {_HELP[name]}", f"# TYPE {name} histogram"]
        for label, bucket in order:
            series = f'{labels},{names.LABEL_SCHEDULED_TOKENS}="{label}"'
            lines += _histogram_lines(name, series, bucket.duration)
        for counter, key in _COUNTER_FIELDS.items():
            lines += [f"# HELP {counter} {_HELP[counter]}", f"# TYPE {counter} counter"]
            for label, bucket in order:
                series = f'{labels},{names.LABEL_SCHEDULED_TOKENS}="{label}"'
                lines.append(f"{counter}{{{series}}} {_fmt(bucket.sums[key])}")
        return lines


def _bucket_order(label: str) -> float:
    return math.inf if label == "+Inf" else float(label)


def _histogram_lines(name: str, series: str, hist: Histogram) -> list[str]:
    lines: list[str] = []
    cumulative = 0
    for bound, count in zip((*hist.buckets, math.inf), hist.counts, strict=True):
        cumulative += count
        lines.append(f'{name}_bucket{{{series},le="{_fmt(bound)}"}} {cumulative}')
    lines.append(f"{name}_sum{{{series}}} {_fmt(hist.total)}")
    lines.append(f"{name}_count{{{series}}} {hist.count}")
    return lines


def _fmt(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 1e15:
        return f"{value:.1f}"
    return repr(float(value))


class EngineMetrics:
    """The vLLM metric set of one engine, labelled with ``model_name`` and ``engine`` (or, with
    ``table``, another engine's metric set)."""

    def __init__(
        self,
        model_name: str,
        engine: str = names.ENGINE_LABEL_VALUE,
        *,
        max_model_len: int | None = None,
        table: names.EngineMetricTable | None = None,
    ) -> None:
        self.table = None if table is None or table.engine == "vllm" else table
        self.labels = f'{names.LABEL_ENGINE}="{engine}",{names.LABEL_MODEL_NAME}="{_escape(model_name)}"'
        if self.table is not None:
            own = ",".join(f'{key}="{value}"' for key, value in self.table.labels)
            self.labels = f'{names.LABEL_MODEL_NAME}="{_escape(model_name)}",{own}'
            self.histograms = {
                name: Histogram(family.buckets)
                for name, family in self.table.families.items()
                if family.buckets
            }
        else:
            self.histograms = {name: Histogram(buckets) for name, buckets in names.HISTOGRAM_BUCKETS.items()}
        self.histograms[SCHEDULED_TOKENS_PER_STEP] = Histogram(names.ITERATION_TOKENS_BUCKETS)
        self.histograms[names.FINE_INTER_TOKEN_LATENCY] = Histogram(names.FINE_ITL_BUCKETS)
        self.histograms[names.FINE_TIME_TO_FIRST_TOKEN] = Histogram(names.FINE_TTFT_BUCKETS)
        for name in (names.FINE_REQUEST_PROMPT_TOKENS, names.FINE_REQUEST_GENERATION_TOKENS):
            self.histograms[name] = Histogram(names.FINE_REQUEST_TOKENS_BUCKETS)
        if max_model_len is not None and self.table is None:  # vLLM sizes these by --max-model-len
            for name in (names.REQUEST_PROMPT_TOKENS, names.REQUEST_GENERATION_TOKENS):
                self.histograms[name] = Histogram(names.request_tokens_buckets(max_model_len))
        self.request_tokens_product = 0.0
        self.steps = StepTelemetry(max(names.DEFAULT_PRECREATED_STEP_TOKENS, max_model_len or 0))
        self.counters: dict[str, float] = {
            name: 0.0 for name in names.COUNTERS if name != names.REQUEST_SUCCESS
        }
        self.success: dict[str, float] = {"stop": 0.0, "length": 0.0, "abort": 0.0}
        self.gauges: dict[str, float] = {name: 0.0 for name in names.GAUGES}
        #: More vLLM families, rendered after the others (a KV connector's, with ``--kv-transfer-config``).
        self.extra: Callable[[str], list[str]] | None = None

    def observe(self, name: str, value: float) -> None:
        """Observe ``value`` in histogram ``name`` (vLLM's ITL and TTFT also in the finer ones);
        a quantity the engine does not export is only mirrored."""
        hist = self.histograms.get(name)
        if hist is not None:
            hist.observe(value)
        fine = _FINE_MIRRORS.get(name)
        if fine is not None:
            self.histograms[fine].observe(value)

    def step(self, result: StepResult) -> None:
        """Record one executed step: its telemetry, and the lengths of the requests it finished."""
        self.steps.observe(StepShape.of(result.output), result.duration_s)
        lengths = [
            (names.REQUEST_PROMPT_TOKENS, names.REQUEST_GENERATION_TOKENS),
            (names.FINE_REQUEST_PROMPT_TOKENS, names.FINE_REQUEST_GENERATION_TOKENS),
        ]
        for out in result.results:
            if out.finished:
                self.request_tokens_product += out.request.prompt_tokens * out.request.num_output_tokens
                for prompt_name, generation_name in lengths:
                    prompts = self.histograms.get(prompt_name)
                    generations = self.histograms.get(generation_name)
                    if prompts is not None and generations is not None:
                        prompts.observe(out.request.prompt_tokens)
                        generations.observe(out.request.num_output_tokens)

    def iteration(self, first_token_prompt_tokens: int, generated_tokens: int, emitted: bool) -> None:
        """Record one engine iteration the way vLLM V1 does.

        vLLM builds its per-iteration stats only for an iteration that emitted output (a step that
        only advanced chunked prefills records nothing) and then observes in
        ``vllm:iteration_tokens_total`` the *whole* prompt of each request that emitted its first
        token plus the tokens generated, adding the same two numbers to ``vllm:prompt_tokens_total``
        and ``vllm:generation_tokens_total``. A chunked prompt thus appears once, at full length,
        in the iteration that finished it: this is not the number of tokens scheduled in a step.
        """
        if not emitted:
            return
        self.inc(names.PROMPT_TOKENS, first_token_prompt_tokens)
        self.inc(names.GENERATION_TOKENS, generated_tokens)
        self.observe(names.ITERATION_TOKENS, first_token_prompt_tokens + generated_tokens)

    def inc(self, name: str, amount: float = 1.0) -> None:
        """Increase counter ``name``."""
        self.counters[name] += amount

    def finished(self, reason: str) -> None:
        """Count a finished request by reason (stop, length, abort)."""
        self.success[reason] = self.success.get(reason, 0.0) + 1

    def set(self, name: str, value: float) -> None:
        """Set gauge ``name``."""
        self.gauges[name] = value

    def render(self) -> str:
        """The whole registry in Prometheus text format."""
        if self.table is not None:
            return self._render_table(self.table)
        lines: list[str] = []
        for name, gauge in self.gauges.items():
            lines += [
                f"# HELP {name} {_HELP[name]}",
                f"# TYPE {name} gauge",
                f"{name}{{{self.labels}}} {_fmt(gauge)}",
            ]
        # Text format 0.0.4 as prometheus_client (and so vLLM) writes it: counter HELP/TYPE lines
        # carry the ``_total`` sample name.
        for name, value in self.counters.items():
            lines += [f"# HELP {name} {_HELP[name]}", f"# TYPE {name} counter"]
            lines.append(f"{name}{{{self.labels}}} {_fmt(value)}")
        success = names.REQUEST_SUCCESS
        lines += [f"# HELP {success} {_HELP[success]}", f"# TYPE {success} counter"]
        for reason, value in self.success.items():
            lines.append(
                f"{names.REQUEST_SUCCESS}{{{self.labels},"
                f'{names.LABEL_FINISHED_REASON}="{reason}"}} {_fmt(value)}'
            )
        for name, hist in self.histograms.items():
            lines += [f"# HELP {name} {_HELP[name]}", f"# TYPE {name} histogram"]
            lines += _histogram_lines(name, self.labels, hist)
        product = names.REQUEST_TOKENS_PRODUCT
        lines += [f"# HELP {product} {_HELP[product]}", f"# TYPE {product} counter"]
        lines.append(f"{product}{{{self.labels}}} {_fmt(self.request_tokens_product)}")
        if self.extra is not None:
            lines += self.extra(self.labels)
        lines += self.steps.render(self.labels)
        return "\n".join(lines) + "\n"

    def _render_table(self, table: names.EngineMetricTable) -> str:
        """The registry under another engine's names, labels and buckets, then the Chunkpilot families."""
        lines: list[str] = []

        def series(family: names.Family, extra: str = "") -> str:
            own = "".join(f',{key}="{value}"' for key, value in family.labels)
            return f"{self.labels}{own}{extra}"

        for key, family in table.families.items():
            if family.buckets:
                kind = "histogram"
            elif key in self.gauges:
                kind = "gauge"
            else:
                kind = "counter"
            lines += [f"# HELP {family.name} {family.help}", f"# TYPE {family.name} {kind}"]
            if kind == "histogram":
                lines += _histogram_lines(family.name, series(family), self.histograms[key])
            elif kind == "gauge":
                lines.append(f"{family.name}{{{series(family)}}} {_fmt(self.gauges[key])}")
            elif key == names.REQUEST_SUCCESS and table.engine != "sglang":
                for reason, value in self.success.items():
                    extra = f',{names.LABEL_FINISHED_REASON}="{reason}"'
                    lines.append(f"{family.name}{{{series(family, extra)}}} {_fmt(value)}")
            elif key == names.REQUEST_SUCCESS:
                lines.append(f"{family.name}{{{series(family)}}} {_fmt(sum(self.success.values()))}")
            else:
                lines.append(f"{family.name}{{{series(family)}}} {_fmt(self.counters.get(key, 0.0))}")
        for name in (
            SCHEDULED_TOKENS_PER_STEP,
            names.FINE_INTER_TOKEN_LATENCY,
            names.FINE_TIME_TO_FIRST_TOKEN,
            names.FINE_REQUEST_PROMPT_TOKENS,
            names.FINE_REQUEST_GENERATION_TOKENS,
        ):
            lines += [f"# HELP {name} {_HELP[name]}", f"# TYPE {name} histogram"]
            lines += _histogram_lines(name, self.labels, self.histograms[name])
        product = names.REQUEST_TOKENS_PRODUCT
        lines += [f"# HELP {product} {_HELP[product]}", f"# TYPE {product} counter"]
        lines.append(f"{product}{{{self.labels}}} {_fmt(self.request_tokens_product)}")
        lines += self.steps.render(self.labels)
        return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
