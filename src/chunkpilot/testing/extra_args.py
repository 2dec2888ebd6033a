"""Variants of ``extraArgs`` per engine: spellings of managed options, and options that are not.

Shared by the API's check (``tests/api/test_options.py``) and the engines' own parsers
(``tests/engine/*/test_real_argv.py``), which prove each refused variant really reaches a managed
option and each allowed one does not.
"""

from __future__ import annotations

#: Tokens the engine of the kind reads as a managed option, and the option the message names.
REFUSED: dict[str, list[tuple[list[str], str]]] = {
    "vllm": [
        (["--max-num-seqs=7"], "--max-num-seqs"),
        (["--max_num_batched_tokens=4096"], "--max-num-batched-tokens"),
        (["--max-num-seq", "7"], "--max-num-seqs"),
        (["--max_num_seq=7"], "--max-num-seqs"),
        (["-tp", "8"], "--tensor-parallel-size"),
        (["-tp=8"], "--tensor-parallel-size"),
        (["-t", "8"], "--tensor-parallel-size"),
        (["--tensor-parallel", "8"], "--tensor-parallel-size"),
        (["--config", "engine.yaml"], "--config"),
        (["--max-num-scheduled-tokens", "4096"], "--max-num-scheduled-tokens"),
        (["--no_enable_prefix_caching"], "--enable-prefix-caching"),
        (["--no-enable-chunked"], "--enable-chunked-prefill"),
        (["--gpu-memory-util=0.5"], "--gpu-memory-utilization"),
        (["--speculative-config.num_speculative_tokens=3"], "--speculative-config.num_speculative_tokens"),
        (["-sc", "{}"], "--speculative-config"),
        (["--long_prefill_token_threshold", "64"], "--long-prefill-token-threshold"),
        (["--served-model-name", "other"], "--served-model-name"),
        (["--port=9000"], "--port"),
        (["--max-model-len", "4096"], "--max-model-len"),
        (["-pp", "2"], "--pipeline-parallel-size"),
        (["--data-parallel-size=2"], "--data-parallel-size"),
        (["--scheduler-cls", "my.Scheduler"], "--scheduler-cls"),
        (["--max-num", "7"], "ambiguous"),
        (["--additional-config.chunkpilot.max_num_partial_prefills=4"], "'chunkpilot' section"),
        (["--additional-config", '{"chunkpilot": {"lanes": 2}}'], "'chunkpilot' section"),
    ],
    "sglang": [
        (["--chunked-prefill-size", "1024"], "--chunked-prefill-size"),
        (["--chunked-prefill", "1024"], "--chunked-prefill-size"),
        (["--max-running", "8"], "--max-running-requests"),
        (["--tp", "2"], "--tp-size"),
        (["--tensor-parallel-size=2"], "--tp-size"),
        (["--model", "other/model"], "--model-path"),
        (["--context-len", "4096"], "--context-length"),
        (["--mem-frac", "0.5"], "--mem-fraction-static"),
        (["--max-total-tokens", "9000"], "--max-total-tokens"),
        (["--config", "engine.yaml"], "--config"),
        (["--schedule-pol", "lpm"], "--schedule-policy"),
        (["--pp-size", "2"], "--pp-size"),
    ],
    "trtllm": [
        (["--max_num_tokens=4096"], "--max_num_tokens"),
        (["--max_batch_size", "8"], "--max_batch_size"),
        (["--tp_size", "2"], "--tensor_parallel_size"),
        (["--pp_size", "2"], "--pipeline_parallel_size"),
        (["--extra_llm_api_options", "options.yaml"], "--config"),
        (["--kv_cache_free_gpu_memory_fraction=0.5"], "--free_gpu_memory_fraction"),
    ],
}

#: Tokens that set nothing the spec manages (or that the engine refuses itself: click takes no prefix).
ALLOWED: dict[str, list[str]] = {
    "vllm": [
        "--seed",
        "-1",
        "--enforce-eager",
        "--dtype",
        "half",
        "--max-num-queued-reqs=64",
        "--kv-cache-dtype=fp8",
        "--additional-config",
        '{"other": 1}',
        "--structured-outputs-config.backend=auto",
        "-O3",
    ],
    "sglang": ["--random-seed", "1", "--disable-cuda-graph", "--log-level=info"],
    "trtllm": ["--log_level", "info", "--max_num", "8", "--trust_remote_code"],
}
