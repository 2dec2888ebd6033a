"""vLLM V1 Prometheus metric names, labels and histogram buckets (vLLM 0.33).

The single source of truth for everything that reads or writes engine metrics: the simulator's
``/metrics``, the tuner's PromQL queries and tests that compare the two engines. Counter constants
carry the ``_total`` suffix of the exposed sample; histogram constants are the family name (the
exposed series add ``_bucket``, ``_sum`` and ``_count``).
"""

from __future__ import annotations

from typing import Final

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
