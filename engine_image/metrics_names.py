"""vLLM V1 Prometheus metric names, labels and histogram buckets (vLLM 0.33), and the other engines'.

The single source of truth for everything that reads or writes engine metrics: the simulator's
``/metrics``, the tuner's PromQL queries and tests that compare the two engines. Counter constants
carry the ``_total`` suffix of the exposed sample; histogram constants are the family name (the
exposed series add ``_bucket``, ``_sum`` and ``_count``).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Final

from chunkpilot.api.engines import ENGINES
from chunkpilot.api.knobs import Dialect

LABEL_MODEL_NAME: Final = "model_name"
LABEL_ENGINE: Final = "engine"
LABEL_FINISHED_REASON: Final = "finished_reason"
ENGINE_LABEL_VALUE: Final = "0"

# Histograms
TIME_TO_FIRST_TOKEN: Final = "vllm:time_to_first_token_seconds"
INTER_TOKEN_LATENCY: Final = "vllm:inter_token_latency_seconds"
E2E_REQUEST_LATENCY: Final = "vllm:e2e_request_latency_seconds"
REQUEST_QUEUE_TIME: Final = "vllm:request_queue_time_seconds"
REQUEST_PREFILL_TIME: Final = "vllm:request_prefill_time_seconds"
REQUEST_DECODE_TIME: Final = "vllm:request_decode_time_seconds"
ITERATION_TOKENS: Final = "vllm:iteration_tokens_total"

# Counters (exposed sample names)
PROMPT_TOKENS: Final = "vllm:prompt_tokens_total"
GENERATION_TOKENS: Final = "vllm:generation_tokens_total"
NUM_PREEMPTIONS: Final = "vllm:num_preemptions_total"
PREFIX_CACHE_QUERIES: Final = "vllm:prefix_cache_queries_total"
PREFIX_CACHE_HITS: Final = "vllm:prefix_cache_hits_total"
REQUEST_SUCCESS: Final = "vllm:request_success_total"

# Gauges
NUM_REQUESTS_RUNNING: Final = "vllm:num_requests_running"
NUM_REQUESTS_WAITING: Final = "vllm:num_requests_waiting"
KV_CACHE_USAGE: Final = "vllm:kv_cache_usage_perc"

#: Removed in vLLM V1 (replaced by :data:`INTER_TOKEN_LATENCY`); never query it.
REMOVED_TIME_PER_OUTPUT_TOKEN: Final = "vllm:time_per_output_token_seconds"

ITL_BUCKETS: Final[tuple[float, ...]] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
TTFT_BUCKETS: Final[tuple[float, ...]] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS: Final[tuple[float, ...]] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
    960.0, 1920.0, 7680.0,
)  # fmt: skip
ITERATION_TOKENS_BUCKETS: Final[tuple[float, ...]] = (
    1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384,
)  # fmt: skip

HISTOGRAM_BUCKETS: Final[dict[str, tuple[float, ...]]] = {
    TIME_TO_FIRST_TOKEN: TTFT_BUCKETS,
    INTER_TOKEN_LATENCY: ITL_BUCKETS,
    E2E_REQUEST_LATENCY: REQUEST_LATENCY_BUCKETS,
    REQUEST_QUEUE_TIME: REQUEST_LATENCY_BUCKETS,
    REQUEST_PREFILL_TIME: REQUEST_LATENCY_BUCKETS,
    REQUEST_DECODE_TIME: REQUEST_LATENCY_BUCKETS,
    ITERATION_TOKENS: ITERATION_TOKENS_BUCKETS,
}
COUNTERS: Final[tuple[str, ...]] = (
    PROMPT_TOKENS,
    GENERATION_TOKENS,
    NUM_PREEMPTIONS,
    PREFIX_CACHE_QUERIES,
    PREFIX_CACHE_HITS,
    REQUEST_SUCCESS,
)
GAUGES: Final[tuple[str, ...]] = (NUM_REQUESTS_RUNNING, NUM_REQUESTS_WAITING, KV_CACHE_USAGE)

# Request-length histograms. vLLM sizes their buckets by the engine's --max-model-len (a 1-2-5 series
# capped at it: ``vllm.v1.metrics.buckets.build_1_2_5_buckets``), so they have no static entry in
# :data:`HISTOGRAM_BUCKETS`; see :func:`request_tokens_buckets`.
REQUEST_PROMPT_TOKENS: Final = "vllm:request_prompt_tokens"
REQUEST_GENERATION_TOKENS: Final = "vllm:request_generation_tokens"


def request_tokens_buckets(max_model_len: int) -> tuple[float, ...]:
    """vLLM's buckets of the request-length histograms: 1, 2, 5, 10, 20, 50, … up to ``max_model_len``."""
    buckets: list[float] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * scale
            if value > max_model_len:
                return tuple(buckets)
            buckets.append(float(value))
        scale *= 10


