"""Offline (discrete-event) mode: run a workload through the engine as fast as possible.

Between events (an arrival, a request finishing, the KV cache filling up) a batch of pure decodes
repeats with one more context token per sequence each step, so its step time grows linearly. Such
stretches are advanced in bulk: the step times are summed in closed form per step without touching
the requests, and the requests are updated once at the end. Everything else runs the scheduler step
by step.
"""

from __future__ import annotations

import gc
import math
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt
from chunkpilot.engine.sim.compiled import picklable
from chunkpilot.engine.sim.engine import EngineCore, SimConfig
from chunkpilot.engine.sim.metrics import StepShape, StepTelemetry
from chunkpilot.engine.sim.scheduler import FinishReason, Request
from chunkpilot.engine.sim.workload import Workload

FloatArray = npt.NDArray[np.float64]
PERCENTILES = (50, 90, 95, 99)


@dataclass(frozen=True, slots=True)
class SLO:
    """Latency objectives: a quantile (0-1) and a maximum in milliseconds for ITL and TTFT."""

    itl_ms: float = 50.0
    itl_quantile: float = 0.99
    ttft_ms: float = 2000.0
    ttft_quantile: float = 0.95

    def __post_init__(self) -> None:
        for name in ("itl_quantile", "ttft_quantile"):
            if not 0.0 < getattr(self, name) < 1.0:
                raise ValueError(f"--slo-{name.replace('_', '-')} must be in (0, 1)")
        if self.itl_ms <= 0 or self.ttft_ms <= 0:
            raise ValueError("--slo-itl-ms and --slo-ttft-ms must be positive")


@dataclass(frozen=True, slots=True)
class Percentiles:
    """Distribution summary in milliseconds."""

    p50: float
    p90: float
    p95: float
    p99: float
    max: float
    mean: float

    @classmethod
    def of(
        cls, values_s: FloatArray, weights: FloatArray | None = None, ordered: SortedSample | None = None
    ) -> Percentiles:
        """Weighted percentiles of ``values_s`` (seconds), reported in milliseconds; ``ordered`` is the
        same sample already sorted, when the caller has it."""
        if values_s.size == 0:
            nan = math.nan
            return cls(nan, nan, nan, nan, nan, nan)
        sample = ordered or SortedSample(values_s, weights)
        qs = [sample.quantile(p / 100) * 1e3 for p in PERCENTILES]
        mean = float(np.average(values_s, weights=weights)) * 1e3
        return cls(qs[0], qs[1], qs[2], qs[3], float(values_s.max()) * 1e3, mean)


class SortedSample:
    """A non-empty sample sorted once, for any number of its quantiles (inverted CDF).

    Weights are integer-like, so their running sums are exact and the order of tied values does not
    change any quantile: the sort need not be stable.
    """

    def __init__(self, values: FloatArray, weights: FloatArray | None = None) -> None:
        order = np.argsort(values)
        self.ordered: FloatArray = values[order]
        self.cumulative: FloatArray = np.cumsum(
            weights[order] if weights is not None else np.ones(values.size)
        )

    def quantile(self, q: float) -> float:
        """The smallest value whose cumulative weight reaches ``q`` of the total."""
        index = int(np.searchsorted(self.cumulative, q * self.cumulative[-1], side="left"))
        return float(self.ordered[min(index, self.ordered.size - 1)])


def quantile(values: FloatArray, q: float, weights: FloatArray | None = None) -> float:
    """The ``q`` quantile (inverted CDF) of ``values`` with optional integer-like weights."""
    if values.size == 0:
        return math.nan
    if weights is None:
        return float(np.quantile(values, q, method="inverted_cdf"))
    return SortedSample(values, weights).quantile(q)


