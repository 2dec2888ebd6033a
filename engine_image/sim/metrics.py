"""A tiny Prometheus registry with the vLLM V1 metrics and the text exposition format (0.0.4)."""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from chunkpilot.engine import metrics_names as names

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


def _fmt(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 1e15:
        return f"{value:.1f}"
    return repr(float(value))


class EngineMetrics:
    """The vLLM metric set of one engine, labelled with ``model_name`` and ``engine``."""

    def __init__(self, model_name: str, engine: str = names.ENGINE_LABEL_VALUE) -> None:
        self.labels = f'{names.LABEL_ENGINE}="{engine}",{names.LABEL_MODEL_NAME}="{_escape(model_name)}"'
        self.histograms = {name: Histogram(buckets) for name, buckets in names.HISTOGRAM_BUCKETS.items()}
        self.histograms[SCHEDULED_TOKENS_PER_STEP] = Histogram(names.ITERATION_TOKENS_BUCKETS)
        self.counters: dict[str, float] = {
            name: 0.0 for name in names.COUNTERS if name != names.REQUEST_SUCCESS
        }
        self.success: dict[str, float] = {"stop": 0.0, "length": 0.0, "abort": 0.0}
        self.gauges: dict[str, float] = {name: 0.0 for name in names.GAUGES}

    def observe(self, name: str, value: float) -> None:
        """Observe ``value`` in histogram ``name``."""
        self.histograms[name].observe(value)

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
            cumulative = 0
            for bound, count in zip((*hist.buckets, math.inf), hist.counts, strict=True):
                cumulative += count
                lines.append(f'{name}_bucket{{{self.labels},le="{_fmt(bound)}"}} {cumulative}')
            lines.append(f"{name}_sum{{{self.labels}}} {_fmt(hist.total)}")
            lines.append(f"{name}_count{{{self.labels}}} {hist.count}")
        return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
