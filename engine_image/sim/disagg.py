"""Prefill/decode disaggregation offline: N prefill engines, M decode engines, KV shipped between them.

A request arrives at the router, which picks a prefill and a decode replica (round robin or least
loaded). The prefill replica runs the prompt (chunked as its scheduler is configured) as a
``max_tokens=1`` request with ``do_remote_decode`` and, on finishing, keeps its KV blocks (vLLM's
delayed free). The decode replica then gets the request with ``do_remote_prefill``: its scheduler
allocates KV blocks for the prompt the first time its waiting pass reaches it, waits
``kv bytes / bandwidth + latency`` with those blocks counted as used, and admits it with all but the
last prompt token computed (vLLM recomputes that token to sample); at that moment the prefill
replica's blocks are released. Everything runs in one discrete-event loop over all replicas.

Measured, as a client behind vLLM's prefill/decode proxy or vllm-router sees it: TTFT from the
arrival at the router to the first token of the decode replica (the prefill replica's token is
discarded), ITL between the decode replica's tokens, E2E to the decode replica's last token.
"""

from __future__ import annotations

import math
import re
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from enum import Enum
from typing import Any

import numpy as np
from chunkpilot.engine.sim.capacity import DEFAULT_TOLERANCE, CapacityResult, search_capacity
from chunkpilot.engine.sim.compiled import picklable
from chunkpilot.engine.sim.engine import EngineCore, SimConfig
from chunkpilot.engine.sim.kvtransfer import DEFAULT_ABORT_TIMEOUT_S, KVTransfer
from chunkpilot.engine.sim.metrics import StepShape, StepTelemetry
from chunkpilot.engine.sim.offline import (
    SLO,
    Percentiles,
    RequestRecord,
    Summary,
    _fast_forward,
    _Recorder,
    latency_fields,
    new_request,
    quantile,
)
from chunkpilot.engine.sim.scheduler import (
    Engine,
    Request,
    RequestStatus,
    SchedulerOutput,
)
from chunkpilot.engine.sim.workload import Workload

__all__ = [
    "DEFAULT_ABORT_TIMEOUT_S",
    "DisaggregatedSummary",
    "KVTransfer",
    "PoolConfig",
    "PoolStats",
    "RouterPolicy",
    "Topology",
    "disaggregated_capacity",
    "kv_transfer_bytes",
    "parse_topology",
    "simulate_colocated",
    "simulate_disaggregated",
]

_TOPOLOGY = re.compile(r"^\s*(\d+)\s*P\s*:?\s*(\d+)\s*D\s*$", re.IGNORECASE)


class RouterPolicy(Enum):
    """How the router picks a replica of a pool for each request."""

    ROUND_ROBIN = "round_robin"
    #: Fewest unfinished requests (waiting, receiving or running) at the arrival.
    LEAST_LOADED = "least_loaded"


def kv_transfer_bytes(core: EngineCore, prompt_tokens: int) -> int:
    """KV bytes of a prompt: layers x 2 x KV heads x head dim x dtype bytes x tokens."""
    return core.model.kv_bytes_per_token * prompt_tokens


@dataclass(frozen=True, slots=True)
class PoolConfig:
    """One pool: the engine every replica runs, how many replicas, and the router's policy for it."""

    config: SimConfig
    replicas: int = 1
    router: RouterPolicy = RouterPolicy.LEAST_LOADED

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"a pool needs at least one replica, not {self.replicas}")
        if self.config.engine is not Engine.VLLM:
            raise ValueError(
                f"prefill/decode disaggregation is simulated for vLLM's KV connectors only, not "
                f"{self.config.engine.value}"
            )

    @property
    def num_gpus(self) -> int:
        """Accelerators the pool occupies."""
        return self.replicas * self.config.tensor_parallel_size


