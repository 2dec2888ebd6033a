"""vLLM V1 scheduling semantics and the scheduler's invariants."""

from __future__ import annotations

import random

import pytest
from chunkpilot.engine.sim.scheduler import (
    FinishReason,
    Request,
    RequestStatus,
    Scheduler,
    SchedulerConfig,
    SchedulerOutput,
)


def _config(**overrides: object) -> SchedulerConfig:
    values: dict[str, object] = {"max_num_batched_tokens": 512, "max_num_seqs": 16, "max_model_len": 4096}
    values.update(overrides)
    return SchedulerConfig(**values)  # type: ignore[arg-type]


def _step(sched: Scheduler, now: float = 0.0, duration: float = 0.01) -> tuple[SchedulerOutput, float]:
    output = sched.schedule(now)
    sched.update(output, now + duration)
    return output, now + duration


def test_random_workload_keeps_every_invariant_under_preemption() -> None:
    cfg = _config(max_num_batched_tokens=256, max_num_seqs=12, long_prefill_token_threshold=128)
    sched = Scheduler(cfg, num_kv_blocks=160, seed=1)  # 2560 tokens: preemption is certain
    sched.check_invariants = True
    rng = random.Random(7)
    requests = [Request(str(i), i * 0.005, rng.randint(16, 900), rng.randint(1, 300)) for i in range(80)]
    pending = list(requests)
    now, steps = 0.0, 0
    while pending or sched.has_unfinished():
        while pending and pending[0].arrival_s <= now:
            sched.add_request(pending.pop(0))
        if not sched.has_unfinished():
            now = pending[0].arrival_s
            continue
        output, now = _step(sched, now)
        steps += 1
        assert output.num_scheduled_tokens <= cfg.max_num_batched_tokens
        assert output.num_scheduled_tokens == sum(s.num_new_tokens for s in output.scheduled)
        assert len(sched.running) <= cfg.max_num_seqs
        assert len({id(s.request) for s in output.scheduled}) == len(output.scheduled)
        assert steps < 100_000
    assert sched.num_preemptions > 0
    assert all(
        r.status is RequestStatus.FINISHED and r.num_output_tokens == r.max_output_tokens for r in requests
    )
    assert sched.kv.num_free_blocks == sched.kv.num_blocks


def test_running_requests_are_served_before_waiting_ones_and_waiting_fcfs() -> None:
    sched = Scheduler(_config(max_num_batched_tokens=300), num_kv_blocks=1000)
    first = Request("first", 0.0, 1000, 4)
    second = Request("second", 0.0, 100, 4)
    sched.add_request(first)
    sched.add_request(second)
    output, now = _step(sched)
    assert [s.request.request_id for s in output.scheduled] == ["first"]  # budget gone on the older prompt
    assert output.scheduled[0].num_new_tokens == 300
    sched.add_request(Request("third", now, 50, 4))
    output, _ = _step(sched, now)
    assert [(s.request.request_id, s.num_new_tokens) for s in output.scheduled] == [("first", 300)]
    assert [r.request_id for r in sched.waiting] == ["second", "third"]


def test_long_prefill_threshold_caps_each_prompt_but_not_a_lone_request() -> None:
    cfg = _config(max_num_batched_tokens=1024, long_prefill_token_threshold=200)
    lone = Scheduler(cfg, num_kv_blocks=1000)
    lone.add_request(Request("a", 0.0, 900, 2))
    assert lone.schedule(0.0).scheduled[0].num_new_tokens == 900

    pair = Scheduler(cfg, num_kv_blocks=1000)
    pair.add_request(Request("a", 0.0, 900, 2))
    pair.add_request(Request("b", 0.0, 900, 2))
    assert [s.num_new_tokens for s in pair.schedule(0.0).scheduled] == [200, 200]


def test_adaptive_long_prefill_threshold_shares_the_budget_left_after_decodes() -> None:
    cfg = _config(
        max_num_batched_tokens=1024,
        long_prefill_token_threshold=100,
        long_prefill_token_threshold_adaptive=True,
    )
    sched = Scheduler(cfg, num_kv_blocks=1000)
    for i in range(4):
        sched.add_request(Request(str(i), 0.0, 2000, 2))
    # No decodes yet: (1024 - 0) // 4 prefilling requests = 256 each, above the 100 floor.
    assert [s.num_new_tokens for s in sched.schedule(0.0).scheduled] == [256, 256, 256, 256]


def test_max_num_active_seqs_caps_running_requests() -> None:
    sched = Scheduler(_config(max_num_active_seqs=3), num_kv_blocks=1000)
    for i in range(6):
        sched.add_request(Request(str(i), 0.0, 20, 50))
    output, _ = _step(sched)
    assert len(output.scheduled) == 3 and len(sched.running) == 3 and len(sched.waiting) == 3


