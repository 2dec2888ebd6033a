"""The chunked-prefill phenomena per engine: SGLang's and TensorRT-LLM's scheduling semantics.

Same scenario as ``test_phenomena``: 64 streams decode, then a 32k-token prompt arrives; the engine is
driven step by step, so the numbers come from the scheduler and step-time model that serve traffic.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from chunkpilot.engine.sim.engine import SimConfig
from chunkpilot.engine.sim.offline import simulate
from chunkpilot.engine.sim.scheduler import (
    SCHEDULER_CONFIGS,
    CapacitySchedulerPolicy,
    ContextChunkingPolicy,
    Engine,
    Request,
    SchedulerConfig,
    SGLangSchedulerConfig,
    TrtllmSchedulerConfig,
    scheduler_config_class,
)
from chunkpilot.engine.sim.sglang_scheduler import SGLangScheduler
from chunkpilot.engine.sim.trtllm_scheduler import TRTLLMScheduler
from chunkpilot.engine.sim.workload import parse_workload_spec

from chunkpilot.testing.sim import LONG_PROMPT, MAX_LEN, STREAMS, LongPromptRun, long_prompt_among_streams

BUDGETS = (8192, 2048, 512)


@pytest.fixture(scope="module")
def sglang_runs() -> dict[tuple[int | None, bool], LongPromptRun]:
    """(chunk size or None for -1, mixed chunk) -> run."""
    runs = {
        (None, False): long_prompt_among_streams(16384, False, max_prefill_tokens=16384, engine=Engine.SGLANG)
    }
    for chunk in BUDGETS:
        for mixed in (False, True):
            runs[(chunk, mixed)] = long_prompt_among_streams(
                chunk, True, enable_mixed_chunk=mixed, engine=Engine.SGLANG
            )
    return runs


@pytest.fixture(scope="module")
def trtllm_runs() -> dict[int | None, LongPromptRun]:
    """max_num_tokens with chunked prefill -> run; None: chunking off (max_num_tokens = max_seq_len)."""
    runs: dict[int | None, LongPromptRun] = {
        None: long_prompt_among_streams(MAX_LEN, False, engine=Engine.TRTLLM)
    }
    for budget in BUDGETS:
        runs[budget] = long_prompt_among_streams(budget, True, engine=Engine.TRTLLM)
    return runs


# ---- SGLang ---------------------------------------------------------------------------------------
def test_sglang_unchunked_long_prompt_stalls_every_stream(sglang_runs: dict[Any, LongPromptRun]) -> None:
    run = sglang_runs[(None, False)]
    assert run.ratio >= 10, f"unchunked max/p50 ITL = {run.ratio:.1f}"
    assert run.long_chunks == [LONG_PROMPT], "without chunking the prompt is one prefill pass"
    assert run.stalled_steps == 1


@pytest.mark.parametrize("chunk", BUDGETS)
def test_sglang_decodes_stall_for_one_chunk_only_pass_per_chunk(
    sglang_runs: dict[Any, LongPromptRun], chunk: int
) -> None:
    separate, mixed = sglang_runs[(chunk, False)], sglang_runs[(chunk, True)]
    chunks = math.ceil(LONG_PROMPT / chunk)
    assert separate.long_chunks == [chunk] * chunks
    assert separate.stalled_steps == chunks, "each chunk is its own forward pass; the decodes wait"
    assert mixed.stalled_steps == 0, "with --enable-mixed-chunk every chunk carries the decodes"
    # Mixed, the running decodes take their tokens out of the chunk budget.
    assert max(mixed.long_chunks) == chunk - STREAMS and sum(mixed.long_chunks) == LONG_PROMPT


def test_sglang_separate_passes_do_not_bound_the_stall(sglang_runs: dict[Any, LongPromptRun]) -> None:
    """The chunks run back to back before any decode: the stall is the whole prompt, however cut."""
    unchunked = max(sglang_runs[(None, False)].stream_itl_s)
    stalls = [max(sglang_runs[(chunk, False)].stream_itl_s) for chunk in BUDGETS]
    assert all(stall >= unchunked for stall in stalls), f"{unchunked=} {stalls=}"
    assert stalls[0] < stalls[1] < stalls[2], "more passes, more per-pass overhead"


def test_sglang_mixed_chunks_bound_the_stall_and_delay_the_long_prompt(
    sglang_runs: dict[Any, LongPromptRun],
) -> None:
    ratios = [sglang_runs[(chunk, True)].ratio for chunk in BUDGETS]
    ttfts = [sglang_runs[(chunk, True)].long_ttft_s for chunk in BUDGETS]
    assert ratios[0] > ratios[1] > ratios[2], f"max/p50 ITL over chunk sizes {BUDGETS}: {ratios}"
    assert ratios[2] <= 2.5, f"max/p50 ITL at chunk 512 = {ratios[2]:.2f}"
    assert ttfts[0] < ttfts[1] < ttfts[2], f"long-prompt TTFT over chunk sizes {BUDGETS}: {ttfts}"
    assert sglang_runs[(None, False)].long_ttft_s < ttfts[0]


def test_sglang_max_prefill_tokens_caps_a_prefill_batch() -> None:
    config = SGLangSchedulerConfig(
        max_num_batched_tokens=4096,
        max_num_seqs=64,
        max_model_len=8192,
        enable_chunked_prefill=False,
        max_prefill_tokens=3000,
    )
    sched = SGLangScheduler(config, num_kv_blocks=10_000)
    for i in range(8):
        sched.add_request(Request(str(i), 0.0, 1000, 10))
    first = sched.schedule(0.0)
    assert [item.num_new_tokens for item in first.scheduled] == [1000, 1000]  # a third would reach 3000
    sched.update(first, 0.1)
    sched.add_request(Request("big", 0.1, 5000, 10))
    second = sched.schedule(0.1)
    assert all(item.is_prefill for item in second.scheduled), "a prefill batch again, decodes wait"


# ---- TensorRT-LLM ---------------------------------------------------------------------------------
def test_trtllm_unchunked_long_prompt_stalls_every_stream(
    trtllm_runs: dict[int | None, LongPromptRun],
) -> None:
    run = trtllm_runs[None]
    assert run.ratio >= 10, f"unchunked max/p50 ITL = {run.ratio:.1f}"
    assert run.long_chunks == [LONG_PROMPT]
    assert run.stalled_steps == 0, "in-flight batching: the decodes share the context pass"


def test_trtllm_chunking_bounds_the_stall_and_delays_the_long_prompt(
    trtllm_runs: dict[int | None, LongPromptRun],
) -> None:
    ratios = [trtllm_runs[b].ratio for b in BUDGETS]
    ttfts = [trtllm_runs[b].long_ttft_s for b in BUDGETS]
    assert ratios[0] > ratios[1] > ratios[2], f"max/p50 ITL over max_num_tokens {BUDGETS}: {ratios}"
    assert ratios[2] <= 2.5, f"max/p50 ITL at max_num_tokens 512 = {ratios[2]:.2f}"
    assert ttfts[0] < ttfts[1] < ttfts[2], f"long-prompt TTFT over max_num_tokens {BUDGETS}: {ttfts}"
    assert trtllm_runs[None].long_ttft_s < ttfts[0]


@pytest.mark.parametrize("policy", list(ContextChunkingPolicy))
def test_trtllm_context_chunks_are_multiples_of_tokens_per_block(policy: ContextChunkingPolicy) -> None:
    """Budget 1000 less one token per admitted stream: a truncated chunk is the multiple of 32 below."""
    run = long_prompt_among_streams(1000, True, context_chunking_policy=policy, engine=Engine.TRTLLM)
    *middle, last = run.long_chunks
    assert middle and all(chunk % 32 == 0 for chunk in middle), middle[:5]
    assert 1000 - STREAMS - 32 < max(middle) < 1000
    assert sum(run.long_chunks) == LONG_PROMPT and 0 < last <= max(middle)


def _kv_pressure(policy: CapacitySchedulerPolicy) -> tuple[int, int, int]:
    """(most requests running at once, preemptions, completed) with a KV cache for ~8 full requests."""
    config = SimConfig.for_engine(
        "trtllm",
        max_num_batched_tokens=4096,
        max_num_seqs=64,
        max_model_len=4096,
        capacity_scheduler_policy=policy,
        enable_prefix_caching=False,
        num_kv_blocks=8 * (1024 + 1024) // 16,
    )
    core = config.build()
    sched = core.scheduler
    sched.check_invariants = True
    for i in range(32):
        sched.add_request(Request(str(i), 0.0, 1024, 1024))
    peak, now = 0, 0.0
    while sched.has_unfinished():
        step = core.step(now)
        assert step is not None
        peak = max(peak, len(sched.running))
        now = step.end_s
    return peak, sched.num_preemptions, 32


def test_trtllm_guaranteed_no_evict_reserves_the_whole_output_max_utilization_preempts() -> None:
    safe_peak, safe_preempted, _ = _kv_pressure(CapacitySchedulerPolicy.GUARANTEED_NO_EVICT)
    greedy_peak, greedy_preempted, _ = _kv_pressure(CapacitySchedulerPolicy.MAX_UTILIZATION)
    assert safe_peak == 8 and safe_preempted == 0, (safe_peak, safe_preempted)
    assert greedy_peak > safe_peak and greedy_preempted > 0, (greedy_peak, greedy_preempted)


# ---- every engine ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("config_class", "scheduler_class", "cap", "offered", "queue", "queued"),
    [
        # SGLang's max_running_requests: 3 of 6 admitted, the other 3 wait.
        (SGLangSchedulerConfig, SGLangScheduler, 3, 6, "waiting", 3),
        # TensorRT-LLM's max_batch_size: 4 of 10 active.
        (TrtllmSchedulerConfig, TRTLLMScheduler, 4, 10, "running", 4),
    ],
    ids=["sglang-max-running-requests", "trtllm-max-batch-size"],
)
def test_the_request_cap_limits_admission(
    config_class: Any, scheduler_class: Any, cap: int, offered: int, queue: str, queued: int
) -> None:
    config = config_class(max_num_batched_tokens=8192, max_num_seqs=cap, max_model_len=8192)
    sched = scheduler_class(config, num_kv_blocks=10_000)
    for i in range(offered):
        sched.add_request(Request(str(i), 0.0, 100, 10))
    out = sched.schedule(0.0)
    assert len(out.scheduled) == cap and len(getattr(sched, queue)) == queued


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_the_budget_trades_ttft_for_itl_on_every_engine(engine: str) -> None:
    """Long prompts among chat traffic: a smaller budget (mixed chunks for SGLang) lowers the ITL
    tail and raises the TTFT median."""
    workload = parse_workload_spec("n=300,rate=3,prompt=2048-8192,output=100-300,seed=3")
    knobs = {"enable_mixed_chunk": True} if engine == "sglang" else {}
    results = []
    for budget in (8192, 512):
        config = SimConfig.for_engine(
            engine, max_num_batched_tokens=budget, max_num_seqs=128, max_model_len=16384, **knobs
        )
        results.append(simulate(config, workload))
    big, small = results
    assert small.itl_ms.p99 < big.itl_ms.p99 / 2, (big.itl_ms.p99, small.itl_ms.p99)
    assert small.ttft_ms.p50 > big.ttft_ms.p50, (big.ttft_ms.p50, small.ttft_ms.p50)


def test_sim_config_for_engine_puts_scheduler_fields_into_the_scheduler() -> None:
    config = SimConfig.for_engine("sglang", model="llama-3.1-8b", max_num_batched_tokens=1024, seed=4)
    assert config.engine is Engine.SGLANG and config.scheduler.max_num_batched_tokens == 1024
    assert config.seed == 4 and config.model == "llama-3.1-8b"
    with pytest.raises(ValueError, match="sglang"):
        SimConfig.for_engine("sglang", long_prefill_token_threshold=512)


def test_a_capacity_policy_the_simulator_does_not_reproduce_is_refused() -> None:
    with pytest.raises(ValueError, match="STATIC_BATCH is not simulated"):
        TrtllmSchedulerConfig(
            max_num_batched_tokens=8192,
            max_num_seqs=4,
            max_model_len=8192,
            capacity_scheduler_policy=CapacitySchedulerPolicy.STATIC_BATCH,
        )


def test_each_engine_has_its_own_scheduler_config_class() -> None:
    assert set(SCHEDULER_CONFIGS) == set(Engine)
    for engine, config_class in SCHEDULER_CONFIGS.items():
        assert config_class.engine is engine and scheduler_config_class(engine.value) is config_class
    assert "max_prefill_tokens" not in SchedulerConfig.__dataclass_fields__
    assert "chunk_unit_size" not in SGLangSchedulerConfig.__dataclass_fields__
    with pytest.raises(TypeError, match="max_prefill_tokens"):
        SimConfig.for_engine("trtllm", max_prefill_tokens=4096)


def test_live_adjustment_keeps_the_engines_config_class() -> None:
    core = SimConfig.for_engine("trtllm", max_num_batched_tokens=4096, max_num_seqs=64).build()
    core.scheduler.set_limits(2048, 32, None)
    config = core.scheduler.config
    assert isinstance(config, TrtllmSchedulerConfig) and config.max_num_seqs == 32