@dataclass(frozen=True, slots=True)
class Topology:
    """A prefill pool, a decode pool and the KV transfer between them."""

    prefill: PoolConfig
    decode: PoolConfig
    kv_transfer: KVTransfer = field(default_factory=KVTransfer)

    def __post_init__(self) -> None:
        if self.prefill.config.model != self.decode.config.model:
            raise ValueError(
                f"both pools must serve the same model, not {self.prefill.config.model} and "
                f"{self.decode.config.model}"
            )

    @property
    def name(self) -> str:
        """``<prefill replicas>P<decode replicas>D``, e.g. ``1P3D``."""
        return f"{self.prefill.replicas}P{self.decode.replicas}D"

    @property
    def num_gpus(self) -> int:
        """Accelerators of both pools."""
        return self.prefill.num_gpus + self.decode.num_gpus

    @classmethod
    def of(
        cls,
        spec: str,
        config: SimConfig,
        *,
        prefill: Mapping[str, Any] | None = None,
        decode: Mapping[str, Any] | None = None,
        kv_transfer: KVTransfer | None = None,
        router: RouterPolicy = RouterPolicy.LEAST_LOADED,
    ) -> Topology:
        """``spec`` (``"1P3D"``) replicas of ``config``, each pool with its own overrides.

        The overrides are :class:`SimConfig` field names or those of ``config``'s scheduler config
        class, e.g. ``decode={"max_num_batched_tokens": 512, "max_num_seqs": 256}``.
        """
        p, d = parse_topology(spec)
        return cls(
            PoolConfig(with_overrides(config, prefill or {}), p, router),
            PoolConfig(with_overrides(config, decode or {}), d, router),
            kv_transfer or KVTransfer(),
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description."""
        return {
            "topology": self.name,
            "gpus": self.num_gpus,
            "kv_transfer": asdict(self.kv_transfer),
            "prefill": _describe_pool(self.prefill),
            "decode": _describe_pool(self.decode),
        }


def parse_topology(spec: str) -> tuple[int, int]:
    """``"1P3D"`` (or ``"1p:3d"``) -> ``(1, 3)``."""
    match = _TOPOLOGY.match(spec)
    if not match or int(match.group(1)) < 1 or int(match.group(2)) < 1:
        raise ValueError(
            f"--topology {spec!r} is not <prefill replicas>P<decode replicas>D with both at least 1, "
            "e.g. 1P3D"
        )
    return int(match.group(1)), int(match.group(2))


def with_overrides(config: SimConfig, overrides: Mapping[str, Any]) -> SimConfig:
    """``config`` with SimConfig fields and fields of its scheduler config's class (its engine's)
    replaced (unknown names are an error)."""
    sim_names = {f.name for f in fields(SimConfig)} - {"scheduler"}
    sched_names = {f.name for f in fields(config.scheduler)}
    unknown = sorted(set(overrides) - sim_names - sched_names)
    if unknown:
        raise ValueError(f"unknown pool setting(s): {', '.join(unknown)}")
    sched = replace(config.scheduler, **{k: v for k, v in overrides.items() if k in sched_names})
    return replace(config, scheduler=sched, **{k: v for k, v in overrides.items() if k in sim_names})


def _describe_pool(pool: PoolConfig) -> dict[str, Any]:
    sched = pool.config.scheduler
    return {
        "replicas": pool.replicas,
        "router": pool.router.value,
        "tensor_parallel_size": pool.config.tensor_parallel_size,
        "max_num_batched_tokens": sched.max_num_batched_tokens,
        "max_num_seqs": sched.max_num_seqs,
        "max_model_len": sched.max_model_len,
        "enable_chunked_prefill": sched.enable_chunked_prefill,
        "long_prefill_token_threshold": sched.long_prefill_token_threshold,
        "enable_prefix_caching": sched.enable_prefix_caching,
        "gpu_memory_utilization": pool.config.gpu_memory_utilization,
    }


@dataclass(frozen=True, slots=True)
class PoolStats:
    """What one pool did during a run (means over its replicas)."""

    role: str
    replicas: int
    #: Fraction of the run's duration the replicas spent executing steps.
    busy_fraction: float
    #: Time-weighted fraction of KV blocks in use (held, receiving or running).
    kv_usage_mean: float
    kv_usage_peak: float
    kv_cache_tokens: int
    steps: int
    preemptions: int
    requests: int
    prompt_tokens: int
    generation_tokens: int
    #: Mean tokens a step scheduled (prefill chunks and decodes), against the pool's budget.
    tokens_per_step: float = 0.0


@dataclass(frozen=True, slots=True)
class DisaggregatedSummary(Summary):
    """A :class:`Summary` of the whole topology plus what each pool and the KV link did."""

    topology: dict[str, Any] = field(default_factory=dict)
    pools: tuple[PoolStats, ...] = ()
    #: From the prefill replica's first token to the decode replica's KV having arrived.
    transfer_ms: Percentiles | None = None
    #: From the arrival to the prefill replica's (discarded) first token: the prefill pool's own TTFT,
    #: and its quantile at the SLO's TTFT quantile.
    prefill_ttft_ms: Percentiles | None = None
    prefill_ttft_at_slo_quantile_ms: float = math.nan
    kv_bytes_per_request: float = 0.0

    def pool(self, role: str) -> PoolStats:
        """The stats of ``"prefill"`` or ``"decode"``."""
        return next(p for p in self.pools if p.role == role)


class _Replica:
    """One engine of a pool inside the event loop."""

    def __init__(self, role: str, core: EngineCore, telemetry: StepTelemetry | None = None) -> None:
        self.role = role
        self.core = core
        #: Records the replica's steps as its ``/metrics`` would (None: not recorded).
        self.telemetry = telemetry
        self.sched = core.scheduler
        self.pending: SchedulerOutput | None = None
        self.wake = math.inf
        #: End of the replica's last step or bulk-advanced stretch: it cannot act before.
        self.free_at = 0.0
        self.busy_s = 0.0
        self.steps = 0
        self.tokens = 0
        self.requests = 0
        self.kv_area = 0.0
        self.kv_peak = 0
        self._kv_t = 0.0
        self._kv_used = 0
        #: Requests the router has sent this way that are still being prefilled elsewhere.
        self.incoming = 0

    @property
    def load(self) -> int:
        """Unfinished requests the router has given this replica (its in-flight count)."""
        return len(self.sched.waiting) + len(self.sched.running) + self.incoming

    def add(self, request: Request, now: float) -> None:
        self.sched.add_request(request)
        self.requests += 1
        self.nudge(now)

    def nudge(self, now: float) -> None:
        """Something it may be waiting for changed (a request came, held blocks were freed): act
        again as soon as it is idle."""
        if self.pending is None:
            self.wake = min(self.wake, max(now, self.free_at))

    def sample_kv(self, now: float) -> None:
        kv = self.sched.kv
        used = kv.num_blocks - kv.num_free_blocks
        self.kv_area += self._kv_used * (now - self._kv_t)
        self._kv_t, self._kv_used = now, used
        self.kv_peak = max(self.kv_peak, used)


class _Router:
    def __init__(self, replicas: list[_Replica], policy: RouterPolicy) -> None:
        self.replicas = replicas
        self.policy = policy
        self.turn = 0

    def pick(self) -> _Replica:
        if self.policy is RouterPolicy.ROUND_ROBIN:
            replica = self.replicas[self.turn % len(self.replicas)]
            self.turn += 1
            return replica
        return min(self.replicas, key=lambda r: r.load)


@dataclass(eq=False, slots=True)
class _Pair:
    arrival_s: float
    prefill: Request
    decode: Request
    decode_replica: _Replica
    prefill_replica: _Replica
    transfer_s: float = 0.0
    received_s: float | None = None


def simulate_disaggregated(
    topology: Topology,
    workload: Workload,
    slo: SLO | None = None,
    *,
    fast_forward: bool = True,
    keep_records: bool = False,
    telemetry: Mapping[str, StepTelemetry] | None = None,
) -> DisaggregatedSummary:
    """Run ``workload`` through ``topology`` and summarise it as the client sees it.

    ``telemetry``: per role (``prefill``, ``decode``), where every step of that pool's replicas is
    recorded the way their ``/metrics`` would.
    """
    wall_start = time.perf_counter()
    slo = slo or SLO()
    link = topology.kv_transfer
    telemetry = telemetry or {}
    prefills = [
        _Replica("prefill", topology.prefill.config.build(), telemetry.get("prefill"))
        for _ in range(topology.prefill.replicas)
    ]
    decodes = [
        _Replica("decode", topology.decode.config.build(), telemetry.get("decode"))
        for _ in range(topology.decode.replicas)
    ]
    per_token = prefills[0].core.model.kv_bytes_per_token
    for replica in decodes:
        replica.sched.kv_transfer_s = lambda tokens: link.seconds(per_token * tokens)
    prefill_router = _Router(prefills, topology.prefill.router)
    decode_router = _Router(decodes, topology.decode.router)
    max_len = min(
        topology.prefill.config.scheduler.max_model_len, topology.decode.config.scheduler.max_model_len
    )

    pairs: list[_Pair] = []
    by_prefill: dict[int, _Pair] = {}
    by_decode: dict[int, _Pair] = {}
    for i, spec in enumerate(workload.requests):
        decode = new_request(
            i, spec.arrival_s, spec.prompt_tokens, spec.output_tokens, spec.block_hashes, max_len
        )
        decode.remote_prefill = True
        prefill = Request(decode.request_id, decode.arrival_s, decode.prompt_tokens, 1, decode.block_hashes)
        prefill.kv_hold = True
        pair = _Pair(spec.arrival_s, prefill, decode, decodes[0], prefills[0])
        pairs.append(pair)
        by_prefill[id(prefill)] = pair
        by_decode[id(decode)] = pair
    recorder = _Recorder()
    spread = any(r.core.steps_spread for r in (*prefills, *decodes))
    _run(pairs, prefill_router, decode_router, recorder, by_prefill, by_decode, fast_forward and not spread)
    summary = _summarise(topology, pairs, prefills, decodes, recorder, slo, keep_records, per_token)
    return replace(summary, wall_s=time.perf_counter() - wall_start)


def simulate_colocated(
    config: SimConfig,
    replicas: int,
    workload: Workload,
    slo: SLO | None = None,
    *,
    router: RouterPolicy = RouterPolicy.LEAST_LOADED,
    fast_forward: bool = True,
    keep_records: bool = False,
) -> DisaggregatedSummary:
    """``replicas`` colocated engines behind the same router: the baseline at the same GPU count.

    Its ``pools`` holds one pool, ``"colocated"``; nothing is transferred.
    """
    wall_start = time.perf_counter()
    slo = slo or SLO()
    pool = PoolConfig(config, replicas, router)
    engines = [_Replica("colocated", config.build()) for _ in range(replicas)]
    max_len = config.scheduler.max_model_len
    pairs: list[_Pair] = []
    for i, spec in enumerate(workload.requests):
        request = new_request(
            i, spec.arrival_s, spec.prompt_tokens, spec.output_tokens, spec.block_hashes, max_len
        )
        pairs.append(_Pair(spec.arrival_s, request, request, engines[0], engines[0]))
    recorder = _Recorder()
    _run(pairs, _Router(engines, router), None, recorder, {}, {}, fast_forward)
    stats = _pool_stats("colocated", engines, [p.decode for p in pairs], *_span(pairs))
    kv = [e.sched.kv for e in engines]
    queries = sum(k.queries for k in kv)
    description = {
        "topology": f"{replicas}x colocated",
        "gpus": pool.num_gpus,
        "colocated": _describe_pool(pool),
    }
    hit_rate = sum(k.hits for k in kv) / queries if queries else 0.0
    summary = _build(pairs, recorder, slo, keep_records, (stats,), hit_rate, description)
    return replace(summary, wall_s=time.perf_counter() - wall_start)


def _run(
    pairs: list[_Pair],
    prefill_router: _Router,
    decode_router: _Router | None,
    recorder: _Recorder,
    by_prefill: dict[int, _Pair],
    by_decode: dict[int, _Pair],
    fast_forward: bool,
) -> None:
    pending = sorted(pairs, key=lambda p: p.arrival_s)
    replicas = prefill_router.replicas + (decode_router.replicas if decode_router else [])
    next_index = 0
    while True:
        next_arrival = pending[next_index].arrival_s if next_index < len(pending) else math.inf
        actor = min(replicas, key=lambda r: r.wake)
        if next_arrival <= actor.wake:
            if next_arrival == math.inf:
                break
            pair = pending[next_index]
            next_index += 1
            pair.prefill_replica = prefill_router.pick()
            if decode_router is not None:
                pair.decode_replica = decode_router.pick()
                pair.decode_replica.incoming += 1
            pair.prefill_replica.add(pair.prefill, next_arrival)
            continue
        # Bulk decode advancing may run until something could reach this replica: for colocated
        # replicas the next arrival, for decode replicas the end of a prefill step (one that has
        # not started yet ends after the next arrival).
        bound = next_arrival
        if actor.role == "decode":
            bound = min(next_arrival, min(r.wake for r in prefill_router.replicas))
        _act(actor, actor.wake, bound, recorder, by_prefill, by_decode, fast_forward)
    unfinished = [p for p in pairs if p.decode.finish_s is None]
    if unfinished:
        raise RuntimeError(
            f"{len(unfinished)} request(s) never finished: a prompt needs more KV blocks than a replica holds"
        )


def _act(
    replica: _Replica,
    now: float,
    bound: float,
    recorder: _Recorder,
    by_prefill: dict[int, _Pair],
    by_decode: dict[int, _Pair],
    fast_forward: bool,
) -> None:
    """Finish the replica's step ending at ``now`` (if any), then start its next one."""
    sched = replica.sched
    replica.sample_kv(now)
    if replica.pending is not None:
        output, replica.pending = replica.pending, None
        for result in sched.update(output, now):
            request = result.request
            if replica.role != "prefill":
                if not result.is_first_token and result.previous_token_s is not None:
                    recorder.itl.append(now - result.previous_token_s)
            elif result.finished and request.kv_hold:
                pair = by_prefill[id(request)]
                pair.decode_replica.incoming -= 1
                pair.decode_replica.add(pair.decode, now)
        replica.sample_kv(now)
    if not sched.has_unfinished():
        replica.wake = math.inf
        return
    if fast_forward and replica.role != "prefill":
        batch = len(sched.running)
        advanced = (
            _decode_fast_forward(replica, now, bound, recorder)
            if replica.role == "decode"
            else _fast_forward(replica.core, now, bound, recorder, replica.telemetry)
        )
        if advanced is not None:
            replica.busy_s += advanced[0] - now
            replica.steps += advanced[1]
            replica.tokens += advanced[1] * batch
            replica.wake = replica.free_at = advanced[0]
            replica.sample_kv(advanced[0])
            return
    output = sched.schedule(now)
    for request in sched.received:
        pair = by_decode[id(request)]
        pair.received_s = now
        pair.prefill_replica.sched.release_held(pair.prefill.request_id)
        pair.prefill_replica.sample_kv(now)
        pair.prefill_replica.nudge(now)  # a prefill stalled on held blocks may admit its next prompt
    sched.received.clear()
    replica.sample_kv(now)
    if output.is_empty:
        ready = sched.next_kv_ready_s()
        replica.wake = ready if ready > now else math.inf  # nothing can run until something arrives
        return
    duration = replica.core.step_time(output.forward_pass)
    if replica.telemetry is not None:
        replica.telemetry.observe(StepShape.of(output), duration)
    replica.pending = output
    replica.busy_s += duration
    replica.steps += 1
    replica.tokens += output.num_scheduled_tokens
    replica.wake = replica.free_at = now + duration


