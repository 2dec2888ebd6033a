"""The KV connector of a serving simulator (``sim serve --kv-transfer-config``): both roles of vLLM's
NIXL connector over HTTP.

Prefill role (``kv_transfer_params.do_remote_decode``): the request finishes after its one token and
keeps its KV blocks; the response carries the decode side's ``kv_transfer_params``. The blocks are
freed when a decode engine has read them (``DELETE /chunkpilot/v1/kv_transfer/{id}``) or after
``VLLM_NIXL_ABORT_REQUEST_TIMEOUT`` seconds, as vLLM's delayed free.

Decode role (``do_remote_prefill``): before the request is queued, the prefill engine named by
``remote_host``/``remote_port`` is asked whether it holds that KV (``GET
/chunkpilot/v1/kv_transfer/{id}``): unreachable is a 502, not held or not matching the prompt a 400.
The scheduler then allocates the prompt's blocks, waits ``bytes / bandwidth + latency`` and decodes;
on arrival the prefill engine is told to release its blocks.

The simulated side channel is the engine's HTTP port (vLLM's NIXL handshake uses a separate ZMQ
port, ``VLLM_NIXL_SIDE_CHANNEL_PORT``); ``remote_host`` is ``VLLM_NIXL_SIDE_CHANNEL_HOST`` when set,
else the listening address (``localhost`` for a wildcard one).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import uuid
from typing import Any, Protocol
from urllib.parse import quote

import aiohttp
from aiohttp import web
from chunkpilot.engine.sim.engine import EngineCore, SimConfig
from chunkpilot.engine.sim.http_api import APIError
from chunkpilot.engine.sim.kvtransfer import (
    KVConnectorConfig,
    KVTransfer,
    KVTransferParamsError,
    RemotePrefill,
    parse_kv_transfer_params,
)
from chunkpilot.engine.sim.metrics import Histogram, _fmt, _histogram_lines
from chunkpilot.engine.sim.scheduler import Request

__all__ = ["KV_TRANSFER_ROUTE", "KVSide"]

KV_TRANSFER_ROUTE = "/chunkpilot/v1/kv_transfer/{request_id}"
#: Seconds the decode side waits for the prefill engine's answer before calling it unreachable.
REMOTE_TIMEOUT_S = 5.0
#: vLLM's NIXL connector histograms (``NixlPromMetrics``).
XFER_TIME_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
BYTES_BUCKETS = tuple(float(2 ** (10 + i)) for i in range(1, 25, 2))
XFER_TIME = "vllm:nixl_xfer_time_seconds"
XFER_BYTES = "vllm:nixl_bytes_transferred"
FAILED_TRANSFERS = "vllm:nixl_num_failed_transfers"
FAILED_NOTIFICATIONS = "vllm:nixl_num_failed_notifications"
PROMPT_BY_SOURCE = "vllm:prompt_tokens_by_source_total"
PROMPT_CACHED = "vllm:prompt_tokens_cached_total"
PROMPT_RECOMPUTED = "vllm:prompt_tokens_recomputed_total"
EXTERNAL_QUERIES = "vllm:external_prefix_cache_queries_total"
EXTERNAL_HITS = "vllm:external_prefix_cache_hits_total"
SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
_block_ids = itertools.count(1)


class SideChannelConfig(Protocol):
    """The server configuration the connector reads: where it listens and the simulated engine."""

    @property
    def host(self) -> str: ...

    @property
    def port(self) -> int: ...

    @property
    def sim(self) -> SimConfig: ...


class KVSideServer(Protocol):
    """What the connector uses of the server that runs the engine (``server.SimEngineServer``)."""

    @property
    def config(self) -> SideChannelConfig: ...

    @property
    def core(self) -> EngineCore: ...

    def sim_now(self) -> float: ...

    def wake(self) -> None: ...


class KVSide:
    """Both connector roles of one serving engine."""

    def __init__(self, server: KVSideServer, connector: KVConnectorConfig, link: KVTransfer) -> None:
        self.server = server
        self.connector = connector
        self.link = link
        self.engine_id = connector.engine_id or str(uuid.uuid4())
        config = server.config
        host = os.environ.get("VLLM_NIXL_SIDE_CHANNEL_HOST") or config.host
        self.host = "localhost" if host in ("", "0.0.0.0", "::") else host
        self.port = config.port
        self.bytes_per_token = server.core.model.kv_bytes_per_token
        sched = server.core.scheduler
        sched.kv_transfer_s = lambda tokens: link.seconds(self.bytes_per_token * tokens)
        #: Prefill side: simulated time at which a held request's blocks are freed anyway.
        self.expiry: dict[str, float] = {}
        self.block_ids: dict[str, list[int]] = {}
        #: Decode side: where each remote-prefilled request's KV lives, until it has arrived.
        self.remote: dict[str, RemotePrefill] = {}
        self.sources = dict.fromkeys(SOURCES, 0.0)
        self.cached = 0.0
        self.recomputed = 0.0
        self.external_queries = 0.0
        self.external_hits = 0.0
        self.xfer_time = Histogram(XFER_TIME_BUCKETS)
        self.xfer_bytes = Histogram(BYTES_BUCKETS)
        self.failed_transfers = 0.0
        self.failed_notifications = 0.0
        self._session: aiohttp.ClientSession | None = None
        self._expirer: asyncio.Task[None] | None = None
        self._notices: set[asyncio.Task[None]] = set()

    # ---- lifecycle ------------------------------------------------------------------------------
    def add_routes(self, app: web.Application) -> None:
        """The side-channel routes and the start/stop hooks."""
        app.router.add_get(KV_TRANSFER_ROUTE, self.describe)
        app.router.add_delete(KV_TRANSFER_ROUTE, self.release)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)

    async def _start(self, _: web.Application) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=REMOTE_TIMEOUT_S))
        self._expirer = asyncio.create_task(self._expire_loop())

    async def _stop(self, _: web.Application) -> None:
        if self._expirer is not None:
            self._expirer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._expirer
        for task in list(self._notices):
            task.cancel()
        if self._session is not None:
            await self._session.close()

    async def _expire_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            now = self.server.sim_now()
            for request_id, deadline in list(self.expiry.items()):
                if deadline <= now:
                    self._free(request_id)

    # ---- request roles ----------------------------------------------------------------------------
    def role(self, params: Any, prompts: int, n: int) -> bool | RemotePrefill | None:
        """The role ``kv_transfer_params`` give an HTTP request (APIError 400 when unusable)."""
        try:
            role = parse_kv_transfer_params(params)
        except KVTransferParamsError as exc:
            raise APIError(400, str(exc), "kv_transfer_params") from None
        if role is not None and (prompts != 1 or n != 1):
            raise APIError(
                400, "kv_transfer_params apply to a request of one prompt and n=1", "kv_transfer_params"
            )
        return role

    async def check_remote(self, remote: RemotePrefill, prompt_tokens: int) -> None:
        """Ask the prefill engine whether it holds the KV ``remote`` names for this prompt."""
        assert self._session is not None
        url = _kv_url(remote)
        where = f"the prefill engine at {remote.host}:{remote.port}"
        try:
            async with self._session.get(url, params={"engine_id": remote.engine_id}) as answer:
                status = answer.status
                body = await answer.json(content_type=None) if status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            self.failed_transfers += 1
            raise APIError(
                502, f"{where} is unreachable for the remote prefill ({type(exc).__name__}: {exc})",
                "kv_transfer_params",
            ) from None  # fmt: skip
        if status != 200 or not isinstance(body, dict):
            self.failed_transfers += 1
            raise APIError(
                400,
                f"{where} holds no KV for remote_request_id {remote.request_id} of engine "
                f"{remote.engine_id} (HTTP {status}): never prefilled there, already read, or freed after "
                "VLLM_NIXL_ABORT_REQUEST_TIMEOUT",
                "kv_transfer_params",
            )
        if body.get("prompt_tokens") != prompt_tokens or body.get("num_blocks") != len(remote.block_ids):
            self.failed_transfers += 1
            raise APIError(
                400,
                f"kv_transfer_params do not match this prompt: {where} holds {body.get('prompt_tokens')} "
                f"prompt tokens in {body.get('num_blocks')} blocks, this request has {prompt_tokens} tokens "
                f"and names {len(remote.block_ids)} blocks",
                "kv_transfer_params",
            )

    def prepare(self, request: Request, role: bool | RemotePrefill | None, finish_reason: str) -> None:
        """Mark a new engine request with its role before it is queued (a prefill that will stop
        rather than reach its length frees its blocks at once, as vLLM's ``request_finished``)."""
        if role is True:
            request.kv_hold = finish_reason == "length"
        elif isinstance(role, RemotePrefill):
            request.remote_prefill = True
            self.remote[request.request_id] = role

    def response_params(self, request: Request) -> dict[str, Any] | None:
        """The ``kv_transfer_params`` of a finished request's response (vLLM's ``request_finished``)."""
        if request.request_id not in self.server.core.scheduler.held:
            return None
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": self.block_ids.get(request.request_id, []),
            "remote_engine_id": self.engine_id,
            "remote_request_id": request.request_id,
            "remote_host": self.host,
            "remote_port": self.port,
            "tp_size": self.server.config.sim.tensor_parallel_size,
        }

    def aborted(self, request: Request) -> None:
        """A decode request dropped before its KV arrived still frees the prefill side (as vLLM does)."""
        remote = self.remote.pop(request.request_id, None)
        if remote is not None:
            self._notify(remote)

    # ---- after each step ---------------------------------------------------------------------------
    def after_step(self, results: list[Any]) -> None:
        """Account the step's first tokens and finished prefills, and release what has arrived."""
        sched = self.server.core.scheduler
        for out in results:
            request = out.request
            if out.is_first_token:
                self._count_sources(request)
            if out.finished and request.request_id in sched.held:
                self.expiry[request.request_id] = self.server.sim_now() + self.link.abort_timeout_s
                self.block_ids[request.request_id] = [next(_block_ids) for _ in range(request.held_blocks)]
        self.drain()

    def drain(self) -> None:
        """Release the prefill side of every request whose KV has arrived."""
        sched = self.server.core.scheduler
        for request in sched.received:
            nbytes = self.bytes_per_token * request.num_external_tokens
            self.xfer_time.observe(self.link.seconds(nbytes))
            self.xfer_bytes.observe(float(nbytes))
            remote = self.remote.pop(request.request_id, None)
            if remote is not None:
                self._notify(remote)
        sched.received.clear()

    def _count_sources(self, request: Request) -> None:
        """vLLM's ``PromptTokenStats`` for one request reaching its first token."""
        prompt = request.prompt_tokens
        cached = request.num_cached_tokens
        recomputed = 1 if cached + 1 == prompt else 0
        external = request.num_external_tokens
        self.sources["local_compute"] += prompt - cached
        self.sources["external_kv_transfer"] += external
        self.sources["local_cache_hit"] += cached + recomputed - external
        self.cached += cached
        self.recomputed += recomputed
        # The connector's prefix-cache stats (vLLM records them when the request is scheduled).
        self.external_queries += prompt
        self.external_hits += external

    def _notify(self, remote: RemotePrefill) -> None:
        task = asyncio.get_running_loop().create_task(self._send_release(remote))
        self._notices.add(task)
        task.add_done_callback(self._notices.discard)

    async def _send_release(self, remote: RemotePrefill) -> None:
        if self._session is None:
            return
        url = _kv_url(remote)
        try:
            async with self._session.delete(url, params={"engine_id": remote.engine_id}) as answer:
                if answer.status != 200:
                    self.failed_notifications += 1
        except (aiohttp.ClientError, TimeoutError):
            self.failed_notifications += 1

    def _free(self, request_id: str) -> bool:
        self.expiry.pop(request_id, None)
        self.block_ids.pop(request_id, None)
        freed = self.server.core.scheduler.release_held(request_id)
        if freed:
            self.server.wake()
        return freed

    # ---- side channel -------------------------------------------------------------------------------
    def _held(self, http: web.Request) -> Request:
        request_id = http.match_info["request_id"]
        engine = http.query.get("engine_id")
        if engine is not None and engine != self.engine_id:
            raise APIError(404, f"this is engine {self.engine_id}, not {engine}", "engine_id")
        request = self.server.core.scheduler.held.get(request_id)
        if request is None:
            raise APIError(404, f"no KV held for request {request_id}", "request_id")
        return request

    async def describe(self, http: web.Request) -> web.Response:
        """``GET``: what a held request's KV is (the decode side checks it before queueing)."""
        request = self._held(http)
        return web.json_response(
            {
                "engine_id": self.engine_id,
                "request_id": request.request_id,
                "prompt_tokens": request.prompt_tokens,
                "num_blocks": request.held_blocks,
                "bytes": self.bytes_per_token * request.prompt_tokens,
            }
        )

    async def release(self, http: web.Request) -> web.Response:
        """``DELETE``: the decode side has read the KV; free the blocks."""
        request = self._held(http)
        self._free(request.request_id)
        return web.json_response({"released": request.request_id})

    # ---- metrics ----------------------------------------------------------------------------------
    def metric_lines(self, labels: str) -> list[str]:
        """The connector's Prometheus families (vLLM's prompt-source split and NIXL transfer stats)."""
        lines = [
            f"# HELP {PROMPT_BY_SOURCE} Number of prompt tokens by source.",
            f"# TYPE {PROMPT_BY_SOURCE} counter",
        ]
        lines += [f'{PROMPT_BY_SOURCE}{{{labels},source="{s}"}} {_fmt(self.sources[s])}' for s in SOURCES]
        for name, value, text in (
            (PROMPT_CACHED, self.cached, "Number of cached prompt tokens (local or external)."),
            (PROMPT_RECOMPUTED, self.recomputed, "Number of cached tokens recomputed for forward pass."),
            (
                EXTERNAL_QUERIES,
                self.external_queries,
                "External prefix cache queries from KV connector cross-instance cache sharing, in terms of "
                "number of queried tokens.",
            ),
            (
                EXTERNAL_HITS,
                self.external_hits,
                "External prefix cache hits from KV connector cross-instance cache sharing, in terms of "
                "number of cached tokens.",
            ),
            (FAILED_TRANSFERS, self.failed_transfers, "Number of failed NIXL KV Cache transfers."),
            (
                FAILED_NOTIFICATIONS,
                self.failed_notifications,
                "Number of failed NIXL KV Cache notifications.",
            ),
        ):
            lines += [f"# HELP {name} {text}", f"# TYPE {name} counter", f"{name}{{{labels}}} {_fmt(value)}"]
        for name, hist, text in (
            (XFER_TIME, self.xfer_time, "Histogram of transfer duration for NIXL KV Cache transfers."),
            (XFER_BYTES, self.xfer_bytes, "Histogram of bytes transferred per NIXL KV Cache transfers."),
        ):
            lines += [f"# HELP {name} {text}", f"# TYPE {name} histogram"]
            lines += _histogram_lines(name, labels, hist)
        return lines


def _kv_url(remote: RemotePrefill) -> str:
    """The prefill engine's KV route for ``remote``: the host checked, the request id quoted."""
    route = KV_TRANSFER_ROUTE.format(request_id=quote(remote.request_id, safe=""))
    return f"http://{_host(remote.host)}:{remote.port}{route}"


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