@dataclass(slots=True, init=False)
class RequestRecord:
    """Latencies of one finished request (seconds; never changed once made).

    One per request: not frozen and with its own ``__init__``, which the compiled core compiles (it
    runs a generated one as Python).
    """

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int
    queue_s: float
    ttft_s: float
    e2e_s: float
    tpot_s: float
    preemptions: int

    def __init__(
        self,
        arrival_s: float,
        prompt_tokens: int,
        output_tokens: int,
        cached_tokens: int,
        queue_s: float,
        ttft_s: float,
        e2e_s: float,
        tpot_s: float,
        preemptions: int,
    ) -> None:
        self.arrival_s = arrival_s
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.cached_tokens = cached_tokens
        self.queue_s = queue_s
        self.ttft_s = ttft_s
        self.e2e_s = e2e_s
        self.tpot_s = tpot_s
        self.preemptions = preemptions

    @classmethod
    def timed(
        cls,
        *,
        arrival_s: float,
        first_scheduled_s: float | None,
        first_token_s: float,
        finish_s: float,
        prompt_tokens: int,
        output_tokens: int,
        cached_tokens: int,
        preemptions: int,
    ) -> RequestRecord:
        """The record of a request finished at ``finish_s``, from the times it went through.

        Without a first-scheduled time it counts as never queued; the time per output token
        spreads the time after the first token over the tokens that followed it.
        """
        first_scheduled = first_scheduled_s if first_scheduled_s is not None else arrival_s
        tpot = (finish_s - first_token_s) / (output_tokens - 1) if output_tokens > 1 else 0.0
        return RequestRecord(
            arrival_s,
            prompt_tokens,
            output_tokens,
            cached_tokens,
            first_scheduled - arrival_s,
            first_token_s - arrival_s,
            finish_s - arrival_s,
            tpot,
            preemptions,
        )


@dataclass(frozen=True, slots=True)
class Summary:
    """Result of one offline simulation (``--json`` prints this object)."""

    requests: int
    completed: int
    duration_s: float
    ttft_ms: Percentiles
    itl_ms: Percentiles
    e2e_ms: Percentiles
    tpot_ms: Percentiles
    queue_ms: Percentiles
    throughput_tok_s: float
    prompt_throughput_tok_s: float
    request_throughput_req_s: float
    goodput_req_s: float
    slo_attainment: float
    slo_met: bool
    itl_at_slo_quantile_ms: float
    ttft_at_slo_quantile_ms: float
    preemptions: int
    steps: int
    prefix_cache_hit_rate: float
    kv_cache_tokens: int
    wall_s: float
    slo: SLO
    config: dict[str, Any] = field(default_factory=dict)
    records: tuple[RequestRecord, ...] = field(default=(), repr=False)
    #: Steps that ran while running requests waited to decode (SGLang's prefill-only passes).
    decode_stall_steps: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready mapping (per-request records left out)."""
        data = asdict(self)
        data.pop("records")
        return data


class _Recorder:
    """Collects ITL samples (single values and bulk linear segments) during a run."""

    def __init__(self) -> None:
        self.stalled_steps = 0
        self.itl: list[float] = []
        self.segments: list[tuple[float, float, int, int]] = []

    def itl_arrays(self) -> tuple[FloatArray, FloatArray]:
        """Every ITL sample: the single ones with weight 1, then each bulk segment's ``count`` values
        ``first + increment * i`` with the segment's batch as their weight."""
        singles = np.asarray(self.itl, dtype=np.float64)
        if not self.segments:
            return singles, np.ones(singles.size, dtype=np.float64)
        first, increment, count, weight = (np.asarray(column) for column in zip(*self.segments, strict=True))
        counts = count.astype(np.int64)
        starts = np.cumsum(counts) - counts
        step = (np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(starts, counts)).astype(np.float64)
        values = (
            np.repeat(first.astype(np.float64), counts)
            + np.repeat(increment.astype(np.float64), counts) * step
        )
        weights = np.repeat(weight.astype(np.float64), counts)
        return (
            np.concatenate((singles, values)),
            np.concatenate((np.ones(singles.size, dtype=np.float64), weights)),
        )