def _decode_fast_forward(
    replica: _Replica, now: float, bound: float, recorder: _Recorder
) -> tuple[float, int] | None:
    """Bulk-advance pure decodes while every waiting request's KV is still in flight."""
    sched = replica.sched
    waiting = sched.waiting
    if any(
        r.status is not RequestStatus.WAITING_FOR_REMOTE_KVS or (r.kv_ready_s or 0) <= now for r in waiting
    ):
        return None
    limit = min(bound, sched.next_kv_ready_s())
    sched.waiting = deque()  # in-flight requests are not schedulable until their KV arrives
    try:
        return _fast_forward(replica.core, now, limit, recorder, replica.telemetry)
    finally:
        sched.waiting = waiting


def _span(pairs: list[_Pair]) -> tuple[float, float]:
    """From the first arrival to the last finish."""
    start = min((p.arrival_s for p in pairs), default=0.0)
    return start, max((p.decode.finish_s or 0.0 for p in pairs), default=start)


def _build(
    pairs: list[_Pair],
    recorder: _Recorder,
    slo: SLO,
    keep_records: bool,
    pools: tuple[PoolStats, ...],
    hit_rate: float,
    description: dict[str, Any],
    kv_bytes_per_token: int = 0,
) -> DisaggregatedSummary:
    start, end = _span(pairs)
    transfer = np.array(
        [p.received_s - (p.prefill.first_token_s or 0.0) for p in pairs if p.received_s is not None],
        dtype=np.float64,
    )
    prefill_ttft = np.array([(p.prefill.first_token_s or 0.0) - p.arrival_s for p in pairs], dtype=np.float64)
    prompt_tokens = sum(p.decode.prompt_tokens for p in pairs)
    return DisaggregatedSummary(
        **latency_fields(
            tuple(_record(p) for p in pairs), len(pairs), recorder, slo, max(end - start, 1e-9), keep_records
        ),
        preemptions=sum(p.preemptions for p in pools),
        steps=sum(p.steps for p in pools),
        prefix_cache_hit_rate=hit_rate,
        kv_cache_tokens=sum(p.kv_cache_tokens * p.replicas for p in pools),
        config=description,
        topology=description,
        pools=pools,
        transfer_ms=Percentiles.of(transfer),
        prefill_ttft_ms=Percentiles.of(prefill_ttft),
        prefill_ttft_at_slo_quantile_ms=quantile(prefill_ttft, slo.ttft_quantile) * 1e3,
        kv_bytes_per_request=kv_bytes_per_token * prompt_tokens / len(pairs) if pairs else 0.0,
    )


