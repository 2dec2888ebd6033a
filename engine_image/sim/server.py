"""Server mode: an OpenAI-compatible HTTP API driven in (scaled) real time by the simulated engine.

One asyncio task runs the engine: it schedules a step, waits the step's simulated duration divided
by the time scale, then delivers the step's tokens to the waiting streams and records the vLLM
metrics. Simulated time is ``time_scale x`` wall time since start; every latency the engine reports
(``/metrics``) is in simulated seconds, i.e. what the modelled GPU would show.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from chunkpilot.engine import metrics_names as names
from chunkpilot.engine.sim import tokenizer
from chunkpilot.engine.sim.engine import EngineCore, SimConfig, StepResult
from chunkpilot.engine.sim.metrics import SCHEDULED_TOKENS_PER_STEP, EngineMetrics
from chunkpilot.engine.sim.scheduler import FinishReason, Request, RequestStatus
from chunkpilot.engine.vllm_plugin.config import (
    LIVE_ADJUST_ROUTE,
    LimitRaiseError,
    LiveLimits,
    PluginConfigError,
    access_problem,
    lowered_limits,
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class APIError(Exception):
    """An error answered with an OpenAI-style body."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.kind = kind or {400: "BadRequestError", 404: "NotFoundError", 405: "MethodNotAllowed"}.get(
            status, "InternalServerError"
        )

    def response(self) -> web.Response:
        """The JSON error response."""
        body = {
            "error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}
        }
        return web.json_response(body, status=self.status)


@dataclass(slots=True)
class _Stream:
    """Bridge between the engine task and one HTTP request."""

    request: Request
    queue: asyncio.Queue[tuple[int, bool]] = field(default_factory=asyncio.Queue)
    natural_stop: bool = False


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


