"""SGLang's scheduling semantics (sglang 0.5.23: ``Scheduler.get_next_batch_to_run``, ``PrefillAdder``).

Each step runs either a prefill (extend) batch or a decode batch, prefill first whenever one can be
formed. A prefill batch continues the one request whose prompt is being chunked, then admits waiting
requests in policy order while three budgets last: ``--chunked-prefill-size`` tokens per pass
(``rem_chunk_tokens``; a prompt longer than what is left is truncated to it and becomes the chunked
request, at most one at a time), ``--max-prefill-tokens`` per batch (``rem_input_tokens``; with
chunking off the first request may exceed it, a later one may not) and the KV cache, which must hold
each new prompt plus its clipped ``max_new_tokens`` on top of an estimate of what the running requests
will still generate (``new_token_ratio``). ``--max-running-requests`` caps the running requests.

Without ``--enable-mixed-chunk`` a prefill batch holds prefill tokens only, so every running decode
waits for that whole pass: a prompt cut into ``n`` chunks stalls the decodes for ``n`` passes. With it,
the chunk shares the pass with one token of every running decode (both budgets shrink by their number).
A decode batch gives every running request one token; when the KV cache cannot hold them, the newest
running requests are retracted (back to the queue, recomputed later).

Simplifications: the radix cache is modelled at the simulator's 16-token block granularity (SGLang's
page size is 1), ``new_token_ratio`` is its initial value (SGLang decays it between retractions), and
speculative decoding is not simulated.
"""

from __future__ import annotations

from chunkpilot.engine.sim.scheduler import (
    Request,
    RequestStatus,
    ScheduledRequest,
    Scheduler,
    SchedulerOutput,
    SchedulingPolicy,
    SGLangSchedulerConfig,
)

#: ``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION``: the most output tokens a KV estimate counts per request.
CLIP_MAX_NEW_TOKENS = 4096
#: ``SGLANG_INIT_NEW_TOKEN_RATIO`` x ``--schedule-conservativeness`` (1.0).
NEW_TOKEN_RATIO = 0.7
#: SGLang falls back from ``lpm`` to ``fcfs`` when more requests than this are waiting.
LPM_QUEUE_LIMIT = 128


