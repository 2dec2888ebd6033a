"""vLLM V1 scheduling semantics: one pass per step over running, then waiting requests.

The other engines' policies (:mod:`~chunkpilot.engine.sim.sglang_scheduler`,
:mod:`~chunkpilot.engine.sim.trtllm_scheduler`) subclass :class:`Scheduler` and replace only
:meth:`Scheduler.schedule`; each engine's scheduler config is its own class
(:class:`SGLangSchedulerConfig`, :class:`TrtllmSchedulerConfig` subclass :class:`SchedulerConfig`,
which is vLLM's), and its class picks the policy (see ``make_scheduler`` in
:mod:`~chunkpilot.engine.sim.engine`).

Invariant at the top of every pass: each request is in exactly one of ``running`` (holding KV blocks
for its computed tokens) or ``waiting`` (FCFS order, preempted requests at the front, holding none),
and ``len(running) <= max_running``. Running requests are served first, in order: each takes
``min(tokens it still needs (1 + k for a decode with k draft tokens), budget left, long-prefill cap)``.
When its KV blocks cannot be allocated, the newest running request is preempted (recompute) until they
can. Then, unless something was preempted, waiting requests are admitted FCFS while the token budget,
the running-request limit and the KV cache allow; prefix-cache hits shrink the prompt still to compute
(at most ``prompt - 1`` tokens hit). Without chunked prefill a prompt is admitted only whole.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from types import MappingProxyType
from typing import ClassVar, Final

from chunkpilot.engine.sim.compiled import picklable
from chunkpilot.engine.sim.kvcache import BLOCK_SIZE, KVCacheManager
from chunkpilot.engine.sim.steptime import ForwardPass

from chunkpilot.api.knobs import CapacitySchedulerPolicy as CapacitySchedulerPolicy
from chunkpilot.api.knobs import ContextChunkingPolicy as ContextChunkingPolicy
from chunkpilot.api.knobs import Dialect

#: Whose scheduling semantics, flags and metric names the simulator reproduces: a flag dialect of
#: the knob table, which also owns TensorRT-LLM's scheduler policies (``chunkpilot.api.knobs``).
Engine = Dialect

#: The capacity-scheduler policies the simulator reproduces (``STATIC_BATCH`` is refused).
SIMULATED_CAPACITY_POLICIES: Final = frozenset(
    {CapacitySchedulerPolicy.GUARANTEED_NO_EVICT, CapacitySchedulerPolicy.MAX_UTILIZATION}
)


class SchedulingPolicy(Enum):
    """Order in which waiting requests are admitted (vLLM: FCFS; the others are SGLang's)."""

    FCFS = "fcfs"
    LPM = "lpm"  # longest prefix match first
    LOF = "lof"  # longest output first
    RANDOM = "random"


class PreemptionMode(Enum):
    """What happens to a preempted request's KV cache."""

    RECOMPUTE = "recompute"


class RequestStatus(Enum):
    """Lifecycle of a request inside the engine."""

    WAITING = "waiting"
    #: Decode side of a disaggregated request: KV blocks allocated, the remote prefill's KV in flight.
    WAITING_FOR_REMOTE_KVS = "waiting_for_remote_kvs"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


class FinishReason(Enum):
    """Why a request stopped (``finished_reason`` label of ``vllm:request_success_total``)."""

    LENGTH = "length"
    STOP = "stop"
    ABORT = "abort"


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """The scheduler knobs every engine's simulation honours, with vLLM's semantics and validation.

    The names follow vLLM's CLI flags: vLLM is the simulator's default engine. The other engines'
    configs (:class:`SGLangSchedulerConfig`, :class:`TrtllmSchedulerConfig`) subclass this one, add
    their own knobs and validate in their own wording; the common fields carry their knobs: SGLang's
    ``--chunked-prefill-size`` is ``max_num_batched_tokens`` (``enable_chunked_prefill`` false for
    -1) and ``--max-running-requests`` is ``max_num_seqs``; TensorRT-LLM's ``max_num_tokens`` is
    ``max_num_batched_tokens`` and ``max_batch_size`` is ``max_num_seqs``. The class says whose
    semantics run (:attr:`engine`); :func:`scheduler_config_class` maps an engine to its class.
    """

    #: Whose scheduling semantics, flags and metric names the simulator reproduces.
    engine: ClassVar[Engine] = Engine.VLLM

    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    max_num_active_seqs: int | None = None
    max_model_len: int = 8192
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    long_prefill_token_threshold_adaptive: bool = False
    max_num_partial_prefills: int | None = None
    max_long_partial_prefills: int | None = None
    enable_prefix_caching: bool = True
    num_speculative_tokens: int = 0
    spec_acceptance_rate: float = 0.7
    block_size: int = BLOCK_SIZE
    policy: SchedulingPolicy = SchedulingPolicy.FCFS
    preemption_mode: PreemptionMode = PreemptionMode.RECOMPUTE

    def __post_init__(self) -> None:
        errors = self.problems()
        if errors:
            raise ValueError("; ".join(errors))

    def problems(self) -> list[str]:
        """Configuration errors in the engine's wording, each naming the flag and the fix."""
        out: list[str] = []
        budget, seqs = self.max_num_batched_tokens, self.max_num_seqs
        if budget < 1 or seqs < 1 or self.max_model_len < 1:
            out.append("--max-num-batched-tokens, --max-num-seqs and --max-model-len must be positive")
        if budget < seqs:
            out.append(
                f"--max-num-batched-tokens ({budget}) must be greater than or equal to "
                f"--max-num-seqs ({seqs})"
            )
        if not self.enable_chunked_prefill and budget < self.max_model_len:
            out.append(
                f"--max-num-batched-tokens ({budget}) is smaller than --max-model-len ({self.max_model_len}) "
                "without chunked prefill: the longest prompt could never be scheduled; raise the budget or "
                "enable chunked prefill"
            )
        if self.long_prefill_token_threshold < 0 or self.long_prefill_token_threshold > self.max_model_len:
            out.append(
                f"--long-prefill-token-threshold ({self.long_prefill_token_threshold}) must be in "
                f"[0, --max-model-len ({self.max_model_len})]"
            )
        if self.max_num_active_seqs is not None and not 1 <= self.max_num_active_seqs <= seqs:
            out.append(
                f"--max-num-active-seqs ({self.max_num_active_seqs}) must be in [1, --max-num-seqs ({seqs})]"
            )
        if self.max_num_partial_prefills is not None and self.max_num_partial_prefills < 1:
            out.append("--max-num-partial-prefills must be >= 1")
        if self.max_long_partial_prefills is not None and (
            self.max_num_partial_prefills is None
            or not 1 <= self.max_long_partial_prefills <= self.max_num_partial_prefills
        ):
            out.append(
                "--max-long-partial-prefills needs --max-num-partial-prefills and must be in [1, that value]"
            )
        k = self.num_speculative_tokens
        if k < 0:
            out.append("num_speculative_tokens must be >= 0")
        if k and budget < seqs * (1 + k):
            out.append(
                f"--max-num-batched-tokens ({budget}) must be at least --max-num-seqs x (1 + "
                f"num_speculative_tokens) = {seqs * (1 + k)} with speculative decoding"
            )
        if not 0.0 <= self.spec_acceptance_rate <= 1.0:
            out.append("--spec-acceptance-rate must be in [0, 1]")
        return out

    def _vllm_only_problems(self) -> list[str]:
        """For another engine's config: the vLLM-only knobs it was given, which it cannot honour."""
        out: list[str] = []
        if self.num_speculative_tokens:
            out.append(f"speculative decoding is simulated for vLLM only, not {self.engine.value}")
        if not 0.0 <= self.spec_acceptance_rate <= 1.0:
            out.append("--spec-acceptance-rate must be in [0, 1]")
        for name in ("max_num_active_seqs", "max_num_partial_prefills", "max_long_partial_prefills"):
            if getattr(self, name) is not None:
                out.append(f"{name} is a vLLM knob; {self.engine.value} cannot honour it")
        if self.long_prefill_token_threshold:
            out.append(f"long_prefill_token_threshold is a vLLM knob; {self.engine.value} cannot honour it")
        return out

    @property
    def max_running(self) -> int:
        """Most requests that may be RUNNING at once."""
        if self.max_num_active_seqs is None:
            return self.max_num_seqs
        return min(self.max_num_seqs, self.max_num_active_seqs)

    @property
    def long_prompt_threshold(self) -> int:
        """Prompt length above which a prefill counts as long for the partial-prefill limits."""
        if self.long_prefill_token_threshold > 0:
            return self.long_prefill_token_threshold
        return max(1, int(0.04 * self.max_model_len))


@dataclass(frozen=True, slots=True)
class SGLangSchedulerConfig(SchedulerConfig):
    """SGLang's scheduler: the common knobs plus its own, validated in its own flags' wording."""

    engine: ClassVar[Engine] = Engine.SGLANG

    #: SGLang ``--max-prefill-tokens``: the token cap of one prefill batch.
    max_prefill_tokens: int = 16384
    #: SGLang ``--enable-mixed-chunk``: run a prefill chunk together with the running decodes.
    enable_mixed_chunk: bool = False

    def problems(self) -> list[str]:
        """Configuration errors in SGLang's wording, each naming the flag and the fix."""
        out: list[str] = []
        if self.max_num_batched_tokens < 1 or self.max_num_seqs < 1 or self.max_model_len < 1:
            out.append(
                "--chunked-prefill-size (or -1 to disable), --max-running-requests and "
                "--context-length must be positive"
            )
        if self.max_prefill_tokens < 1:
            out.append(f"--max-prefill-tokens ({self.max_prefill_tokens}) must be positive")
        if self.enable_mixed_chunk and not self.enable_chunked_prefill:
            out.append("--enable-mixed-chunk needs chunked prefill (--chunked-prefill-size > 0)")
        out += self._vllm_only_problems()
        return out


@dataclass(frozen=True, slots=True)
class TrtllmSchedulerConfig(SchedulerConfig):
    """TensorRT-LLM's scheduler: the common knobs plus its own, validated in its own options' wording."""

    engine: ClassVar[Engine] = Engine.TRTLLM

    #: TensorRT-LLM ``scheduler_config.capacity_scheduler_policy``.
    capacity_scheduler_policy: CapacitySchedulerPolicy = CapacitySchedulerPolicy.GUARANTEED_NO_EVICT
    #: TensorRT-LLM ``scheduler_config.context_chunking_policy``.
    context_chunking_policy: ContextChunkingPolicy = ContextChunkingPolicy.FIRST_COME_FIRST_SERVED
    #: TensorRT-LLM ``kv_cache_config.tokens_per_block``: a truncated context chunk is a multiple of it.
    chunk_unit_size: int = 32

    def problems(self) -> list[str]:
        """Configuration errors in TensorRT-LLM's wording, each naming the option and the fix."""
        out: list[str] = []
        if self.max_num_batched_tokens < 1 or self.max_num_seqs < 1 or self.max_model_len < 1:
            out.append("--max_num_tokens, --max_batch_size and --max_seq_len must be positive")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            out.append(
                f"--max_num_tokens ({self.max_num_batched_tokens}) is smaller than --max_seq_len "
                f"({self.max_model_len}) without chunked prefill: a long prompt could never be "
                "scheduled; raise --max_num_tokens, lower --max_seq_len or enable_chunked_prefill"
            )
        if self.capacity_scheduler_policy not in SIMULATED_CAPACITY_POLICIES:
            out.append(
                f"scheduler_config.capacity_scheduler_policy {self.capacity_scheduler_policy.value} is "
                f"not simulated; use one of {', '.join(sorted(SIMULATED_CAPACITY_POLICIES))}"
            )
        if self.chunk_unit_size < 1:
            out.append("kv_cache_config.tokens_per_block must be positive")
        elif self.enable_chunked_prefill and self.max_num_batched_tokens < self.chunk_unit_size:
            out.append(
                f"--max_num_tokens ({self.max_num_batched_tokens}) must be at least "
                f"kv_cache_config.tokens_per_block ({self.chunk_unit_size}) with chunked prefill"
            )
        out += self._vllm_only_problems()
        return out


#: Each engine's scheduler config class: the one table that maps an engine to its knobs.
SCHEDULER_CONFIGS: Final[Mapping[Engine, type[SchedulerConfig]]] = MappingProxyType(
    {
        Engine.VLLM: SchedulerConfig,
        Engine.SGLANG: SGLangSchedulerConfig,
        Engine.TRTLLM: TrtllmSchedulerConfig,
    }
)


def scheduler_config_class(engine: Engine | str) -> type[SchedulerConfig]:
    """The scheduler config class of ``engine`` (a :class:`Engine` or its name)."""
    return SCHEDULER_CONFIGS[Engine(engine)]


@dataclass(eq=False, slots=True, init=False)
class Request:
    """One generation request and its progress (times in simulated seconds)."""

    request_id: str
    arrival_s: float
    prompt_tokens: int
    max_output_tokens: int
    block_hashes: tuple[int, ...] = ()
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    plain_blocks: int = 0
    cached_hashes: list[int] = field(default_factory=list)
    num_preemptions: int = 0
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    finish_s: float | None = None
    finish_reason: FinishReason | None = None
    #: Prefill side of a disaggregated request (``do_remote_decode``): on finishing, its KV blocks
    #: stay allocated in :attr:`Scheduler.held` until the decode side has read them.
    kv_hold: bool = False
    #: Decode side of a disaggregated request (``do_remote_prefill``): its prompt's KV comes from a
    #: remote prefill engine instead of being computed here.
    remote_prefill: bool = False
    #: When the remote KV of a WAITING_FOR_REMOTE_KVS request has arrived (simulated seconds).
    kv_ready_s: float | None = None
    #: Prompt tokens whose KV came from a remote engine (vLLM's ``num_external_computed_tokens``).
    num_external_tokens: int = 0

    def __init__(
        self,
        request_id: str,
        arrival_s: float,
        prompt_tokens: int,
        max_output_tokens: int,
        block_hashes: tuple[int, ...] = (),
        status: RequestStatus = RequestStatus.WAITING,
        num_computed_tokens: int = 0,
        num_output_tokens: int = 0,
        num_cached_tokens: int = 0,
        plain_blocks: int = 0,
        cached_hashes: list[int] | None = None,
        num_preemptions: int = 0,
        first_scheduled_s: float | None = None,
        first_token_s: float | None = None,
        last_token_s: float | None = None,
        finish_s: float | None = None,
        finish_reason: FinishReason | None = None,
        kv_hold: bool = False,
        remote_prefill: bool = False,
        kv_ready_s: float | None = None,
        num_external_tokens: int = 0,
    ) -> None:
        self.request_id = request_id
        self.arrival_s = arrival_s
        self.prompt_tokens = prompt_tokens
        self.max_output_tokens = max_output_tokens
        self.block_hashes = block_hashes
        self.status = status
        self.num_computed_tokens = num_computed_tokens
        self.num_output_tokens = num_output_tokens
        self.num_cached_tokens = num_cached_tokens
        self.plain_blocks = plain_blocks
        self.cached_hashes = [] if cached_hashes is None else cached_hashes
        self.num_preemptions = num_preemptions
        self.first_scheduled_s = first_scheduled_s
        self.first_token_s = first_token_s
        self.last_token_s = last_token_s
        self.finish_s = finish_s
        self.finish_reason = finish_reason
        self.kv_hold = kv_hold
        self.remote_prefill = remote_prefill
        self.kv_ready_s = kv_ready_s
        self.num_external_tokens = num_external_tokens

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens known so far."""
        return self.prompt_tokens + self.num_output_tokens

    @property
    def held_blocks(self) -> int:
        """KV blocks this request holds."""
        return self.plain_blocks + len(self.cached_hashes)

    @property
    def is_decoding(self) -> bool:
        """True when only the last sampled token is left to compute."""
        return (
            self.prompt_tokens + self.num_output_tokens - self.num_computed_tokens == 1
            and self.num_output_tokens > 0
        )


@dataclass(slots=True, init=False)
class ScheduledRequest:
    """Tokens one request computes in this step.

    One is built per request per step (a capacity search builds millions): a slotted dataclass with
    its own ``__init__``, which the compiled core compiles (a generated one it runs as Python).
    """

    request: Request
    num_new_tokens: int
    num_computed_before: int
    num_draft_tokens: int
    is_prefill: bool

    def __init__(
        self,
        request: Request,
        num_new_tokens: int,
        num_computed_before: int,
        num_draft_tokens: int,
        is_prefill: bool,
    ) -> None:
        self.request = request
        self.num_new_tokens = num_new_tokens
        self.num_computed_before = num_computed_before
        self.num_draft_tokens = num_draft_tokens
        self.is_prefill = is_prefill


@dataclass(slots=True, init=False)
class SchedulerOutput:
    """The batch of one step (never changed once built; not frozen for :class:`ForwardPass`'s reason)."""

    scheduled: tuple[ScheduledRequest, ...]
    preempted: tuple[Request, ...]
    num_scheduled_tokens: int
    forward_pass: ForwardPass

    def __init__(
        self,
        scheduled: tuple[ScheduledRequest, ...],
        preempted: tuple[Request, ...],
        num_scheduled_tokens: int,
        forward_pass: ForwardPass,
    ) -> None:
        self.scheduled = scheduled
        self.preempted = preempted
        self.num_scheduled_tokens = num_scheduled_tokens
        self.forward_pass = forward_pass

    @property
    def is_empty(self) -> bool:
        """True when nothing was scheduled."""
        return not self.scheduled


@dataclass(slots=True, init=False)
class RequestOutput:
    """What one request produced in one step (built like :class:`ScheduledRequest`, for its reason)."""

    request: Request
    new_tokens: int
    is_first_token: bool
    finished: bool
    previous_token_s: float | None

    def __init__(
        self,
        request: Request,
        new_tokens: int,
        is_first_token: bool,
        finished: bool,
        previous_token_s: float | None,
    ) -> None:
        self.request = request
        self.new_tokens = new_tokens
        self.is_first_token = is_first_token
        self.finished = finished
        self.previous_token_s = previous_token_s


class Scheduler:
    """Request queues, KV-cache accounting and the per-step scheduling decision."""

    def __init__(self, config: SchedulerConfig, num_kv_blocks: int, seed: int = 0) -> None:
        self.config = config
        self.kv = KVCacheManager(num_kv_blocks, config.block_size, config.enable_prefix_caching)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.rng = random.Random(seed)
        self.num_preemptions = 0
        self.check_invariants = False
        #: Finished prefill-side requests whose KV blocks a decode engine has not released yet.
        self.held: dict[str, Request] = {}
        #: Seconds to receive ``n`` tokens of remote KV; set on engines that decode remote prefills.
        self.kv_transfer_s: Callable[[int], float] | None = None
        #: Decode-side requests whose remote KV arrived (drained by whoever releases the prefill side).
        self.received: list[Request] = []

    def set_limits(
        self, max_num_batched_tokens: int, max_num_seqs: int, max_num_active_seqs: int | None
    ) -> None:
        """Change the token budget and the sequence limits between steps (live adjustment).

        Like the vLLM plugin, a lower running limit only stops admissions: requests already
        running above it finish normally. Raises ValueError for an inconsistent config.
        """
        self.config = replace(
            self.config,
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
            max_num_active_seqs=max_num_active_seqs,
        )

    # ---- queue operations ------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        """Queue a new request (FCFS)."""
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        """True while any request is waiting or running."""
        return bool(self.waiting or self.running)

    def release_held(self, request_id: str) -> bool:
        """Free the KV blocks a finished prefill-side request kept for its decode side."""
        request = self.held.pop(request_id, None)
        if request is None:
            return False
        self._free(request)
        return True

    def next_kv_ready_s(self) -> float:
        """Earliest arrival of a remote KV still in flight (inf when none)."""
        return min(
            (r.kv_ready_s for r in self.waiting if r.kv_ready_s is not None),
            default=math.inf,
        )

    def abort(self, request: Request, now: float) -> None:
        """Drop a request wherever it is and free its blocks."""
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
            self._free(request)
        elif request in self.waiting:
            self.waiting.remove(request)
            self._free(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = FinishReason.ABORT
        request.finish_s = now

    # ---- the pass --------------------------------------------------------------------------
    def schedule(self, now: float) -> SchedulerOutput:
        """Decide the batch of the next step (vLLM V1 order: running first, then waiting FCFS)."""
        cfg = self.config
        k = cfg.num_speculative_tokens
        token_budget = cfg.max_num_batched_tokens
        running_before = len(self.running)  # above max_running only after a live lowering
        scheduled: list[ScheduledRequest] = []
        preempted: list[Request] = []
        cap = self._long_prefill_cap()
        partial_prefills = 0
        long_partial_prefills = 0
        limit_partials = cfg.max_num_partial_prefills is not None

        block_size = cfg.block_size
        max_model_len = cfg.max_model_len
        running = self.running
        allocate = self.kv.allocate
        append = scheduled.append
        req_index = 0
        while req_index < len(running) and token_budget > 0:
            request = running[req_index]
            computed = request.num_computed_tokens
            outputs = request.num_output_tokens
            remaining = request.prompt_tokens + outputs - computed
            decoding = remaining == 1 and outputs > 0
            if decoding:
                drafts = (k if k < token_budget - 1 else token_budget - 1) if k else 0
                num_new = 1 + drafts
            else:
                drafts = 0
                num_new = remaining if not 0 < cap < remaining else cap
            if num_new > token_budget:
                num_new = token_budget
            if num_new > max_model_len - computed:
                num_new = max_model_len - computed
            if num_new <= 0:
                req_index += 1
                continue
            if not decoding and limit_partials:
                is_long = request.prompt_tokens > cfg.long_prompt_threshold
                if not self._partial_allowed(partial_prefills, long_partial_prefills, is_long):
                    req_index += 1
                    continue
                partial_prefills += 1
                long_partial_prefills += is_long
            held = request.plain_blocks + len(request.cached_hashes)
            needed = -(-(computed + num_new) // block_size) - held
            if needed > 0:
                while not allocate(needed):
                    victim = running.pop()
                    self._preempt(victim)
                    preempted.append(victim)
                    if victim is request:
                        break
                if request.status is not RequestStatus.RUNNING:
                    break
                request.plain_blocks += needed
            if drafts >= num_new:
                drafts = num_new - 1
            append(ScheduledRequest(request, num_new, computed, drafts, not decoding))
            token_budget -= num_new
            req_index += 1

        if not preempted:
            if self.kv_transfer_s is not None:
                self._receiving_first()
            index = 0
            while index < len(self.waiting) and token_budget > 0 and len(self.running) < cfg.max_running:
                request = self.waiting[index]
                if request.remote_prefill:
                    ready = self._remote_kv_ready(request, now)
                    if ready is None:
                        break  # no KV blocks for its prompt (vLLM stops admitting too)
                    if not ready:
                        index += 1  # its KV is still on the way
                        continue
                hits = 0
                if request.num_computed_tokens == 0 and request.block_hashes:
                    hits = self.kv.lookup(request.block_hashes, request.num_tokens)
                cached_tokens = hits * cfg.block_size or request.num_computed_tokens
                num_new = request.num_tokens - cached_tokens
                if 0 < cap < num_new:
                    num_new = cap
                if not cfg.enable_chunked_prefill and num_new > token_budget:
                    break
                num_new = min(num_new, token_budget)
                if limit_partials:
                    is_long = request.prompt_tokens > cfg.long_prompt_threshold
                    if not self._partial_allowed(partial_prefills, long_partial_prefills, is_long):
                        if is_long and partial_prefills < (cfg.max_num_partial_prefills or 0):
                            index += 1  # a short prompt behind may still go (legacy partial-prefill rule)
                            continue
                        break
                hit_hashes = request.block_hashes[:hits]
                self.kv.acquire_cached(hit_hashes)
                needed = self.kv.blocks_for(cached_tokens + num_new) - hits - request.plain_blocks
                if not self.kv.allocate(needed):
                    self.kv.release(0, list(hit_hashes))
                    break
                if limit_partials:
                    partial_prefills += 1
                    long_partial_prefills += request.prompt_tokens > cfg.long_prompt_threshold
                del self.waiting[index]
                if request.block_hashes and request.status is RequestStatus.WAITING:
                    self.kv.record_query(request.prompt_tokens, hits)
                request.cached_hashes = list(hit_hashes)
                request.plain_blocks += max(needed, 0)
                request.num_computed_tokens = cached_tokens
                if request.num_preemptions == 0:
                    request.num_cached_tokens = cached_tokens
                if request.first_scheduled_s is None:
                    request.first_scheduled_s = now
                request.status = RequestStatus.RUNNING
                self.running.append(request)
                scheduled.append(ScheduledRequest(request, num_new, cached_tokens, 0, True))
                token_budget -= num_new

        total = cfg.max_num_batched_tokens - token_budget
        assert 0 <= total <= cfg.max_num_batched_tokens, "token budget overrun"
        assert len(self.running) <= max(cfg.max_running, running_before), "running-request limit exceeded"
        if self.check_invariants:
            self._check()
        return SchedulerOutput(
            tuple(scheduled), tuple(preempted), total, self._forward_pass(scheduled, total)
        )

    def update(self, output: SchedulerOutput, now: float) -> list[RequestOutput]:
        """Apply a finished step at time ``now``: advance computed tokens, sample, finish requests."""
        results: list[RequestOutput] = []
        self._apply(output, now, results, None)
        return results

    def advance(self, output: SchedulerOutput, now: float, itl: list[float]) -> None:
        """:meth:`update`, recording only the inter-token latency of every token sampled after a
        request's first into ``itl`` (the offline run's use, without a record per request)."""
        self._apply(output, now, None, itl)

    def _apply(
        self,
        output: SchedulerOutput,
        now: float,
        results: list[RequestOutput] | None,
        itl: list[float] | None,
    ) -> None:
        cfg = self.config
        max_model_len = cfg.max_model_len
        promote = self.kv.enable_prefix_caching
        block_size = cfg.block_size
        finished: list[Request] = []
        for item in output.scheduled:
            request, num_new, drafts = item.request, item.num_new_tokens, item.num_draft_tokens
            if request.status is not RequestStatus.RUNNING:
                continue
            computed = request.num_computed_tokens + num_new - drafts
            request.num_computed_tokens = computed
            hashes = request.block_hashes
            if (
                promote
                and hashes
                and request.plain_blocks > 0
                and len(request.cached_hashes) < len(hashes)
                and (len(request.cached_hashes) + 1) * block_size <= computed
            ):
                self._promote_full_blocks(request)
            outputs = request.num_output_tokens
            if computed < request.prompt_tokens + outputs:
                continue  # partial prefill: nothing sampled yet
            accepted = 0
            if drafts:
                accept = cfg.spec_acceptance_rate
                while accepted < drafts and self.rng.random() < accept:
                    accepted += 1
            new_tokens = 1 + accepted
            if new_tokens > request.max_output_tokens - outputs:
                new_tokens = request.max_output_tokens - outputs
            outputs += new_tokens
            request.num_output_tokens = outputs
            request.num_computed_tokens = computed + new_tokens - 1
            previous = request.last_token_s
            is_first = request.first_token_s is None
            if is_first:
                request.first_token_s = now
            request.last_token_s = now
            done = outputs >= request.max_output_tokens or request.prompt_tokens + outputs >= max_model_len
            if results is not None:
                results.append(RequestOutput(request, new_tokens, is_first, done, previous))
            elif itl is not None and not is_first and previous is not None:
                itl.append(now - previous)
            if done:
                finished.append(request)
        for request in finished:
            self.finish(request, now, FinishReason.LENGTH)

    def finish(self, request: Request, now: float, reason: FinishReason) -> None:
        """Retire a running request and free its blocks (a ``kv_hold`` request keeps them in
        :attr:`held` for its remote decode, like vLLM's KV connectors delaying the free)."""
        self.running.remove(request)
        if request.kv_hold and reason is FinishReason.LENGTH:
            self.held[request.request_id] = request
        else:
            self._free(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        request.finish_s = now

    def _receiving_first(self) -> None:
        """Put the requests receiving remote KV at the front of the waiting queue, as vLLM re-queues
        them after every pass: one that cannot get blocks (a preempted request) never stands in front
        of one whose KV has arrived and whose blocks it would free by finishing."""
        waiting = self.waiting
        if any(r.status is RequestStatus.WAITING_FOR_REMOTE_KVS for r in waiting):
            receiving = [r for r in waiting if r.status is RequestStatus.WAITING_FOR_REMOTE_KVS]
            others = [r for r in waiting if r.status is not RequestStatus.WAITING_FOR_REMOTE_KVS]
            waiting.clear()
            waiting.extend(receiving + others)

    def _remote_kv_ready(self, request: Request, now: float) -> bool | None:
        """Decode side of a disaggregated request, met in the waiting pass.

        As vLLM's KV connectors do: on first sight allocate the blocks for its whole prompt and start
        receiving (WAITING_FOR_REMOTE_KVS; None when the blocks are not free); once the KV has
        arrived the prompt counts as computed except its last token, which this engine computes to
        sample the first token, and the request is admitted like any other (True).
        """
        if request.kv_ready_s is None:
            blocks = self.kv.blocks_for(request.prompt_tokens)
            if not self.kv.allocate(blocks):
                return None
            request.plain_blocks = blocks
            request.status = RequestStatus.WAITING_FOR_REMOTE_KVS
            seconds = self.kv_transfer_s(request.prompt_tokens) if self.kv_transfer_s else 0.0
            request.kv_ready_s = now + seconds
            if seconds > 0:
                return False
        if now < request.kv_ready_s:
            return False
        request.remote_prefill = False
        request.kv_ready_s = None
        request.status = RequestStatus.WAITING
        request.num_computed_tokens = request.prompt_tokens - 1
        request.num_external_tokens = request.prompt_tokens
        self.received.append(request)
        return True

    # ---- building blocks of the other engines' policies -------------------------------------
    def _prefix_hits(self, request: Request) -> int:
        """Leading prompt blocks of a waiting request resident in the prefix cache."""
        if request.num_computed_tokens == 0 and request.block_hashes:
            return self.kv.lookup(request.block_hashes, request.num_tokens)
        return 0

    def _admit(self, index: int, hits: int, num_new: int, now: float) -> bool:
        """Move ``waiting[index]`` to ``running`` holding its ``hits`` cached blocks plus KV for
        ``num_new`` more tokens; False, with nothing changed, when those blocks are not free."""
        request = self.waiting[index]
        cached_tokens = hits * self.config.block_size
        hit_hashes = request.block_hashes[:hits]
        self.kv.acquire_cached(hit_hashes)
        needed = self.kv.blocks_for(cached_tokens + num_new) - hits
        if not self.kv.allocate(needed):
            self.kv.release(0, list(hit_hashes))
            return False
        del self.waiting[index]
        if request.block_hashes and request.status is RequestStatus.WAITING:
            self.kv.record_query(request.prompt_tokens, hits)
        request.cached_hashes = list(hit_hashes)
        request.plain_blocks = max(needed, 0)
        request.num_computed_tokens = cached_tokens
        if request.num_preemptions == 0:
            request.num_cached_tokens = cached_tokens
        if num_new > 0 and request.first_scheduled_s is None:
            request.first_scheduled_s = now
        request.status = RequestStatus.RUNNING
        self.running.append(request)
        return True

    def _grow(self, request: Request, num_new: int) -> bool:
        """Allocate the KV blocks a running request needs for ``num_new`` more tokens."""
        needed = self.kv.blocks_for(request.num_computed_tokens + num_new) - request.held_blocks
        if needed <= 0:
            return True
        if not self.kv.allocate(needed):
            return False
        request.plain_blocks += needed
        return True

    def _output(self, scheduled: list[ScheduledRequest], preempted: list[Request]) -> SchedulerOutput:
        total = sum(item.num_new_tokens for item in scheduled)
        if self.check_invariants:
            self._check()
        return SchedulerOutput(
            tuple(scheduled), tuple(preempted), total, self._forward_pass(scheduled, total)
        )

    # ---- helpers ---------------------------------------------------------------------------
    def _long_prefill_cap(self) -> int:
        """Per-request prefill cap of this step (0 = none); never applied to a lone request."""
        cfg = self.config
        threshold = cfg.long_prefill_token_threshold
        if threshold <= 0 or len(self.running) + len(self.waiting) <= 1:
            return 0
        if not cfg.long_prefill_token_threshold_adaptive:
            return threshold
        decoding = sum(1 for r in self.running if r.is_decoding)
        prefilling = len(self.running) - decoding + len(self.waiting)
        left = cfg.max_num_batched_tokens - decoding * (1 + cfg.num_speculative_tokens)
        return max(threshold, left // max(1, prefilling))

    def _partial_allowed(self, partials: int, long_partials: int, is_long: bool) -> bool:
        cfg = self.config
        if cfg.max_num_partial_prefills is not None and partials >= cfg.max_num_partial_prefills:
            return False
        return not (
            is_long
            and cfg.max_long_partial_prefills is not None
            and long_partials >= cfg.max_long_partial_prefills
        )

    def _promote_full_blocks(self, request: Request) -> None:
        size = self.config.block_size
        index = len(request.cached_hashes)
        hashes = request.block_hashes
        while (
            index < len(hashes)
            and (index + 1) * size <= request.num_computed_tokens
            and request.plain_blocks > 0
        ):
            self.kv.promote(hashes[index])
            request.cached_hashes.append(hashes[index])
            request.plain_blocks -= 1
            index += 1

    def _preempt(self, request: Request) -> None:
        self._free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    def _free(self, request: Request) -> None:
        self.kv.release(request.plain_blocks, request.cached_hashes)
        request.plain_blocks = 0
        request.cached_hashes = []

    def _forward_pass(self, scheduled: list[ScheduledRequest], total: int) -> ForwardPass:
        pairs = 0.0
        prefill_ctx = decode_ctx = sampled = 0
        for item in scheduled:
            before = item.num_computed_before
            end = before + item.num_new_tokens
            if item.is_prefill:
                pairs += ForwardPass.prefill_pairs(item.num_new_tokens, before)
                prefill_ctx += end
            else:
                decode_ctx += end
            request, drafts = item.request, item.num_draft_tokens
            if end - drafts >= request.prompt_tokens + request.num_output_tokens:
                sampled += 1 + drafts
        return ForwardPass(total, len(scheduled), sampled, pairs, prefill_ctx, decode_ctx)

    def _check(self) -> None:
        seen = {id(r) for r in self.running}
        assert len(seen) == len(self.running), "request scheduled twice"
        assert not seen & {id(r) for r in self.waiting}, "request both waiting and running"
        for request in self.running:
            assert request.held_blocks * self.config.block_size >= request.num_computed_tokens, (
                "KV under-allocated"
            )
        for request in self.waiting:
            if request.status is not RequestStatus.WAITING_FOR_REMOTE_KVS and not request.num_external_tokens:
                assert request.held_blocks == 0, "waiting request holds blocks"
        outside = sum(r.plain_blocks for r in self.waiting) + sum(r.plain_blocks for r in self.held.values())
        self.kv.check_invariants(sum(r.plain_blocks for r in self.running) + outside)


picklable(SchedulerConfig, SGLangSchedulerConfig, TrtllmSchedulerConfig)
