"""The chunked-prefill phenomena the simulator must reproduce (offline core, no server).

Each test drives the engine step by step with hand-built requests, so the numbers come from the same
scheduler and step-time model that serve traffic.
"""

from __future__ import annotations

import pytest
from chunkpilot.engine.sim.engine import EngineCore, SimConfig
from chunkpilot.engine.sim.offline import simulate
from chunkpilot.engine.sim.scheduler import Request, SchedulerConfig
from chunkpilot.engine.sim.steptime import ForwardPass
from chunkpilot.engine.sim.workload import parse_workload_spec

from chunkpilot.testing.sim import STREAMS, LongPromptRun, long_prompt_among_streams

# Streams with 4k-token contexts (multi-turn chats). With very short stream contexts the decode
# steps are lighter and the ratio at budget 512 is higher (about 2.9 at 128 tokens): the last
# chunks of a 32k prompt attend over ~32k cached tokens, which no budget can avoid.
STREAM_CONTEXT = 4096


@pytest.fixture(scope="module")
def long_prompt_runs() -> dict[int | None, LongPromptRun]:
    """Budget -> run; ``None`` is the unchunked engine."""
    runs: dict[int | None, LongPromptRun] = {None: long_prompt_among_streams(40_960, False, STREAM_CONTEXT)}
    for budget in (8192, 2048, 512):
        runs[budget] = long_prompt_among_streams(budget, True, STREAM_CONTEXT)
    return runs


def test_a_unchunked_long_prompt_stalls_every_stream(
    long_prompt_runs: dict[int | None, LongPromptRun],
) -> None:
    run = long_prompt_runs[None]
    assert run.ratio >= 10, f"unchunked max/p50 ITL = {run.ratio:.1f}"


def test_a_chunking_bounds_the_stall_and_delays_the_long_prompt(
    long_prompt_runs: dict[int | None, LongPromptRun],
) -> None:
    ratios = [long_prompt_runs[b].ratio for b in (8192, 2048, 512)]
    ttfts = [long_prompt_runs[b].long_ttft_s for b in (8192, 2048, 512)]
    assert ratios[0] > ratios[1] > ratios[2], f"max/p50 ITL over budgets 8192, 2048, 512: {ratios}"
    assert ratios[2] <= 2.5, f"max/p50 ITL at budget 512 = {ratios[2]:.2f}"
    assert ttfts[0] < ttfts[1] < ttfts[2], f"long-prompt TTFT over budgets 8192, 2048, 512: {ttfts}"
    assert long_prompt_runs[None].long_ttft_s < ttfts[0]


def _prefill_pairs(prompt: int, budget: int) -> float:
    """Attention query-key pairs of one prompt prefilled alone under ``budget``."""
    scheduler = SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=8, max_model_len=prompt + 16)
    core = SimConfig(model="llama-3.1-8b", accelerator="h100", scheduler=scheduler).build()
    core.scheduler.add_request(Request("r", 0.0, prompt, 1))
    pairs, now = 0.0, 0.0
    while core.scheduler.has_unfinished():
        step = core.step(now)
        assert step is not None
        pairs += step.output.forward_pass.prefill_attention_pairs
        now = step.end_s
    return pairs


@pytest.mark.parametrize(("prompt", "chunk"), [(16_384, 2048), (16_384, 512), (8192, 1024)])
def test_b_attention_overhead_of_chunking_is_about_chunk_over_prompt(prompt: int, chunk: int) -> None:
    whole = _prefill_pairs(prompt, prompt)
    chunked = _prefill_pairs(prompt, chunk)
    overhead = chunked / whole - 1
    # Every chunk after the first attends to its whole diagonal block: N(N+C)/2 - C(C-1)/2 pairs in
    # total against N(N+1)/2, i.e. an overhead of C/N to first order (C/N - (C/N)^2 exactly-ish).
    assert overhead == pytest.approx(chunk / prompt, rel=0.15), (
        f"overhead {overhead:.4f} vs C/N {chunk / prompt}"
    )
    exact = (prompt * (prompt + chunk) - chunk * (chunk - 1)) / (prompt * (prompt + 1)) - 1
    assert overhead == pytest.approx(exact, rel=1e-9)