# ---------------------------------------------------------------------------------------------------
# Chunkpilot's own engine telemetry (the simulator natively, vLLM through the Chunkpilot scheduler
# plugin), for the digital twin. Every step is counted once, in the bucket of the number of tokens it
# scheduled (label :data:`LABEL_SCHEDULED_TOKENS`: the bucket's upper bound, ``le`` semantics, so the
# bucket "64" holds steps of 49-64 tokens). Per bucket, ``rate(X_total[W]) / rate(STEP_DURATION_count[W])``
# is the mean of X per step and ``rate(STEP_DURATION_sum[W]) / rate(STEP_DURATION_count[W])`` the mean
# step time: one point of the step-time curve for the twin's least-squares fit.
LABEL_SCHEDULED_TOKENS: Final = "scheduled_tokens"

#: Histogram: wall time of one engine step (schedule + forward pass + sampling), by token bucket.
STEP_DURATION: Final = "chunkpilot:step_duration_seconds"
# Counters by token bucket (exposed sample names).
STEP_PREFILL_TOKENS: Final = "chunkpilot:step_prefill_tokens_total"
STEP_DECODE_TOKENS: Final = "chunkpilot:step_decode_tokens_total"
STEP_SEQUENCES: Final = "chunkpilot:step_sequences_total"
STEP_DECODE_SEQUENCES: Final = "chunkpilot:step_decode_sequences_total"
STEP_SAMPLED_SEQUENCES: Final = "chunkpilot:step_sampled_sequences_total"
STEP_PREFILL_ATTENTION_PAIRS: Final = "chunkpilot:step_prefill_attention_pairs_total"
STEP_PREFILL_CONTEXT_TOKENS: Final = "chunkpilot:step_prefill_context_tokens_total"
STEP_DECODE_CONTEXT_TOKENS: Final = "chunkpilot:step_decode_context_tokens_total"

#: What each per-bucket counter adds per step (documentation and HELP text).
STEP_COUNTERS: Final[dict[str, str]] = {
    STEP_PREFILL_TOKENS: "Prompt (or recomputed) tokens computed by prefill chunks.",
    STEP_DECODE_TOKENS: "Tokens computed by decoding sequences (1 + speculative tokens each).",
    STEP_SEQUENCES: "Sequences in the batch.",
    STEP_DECODE_SEQUENCES: "Decoding sequences in the batch.",
    STEP_SAMPLED_SEQUENCES: "Tokens sampled (rows of the LM head).",
    STEP_PREFILL_ATTENTION_PAIRS: "Query-key pairs of the prefill chunks' attention.",
    STEP_PREFILL_CONTEXT_TOKENS: "KV tokens attended by prefill chunks (cached plus new).",
    STEP_DECODE_CONTEXT_TOKENS: "KV tokens read by decoding sequences.",
}
#: The per-step shape counter behind each field of a step's shape (the telemetry's counters,
#: the twin capture's step totals).
STEP_SHAPE_FIELDS: Final[dict[str, str]] = {
    "prefill_tokens": STEP_PREFILL_TOKENS,
    "decode_tokens": STEP_DECODE_TOKENS,
    "sequences": STEP_SEQUENCES,
    "decode_sequences": STEP_DECODE_SEQUENCES,
    "sampled_sequences": STEP_SAMPLED_SEQUENCES,
    "prefill_attention_pairs": STEP_PREFILL_ATTENTION_PAIRS,
    "prefill_context_tokens": STEP_PREFILL_CONTEXT_TOKENS,
    "decode_context_tokens": STEP_DECODE_CONTEXT_TOKENS,
}