def simulate(
    config: SimConfig,
    workload: Workload,
    slo: SLO | None = None,
    *,
    fast_forward: bool = True,
    keep_records: bool = False,
    telemetry: StepTelemetry | None = None,
    stop_on_miss: bool = False,
) -> Summary:
    """Run ``workload`` on the engine ``config`` describes and summarise the latencies.

    ``telemetry``, when given, records every step the way the server's ``/metrics`` does.
    ``stop_on_miss``: end the run once it can no longer meet ``slo`` (:class:`MissWatch`): the
    summary then covers the requests completed so far and ``slo_met`` is False (the quantiles are
    those of what ran; the TTFT's at least that of every request's TTFT so far). A run that meets
    the SLO is the same with or without it.
    """
    wall_start = time.perf_counter()
    slo = slo or SLO()
    # The run allocates a request per arrival and millions of short-lived, acyclic per-step records;
    # the cyclic collector's passes over them find nothing, so it rests until the summary is made.
    collecting = gc.isenabled()
    gc.disable()
    try:
        core = config.build()
        max_len = core.scheduler.config.max_model_len
        requests = [
            new_request(i, spec.arrival_s, spec.prompt_tokens, spec.output_tokens, spec.block_hashes, max_len)
            for i, spec in enumerate(workload.requests)
        ]
        recorder = _Recorder()
        # Bulk decode advances identical steps in closed form: not when each step draws its own time.
        run = EngineRun(core, fast_forward and not core.steps_spread, telemetry, recorder)
        arrivals = sorted(requests, key=lambda r: r.arrival_s)
        run.add(arrivals)
        if stop_on_miss:
            run.watch = MissWatch(arrivals, slo, recorder)
        run.advance()
        summary = _summarise(core, config, requests, recorder, run.steps, slo, keep_records)
    finally:
        if collecting:
            gc.enable()
    if run.watch is not None and run.watch.missed:
        # The quantiles over what ran: the ITL's of the gaps so far, the TTFT's a lower bound.
        summary = replace(
            summary,
            slo_met=False,
            ttft_at_slo_quantile_ms=max(
                summary.ttft_at_slo_quantile_ms, run.watch.bound_quantile_ms(run.now)
            ),
        )
    return _with_wall(summary, time.perf_counter() - wall_start)