def _summarise(
    topology: Topology,
    pairs: list[_Pair],
    prefills: list[_Replica],
    decodes: list[_Replica],
    recorder: _Recorder,
    slo: SLO,
    keep_records: bool,
    kv_bytes_per_token: int,
) -> DisaggregatedSummary:
    start, end = _span(pairs)
    pools = (
        _pool_stats("prefill", prefills, [p.prefill for p in pairs], start, end),
        _pool_stats("decode", decodes, [p.decode for p in pairs], start, end),
    )
    queries = sum(r.sched.kv.queries for r in prefills)
    hits = sum(r.sched.kv.hits for r in prefills)
    hit_rate = hits / queries if queries else 0.0
    return _build(pairs, recorder, slo, keep_records, pools, hit_rate, topology.to_dict(), kv_bytes_per_token)


def _record(pair: _Pair) -> RequestRecord:
    """A pair's record: queued until the prefill pool scheduled it, first token and end from decode."""
    d, p = pair.decode, pair.prefill
    assert d.first_token_s is not None and d.finish_s is not None
    return RequestRecord.timed(
        arrival_s=pair.arrival_s,
        first_scheduled_s=p.first_scheduled_s,
        first_token_s=d.first_token_s,
        finish_s=d.finish_s,
        prompt_tokens=d.prompt_tokens,
        output_tokens=d.num_output_tokens,
        cached_tokens=p.num_cached_tokens,
        preemptions=p.num_preemptions + d.num_preemptions,
    )