class SimEngineServer:
    """The simulated engine behind an aiohttp application."""

    def __init__(self, config: ServerConfig) -> None:
        if not config.time_scale > 0:
            raise ValueError("--time-scale must be > 0")
        self.config = config
        self.core: EngineCore = config.sim.build()
        self.model_name = config.served_model_names[0]
        self.metrics = EngineMetrics(self.model_name)
        self.streams: dict[str, _Stream] = {}
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

    # ---- clock ------------------------------------------------------------------------------
    def sim_now(self) -> float:
        """Simulated time at which the next step may start (never before the step in flight ends)."""
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
        app = web.Application(middlewares=[self._errors], client_max_size=64 * 2**20)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics_handler)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/version", self.version)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_get(LIVE_ADJUST_ROUTE, self.get_limits)
        app.router.add_put(LIVE_ADJUST_ROUTE, self.put_limits)
        app.on_startup.append(self._start_engine)
        app.on_shutdown.append(self._stop_engine)
        return app

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except APIError as error:
            return error.response()
        except web.HTTPException as error:
            if error.status < 400:
                raise
            return APIError(error.status, error.reason or "error").response()

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
            start = self.sim_now()
            result = self.core.step(start)
            if result is None:
                self._work.clear()
                await asyncio.sleep(0.001)
                continue
            self._sim_clock = result.end_s
            delay = self._wall_at(result.end_s) - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                await asyncio.sleep(0)
            self._deliver(result)

    def _deliver(self, result: StepResult) -> None:
        m = self.metrics
        m.observe(SCHEDULED_TOKENS_PER_STEP, result.output.num_scheduled_tokens)
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
                reason = "stop" if stream is not None and stream.natural_stop else "length"
                m.finished(reason)
                m.observe(names.E2E_REQUEST_LATENCY, end - request.arrival_s)
                m.observe(names.REQUEST_DECODE_TIME, end - (request.first_token_s or end))
            if stream is not None:
                stream.queue.put_nowait((out.new_tokens, out.finished))
        kv = self.core.scheduler.kv
        m.counters[names.PREFIX_CACHE_QUERIES] = float(kv.queries)
        m.counters[names.PREFIX_CACHE_HITS] = float(kv.hits)
        self._update_gauges()

    def _update_gauges(self) -> None:
        sched = self.core.scheduler
        self.metrics.set(names.NUM_REQUESTS_RUNNING, len(sched.running))
        self.metrics.set(names.NUM_REQUESTS_WAITING, len(sched.waiting))
        self.metrics.set(names.KV_CACHE_USAGE, sched.kv.usage)

    def _submit(self, prompt_ids: list[int], max_tokens: int, natural_stop: bool) -> _Stream:
        request_id = uuid.uuid4().hex
        sched = self.core.scheduler
        request = Request(
            request_id,
            self.wall_now(),
            len(prompt_ids),
            max_tokens,
            tokenizer.block_hashes(prompt_ids, sched.config.block_size),
        )
        stream = _Stream(request, natural_stop=natural_stop)
        self.streams[request_id] = stream
        sched.add_request(request)
        self._work.set()
        return stream

    def _abort(self, stream: _Stream) -> None:
        request = stream.request
        if request.status is not RequestStatus.FINISHED:
            self.core.scheduler.abort(request, self.sim_now())
            self.metrics.finished(FinishReason.ABORT.value)
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

    async def version(self, _: web.Request) -> web.Response:
        """Engine version (the vLLM version whose semantics are simulated)."""
        return web.json_response({"version": "0.33.0+chunkpilot.sim"})

    async def models(self, _: web.Request) -> web.Response:
        """The served model names."""
        data = [
            {
                "id": name,
                "object": "model",
                "created": self.created,
                "owned_by": "vllm",
                "root": self.config.sim.model,
                "parent": None,
                "max_model_len": self.core.scheduler.config.max_model_len,
            }
            for name in self.config.served_model_names
        ]
        return web.json_response({"object": "list", "data": data})

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
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
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

    async def completions(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/completions``."""
        body = await _json_body(request)
        prompt = body.get("prompt")
        vocab = self.core.model.vocab_size
        if isinstance(prompt, str):
            ids = tokenizer.encode(prompt, vocab)
        elif (
            isinstance(prompt, list)
            and prompt
            and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
        ):
            ids = list(prompt)
        elif isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            ids = tokenizer.encode(prompt[0], vocab)
        else:
            raise APIError(400, "'prompt' must be a non-empty string or a list of token ids", "prompt")
        return await self._generate(request, body, ids, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/chat/completions``."""
        body = await _json_body(request)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise APIError(400, "'messages' must be a non-empty list", "messages")
        parsed: list[tuple[str, str]] = []
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise APIError(400, f"messages[{i}] must be an object with a string 'role'", "messages")
            parsed.append((message["role"], _content_text(message.get("content"), i)))
        ids = tokenizer.encode_chat(parsed, self.core.model.vocab_size)
        return await self._generate(request, body, ids, chat=True)

    async def _generate(
        self, http: web.Request, body: dict[str, Any], prompt_ids: list[int], chat: bool
    ) -> web.StreamResponse:
        self._check_model(body.get("model"))
        max_len = self.core.scheduler.config.max_model_len
        limit_key = (
            "max_completion_tokens"
            if chat and body.get("max_completion_tokens") is not None
            else "max_tokens"
        )
        max_tokens = body.get(limit_key)
        if max_tokens is None:
            max_tokens = max_len - len(prompt_ids)
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise APIError(400, f"'{limit_key}' must be a positive integer", limit_key)
        n = body.get("n", 1)
        if n != 1:
            raise APIError(400, "only n=1 is supported", "n")
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise APIError(400, "'stream' must be a boolean", "stream")
        ignore_eos = body.get("ignore_eos", False)
        if not isinstance(ignore_eos, bool):
            raise APIError(400, "'ignore_eos' must be a boolean", "ignore_eos")
        if len(prompt_ids) + max_tokens > max_len:
            raise APIError(
                400,
                f"This model's maximum context length is {max_len} tokens. However, you requested "
                f"{len(prompt_ids) + max_tokens} tokens ({len(prompt_ids)} in the messages, "
                f"{max_tokens} in the completion). Please reduce the length of the messages or completion.",
                limit_key,
            )
        natural = tokenizer.natural_length(prompt_ids)
        natural_stop = not ignore_eos and natural < max_tokens
        target = natural if natural_stop else max_tokens
        options = body.get("stream_options") or {}
        include_usage = bool(isinstance(options, dict) and options.get("include_usage"))
        generation = self._submit(prompt_ids, target, natural_stop)
        if stream:
            return await self._stream(http, generation, chat, include_usage)
        return await self._complete(http, generation, chat)

    def _check_model(self, model: object) -> None:
        if model is None:
            return
        if not isinstance(model, str):
            raise APIError(400, "'model' must be a string", "model")
        if model not in self.config.served_model_names and model != self.config.sim.model:
            raise APIError(404, f"The model `{model}` does not exist.", "model", "NotFoundError")

    async def _complete(self, http: web.Request, generation: _Stream, chat: bool) -> web.Response:
        text = tokenizer.TextGenerator(generation.request.request_id)
        pieces: list[str] = []
        try:
            while True:
                count, finished = await generation.queue.get()
                pieces.append(text.tokens(count))
                if finished:
                    break
        finally:
            self._abort(generation)
        request = generation.request
        reason = "stop" if generation.natural_stop else "length"
        content = "".join(pieces)
        choice: dict[str, Any] = (
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": reason,
                "logprobs": None,
            }
            if chat
            else {"index": 0, "text": content, "finish_reason": reason, "logprobs": None}
        )
        return web.json_response(
            {
                "id": ("chatcmpl-" if chat else "cmpl-") + request.request_id,
                "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()),
                "model": self.model_name,
                "choices": [choice],
                "usage": _usage(request),
            }
        )

    async def _stream(
        self, http: web.Request, generation: _Stream, chat: bool, include_usage: bool
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(http)
        request = generation.request
        created = int(time.time())
        base = {
            "id": ("chatcmpl-" if chat else "cmpl-") + request.request_id,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": created,
            "model": self.model_name,
        }
        text = tokenizer.TextGenerator(request.request_id)
        try:
            if chat:
                first = {
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
                await _send(response, {**base, "choices": [first]})
            while True:
                count, finished = await generation.queue.get()
                reason = ("stop" if generation.natural_stop else "length") if finished else None
                piece = text.tokens(count)
                choice: dict[str, Any] = (
                    {"index": 0, "delta": {"content": piece}, "logprobs": None, "finish_reason": reason}
                    if chat
                    else {"index": 0, "text": piece, "logprobs": None, "finish_reason": reason}
                )
                chunk: dict[str, Any] = {**base, "choices": [choice]}
                if include_usage:
                    chunk["usage"] = None
                await _send(response, chunk)
                if finished:
                    break
            if include_usage:
                await _send(response, {**base, "choices": [], "usage": _usage(request)})
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            self._abort(generation)
            raise
        finally:
            self._abort(generation)
        return response


async def _send(response: web.StreamResponse, payload: dict[str, Any]) -> None:
    await response.write(f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode())


def _usage(request: Request) -> dict[str, int]:
    return {
        "prompt_tokens": request.prompt_tokens,
        "completion_tokens": request.num_output_tokens,
        "total_tokens": request.prompt_tokens + request.num_output_tokens,
    }


async def _json_body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise APIError(400, f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise APIError(400, "request body must be a JSON object")
    return body


def _content_text(content: object, index: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                raise APIError(400, f"messages[{index}].content: only text parts are supported", "messages")
        return "".join(parts)
    if content is None:
        return ""
    raise APIError(400, f"messages[{index}].content must be a string or a list of text parts", "messages")


def serve(config: ServerConfig) -> None:
    """Run the server until interrupted (SIGINT/SIGTERM)."""
    server = SimEngineServer(config)
    web.run_app(
        server.app(),
        host=config.host,
        port=config.port,
        print=lambda line: print(line, flush=True),
        access_log=None,
        shutdown_timeout=max(1.0, config.shutdown_timeout),
    )
