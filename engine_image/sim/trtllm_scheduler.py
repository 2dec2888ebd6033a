"""TensorRT-LLM's in-flight batching (1.x PyTorch backend: ``SimpleScheduler`` =
``CapacityScheduler`` then ``MicroBatchScheduler``, ``tensorrt_llm/_torch/pyexecutor/scheduler.py``).

Each step the capacity scheduler first decides which requests are active, at most ``max_batch_size``,
FCFS with head-of-line blocking:

- ``GUARANTEED_NO_EVICT`` (the ``trtllm-serve`` default) admits a request only when the KV blocks for
  its whole prompt *and* its whole ``max_tokens`` fit beside what every active request still needs to
  completion, so nothing is ever evicted;
- ``MAX_UTILIZATION`` admits while the blocks for the prompt fit and, when a running request cannot
  get its next block, pauses (evicts, recomputed later) the most recently admitted one.

Then the micro-batch scheduler fills one in-flight batch under ``max_num_tokens``: generation
requests first, one token each (it stops at the first that does not fit), then context requests. With
chunked prefill (``enable_chunked_prefill``) the contexts share what is left of the budget:
``FIRST_COME_FIRST_SERVED`` chunking gives each in turn all it can take, a truncated chunk rounded down
to a multiple of ``tokens_per_block``; ``EQUAL_PROGRESS`` grows them all by ``tokens_per_block`` in
turn. Without
it a context runs whole or the batch stops there. Generation and context share every forward pass.

Simplifications: KV accounting uses the simulator's 16-token blocks (``tokens_per_block`` only sizes
the chunks), the reservation counts a shared prefix block once per request, and speculative decoding
is not simulated.
"""

from __future__ import annotations

from chunkpilot.engine.sim.scheduler import (
    CapacitySchedulerPolicy,
    ContextChunkingPolicy,
    Request,
    RequestStatus,
    ScheduledRequest,
    Scheduler,
    SchedulerOutput,
    TrtllmSchedulerConfig,
)


class TRTLLMScheduler(Scheduler):
    """Capacity scheduler (admission by KV policy) plus micro-batch scheduler (token budget)."""

    def __init__(self, config: TrtllmSchedulerConfig, num_kv_blocks: int, seed: int = 0) -> None:
        super().__init__(config, num_kv_blocks, seed)

    @property
    def trtllm_config(self) -> TrtllmSchedulerConfig:
        """:attr:`config` with TensorRT-LLM's own knobs (live adjustment replaces it in its class)."""
        cfg = self.config
        if not isinstance(cfg, TrtllmSchedulerConfig):
            raise TypeError(
                f"a TensorRT-LLM scheduler needs a TrtllmSchedulerConfig, not {type(cfg).__name__}"
            )
        return cfg

    def schedule(self, now: float) -> SchedulerOutput:
        """Admit by the capacity policy, then batch generation first and context chunks after."""
        preempted: list[Request] = []
        self._capacity(now)
        scheduled = self._micro_batch(now, preempted)
        return self._output(scheduled, preempted)

    # ---- capacity scheduler --------------------------------------------------------------------
    def _to_completion(self, request: Request) -> int:
        """Blocks ``request`` still needs to reach its full prompt plus ``max_tokens``."""
        total = self.kv.blocks_for(request.prompt_tokens + request.max_output_tokens)
        return max(0, total - request.held_blocks)

    def _capacity(self, now: float) -> None:
        cfg = self.trtllm_config
        no_evict = cfg.capacity_scheduler_policy is CapacitySchedulerPolicy.GUARANTEED_NO_EVICT
        if no_evict:
            available = self.kv.num_free_blocks - sum(self._to_completion(r) for r in self.running)
        else:
            available = self.kv.num_free_blocks - sum(
                max(0, self.kv.blocks_for(r.prompt_tokens) - r.held_blocks) for r in self.running
            )
        while self.waiting and len(self.running) < cfg.max_running:
            request = self.waiting[0]
            hits = self._prefix_hits(request)
            tokens = request.num_tokens + (request.max_output_tokens - request.num_output_tokens) * no_evict
            need = self.kv.blocks_for(tokens) - hits
            if need > available or not self._admit(0, hits, 0, now):
                break  # FCFS: the head of the queue blocks the rest
            available -= need

    # ---- micro-batch scheduler -----------------------------------------------------------------
    def _micro_batch(self, now: float, preempted: list[Request]) -> list[ScheduledRequest]:
        cfg = self.config
        budget = cfg.max_num_batched_tokens
        items: list[ScheduledRequest] = []
        contexts: list[Request] = []
        used = 0
        count = 0
        index = 0
        while index < len(self.running):
            request = self.running[index]
            if request.is_decoding:
                if used + 1 > budget:
                    break
                if not self._grow_or_pause(request, preempted):
                    break
                items.append(ScheduledRequest(request, 1, request.num_computed_tokens, 0, False))
                used += 1
            elif not cfg.enable_chunked_prefill:
                remaining = request.num_tokens - request.num_computed_tokens
                if used + remaining > budget or not self._grow(request, remaining):
                    break
                items.append(self._context(request, remaining, now))
                used += remaining
            else:
                contexts.append(request)
            count += 1
            index += 1
            if count >= cfg.max_num_seqs:
                break
        capacity = budget - used
        for request, size in self._chunk_sizes(contexts, capacity):
            if size <= 0:
                continue  # a truncated chunk below one block: nothing this step
            if not self._grow(request, size):
                break
            items.append(self._context(request, size, now))
        return items

    def _chunk_sizes(self, contexts: list[Request], capacity: int) -> list[tuple[Request, int]]:
        """Tokens of each waiting context this step: all of them when they fit, else chunked by policy."""
        live = [r for r in contexts if r.status is RequestStatus.RUNNING]  # paused ones dropped
        remaining = [r.num_tokens - r.num_computed_tokens for r in live]
        if sum(remaining) <= capacity:
            return list(zip(live, remaining, strict=True))
        cfg = self.trtllm_config
        unit = cfg.chunk_unit_size
        if cfg.context_chunking_policy is ContextChunkingPolicy.EQUAL_PROGRESS:
            sizes = [0] * len(live)
            used, progressed = 0, True
            while used < capacity and progressed:
                progressed = False
                for i, left in enumerate(remaining):
                    step = min(sizes[i] + unit, left) - sizes[i]
                    if step > 0 and used + step <= capacity:
                        sizes[i] += step
                        used += step
                        progressed = True
            return [(r, n) for r, n in zip(live, sizes, strict=True) if n > 0]
        out: list[tuple[Request, int]] = []
        for request, left in zip(live, remaining, strict=True):  # FIRST_COME_FIRST_SERVED
            size = left if left <= capacity else capacity // unit * unit
            out.append((request, size))
            capacity -= size
            if capacity <= 0:
                break
        return out

    def _context(self, request: Request, num_new: int, now: float) -> ScheduledRequest:
        if request.first_scheduled_s is None:
            request.first_scheduled_s = now
        return ScheduledRequest(request, num_new, request.num_computed_tokens, 0, True)

    def _grow_or_pause(self, request: Request, preempted: list[Request]) -> bool:
        """KV for a generation token; under MAX_UTILIZATION pause the newest requests until it fits."""
        while not self._grow(request, 1):
            if self.trtllm_config.capacity_scheduler_policy is CapacitySchedulerPolicy.GUARANTEED_NO_EVICT:
                return False  # cannot happen while the reservation holds
            victim = self.running.pop()
            self._preempt(victim)
            preempted.append(victim)
            if victim is request:
                return False
        return True