#: Counter (vLLM plugin only): seconds the plugin spent recording the step telemetry, its own cost.
TELEMETRY_SECONDS: Final = "chunkpilot:step_telemetry_seconds_total"

#: Upper bounds of the scheduled-token buckets: powers of two and their midpoints (<= 19% apart above 4
#: tokens, so the step time varies little within a bucket), then +Inf.
STEP_TOKEN_BUCKETS: Final[tuple[int, ...]] = (
    1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048,
    3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
)  # fmt: skip
#: Token buckets exported at zero from start-up at least up to this count (see the engines' telemetry).
DEFAULT_PRECREATED_STEP_TOKENS: Final = 8192
STEP_DURATION_BUCKETS: Final[tuple[float, ...]] = (
    0.0005, 0.001, 0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5,
    1.0, 2.5,
)  # fmt: skip

# Finer latency histograms than vLLM's (its ITL buckets jump 10 -> 25 -> 50 -> 75 ms): about 5-10 %
# apart in the range SLOs are set in, so ``histogram_quantile`` can tell configurations apart.
FINE_INTER_TOKEN_LATENCY: Final = "chunkpilot:inter_token_latency_seconds"
FINE_TIME_TO_FIRST_TOKEN: Final = "chunkpilot:time_to_first_token_seconds"
FINE_ITL_BUCKETS: Final[tuple[float, ...]] = (
    0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.007, 0.008, 0.009, 0.010, 0.011, 0.012, 0.013, 0.014,
    0.015, 0.016, 0.018, 0.020, 0.022, 0.024, 0.026, 0.028, 0.030, 0.033, 0.036, 0.040, 0.044, 0.048,
    0.052, 0.056, 0.060, 0.065, 0.070, 0.075, 0.080, 0.090, 0.100, 0.110, 0.120, 0.135, 0.150, 0.175,
    0.200, 0.250, 0.300, 0.400, 0.500, 0.750, 1.0, 2.0, 5.0,
)  # fmt: skip
FINE_TTFT_BUCKETS: Final[tuple[float, ...]] = (
    0.005, 0.010, 0.020, 0.030, 0.040, 0.050, 0.060, 0.070, 0.080, 0.090, 0.100, 0.125, 0.150, 0.175,
    0.200, 0.250, 0.300, 0.350, 0.400, 0.450, 0.500, 0.600, 0.700, 0.800, 0.900, 1.0, 1.25, 1.5, 1.75,
    2.0, 2.25, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0, 8.0, 10.0, 12.5, 15.0, 20.0, 30.0, 60.0, 120.0,
)  # fmt: skip


# Finer request-length histograms of our own: the 1-2-5 series of vLLM's cannot tell where in
# 2000-5000 tokens the prompts lie, and the twin's synthetic workload is drawn from these buckets.
FINE_REQUEST_PROMPT_TOKENS: Final = "chunkpilot:request_prompt_tokens"
FINE_REQUEST_GENERATION_TOKENS: Final = "chunkpilot:request_generation_tokens"
#: Counter: sum over finished requests of prompt tokens x generated tokens. With the two histograms'
#: sums and counts it gives the covariance of the lengths, which the histograms alone do not carry.
REQUEST_TOKENS_PRODUCT: Final = "chunkpilot:request_prompt_generation_tokens_total"
#: 1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 20, 25, 30, 40, 50, 60, 80, 100, 120, 150, ... up to 10**6
#: (at most 25 % apart above 10 tokens).
FINE_REQUEST_TOKENS_BUCKETS: Final[tuple[float, ...]] = tuple(
    sorted(
        {
            float(int(m * 10**k))
            for k in range(7)
            for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8)
            if m * 10**k <= 10**6
        }
    )
)


def step_token_bucket(num_tokens: int) -> str:
    """The :data:`LABEL_SCHEDULED_TOKENS` value of a step that scheduled ``num_tokens`` tokens."""
    i = bisect.bisect_left(STEP_TOKEN_BUCKETS, num_tokens)
    return str(STEP_TOKEN_BUCKETS[i]) if i < len(STEP_TOKEN_BUCKETS) else "+Inf"