def test_c_speculative_decoding_charges_one_plus_k_per_stream() -> None:
    scheduler = SchedulerConfig(
        max_num_batched_tokens=512, max_num_seqs=100, max_model_len=8192, num_speculative_tokens=4
    )
    core = SimConfig(model="llama-3.1-8b", accelerator="h100", scheduler=scheduler).build()
    sched = core.scheduler
    streams = [Request(f"s{i}", 0.0, 16, 1000) for i in range(STREAMS)]
    for request in streams:
        sched.add_request(request)
    now = 0.0
    while not all(r.is_decoding for r in streams):
        step = core.step(now)
        assert step is not None
        now = step.end_s
    sched.add_request(Request("long", now, 4096, 1))
    output = sched.schedule(now)
    decode = [s for s in output.scheduled if not s.is_prefill]
    prefill = [s for s in output.scheduled if s.is_prefill]
    assert len(decode) == STREAMS and all(s.num_new_tokens == 5 and s.num_draft_tokens == 4 for s in decode)
    assert sum(s.num_new_tokens for s in prefill) == 512 - STREAMS * 5 == 192


def test_d_piggybacking_a_chunk_on_decodes_is_cheaper_than_two_passes() -> None:
    """64 decodes (1k context each) and a 256-token chunk: one mixed pass vs a decode and a prefill pass."""
    model = SimConfig(model="llama-3.1-8b", accelerator="h100").build().step_model
    decodes, context, chunk, cached = 64, 1024, 256, 2048
    pairs = ForwardPass.prefill_pairs(chunk, cached)
    decode_only = ForwardPass(decodes, decodes, decodes, decode_context_tokens=decodes * context)
    prefill_only = ForwardPass(chunk, 1, 0, pairs, prefill_context_tokens=cached + chunk)
    mixed = ForwardPass(
        decodes + chunk,
        decodes + 1,
        decodes,
        pairs,
        prefill_context_tokens=cached + chunk,
        decode_context_tokens=decodes * context,
    )
    d, p, m = model.step_time(decode_only), model.step_time(prefill_only), model.step_time(mixed)
    assert m < 0.75 * (d + p), f"mixed {m * 1e3:.2f} ms vs apart {(d + p) * 1e3:.2f} ms"
    # The decodes ride along the chunk's weight reads: their marginal cost is under half a decode pass.
    assert m - p < 0.5 * d, f"marginal decode cost {(m - p) * 1e3:.2f} ms vs decode pass {d * 1e3:.2f} ms"
    assert m > max(d, p)


def test_e_prefix_cache_hits_cut_prefill_work_and_ttft() -> None:
    workload = parse_workload_spec("n=200,rate=4,prompt=2048-3072,output=32-64,prefix=1536,groups=2,seed=3")
    results = {}
    for caching in (False, True):
        scheduler = SchedulerConfig(
            max_num_batched_tokens=2048, max_num_seqs=64, max_model_len=8192, enable_prefix_caching=caching
        )
        config = SimConfig(model="llama-3.1-8b", accelerator="h100", scheduler=scheduler)
        results[caching] = simulate(config, workload, keep_records=True)
    off, on = results[False], results[True]
    computed_off = sum(r.prompt_tokens - r.cached_tokens for r in off.records)
    computed_on = sum(r.prompt_tokens - r.cached_tokens for r in on.records)
    assert off.prefix_cache_hit_rate == 0.0
    assert on.prefix_cache_hit_rate > 0.4
    assert computed_on < 0.6 * computed_off
    assert on.ttft_ms.p50 < 0.8 * off.ttft_ms.p50
    assert on.ttft_ms.mean < off.ttft_ms.mean


def test_prefix_hits_are_capped_so_one_prompt_token_is_computed() -> None:
    scheduler = SchedulerConfig(max_num_batched_tokens=2048, max_num_seqs=8, max_model_len=4096)
    core: EngineCore = SimConfig(scheduler=scheduler).build()
    hashes = tuple(range(1, 65))  # 64 full blocks = 1024 tokens
    first = Request("a", 0.0, 1024, 2, hashes)
    core.scheduler.add_request(first)
    now = 0.0
    while core.scheduler.has_unfinished():
        step = core.step(now)
        assert step is not None
        now = step.end_s
    again = Request("b", now, 1024, 2, hashes)
    core.scheduler.add_request(again)
    output = core.scheduler.schedule(now)
    (item,) = output.scheduled
    assert item.num_computed_before == 1024 - 16  # 63 blocks hit, the last block recomputed
    assert item.num_new_tokens == 16