class SGLangScheduler(Scheduler):
    """Separate prefill and decode batches, one chunked request at a time (SGLang)."""

    def __init__(self, config: SGLangSchedulerConfig, num_kv_blocks: int, seed: int = 0) -> None:
        super().__init__(config, num_kv_blocks, seed)
        self.chunked: Request | None = None

    @property
    def sglang_config(self) -> SGLangSchedulerConfig:
        """:attr:`config` with SGLang's own knobs (live adjustment replaces it in its class)."""
        cfg = self.config
        if not isinstance(cfg, SGLangSchedulerConfig):
            raise TypeError(f"an SGLang scheduler needs an SGLangSchedulerConfig, not {type(cfg).__name__}")
        return cfg

    def schedule(self, now: float) -> SchedulerOutput:
        """A prefill batch when one can be formed (mixed with the decodes if enabled), else a decode batch."""
        cfg = self.sglang_config
        preempted: list[Request] = []
        if self.chunked is not None and self.chunked.status is not RequestStatus.RUNNING:
            self.chunked = None
        decoding = [r for r in self.running if r.is_decoding]
        mixed = cfg.enable_mixed_chunk and cfg.enable_chunked_prefill
        scheduled = self._prefill_batch(now, len(decoding) if mixed else 0)
        if not scheduled:
            scheduled = self._decode_batch(decoding, preempted)
        elif mixed and decoding:
            scheduled += self._decode_batch(decoding, preempted)
        return self._output(scheduled, preempted)

    def abort(self, request: Request, now: float) -> None:
        """Drop a request (and forget it as the chunked one)."""
        if request is self.chunked:
            self.chunked = None
        super().abort(request, now)

    # ---- the prefill adder ---------------------------------------------------------------------
    def _prefill_batch(self, now: float, mixed_decodes: int) -> list[ScheduledRequest]:
        cfg = self.sglang_config
        if not self.waiting and self.chunked is None:
            return []
        block = cfg.block_size
        rem_input = cfg.max_prefill_tokens - mixed_decodes
        rem_chunk = cfg.max_num_batched_tokens - mixed_decodes if cfg.enable_chunked_prefill else None
        rem_total = self.kv.num_free_blocks * block - sum(
            (
                min(r.max_output_tokens - r.num_output_tokens, CLIP_MAX_NEW_TOKENS) * NEW_TOKEN_RATIO
                for r in self.running
                if r is not self.chunked
            ),
            0.0,
        )
        items: list[ScheduledRequest] = []
        chunked = self.chunked
        if chunked is not None and rem_chunk is not None and rem_chunk > 0:
            remaining = chunked.num_tokens - chunked.num_computed_tokens
            num_new = min(remaining, rem_chunk)
            if self._grow(chunked, num_new):
                items.append(ScheduledRequest(chunked, num_new, chunked.num_computed_tokens, 0, True))
                rem_input -= num_new
                rem_chunk -= num_new
                rem_total -= num_new
                if num_new == remaining:
                    self.chunked = None
                    rem_total -= min(chunked.max_output_tokens, CLIP_MAX_NEW_TOKENS)
        if self.chunked is not None:
            return items  # the chunk took the whole pass (or memory is short): nobody else joins
        self._order_waiting()
        while self.waiting and rem_input > 0 and (rem_chunk is None or rem_chunk > 0) and rem_total > 0:
            if len(self.running) >= cfg.max_running:
                break
            request = self.waiting[0]
            hits = self._prefix_hits(request)
            extend = request.num_tokens - hits * block
            max_new = min(request.max_output_tokens - request.num_output_tokens, CLIP_MAX_NEW_TOKENS)
            if extend + max_new > rem_total:
                break  # NO_TOKEN: the KV cache cannot promise this request its output
            truncated = False
            if rem_chunk is None:
                if items and extend >= rem_input:
                    break
                num_new = extend
            elif extend > rem_chunk:
                num_new, truncated = rem_chunk, True
            else:
                num_new = extend
            if not self._admit(0, hits, num_new, now):
                break
            items.append(ScheduledRequest(request, num_new, hits * block, 0, True))
            rem_input -= num_new
            if rem_chunk is not None:
                rem_chunk -= num_new
            rem_total -= num_new + (0 if truncated else max_new)
            if truncated:
                self.chunked = request
                break
        return items

    def _order_waiting(self) -> None:
        policy = self.config.policy
        if policy is SchedulingPolicy.LPM and len(self.waiting) <= LPM_QUEUE_LIMIT:
            ordered = sorted(self.waiting, key=lambda r: -self._prefix_hits(r))
        elif policy is SchedulingPolicy.LOF:
            ordered = sorted(self.waiting, key=lambda r: -r.max_output_tokens)
        elif policy is SchedulingPolicy.RANDOM:
            ordered = list(self.waiting)
            self.rng.shuffle(ordered)
        else:
            return
        self.waiting.clear()
        self.waiting.extend(ordered)

    # ---- the decode batch ----------------------------------------------------------------------
    def _decode_batch(self, decoding: list[Request], preempted: list[Request]) -> list[ScheduledRequest]:
        """One token for every running decode; retract the newest ones while the KV cache is short."""
        items: list[ScheduledRequest] = []
        last = len(decoding)
        index = 0
        while index < last:
            request = decoding[index]
            while not self._grow(request, 1):
                last -= 1
                victim = decoding[last]
                self.running.remove(victim)
                self._preempt(victim)
                preempted.append(victim)
                if victim is request:
                    break
            if request.status is RequestStatus.RUNNING:
                items.append(ScheduledRequest(request, 1, request.num_computed_tokens, 0, False))
            index += 1
        return items