# ---------------------------------------------------------------------------------------------------
# Other engines. Each exposes (some of) the same quantities under its own names, labels and buckets;
# :class:`EngineMetricTable` maps the vLLM names above (the simulator's internal vocabulary) to one
# engine's. A vLLM name missing from ``families`` is a quantity that engine does not export. The
# ``chunkpilot:*`` step telemetry and fine histograms are the same for every engine.

#: Internal key (never rendered for vLLM) of the per-request TPOT histogram TensorRT-LLM exports.
REQUEST_TIME_PER_OUTPUT_TOKEN: Final = "chunkpilot_sim:request_time_per_output_token_seconds"


@dataclass(frozen=True)
class Family:
    """One exported metric family: its name (counters: the ``_total`` sample), HELP text,
    buckets (histograms) and labels of its own besides the table's."""

    name: str
    help: str
    buckets: tuple[float, ...] = ()
    labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class TunerMetrics:
    """The five series the tuner's queries read (``tuner.measure``) for one engine."""

    itl_histogram: str
    ttft_histogram: str
    generation_tokens: str
    prompt_tokens: str
    request_success: str
    #: Prefix-cache counters in tokens (queried, hit) for the twin's workload; None: not exported.
    prefix_cache_queries: str | None = None
    prefix_cache_hits: str | None = None
    #: Read Chunkpilot's fine ITL and TTFT histograms first where the pods export them (the
    #: simulator does for every engine, vLLM through the Chunkpilot scheduler plugin); the engine's
    #: own histograms are the fallback (``chunkpilot.tuner.measure.window_source``).
    fine_latency_first: bool = False
    #: ``itl_histogram`` is a per-request time-per-output-token histogram, not a per-token one.
    itl_per_request: bool = False
    #: Gauges whose sum is the requests inside the engine (running and waiting): their growth over a
    #: window added to the completions is the rate requests arrived at. Empty: not exported.
    in_flight: tuple[str, ...] = ()


@dataclass(frozen=True)
class EngineMetricTable:
    """One engine's Prometheus vocabulary, endpoints and what the tuner reads from it."""

    engine: str
    version: str
    #: Labels on every series besides ``model_name`` (e.g. SGLang's ``engine_type="unified"``).
    labels: tuple[tuple[str, str], ...]
    #: vLLM name (the keys used above) -> this engine's family.
    families: dict[str, Family]
    metrics_path: str
    health_path: str
    tuner: TunerMetrics
    #: Where the engine cannot give the tuner a quantity directly: how the tuner gets it instead.
    notes: tuple[str, ...] = ()


VLLM_TUNER: Final = TunerMetrics(
    INTER_TOKEN_LATENCY,
    TIME_TO_FIRST_TOKEN,
    GENERATION_TOKENS,
    PROMPT_TOKENS,
    REQUEST_SUCCESS,
    PREFIX_CACHE_QUERIES,
    PREFIX_CACHE_HITS,
    # Its ITL buckets have no boundary between 25 and 50 ms: tokens of 26-28 ms read p99 49.75 ms.
    # The simulator and pods running the Chunkpilot scheduler plugin export the fine histograms.
    fine_latency_first=True,
    in_flight=(NUM_REQUESTS_RUNNING, NUM_REQUESTS_WAITING),
)

# SGLang 0.5.23 (``srt/observability/metrics_collector.py``): the tokenizer manager's request metrics
# carry ``model_name`` and ``engine_type`` (``unified`` outside disaggregation), several also
# ``is_streaming``; the scheduler's gauges add ``tp_rank``, ``pp_rank``, ``moe_ep_rank``.
SGLANG_TTFT_BUCKETS: Final[tuple[float, ...]] = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400,
)  # fmt: skip
SGLANG_ITL_BUCKETS: Final[tuple[float, ...]] = (
    0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100,
    0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000,
)  # fmt: skip
SGLANG_E2E_BUCKETS: Final[tuple[float, ...]] = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400,
)  # fmt: skip
SGLANG_QUEUE_BUCKETS: Final[tuple[float, ...]] = (
    0.0, 0.001, 0.005, 0.010, 0.050, 0.100, 0.200, 0.500, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50, 60, 70,
    80, 90, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1200, 1400, 1600, 1800, 2000, 2500, 3000,
)  # fmt: skip
SGLANG_TOKENS_BUCKETS: Final[tuple[float, ...]] = (
    100, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000, 12500, 15000,
    17500, 20000, 22500, 25000, 27500, 30000, 35000, 40000, 60000, 80000, 100000, 200000, 300000, 400000,
    600000, 800000, 1000000, 1100000,
)  # fmt: skip
#: The simulator has no per-request streaming flag in its metrics: every request counts as streamed.
_STREAMING: Final = (("is_streaming", "true"),)
_SCHEDULER: Final = (("tp_rank", "0"), ("pp_rank", "0"), ("moe_ep_rank", "0"))