def new_request(
    index: int, arrival: float, prompt: int, output: int, hashes: tuple[int, ...], max_len: int
) -> Request:
    """Request ``index`` of a workload, its prompt and output clamped to ``max_len``."""
    prompt = min(prompt, max_len - 1)
    output = max(1, min(output, max_len - prompt))
    return Request(str(index), arrival, prompt, output, hashes[: prompt // 16])


#: Steps between two checks of :class:`MissWatch` (a check visits the requests still waiting and
#: the gaps recorded since the last).
WATCH_EVERY_STEPS = 32


class MissWatch:
    """Whether a run has missed its SLO for certain, by its TTFT or its ITL quantile.

    Offline every request completes. The TTFT quantile (inverted CDF over every request) misses
    once fewer than ``q`` of the requests can still get their first token within the target: one
    whose first token came later than the target after its arrival, or that has waited longer than
    that without one, is late whatever happens next. The ITL quantile (over every gap between a
    request's tokens) misses once more gaps are above its target than ``1 - q`` of the most gaps
    the run can have (one per output token after the first; fewer when speculative tokens are
    accepted several at a time), whatever the remaining gaps are.
    """

    def __init__(self, arrivals: list[Request], slo: SLO, recorder: _Recorder) -> None:
        self.arrivals = arrivals
        self.slo = slo
        self.recorder = recorder
        self.late = 0
        self.waiting: list[Request] = []
        self.seen = 0
        self.most_gaps = float(sum(r.max_output_tokens - 1 for r in arrivals))
        self.slow_gaps = 0.0
        self.singles = 0
        self.segments = 0
        self.missed = False

    def check(self, arrived: int, now: float) -> bool:
        """Whether the SLO has missed, with the first ``arrived`` requests arrived by ``now``."""
        self.missed = self._ttft_missed(arrived, now) or self._itl_missed()
        return self.missed

    def _ttft_missed(self, arrived: int, now: float) -> bool:
        if arrived > self.seen:
            self.waiting.extend(self.arrivals[self.seen : arrived])
            self.seen = arrived
        target_ms = self.slo.ttft_ms
        still: list[Request] = []
        overdue = 0
        for request in self.waiting:
            first = request.first_token_s
            if first is not None:
                if (first - request.arrival_s) * 1e3 > target_ms:
                    self.late += 1
                continue
            still.append(request)
            if (now - request.arrival_s) * 1e3 > target_ms:
                overdue += 1
        self.waiting = still
        total = len(self.arrivals)
        # The summary's test: the requests within the target reach q of all of them.
        return total - (self.late + overdue) < self.slo.ttft_quantile * total

    def _itl_missed(self) -> bool:
        target_ms = self.slo.itl_ms
        singles = self.recorder.itl
        for index in range(self.singles, len(singles)):
            if singles[index] * 1e3 > target_ms:
                self.slow_gaps += 1.0
        self.singles = len(singles)
        segments = self.recorder.segments
        for index in range(self.segments, len(segments)):
            first, increment, count, batch = segments[index]
            self.slow_gaps += batch * (count - _first_above(first, increment, count, target_ms))
        self.segments = len(segments)
        most = self.most_gaps
        return most - self.slow_gaps < self.slo.itl_quantile * most

    def bound_quantile_ms(self, now: float) -> float:
        """The TTFT quantile over every request's TTFT so far (those still waiting: their wait;
        those yet to arrive: 0), a lower bound of the run's."""
        bounds = np.zeros(len(self.arrivals), dtype=np.float64)
        for index, request in enumerate(self.arrivals[: self.seen]):
            first = request.first_token_s
            bounds[index] = (first if first is not None else now) - request.arrival_s
        return quantile(bounds, self.slo.ttft_quantile) * 1e3


def _first_above(first: float, increment: float, count: int, target_ms: float) -> int:
    """The first ``i`` below ``count`` whose gap ``first + increment * i`` (as the summary computes
    it) is above ``target_ms``; ``count`` when none is (the gaps grow with ``i``)."""
    low, high = 0, count
    while low < high:
        middle = (low + high) // 2
        if (first + increment * float(middle)) * 1e3 > target_ms:
            high = middle
        else:
            low = middle + 1
    return low


class EngineRun:
    """One engine advanced through simulated time as its requests arrive.

    :func:`simulate` adds every request and runs to the end; a caller that learns of arrivals as it
    goes (many replicas behind a router, advanced in step) adds them and advances ``until`` a time
    again and again, taking the ITL samples of each stretch (:meth:`take_itl`).
    """

    def __init__(
        self,
        core: EngineCore,
        fast_forward: bool = True,
        telemetry: StepTelemetry | None = None,
        recorder: _Recorder | None = None,
    ) -> None:
        self.core, self.telemetry = core, telemetry
        self.recorder = recorder if recorder is not None else _Recorder()
        self.fast_forward = fast_forward
        self.pending: list[Request] = []
        self.now = 0.0
        self.steps = 0
        self._next = 0
        #: Ends the run once the SLO has missed for certain (:func:`simulate`'s
        #: ``stop_on_miss``); None: runs to the end.
        self.watch: MissWatch | None = None

    def add(self, requests: list[Request]) -> None:
        """Queue arrivals, in order and none before the last one added."""
        self.pending.extend(requests)

    def advance(self, until: float = math.inf) -> None:
        """Run steps until the engine is idle with nothing left to arrive before ``until``, or a step
        ends at or after ``until`` (the last one may end past it)."""
        core, recorder, telemetry, fast_forward = self.core, self.recorder, self.telemetry, self.fast_forward
        sched = core.scheduler
        pending = self.pending
        count = len(pending)
        next_index, now, steps = self._next, self.now, self.steps
        itl = recorder.itl
        watch = self.watch
        next_check = steps + WATCH_EVERY_STEPS
        while True:
            if watch is not None and steps >= next_check:
                next_check = steps + WATCH_EVERY_STEPS
                if watch.check(next_index, now):
                    break
            while next_index < count and pending[next_index].arrival_s <= now:
                sched.add_request(pending[next_index])
                next_index += 1
            next_arrival = pending[next_index].arrival_s if next_index < count else math.inf
            if not sched.has_unfinished():
                if next_arrival >= until:
                    break
                now = next_arrival
                continue
            if now >= until:
                break
            if fast_forward:
                advanced = _fast_forward(core, now, min(next_arrival, until), recorder, telemetry)
                if advanced:
                    now, steps = advanced[0], steps + advanced[1]
                    continue
            output = sched.schedule(now)
            if output.is_empty:
                if next_index < count:
                    now = max(now, next_arrival)
                    continue
                raise RuntimeError(
                    "no request can be scheduled: a prompt needs more KV blocks than the cache holds"
                )
            end = now + core.step_time(output.forward_pass)
            if all(item.is_prefill for item in output.scheduled) and any(
                r.is_decoding for r in sched.running
            ):
                recorder.stalled_steps += 1  # decodes left waiting for a prefill-only pass
            if telemetry is not None:
                telemetry.observe(StepShape.of(output), end - now)
            sched.advance(output, end, itl)
            now = end
            steps += 1
        self._next, self.now, self.steps = next_index, now, steps

    @property
    def waiting(self) -> int:
        """Requests queued for their first step (the engine's ``num_requests_waiting``)."""
        return len(self.core.scheduler.waiting)

    def take_itl(self) -> tuple[FloatArray, FloatArray]:
        """The ITL samples (seconds) and their weights since the last call, then forgets them."""
        values, weights = self.recorder.itl_arrays()
        self.recorder.itl.clear()
        self.recorder.segments.clear()
        return values, weights


def _fast_forward(
    core: EngineCore,
    now: float,
    next_arrival: float,
    recorder: _Recorder,
    telemetry: StepTelemetry | None = None,
) -> tuple[float, int] | None:
    """Advance a stretch of identical pure-decode steps at once; None when the next step is not one."""
    sched = core.scheduler
    cfg = sched.config
    running = sched.running
    if cfg.num_speculative_tokens or not running or (sched.waiting and len(running) < cfg.max_running):
        return None
    batch = len(running)
    context = 0
    max_model_len = cfg.max_model_len
    steps_left = max_model_len  # no request has more left than the model length
    for request in running:  # every one decoding, each sampled in the step that ended now
        outputs = request.num_output_tokens
        tokens = request.prompt_tokens + outputs
        if request.last_token_s != now or outputs <= 0 or tokens - request.num_computed_tokens != 1:
            return None
        context += tokens
        left = request.max_output_tokens - outputs
        if left < steps_left:
            steps_left = left
        if max_model_len - tokens < steps_left:
            steps_left = max_model_len - tokens
    kv = sched.kv
    spare = kv.num_free_blocks // batch - 1
    limit = min(steps_left, cfg.block_size * spare)
    if limit < 2:
        return None
    model = core.step_model
    first = model.fixed_time(batch, batch, batch) + model.decode_time_per_context_token * context
    increment = model.decode_time_per_context_token * batch
    t, n = now, 0
    while n < limit and t < next_arrival:
        t += first + increment * n
        n += 1
    if n < 2:
        return None
    extra = 0
    block_size = kv.block_size
    for request in running:
        request.num_output_tokens += n
        computed = request.num_computed_tokens + n
        request.num_computed_tokens = computed
        request.last_token_s = t
        grow = -(-computed // block_size) - request.plain_blocks - len(request.cached_hashes)
        if grow > 0:
            request.plain_blocks += grow
            extra += grow
    allocated = kv.allocate(extra)
    assert allocated, "bulk decode outgrew the free KV blocks"
    recorder.segments.append((first, increment, n, batch))
    if telemetry is not None:
        telemetry.observe_decode_run(batch, context, n, first, increment)
    if n == steps_left:
        for request in [
            r
            for r in running
            if r.num_output_tokens >= r.max_output_tokens or r.num_tokens >= cfg.max_model_len
        ]:
            sched.finish(request, t, FinishReason.LENGTH)
    return t, n


def latency_fields(
    records: tuple[RequestRecord, ...],
    requested: int,
    recorder: _Recorder,
    slo: SLO,
    duration: float,
    keep_records: bool,
) -> dict[str, Any]:
    """The :class:`Summary` fields every simulation derives alike from its finished requests."""
    arrays = {
        name: np.array([getattr(rec, name) for rec in records], dtype=np.float64)
        for name in ("ttft_s", "e2e_s", "tpot_s", "queue_s")
    }
    itl_values, itl_weights = recorder.itl_arrays()
    itl_sorted = SortedSample(itl_values, itl_weights) if itl_values.size else None
    output_tokens = sum(rec.output_tokens for rec in records)
    prompt_tokens = sum(rec.prompt_tokens for rec in records)
    good = sum(1 for rec in records if rec.ttft_s * 1e3 <= slo.ttft_ms and rec.tpot_s * 1e3 <= slo.itl_ms)
    itl_q = itl_sorted.quantile(slo.itl_quantile) * 1e3 if itl_sorted is not None else math.nan
    ttft_q = quantile(arrays["ttft_s"], slo.ttft_quantile) * 1e3
    return {
        "requests": requested,
        "completed": len(records),
        "duration_s": duration,
        "ttft_ms": Percentiles.of(arrays["ttft_s"]),
        "itl_ms": Percentiles.of(itl_values, itl_weights, itl_sorted),
        "e2e_ms": Percentiles.of(arrays["e2e_s"]),
        "tpot_ms": Percentiles.of(arrays["tpot_s"]),
        "queue_ms": Percentiles.of(arrays["queue_s"]),
        "throughput_tok_s": output_tokens / duration,
        "prompt_throughput_tok_s": prompt_tokens / duration,
        "request_throughput_req_s": len(records) / duration,
        "goodput_req_s": good / duration,
        "slo_attainment": good / requested if requested else math.nan,
        "slo_met": bool(itl_q <= slo.itl_ms and ttft_q <= slo.ttft_ms) if records else False,
        "itl_at_slo_quantile_ms": itl_q,
        "ttft_at_slo_quantile_ms": ttft_q,
        "slo": slo,
        "records": records if keep_records else (),
        "wall_s": 0.0,
    }


def _summarise(
    core: EngineCore,
    config: SimConfig,
    requests: list[Request],
    recorder: _Recorder,
    steps: int,
    slo: SLO,
    keep_records: bool,
) -> Summary:
    done = [r for r in requests if r.finish_s is not None and r.first_token_s is not None]
    start = min((r.arrival_s for r in requests), default=0.0)
    end = max((r.finish_s or 0.0 for r in done), default=start)
    kv = core.scheduler.kv
    records = tuple(_record(r) for r in done)
    return Summary(
        **latency_fields(records, len(requests), recorder, slo, max(end - start, 1e-9), keep_records),
        preemptions=core.scheduler.num_preemptions,
        steps=steps,
        prefix_cache_hit_rate=kv.hits / kv.queries if kv.queries else 0.0,
        kv_cache_tokens=kv.num_blocks * kv.block_size,
        config=_describe(core, config),
        decode_stall_steps=recorder.stalled_steps,
    )


def _record(r: Request) -> RequestRecord:
    assert r.first_token_s is not None and r.finish_s is not None
    return RequestRecord.timed(
        arrival_s=r.arrival_s,
        first_scheduled_s=r.first_scheduled_s,
        first_token_s=r.first_token_s,
        finish_s=r.finish_s,
        prompt_tokens=r.prompt_tokens,
        output_tokens=r.num_output_tokens,
        cached_tokens=r.num_cached_tokens,
        preemptions=r.num_preemptions,
    )


def _describe(core: EngineCore, config: SimConfig) -> dict[str, Any]:
    sched = config.scheduler
    return {
        "engine": sched.engine.value,
        "model": core.model.name,
        "accelerator": core.accelerator.name,
        "tensor_parallel_size": config.tensor_parallel_size,
        "max_num_batched_tokens": sched.max_num_batched_tokens,
        "max_num_seqs": sched.max_num_seqs,
        "max_num_active_seqs": sched.max_num_active_seqs,
        "max_model_len": sched.max_model_len,
        "enable_chunked_prefill": sched.enable_chunked_prefill,
        "long_prefill_token_threshold": sched.long_prefill_token_threshold,
        "enable_prefix_caching": sched.enable_prefix_caching,
        "num_speculative_tokens": sched.num_speculative_tokens,
        "gpu_memory_utilization": config.gpu_memory_utilization,
    }


def _with_wall(summary: Summary, wall_s: float) -> Summary:
    return replace(summary, wall_s=wall_s)


picklable(SLO, Percentiles, RequestRecord, Summary)