def _pool_stats(
    role: str, replicas: list[_Replica], requests: list[Request], start: float, end: float
) -> PoolStats:
    duration = max(end - start, 1e-9)
    for replica in replicas:
        replica.sample_kv(max(end, replica._kv_t))
    blocks = replicas[0].sched.kv.num_blocks
    return PoolStats(
        role=role,
        replicas=len(replicas),
        busy_fraction=sum(min(r.busy_s, duration) for r in replicas) / (len(replicas) * duration),
        kv_usage_mean=sum(r.kv_area for r in replicas) / (len(replicas) * duration * blocks),
        kv_usage_peak=max(r.kv_peak for r in replicas) / blocks,
        kv_cache_tokens=blocks * replicas[0].sched.kv.block_size,
        steps=sum(r.steps for r in replicas),
        preemptions=sum(r.sched.num_preemptions for r in replicas),
        requests=sum(r.requests for r in replicas),
        prompt_tokens=sum(r.prompt_tokens for r in requests),
        generation_tokens=sum(r.num_output_tokens for r in requests),
        tokens_per_step=sum(r.tokens for r in replicas) / max(1, sum(r.steps for r in replicas)),
    )


def disaggregated_capacity(
    topology: Topology,
    workload: Workload,
    slo: SLO,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    start_rate: float = 1.0,
    seed: int = 0,
    min_duration_s: float = 0.0,
) -> CapacityResult:
    """The highest Poisson rate at which ``topology`` meets ``slo`` (as :func:`find_capacity`;
    ``min_duration_s``: each probe's arrivals span at least that long, the requests repeated)."""
    return search_capacity(
        lambda retimed: simulate_disaggregated(topology, retimed, slo),
        workload,
        tolerance=tolerance,
        start_rate=start_rate,
        seed=seed,
        min_duration_s=min_duration_s,
    )


picklable(PoolConfig, Topology, PoolStats, DisaggregatedSummary)