SGLANG_METRICS: Final = EngineMetricTable(
    engine="sglang",
    version="0.5.23",
    labels=(("engine_type", "unified"),),
    families={
        TIME_TO_FIRST_TOKEN: Family(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            SGLANG_TTFT_BUCKETS,
            _STREAMING,
        ),
        INTER_TOKEN_LATENCY: Family(
            "sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            SGLANG_ITL_BUCKETS,
        ),
        E2E_REQUEST_LATENCY: Family(
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            SGLANG_E2E_BUCKETS,
            _STREAMING,
        ),
        REQUEST_QUEUE_TIME: Family(
            "sglang:queue_time_seconds",
            "Histogram of queueing time in seconds.",
            SGLANG_QUEUE_BUCKETS,
            _SCHEDULER,
        ),
        REQUEST_PROMPT_TOKENS: Family(
            "sglang:prompt_tokens_histogram", "Histogram of prompt token length.", SGLANG_TOKENS_BUCKETS
        ),
        REQUEST_GENERATION_TOKENS: Family(
            "sglang:generation_tokens_histogram",
            "Histogram of generation token length.",
            SGLANG_TOKENS_BUCKETS,
        ),
        PROMPT_TOKENS: Family(
            "sglang:prompt_tokens_total", "Number of prefill tokens processed.", (), _STREAMING
        ),
        GENERATION_TOKENS: Family(
            "sglang:generation_tokens_total", "Number of generation tokens processed.", (), _STREAMING
        ),
        REQUEST_SUCCESS: Family("sglang:num_requests_total", "Number of requests processed.", (), _STREAMING),
        PREFIX_CACHE_HITS: Family(
            "sglang:cached_tokens_total",
            "Number of cached prompt tokens by source (device/host/storage).",
            (),
            (("cache_source", "device"),),
        ),
        NUM_PREEMPTIONS: Family(
            "sglang:num_retracted_requests_total", "Total number of retracted requests.", (), _SCHEDULER
        ),
        NUM_REQUESTS_RUNNING: Family(
            "sglang:num_running_reqs", "The number of running requests.", (), _SCHEDULER
        ),
        NUM_REQUESTS_WAITING: Family(
            "sglang:num_queue_reqs", "The number of requests in the waiting queue.", (), _SCHEDULER
        ),
        KV_CACHE_USAGE: Family("sglang:token_usage", "The token usage.", (), _SCHEDULER),
    },
    metrics_path="/metrics",  # on the API port, with --enable-metrics
    health_path="/health",
    tuner=TunerMetrics(
        "sglang:inter_token_latency_seconds",
        "sglang:time_to_first_token_seconds",
        "sglang:generation_tokens_total",
        "sglang:prompt_tokens_total",
        "sglang:num_requests_total",
        # Every prompt token is a prefix-cache query in SGLang (the radix cache is always consulted).
        "sglang:prompt_tokens_total",
        "sglang:cached_tokens_total",
        # Its ITL buckets jump 40 -> 60 ms around the usual targets.
        fine_latency_first=True,
        in_flight=("sglang:num_running_reqs", "sglang:num_queue_reqs"),
    ),
)

