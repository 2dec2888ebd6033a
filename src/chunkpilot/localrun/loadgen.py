"""Trace-replay load generator: streaming completions against a service's Ready endpoints.

Requests leave at the trace's (time-scaled) arrival times whether or not earlier ones have finished
(an open-loop client, as real users are), each to the next Ready pod in round-robin order. Every
request asks for exactly the trace's output length (``max_tokens`` with ``ignore_eos``) and carries a
prompt of the trace's prompt length. The run is bounded in requests, in time and in concurrency, and
stops by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import string
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import aiohttp

from chunkpilot.localrun.endpoints import Balancer, Endpoint
from chunkpilot.localrun.stats import LoadSummary, RequestRecord, summarise
from chunkpilot.localrun.traces import TraceRequest

PromptBuilder = Callable[[int, random.Random], str]


def word_prompt(tokens: int, rng: random.Random) -> str:
    """A prompt of ``tokens`` tokens under common token-count approximations.

    Three-letter lowercase words joined by single spaces count one token per word whether the
    tokenizer approximation splits on whitespace, on word characters, or counts four characters
    per token. Words are random, so different requests share no prefix (no accidental prefix-cache
    hits).
    """
    letters = string.ascii_lowercase
    return " ".join("".join(rng.choices(letters, k=3)) for _ in range(max(1, tokens)))


@dataclass(frozen=True, slots=True)
class LoadOptions:
    """Bounds and knobs of one load run."""

    time_scale: float = 1.0
    duration_s: float | None = None
    max_concurrency: int = 256
    request_timeout_s: float = 300.0
    drain_timeout_s: float = 60.0
    no_endpoint_wait_s: float = 5.0
    model: str | None = None
    seed: int = 0


class ModelNames:
    """The served model name of each endpoint, asked once from its ``/v1/models``."""

    def __init__(self, fixed: str | None) -> None:
        self._fixed = fixed
        self._names: dict[str, str] = {}

    async def name(self, session: aiohttp.ClientSession, endpoint: Endpoint) -> str:
        if self._fixed is not None:
            return self._fixed
        cached = self._names.get(endpoint.url)
        if cached is None:
            async with session.get(f"{endpoint.url}/v1/models") as response:
                response.raise_for_status()
                body = await response.json()
            cached = str(body["data"][0]["id"])
            self._names[endpoint.url] = cached
        return cached


async def _pick(balancer: Balancer, wait_s: float, stop: asyncio.Event) -> Endpoint | None:
    deadline = time.monotonic() + wait_s
    while True:
        endpoint = balancer.pick()
        if endpoint is not None or time.monotonic() >= deadline or stop.is_set():
            return endpoint
        await asyncio.sleep(0.1)


async def stream_completion(
    session: aiohttp.ClientSession,
    endpoint: Endpoint,
    model: str,
    prompt: str,
    max_tokens: int,
    record: RequestRecord,
    clock_origin: float,
    timeout_s: float,
) -> None:
    """Send one streaming completion and fill ``record`` with what the client saw."""
    payload: dict[str, Any] = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.monotonic()
    record.started_s = started - clock_origin
    last_token: float | None = None
    chunks = 0
    usage_tokens: int | None = None
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with session.post(f"{endpoint.url}/v1/completions", json=payload, timeout=timeout) as response:
        if response.status != 200:
            body = (await response.text())[:200]
            record.error = f"http_{response.status}: {body}"
            return
        async for raw in response.content:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            event = json.loads(data)
            if "error" in event:
                record.error = f"stream_error: {event['error']}"
                return
            usage = event.get("usage")
            if usage:
                usage_tokens = int(usage.get("completion_tokens", 0))
            if any(choice.get("text") for choice in event.get("choices", [])):
                now = time.monotonic()
                if last_token is None:
                    record.ttft_s = now - started
                else:
                    record.itl_s.append(now - last_token)
                last_token = now
                chunks += 1
    record.e2e_s = time.monotonic() - started
    record.output_tokens = usage_tokens if usage_tokens is not None else chunks
    if record.ttft_s is None:
        record.error = "no_tokens: the stream ended without a token"


async def _one_request(
    index: int,
    request: TraceRequest,
    session: aiohttp.ClientSession,
    balancer: Balancer,
    models: ModelNames,
    prompt_builder: PromptBuilder,
    rng: random.Random,
    options: LoadOptions,
    clock_origin: float,
    stop: asyncio.Event,
    record: RequestRecord,
) -> None:
    endpoint = await _pick(balancer, options.no_endpoint_wait_s, stop)
    if endpoint is None:
        record.error = "no_ready_endpoint: the service had no Ready endpoint"
        return
    record.pod, record.track = endpoint.pod, endpoint.track
    try:
        model = await models.name(session, endpoint)
        prompt = prompt_builder(request.prompt_tokens, rng)
        await stream_completion(
            session,
            endpoint,
            model,
            prompt,
            request.output_tokens,
            record,
            clock_origin,
            options.request_timeout_s,
        )
    except TimeoutError:
        record.error = "timeout: no complete answer within the request timeout"
    except aiohttp.ClientError as error:
        record.error = f"connection: {type(error).__name__}: {error}"
    except (ValueError, KeyError) as error:
        record.error = f"protocol: {type(error).__name__}: {error}"


async def replay(
    schedule: Iterable[TraceRequest],
    balancer: Balancer,
    options: LoadOptions | None = None,
    *,
    prompt_builder: PromptBuilder = word_prompt,
    stop: asyncio.Event | None = None,
    on_record: Callable[[RequestRecord], None] | None = None,
) -> tuple[list[RequestRecord], float]:
    """Send the scheduled requests (wall offsets) and return their records and the run's wall time.

    Stops issuing at the end of the schedule, after ``duration_s``, or when ``stop`` is set; then
    waits up to ``drain_timeout_s`` for requests in flight and cancels the rest.
    """
    options = options or LoadOptions()
    stop = stop or asyncio.Event()
    rng = random.Random(options.seed)
    records: list[RequestRecord] = []
    tasks: set[asyncio.Task[None]] = set()
    slots = asyncio.Semaphore(options.max_concurrency)
    models = ModelNames(options.model)
    connector = aiohttp.TCPConnector(limit=options.max_concurrency, force_close=False)
    origin = time.monotonic()
    deadline = None if options.duration_s is None else origin + options.duration_s

    async def guarded(index: int, request: TraceRequest, record: RequestRecord) -> None:
        try:
            await _one_request(
                index, request, session, balancer, models, prompt_builder, rng, options, origin, stop, record
            )
        finally:
            slots.release()
            if on_record is not None:
                on_record(record)

    async with aiohttp.ClientSession(connector=connector) as session:
        for index, request in enumerate(schedule):
            due = origin + request.arrival_s
            if deadline is not None and due >= deadline:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=max(0.0, due - time.monotonic()))
            if stop.is_set():
                break
            await slots.acquire()
            record = RequestRecord(index, request.arrival_s, request.prompt_tokens, request.output_tokens)
            records.append(record)
            task = asyncio.create_task(guarded(index, request, record))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            _, pending = await asyncio.wait(set(tasks), timeout=options.drain_timeout_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
    for record in records:
        if record.error is None and record.e2e_s is None:
            record.error = "cancelled: still running when the load run ended"
    return records, time.monotonic() - origin


async def run_load(
    schedule: Iterable[TraceRequest],
    balancer: Balancer,
    options: LoadOptions | None = None,
    *,
    prompt_builder: PromptBuilder = word_prompt,
    stop: asyncio.Event | None = None,
) -> LoadSummary:
    """Replay ``schedule`` and summarise what the client measured."""
    options = options or LoadOptions()
    records, wall = await replay(schedule, balancer, options, prompt_builder=prompt_builder, stop=stop)
    return summarise(records, wall, options.time_scale)


class BackgroundLoad:
    """A load run on its own thread and event loop (for the local stack and the demo)."""

    def __init__(
        self,
        schedule: Iterable[TraceRequest],
        balancer: Balancer,
        options: LoadOptions | None = None,
        *,
        prompt_builder: PromptBuilder = word_prompt,
    ) -> None:
        self._schedule = schedule
        self._balancer = balancer
        self._options = options or LoadOptions()
        self._prompt_builder = prompt_builder
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._summary: LoadSummary | None = None
        self._error: BaseException | None = None
        self._records: list[RequestRecord] = []
        self._thread = threading.Thread(target=self._main, name="chunkpilot-load", daemon=True)

    def start(self) -> BackgroundLoad:
        """Start sending requests; returns ``self``."""
        self._thread.start()
        self._ready.wait()
        return self

    def _main(self) -> None:
        async def body() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            self._ready.set()
            records, wall = await replay(
                self._schedule,
                self._balancer,
                self._options,
                prompt_builder=self._prompt_builder,
                stop=self._stop,
                on_record=self._records.append,
            )
            self._summary = summarise(records, wall, self._options.time_scale)

        try:
            asyncio.run(body())
        except BaseException as error:
            self._error = error
        finally:
            self._ready.set()

    @property
    def running(self) -> bool:
        """Whether requests are still being sent or awaited."""
        return self._thread.is_alive()

    def completed_records(self) -> list[RequestRecord]:
        """Records of the requests finished so far."""
        return list(self._records)

    def stop(self, timeout_s: float | None = None) -> LoadSummary | None:
        """Stop issuing requests, wait for those in flight (up to the drain timeout), summarise."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and self._thread.is_alive():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stop.set)
        return self.wait(timeout_s)

    def wait(self, timeout_s: float | None = None) -> LoadSummary | None:
        """Wait for the run to end by itself; its summary, or ``None`` if still running."""
        self._thread.join(timeout_s)
        if self._error is not None:
            raise self._error
        return self._summary