def test_without_chunked_prefill_prompts_are_admitted_whole() -> None:
    sched = Scheduler(_config(max_num_batched_tokens=4096, enable_chunked_prefill=False), num_kv_blocks=1000)
    sched.add_request(Request("a", 0.0, 3000, 2))
    sched.add_request(Request("b", 0.0, 3000, 2))
    output = sched.schedule(0.0)
    assert [(s.request.request_id, s.num_new_tokens) for s in output.scheduled] == [("a", 3000)]


def test_legacy_partial_prefill_limits() -> None:
    cfg = _config(
        max_num_batched_tokens=4096,
        long_prefill_token_threshold=400,
        max_num_partial_prefills=2,
        max_long_partial_prefills=1,
    )
    sched = Scheduler(cfg, num_kv_blocks=1000)
    sched.add_request(Request("long1", 0.0, 2000, 2))
    sched.add_request(Request("long2", 0.0, 2000, 2))
    sched.add_request(Request("short", 0.0, 300, 2))
    output = sched.schedule(0.0)
    # One long prefill at a time; the short prompt behind the second long one may still go.
    assert [s.request.request_id for s in output.scheduled] == ["long1", "short"]


def test_kv_exhaustion_preempts_the_newest_running_request() -> None:
    sched = Scheduler(_config(max_num_batched_tokens=512), num_kv_blocks=8)  # 128 tokens
    sched.check_invariants = True
    old = Request("old", 0.0, 48, 100)
    new = Request("new", 0.0, 48, 100)
    sched.add_request(old)
    sched.add_request(new)
    now = 0.0
    preempted: list[str] = []
    while not preempted:
        output, now = _step(sched, now)
        preempted = [r.request_id for r in output.preempted]
    assert preempted == ["new"]
    assert new.status is RequestStatus.PREEMPTED and new.num_computed_tokens == 0
    assert sched.waiting[0] is new and sched.running == [old]


def test_speculative_tokens_count_towards_the_budget_and_advance_by_accepted_drafts() -> None:
    cfg = _config(
        max_num_batched_tokens=64, max_num_seqs=8, num_speculative_tokens=3, spec_acceptance_rate=1.0
    )
    sched = Scheduler(cfg, num_kv_blocks=1000)
    request = Request("a", 0.0, 10, 20)
    sched.add_request(request)
    _, now = _step(sched)
    assert request.num_output_tokens == 1
    output, _ = _step(sched, now)
    assert output.scheduled[0].num_new_tokens == 4 and output.scheduled[0].num_draft_tokens == 3
    assert request.num_output_tokens == 5  # all drafts accepted: 1 + 3


def test_abort_frees_blocks() -> None:
    sched = Scheduler(_config(), num_kv_blocks=100)
    request = Request("a", 0.0, 200, 50)
    sched.add_request(request)
    _step(sched)
    assert sched.kv.num_free_blocks < 100
    sched.abort(request, 1.0)
    assert request.finish_reason is FinishReason.ABORT
    assert sched.kv.num_free_blocks == 100 and not sched.has_unfinished()


@pytest.mark.parametrize(
    ("overrides", "flag"),
    [
        ({"max_num_batched_tokens": 8, "max_num_seqs": 16}, "--max-num-seqs"),
        ({"enable_chunked_prefill": False, "max_num_batched_tokens": 512}, "--max-model-len"),
        ({"long_prefill_token_threshold": 10_000}, "--long-prefill-token-threshold"),
        ({"max_num_active_seqs": 17}, "--max-num-active-seqs"),
        ({"max_long_partial_prefills": 1}, "--max-long-partial-prefills"),
        ({"num_speculative_tokens": 40}, "num_speculative_tokens"),
    ],
)
def test_invalid_configurations_name_the_flag(overrides: dict[str, object], flag: str) -> None:
    with pytest.raises(ValueError, match=flag):
        _config(**overrides)


def test_set_limits_lowers_the_budget_and_running_cap_between_steps() -> None:
    sched = Scheduler(_config(max_num_batched_tokens=512, max_num_seqs=8), num_kv_blocks=1000)
    for i in range(6):
        sched.add_request(Request(str(i), 0.0, 40, 50))
    output, now = _step(sched)
    assert len(sched.running) == 6 and output.num_scheduled_tokens == 240
    sched.set_limits(128, 4, 2)
    sched.add_request(Request("late", now, 1000, 4))
    while sched.has_unfinished():
        output, now = _step(sched, now)
        assert output.num_scheduled_tokens <= 128
        # The six already running keep going; nothing new is admitted above the lowered cap.
        if any(s.request.request_id == "late" for s in output.scheduled):
            assert len(sched.running) <= 2
    assert sched.config.max_running == 2


def test_set_limits_refuses_an_inconsistent_config() -> None:
    sched = Scheduler(_config(max_num_batched_tokens=512, max_num_seqs=16), num_kv_blocks=1000)
    with pytest.raises(ValueError, match="max-num-batched-tokens"):
        sched.set_limits(8, 16, None)
    assert sched.config.max_num_batched_tokens == 512