# TensorRT-LLM (``tensorrt_llm/metrics/collector.py``, served by trtllm-serve at /prometheus/metrics;
# /metrics is iteration statistics as JSON). 1.0-1.1 name the request families without a prefix,
# later releases with ``trtllm_``; labels ``model_name`` and ``engine_type="trtllm"``. Request metrics
# need ``return_perf_metrics``. There is no inter-token-latency histogram and no token counter.
TRTLLM_PREFIX_SINCE: Final = (1, 2)


def trtllm_metrics(version: str = "1.2.1") -> EngineMetricTable:
    """TensorRT-LLM's table for ``version`` (the prefix differs by release)."""
    numbers = tuple(int(n) for n in version.split(".")[:2] if n.isdigit())
    prefix = "trtllm_" if numbers >= TRTLLM_PREFIX_SINCE else ""
    families = {
        REQUEST_SUCCESS: Family(
            prefix + "request_success_total", "Count of successfully processed requests."
        ),
        E2E_REQUEST_LATENCY: Family(
            prefix + "e2e_request_latency_seconds",
            "Histogram of end to end request latency in seconds.",
            REQUEST_LATENCY_BUCKETS,
        ),
        TIME_TO_FIRST_TOKEN: Family(
            prefix + "time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        ),
        REQUEST_TIME_PER_OUTPUT_TOKEN: Family(
            prefix + "time_per_output_token_seconds",
            "Histogram of time per output token in seconds.",
            ITL_BUCKETS,
        ),
        REQUEST_QUEUE_TIME: Family(
            prefix + "request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        ),
    }
    if prefix:
        families[KV_CACHE_USAGE] = Family(prefix + "kv_cache_utilization", "KV cache utilization")
    return EngineMetricTable(
        engine="trtllm",
        version=version,
        labels=(("engine_type", "trtllm"),),
        families=families,
        metrics_path="/prometheus/metrics",
        health_path="/health",
        tuner=TunerMetrics(
            prefix + "time_per_output_token_seconds",
            prefix + "time_to_first_token_seconds",
            FINE_REQUEST_GENERATION_TOKENS + "_sum",
            FINE_REQUEST_PROMPT_TOKENS + "_sum",
            prefix + "request_success_total",
            fine_latency_first=True,
            itl_per_request=True,
        ),
        notes=(
            "ITL: TensorRT-LLM exports no inter-token histogram. The tuner reads Chunkpilot's "
            "per-token one (chunkpilot:inter_token_latency_seconds) where the pods export it (the "
            "simulator does); otherwise the per-request time-per-output-token histogram, whose "
            "quantiles average each request's stalls over its tokens, judged conservatively (see "
            "chunkpilot.tuner.measure.TPOT_ITL_FACTOR) and named in every reason.",
            "Tokens: no prompt/generation token counters; the tuner reads the sums of Chunkpilot's "
            "request-length histograms (chunkpilot:request_*_tokens, exported by the simulator) and "
            "has no throughput reading on an engine without them.",
        ),
    )


TRTLLM_METRICS: Final = trtllm_metrics()


def _vllm_table() -> EngineMetricTable:
    families = {name: Family(name, "", buckets) for name, buckets in HISTOGRAM_BUCKETS.items()}
    for name in (*COUNTERS, *GAUGES):
        families[name] = Family(name, "")
    return EngineMetricTable(
        engine="vllm",
        version="0.33.0",
        labels=((LABEL_ENGINE, ENGINE_LABEL_VALUE),),
        families=families,
        metrics_path="/metrics",
        health_path="/health",
        tuner=VLLM_TUNER,
    )


VLLM_METRICS: Final = _vllm_table()

#: Metric tables by flag dialect: an engine exports the metric names of the dialect it speaks.
DIALECT_METRICS: Final[dict[str, EngineMetricTable]] = {
    Dialect.VLLM: VLLM_METRICS,
    Dialect.SGLANG: SGLANG_METRICS,
    Dialect.TRTLLM: TRTLLM_METRICS,
}


def engine_metrics(engine: str) -> EngineMetricTable:
    """The metric table of a registered engine kind (ValueError naming the kinds for an unknown one)."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
    return DIALECT_METRICS[ENGINES[engine].dialect]


def tuner_metrics(engine: str = "vllm") -> TunerMetrics:
    """The series the tuner queries for an engine kind."""
    return engine_metrics(engine).tuner
