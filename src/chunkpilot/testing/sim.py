"""The simulator's long-prompt scenario: 64 streams decode, then a 32k-token prompt arrives.

The engine is driven step by step with hand-built requests, so the numbers come from the same scheduler
and step-time model that serve traffic.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from chunkpilot.engine.sim.engine import SimConfig
from chunkpilot.engine.sim.scheduler import Engine, Request, scheduler_config_class

#: The long prompt's length in tokens.
LONG_PROMPT = 32_768
#: How many streams decode when it arrives.
STREAMS = 64
#: The context of each stream unless told: a multi-turn chat.
STREAM_CONTEXT = 4096
#: The model length the scheduler is built with.
MAX_LEN = 40_960


@dataclass
class LongPromptRun:
    """What the streams saw after the long prompt arrived, and that prompt's TTFT."""

    stream_itl_s: list[float] = field(default_factory=list)
    long_ttft_s: float = 0.0
    #: Steps with no decode in them while streams were waiting to decode.
    stalled_steps: int = 0
    #: Prefill tokens of each step that computed part of the long prompt.
    long_chunks: list[int] = field(default_factory=list)

    @property
    def p50(self) -> float:
        return statistics.median(self.stream_itl_s)

    @property
    def ratio(self) -> float:
        return max(self.stream_itl_s) / self.p50


def long_prompt_among_streams(
    budget: int,
    chunked: bool,
    stream_context: int = STREAM_CONTEXT,
    engine: Engine = Engine.VLLM,
    **knobs: Any,
) -> LongPromptRun:
    """64 streams decode; once all of them have a first token a 32k-token prompt arrives.

    ITLs of the streams are recorded from that arrival until 3 simulated seconds after the long
    prompt's first token, so steady decode steps are the majority in every configuration. ``engine``
    picks the scheduler config class; ``knobs`` are further fields of it (its own scheduling options).
    """
    scheduler = scheduler_config_class(engine)(
        max_num_batched_tokens=budget,
        max_num_seqs=128,
        max_model_len=MAX_LEN,
        enable_chunked_prefill=chunked,
        enable_prefix_caching=False,
        **knobs,
    )
    core = SimConfig(
        model="llama-3.1-70b", accelerator="h100", tensor_parallel_size=4, scheduler=scheduler
    ).build()
    sched = core.scheduler
    sched.check_invariants = True
    streams = [Request(f"s{i}", 0.0, stream_context, 5000) for i in range(STREAMS)]
    for request in streams:
        sched.add_request(request)
    run = LongPromptRun()
    long: Request | None = None
    now = 0.0
    while long is None or long.first_token_s is None or now < long.first_token_s + 3.0:
        if long is None and all(r.first_token_s is not None for r in streams):
            long = Request("long", now, LONG_PROMPT, 1)
            sched.add_request(long)
        step = core.step(now)
        assert step is not None
        if long is not None:
            items = step.output.scheduled
            if not any(not item.is_prefill for item in items):
                run.stalled_steps += 1
            run.long_chunks += [item.num_new_tokens for item in items if item.request is long]
            for out in step.results:
                if out.request is not long and out.previous_token_s is not None:
                    run.stream_itl_s.append(step.end_s - out.previous_token_s)
        now = step.end_s
    assert long is not None and long.first_token_s is not None
    run.long_ttft_s = long.first_token_s - long.arrival_s
    return run
