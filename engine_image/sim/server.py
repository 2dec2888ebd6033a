"""Server mode: an OpenAI-compatible HTTP API driven in (scaled) real time by the simulated engine.

One asyncio task runs the engine: it schedules a step, waits the step's simulated duration divided
by the time scale, then delivers the step's tokens to the waiting streams and records the vLLM
metrics. Simulated time is ``time_scale x`` wall time since start; every latency the engine reports
(``/metrics``) is in simulated seconds, i.e. what the modelled GPU would show.

The engine keeps the offline simulator's clock: a step starts when the previous one ends (or, on an
idle engine, when the request that wakes it arrived), not when the event loop next gets to it. The
loop's own lag (HTTP handlers, streaming, scrapes, a busy CPU) delays the delivery of tokens, as an
API server's would, but not the engine's steps, so it is in no latency the engine reports; a request
that arrives while the simulated clock trails the wall clock waits for the step that starts after
its arrival, as offline. Past :data:`MAX_CLOCK_LAG_S` of lag (an engine that cannot keep up with its
time scale) the clock jumps to the wall clock.

Request handling (validation, planned outputs, response bodies) lives in
:mod:`~chunkpilot.engine.sim.openai_api`; this module owns the engine task and the routes. The route
modules (``openai_api``, ``kvserve``) never import this one: each declares the protocol of the server
it needs, which :class:`SimEngineServer` satisfies.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from chunkpilot.engine import metrics_names as names
from chunkpilot.engine.live_adjust import (
    LIVE_ADJUST_ROUTE,
    LimitRaiseError,
    LiveLimits,
    PluginConfigError,
    access_problem,
    lowered_limits,
)
from chunkpilot.engine.sim import tokenizer
from chunkpilot.engine.sim.engine import EngineCore, SimConfig, StepResult
from chunkpilot.engine.sim.generation import Plan
from chunkpilot.engine.sim.http_api import APIError, errors_middleware
from chunkpilot.engine.sim.jobs import Choice
from chunkpilot.engine.sim.kvserve import KVSide
from chunkpilot.engine.sim.kvtransfer import KVConnectorConfig, KVTransfer, RemotePrefill
from chunkpilot.engine.sim.metrics import SCHEDULED_TOKENS_PER_STEP, EngineMetrics
from chunkpilot.engine.sim.openai_api import OpenAIRoutes
from chunkpilot.engine.sim.scheduler import FinishReason, Request, RequestStatus

__all__ = ["APIError", "ServerConfig", "SimEngineServer", "serve"]

#: Largest request body accepted (413 past it).
MAX_BODY_BYTES = 64 * 2**20
#: Wall seconds the simulated clock may trail the wall clock before it jumps to it: the event loop's
#: lag up to this is absorbed (steps stay back to back in simulated time, as offline).
MAX_CLOCK_LAG_S = 0.25
#: Longest wall wait of an engine with nothing it can run before it looks again.
IDLE_POLL_S = 0.05


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """How the server presents the simulated engine."""

    sim: SimConfig
    served_model_names: tuple[str, ...]
    time_scale: float = 1.0
    host: str = "127.0.0.1"
    port: int = 8000
    shutdown_timeout: float = 0.0
    #: Bearer token of the live-adjustment route (``CHUNKPILOT_LIVE_ADJUST_TOKEN``); None: the
    #: route answers 503, like the vLLM plugin's.
    live_adjust_token: str | None = None
    #: SGLang serves its metrics only with ``--enable-metrics`` (else /metrics answers 404).
    metrics_enabled: bool = True
    #: The simulated engine's release where its metric names depend on it (TensorRT-LLM).
    engine_version: str | None = None
    #: ``--kv-transfer-config``: serve both prefill/decode-disaggregation roles (vLLM only).
    kv_connector: KVConnectorConfig | None = None
    #: ``--kv-bandwidth-gbps`` and ``--kv-latency-ms``: how long a remote prefill's KV takes to arrive.
    kv_transfer: KVTransfer = field(default_factory=KVTransfer)


#: Iteration statistics TensorRT-LLM's ``/metrics`` keeps until read.
ITERATION_STATS_KEPT = 1000


class SimEngineServer:
    """The simulated engine behind an aiohttp application."""

    def __init__(self, config: ServerConfig) -> None:
        if not config.time_scale > 0:
            raise ValueError("--time-scale must be > 0")
        self.config = config
        self.core: EngineCore = config.sim.build()
        self.model_name = config.served_model_names[0]
        engine = config.sim.engine.value
        self.table = (
            names.trtllm_metrics(config.engine_version)
            if engine == "trtllm" and config.engine_version
            else names.engine_metrics(engine)
        )
        self.metrics = EngineMetrics(
            self.model_name, max_model_len=self.core.scheduler.config.max_model_len, table=self.table
        )
        self.iteration_stats: deque[dict[str, Any]] = deque(maxlen=ITERATION_STATS_KEPT)
        self._iteration = 0
        self.streams: dict[str, Choice] = {}
        self._wall0 = time.monotonic()
        self._sim_clock = 0.0
        self._work = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._healthy = True
        self.created = int(time.time())
        sched = self.core.scheduler.config
        self.startup_limits = LiveLimits(
            sched.max_num_batched_tokens, sched.max_num_seqs, sched.max_num_active_seqs or sched.max_num_seqs
        )
        self.live_limits = self.startup_limits
        self._live_generation = 0
        self.kv: KVSide | None = None
        if config.kv_connector is not None:
            self.kv = KVSide(self, config.kv_connector, config.kv_transfer)
            self.metrics.extra = self.kv.metric_lines
        tokenizer.vocabulary(self.vocab_size)  # built once, before the first request

    @property
    def vocab_size(self) -> int:
        """Token ids run from 0 to ``vocab_size - 1``."""
        return self.core.model.vocab_size

    @property
    def max_model_len(self) -> int:
        """Context length: prompt plus output tokens."""
        return self.core.scheduler.config.max_model_len

    # ---- clock ------------------------------------------------------------------------------
    def sim_now(self) -> float:
        """Simulated time now by the wall clock, never before the step in flight ends (aborts, expiries)."""
        return max(self._sim_clock, self.wall_now())

    def wall_now(self) -> float:
        """Simulated seconds since start by the wall clock (arrival times: a request that arrives while a
        step is in flight arrives now, not when that step ends)."""
        return (time.monotonic() - self._wall0) * self.config.time_scale

    def _wall_at(self, sim_s: float) -> float:
        return self._wall0 + sim_s / self.config.time_scale

    # ---- application ------------------------------------------------------------------------
    def app(self) -> web.Application:
        """The aiohttp application with every route."""
        app = web.Application(middlewares=[errors_middleware], client_max_size=MAX_BODY_BYTES)
        app.router.add_get(self.table.health_path, self.health)
        if self.config.metrics_enabled:
            app.router.add_get(self.table.metrics_path, self.metrics_handler)
        if self.table.engine == "trtllm":
            app.router.add_get("/metrics", self.iteration_stats_handler)
        app.router.add_get(LIVE_ADJUST_ROUTE, self.get_limits)
        app.router.add_put(LIVE_ADJUST_ROUTE, self.put_limits)
        OpenAIRoutes(self).add_to(app.router)
        if self.kv is not None:
            self.kv.add_routes(app)
        app.on_startup.append(self._start_engine)
        app.on_shutdown.append(self._stop_engine)
        return app

    async def _start_engine(self, _: web.Application) -> None:
        self._task = asyncio.create_task(self._engine_loop())

    async def _stop_engine(self, _: web.Application) -> None:
        self._healthy = False
        deadline = time.monotonic() + self.config.shutdown_timeout
        while self.core.scheduler.has_unfinished() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # ---- engine task ------------------------------------------------------------------------
    async def _engine_loop(self) -> None:
        sched = self.core.scheduler
        while True:
            if not sched.has_unfinished():
                self._work.clear()
                self._update_gauges()
                await self._work.wait()
                continue
            start = self._step_start()
            result = self._step(start)
            if result is None:
                self._work.clear()
                if self.kv is not None:
                    self.kv.drain()
                await self._idle(start)
                continue
            self._sim_clock = result.end_s
            delay = self._wall_at(result.end_s) - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                await asyncio.sleep(0)
            self._deliver(result)

    def _step_start(self) -> float:
        """Simulated start of the next step: the end of the last one (or the event that made work),
        unless the clock trails the wall clock by more than :data:`MAX_CLOCK_LAG_S`."""
        return max(self._sim_clock, self.wall_now() - MAX_CLOCK_LAG_S * self.config.time_scale)

    def _step(self, start: float) -> StepResult | None:
        """One step at ``start`` over the requests that had arrived by then (later arrivals wait for
        the next step, as a request arriving during a step does offline)."""
        sched = self.core.scheduler
        waiting = sched.waiting
        if not any(r.arrival_s > start for r in waiting):
            return self.core.step(start)
        late = [r for r in waiting if r.arrival_s > start]
        sched.waiting = deque(r for r in waiting if r.arrival_s <= start)
        try:
            return self.core.step(start)
        finally:
            sched.waiting.extend(late)

    def _next_event(self, after: float) -> float:
        """Earliest known simulated time after ``after`` at which a step may run: a queued request's
        arrival or a remote KV's (inf when none is known)."""
        sched = self.core.scheduler
        arrivals = (r.arrival_s for r in sched.waiting if r.arrival_s > after)
        ready = sched.next_kv_ready_s()
        return min(min(arrivals, default=math.inf), ready if ready > after else math.inf)

    async def _idle(self, start: float) -> None:
        """Nothing could run at ``start``: move the clock to the next event, waiting (at most
        :data:`IDLE_POLL_S`) for the wall clock to reach it, new work, or freed blocks."""
        event = self._next_event(start)
        if event > self.wall_now():
            timeout = min(self._wall_at(event) - time.monotonic(), IDLE_POLL_S)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._work.wait(), max(0.001, timeout))
            event = self._next_event(start)  # a request may have come in meanwhile
        # An event of unknown time (blocks freed, a poll) happened by the wall clock.
        self._sim_clock = max(self._sim_clock, min(event, self.wall_now()))

    def wake(self) -> None:
        """Let the engine task schedule again (new work or freed blocks)."""
        self._work.set()

    def _deliver(self, result: StepResult) -> None:
        m = self.metrics
        m.observe(SCHEDULED_TOKENS_PER_STEP, result.output.num_scheduled_tokens)
        m.step(result)
        m.iteration(
            sum(out.request.prompt_tokens for out in result.results if out.is_first_token),
            sum(out.new_tokens for out in result.results),
            emitted=bool(result.results),
        )
        if result.output.preempted:
            m.inc(names.NUM_PREEMPTIONS, len(result.output.preempted))
        end = result.end_s
        for out in result.results:
            request = out.request
            if out.is_first_token:
                m.observe(names.TIME_TO_FIRST_TOKEN, end - request.arrival_s)
                scheduled = (
                    request.first_scheduled_s if request.first_scheduled_s is not None else request.arrival_s
                )
                m.observe(names.REQUEST_QUEUE_TIME, scheduled - request.arrival_s)
                m.observe(names.REQUEST_PREFILL_TIME, end - scheduled)
            elif out.previous_token_s is not None:
                m.observe(names.INTER_TOKEN_LATENCY, end - out.previous_token_s)
            stream = self.streams.get(request.request_id)
            if out.finished:
                m.finished(stream.plan.finish_reason if stream is not None else "length")
                m.observe(names.E2E_REQUEST_LATENCY, end - request.arrival_s)
                m.observe(names.REQUEST_DECODE_TIME, end - (request.first_token_s or end))
                if request.num_output_tokens > 1 and request.first_token_s is not None:
                    tpot = (end - request.first_token_s) / (request.num_output_tokens - 1)
                    m.observe(names.REQUEST_TIME_PER_OUTPUT_TOKEN, tpot)
            if stream is not None:
                stream.queue.put_nowait((stream.index, out.new_tokens, out.finished))
        kv = self.core.scheduler.kv
        m.counters[names.PREFIX_CACHE_QUERIES] = float(kv.queries)
        m.counters[names.PREFIX_CACHE_HITS] = float(kv.hits)
        if self.kv is not None:
            self.kv.after_step(result.results)
        self._update_gauges()
        if self.table.engine == "trtllm":
            self._record_iteration(result)

    def _record_iteration(self, result: StepResult) -> None:
        """One entry of TensorRT-LLM's iteration statistics (the fields its /metrics JSON carries)."""
        sched = self.core.scheduler
        kv = sched.kv
        context = [item for item in result.output.scheduled if item.is_prefill]
        self._iteration += 1
        self.iteration_stats.append(
            {
                "iter": self._iteration,
                "iterLatencyMS": result.duration_s * 1e3,
                "numActiveRequests": len(sched.running),
                "numQueuedRequests": len(sched.waiting),
                "numCompletedRequests": sum(1 for out in result.results if out.finished),
                "maxNumActiveRequests": sched.config.max_num_seqs,
                "maxBatchSizeRuntime": sched.config.max_num_seqs,
                "maxNumTokensRuntime": sched.config.max_num_batched_tokens,
                "kvCacheStats": {
                    "maxNumBlocks": kv.num_blocks,
                    "freeNumBlocks": kv.num_free_blocks,
                    "usedNumBlocks": kv.num_blocks - kv.num_free_blocks,
                    "tokensPerBlock": kv.block_size,
                },
                "inflightBatchingStats": {
                    "numContextRequests": len(context),
                    "numCtxTokens": sum(item.num_new_tokens for item in context),
                    "numGenRequests": len(result.output.scheduled) - len(context),
                    "numPausedRequests": len(result.output.preempted),
                    "numScheduledRequests": len(result.output.scheduled),
                },
            }
        )

    def _update_gauges(self) -> None:
        sched = self.core.scheduler
        self.metrics.set(names.NUM_REQUESTS_RUNNING, len(sched.running))
        self.metrics.set(names.NUM_REQUESTS_WAITING, len(sched.waiting))
        self.metrics.set(names.KV_CACHE_USAGE, sched.kv.usage)

    def submit(
        self,
        prompt_ids: list[int],
        plan: Plan,
        index: int,
        queue: asyncio.Queue[tuple[int, int, bool]],
        kv_role: bool | RemotePrefill | None = None,
    ) -> Choice:
        """Hand one choice to the scheduler; its tokens arrive in ``queue`` (``kv_role``: see
        :meth:`KVSide.role`)."""
        request_id = uuid.uuid4().hex
        sched = self.core.scheduler
        request = Request(
            request_id,
            self.wall_now(),
            len(prompt_ids),
            plan.num_tokens,
            tokenizer.block_hashes(prompt_ids, sched.config.block_size),
        )
        choice = Choice(request, index, plan, queue)
        self.streams[request_id] = choice
        if self.kv is not None:
            self.kv.prepare(request, kv_role, plan.finish_reason)
        sched.add_request(request)
        self._work.set()
        return choice

    def abort(self, choice: Choice) -> None:
        """Abort ``choice`` unless it finished (counted as ``abort``); forget it either way."""
        request = choice.request
        if request.status is not RequestStatus.FINISHED:
            self.core.scheduler.abort(request, self.sim_now())
            self.metrics.finished(FinishReason.ABORT.value)
            if self.kv is not None:
                self.kv.aborted(request)
            self._update_gauges()
        self.streams.pop(request.request_id, None)

    # ---- handlers ---------------------------------------------------------------------------
    async def health(self, _: web.Request) -> web.Response:
        """200 while the engine runs, 503 once it is shutting down or failed."""
        alive = self._healthy and self._task is not None and not self._task.done()
        return web.Response(status=200 if alive else 503)

    async def metrics_handler(self, _: web.Request) -> web.Response:
        """Prometheus text exposition."""
        self._update_gauges()
        return web.Response(text=self.metrics.render(), content_type="text/plain", charset="utf-8")

    async def iteration_stats_handler(self, _: web.Request) -> web.Response:
        """TensorRT-LLM's ``/metrics``: the iteration statistics since the last read, as JSON."""
        stats = list(self.iteration_stats)
        self.iteration_stats.clear()
        return web.json_response(stats)

    # ---- live adjustment (the vLLM plugin's contract, see chunkpilot.engine.vllm_plugin.endpoint)
    def _limits_refusal(self, request: web.Request) -> web.Response | None:
        problem = access_problem(
            self.config.live_adjust_token, request.headers.get("Authorization"), configured=True
        )
        if problem is None:
            return None
        headers = {"WWW-Authenticate": "Bearer"} if problem.status == 401 else None
        return web.json_response({"error": problem.message}, status=problem.status, headers=headers)

    def _limits_snapshot(self) -> dict[str, Any]:
        """The plugin's answer: start-up limits, the last request and what the scheduler applied."""
        if not self._live_generation:
            return {"startup": self.startup_limits.to_json(), "requested": None, "applied": None}
        limits = self.live_limits.to_json()
        return {
            "startup": self.startup_limits.to_json(),
            "requested": {"generation": self._live_generation, "limits": limits},
            "applied": {
                "generation": self._live_generation,
                "startup": self.startup_limits.to_json(),
                "applied": limits,
                "error": None,
            },
        }

    async def get_limits(self, request: web.Request) -> web.Response:
        """``GET /chunkpilot/v1/scheduler/limits``: start-up, requested and applied limits."""
        refusal = self._limits_refusal(request)
        if refusal is not None:
            return refusal
        return web.json_response(self._limits_snapshot())

    async def put_limits(self, request: web.Request) -> web.Response:
        """``PUT /chunkpilot/v1/scheduler/limits``: lower limits now; 409 for a raise above start-up."""
        refusal = self._limits_refusal(request)
        if refusal is not None:
            return refusal
        example = 'the body must be a JSON object such as {"max_num_batched_tokens": 1024}'
        try:
            body = json.loads(await request.read())
        except (ValueError, RecursionError):
            return web.json_response({"error": example}, status=400)
        if not isinstance(body, dict):
            return web.json_response({"error": example}, status=400)
        try:
            new = lowered_limits(self.startup_limits, self.live_limits, body)
            active = None if new.max_num_active_seqs >= new.max_num_seqs else new.max_num_active_seqs
            # Steps are scheduled on this event loop, so the change lands between two steps.
            self.core.scheduler.set_limits(new.max_num_batched_tokens, new.max_num_seqs, active)
        except LimitRaiseError as exc:
            return web.json_response({"error": str(exc)}, status=409)
        except (PluginConfigError, ValueError) as exc:
            return web.json_response({"error": str(exc)}, status=422)
        self.live_limits = new
        self._live_generation += 1
        return web.json_response(self._limits_snapshot())


def serve(config: ServerConfig) -> None:
    """Run the server until interrupted (SIGINT/SIGTERM).

    A client that disconnects cancels its handler, which aborts its requests in the engine
    (streaming or not), as vLLM does. ``OSError`` (address in use, unresolvable host) propagates.
    """
    server = SimEngineServer(config)
    web.run_app(
        server.app(),
        host=config.host,
        port=config.port,
        print=lambda line: print(line, flush=True),
        access_log=None,
        shutdown_timeout=max(1.0, config.shutdown_timeout),
        handler_cancellation=True,
    )
