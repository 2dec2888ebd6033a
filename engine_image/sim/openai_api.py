"""The OpenAI routes of the simulator's server: ``/v1/completions``, ``/v1/chat/completions``,
``/v1/models``, ``/tokenize``, ``/detokenize``, ``/version``, ``/ping``, ``/openapi.json``, ``/docs``.

Requests are validated as vLLM's server validates them (400/404/415 naming the field), prompts
are sized before they are tokenized (a prompt that cannot fit is refused without tokenizing it)
and large ones are tokenized off the event loop, so ``/health`` keeps answering.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from aiohttp import web
from chunkpilot.engine.sim import generation, tokenizer
from chunkpilot.engine.sim.engine import SimConfig
from chunkpilot.engine.sim.http_api import APIError, check_text, json_body
from chunkpilot.engine.sim.jobs import Choice, Job
from chunkpilot.engine.sim.kvserve import KVSide
from chunkpilot.engine.sim.kvtransfer import RemotePrefill
from chunkpilot.engine.sim.openapi import VERSION, docs_html, openapi_document
from chunkpilot.engine.sim.sampling import Prompt, Sampling, parse_messages, parse_prompts, parse_sampling
from chunkpilot.engine.sim.streaming import complete, stream

T = TypeVar("T")
#: Prompts (or planned outputs) larger than this many characters (tokens) are handled in a thread.
OFF_LOOP_SIZE = 50_000


class ServedModels(Protocol):
    """The server configuration the routes read: the names it serves and the simulated engine."""

    @property
    def served_model_names(self) -> tuple[str, ...]: ...

    @property
    def sim(self) -> SimConfig: ...


class RoutesServer(Protocol):
    """What the routes use of the server that runs the engine (``server.SimEngineServer``)."""

    @property
    def config(self) -> ServedModels: ...

    @property
    def created(self) -> int: ...

    @property
    def model_name(self) -> str: ...

    @property
    def max_model_len(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def kv(self) -> KVSide | None: ...

    async def health(self, request: web.Request, /) -> web.Response: ...

    def submit(
        self,
        prompt_ids: list[int],
        plan: generation.Plan,
        index: int,
        queue: asyncio.Queue[tuple[int, int, bool]],
        kv_role: bool | RemotePrefill | None = None,
    ) -> Choice: ...

    def abort(self, choice: Choice) -> None: ...


class OpenAIRoutes:
    """Handlers of the OpenAI-compatible API of one server."""

    def __init__(self, server: RoutesServer) -> None:
        self.server = server

    def add_to(self, router: web.UrlDispatcher) -> None:
        """Register every route on ``router``."""
        router.add_get("/v1/models", self.models)
        router.add_get("/version", self.version)
        router.add_get("/ping", self.ping)
        router.add_post("/ping", self.ping)
        router.add_post("/v1/completions", self.completions)
        router.add_post("/v1/chat/completions", self.chat_completions)
        router.add_post("/tokenize", self.tokenize)
        router.add_post("/detokenize", self.detokenize)
        router.add_get("/openapi.json", self.openapi)
        router.add_get("/docs", self.docs)

    # ---- small routes ---------------------------------------------------------------------------
    async def models(self, _: web.Request) -> web.Response:
        """The served model names."""
        server = self.server
        data = [
            {
                "id": name,
                "object": "model",
                "created": server.created,
                "owned_by": "vllm",
                "root": server.config.sim.model,
                "parent": None,
                "max_model_len": server.max_model_len,
            }
            for name in server.config.served_model_names
        ]
        return web.json_response({"object": "list", "data": data})

    async def version(self, _: web.Request) -> web.Response:
        """Engine version (the vLLM version whose semantics are simulated)."""
        return web.json_response({"version": VERSION})

    async def ping(self, _: web.Request) -> web.Response:
        """200 while the engine runs (``/health``'s answer, as vLLM's ``/ping``)."""
        return await self.server.health(_)

    async def openapi(self, _: web.Request) -> web.Response:
        """The OpenAPI 3.1 document of this API."""
        return web.json_response(openapi_document())

    async def docs(self, _: web.Request) -> web.Response:
        """A self-contained HTML page describing the API (no assets fetched from anywhere)."""
        return web.Response(text=docs_html(openapi_document()), content_type="text/html")

    # ---- tokenizer routes ---------------------------------------------------------------------
    async def tokenize(self, http: web.Request) -> web.Response:
        """``POST /tokenize``: ``{"prompt": str}`` or ``{"messages": [...]}`` to token ids."""
        body = await json_body(http)
        self._check_model(body.get("model"))
        return_strs = body.get("return_token_strs", False)
        if not isinstance(return_strs, bool):
            raise APIError(400, "'return_token_strs' must be a boolean", "return_token_strs")
        if "messages" in body:
            messages = parse_messages(body["messages"])
            self._size_check(sum(len(c) for _, c in messages), "messages")
            ids = await _maybe_off_loop(
                sum(len(c) for _, c in messages), tokenizer.encode_chat, messages, self.server.vocab_size
            )
            strs = [tokenizer.decode_token(t, self.server.vocab_size) for t in ids]
        else:
            prompt = body.get("prompt")
            if not isinstance(prompt, str):
                raise APIError(400, "'prompt' must be a string (or give 'messages')", "prompt")
            check_text(prompt, "prompt")
            self._size_check(len(prompt), "prompt")
            strs = await _maybe_off_loop(len(prompt), tokenizer.pieces, prompt)
            ids = await _maybe_off_loop(len(prompt), tokenizer.encode, prompt, self.server.vocab_size)
        return web.json_response(
            {
                "count": len(ids),
                "max_model_len": self.server.max_model_len,
                "tokens": ids,
                "token_strs": strs if return_strs else None,
            }
        )

    async def detokenize(self, http: web.Request) -> web.Response:
        """``POST /detokenize``: token ids to text (vocabulary ids decode exactly)."""
        body = await json_body(http)
        self._check_model(body.get("model"))
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in tokens
        ):
            raise APIError(400, "'tokens' must be a list of token ids", "tokens")
        vocab = self.server.vocab_size
        for token in tokens:
            if not 0 <= token < vocab:
                raise APIError(
                    400, f"'tokens': token id {token} is out of vocabulary (size {vocab})", "tokens"
                )
        return web.json_response({"prompt": "".join(tokenizer.decode_token(t, vocab) for t in tokens)})

    # ---- generation ---------------------------------------------------------------------------
    async def completions(self, http: web.Request) -> web.StreamResponse:
        """``POST /v1/completions``."""
        body = await json_body(http)
        self._check_model(body.get("model"))
        sampling = parse_sampling(body, chat=False)
        prompts = parse_prompts(body.get("prompt"), self.server.vocab_size)
        ids: list[list[int]] = []
        echoes: list[str] = []
        echo_tokens: list[list[str]] = []
        for prompt in prompts:
            ids.append(await self._prompt_ids(prompt, sampling))
            tokens = self._echo_tokens(prompt, ids[-1]) if sampling.echo else []
            echo_tokens.append(tokens)
            echoes.append("" if not sampling.echo else prompt.text or "".join(tokens))
        job = Job(False, sampling, ids, echoes, echo_tokens, [], int(time.time()), "cmpl-")
        job.kv_params = body.get("kv_transfer_params")
        return await self._generate(http, job)

    async def chat_completions(self, http: web.Request) -> web.StreamResponse:
        """``POST /v1/chat/completions``."""
        body = await json_body(http)
        self._check_model(body.get("model"))
        sampling = parse_sampling(body, chat=True)
        messages = parse_messages(body.get("messages"))
        size = sum(len(c) for _, c in messages)
        self._size_check(size, "messages")
        ids = await _maybe_off_loop(size, tokenizer.encode_chat, messages, self.server.vocab_size)
        job = Job(True, sampling, [ids], [""], [[]], [], int(time.time()), "chatcmpl-")
        job.kv_params = body.get("kv_transfer_params")
        return await self._generate(http, job)

    def _check_model(self, model: object) -> None:
        if model is None:
            return
        if not isinstance(model, str):
            raise APIError(400, "'model' must be a string", "model")
        config = self.server.config
        if model not in config.served_model_names and model != config.sim.model:
            raise APIError(404, f"The model `{model}` does not exist.", "model", "NotFoundError")

    def _size_check(self, chars: int, param: str) -> None:
        """Refuse a prompt that cannot fit before tokenizing it: ``chars`` characters are at least
        ``chars / 4`` tokens, and one output token must fit beside them."""
        max_len = self.server.max_model_len
        at_least = -(-chars // tokenizer.CHARS_PER_TOKEN)
        if at_least + 1 > max_len:
            raise APIError(
                400,
                f"This model's maximum context length is {max_len} tokens. However, your request has "
                f"at least {at_least} input tokens ({chars} characters). Please reduce the length of the "
                "input.",
                param,
            )

    async def _prompt_ids(self, prompt: Prompt, sampling: Sampling) -> list[int]:
        if prompt.ids is not None:
            return list(prompt.ids)
        assert prompt.text is not None
        self._size_check(len(prompt.text), "prompt")
        return await _maybe_off_loop(len(prompt.text), tokenizer.encode, prompt.text, self.server.vocab_size)

    def _echo_tokens(self, prompt: Prompt, ids: list[int]) -> list[str]:
        if prompt.text is not None:
            return tokenizer.pieces(prompt.text)
        return [tokenizer.decode_token(t, self.server.vocab_size) for t in ids]

    def _max_tokens(self, prompt_ids: list[int], sampling: Sampling) -> int:
        max_len = self.server.max_model_len
        max_tokens = sampling.max_tokens if sampling.max_tokens is not None else max_len - len(prompt_ids)
        if max_tokens < 1 or len(prompt_ids) + max_tokens > max_len:
            raise APIError(
                400,
                f"This model's maximum context length is {max_len} tokens. However, you requested "
                f"{len(prompt_ids) + max(max_tokens, 1)} tokens ({len(prompt_ids)} in the messages, "
                f"{max(max_tokens, 1)} in the completion). Please reduce the length of the messages or "
                "completion.",
                sampling.limit_key,
            )
        return max_tokens

    async def _generate(self, http: web.Request, job: Job) -> web.StreamResponse:
        sampling = job.sampling
        limits = [self._max_tokens(ids, sampling) for ids in job.prompt_ids]
        kv = self.server.kv
        role = kv.role(job.kv_params, len(job.prompt_ids), sampling.n) if kv is not None else None
        if kv is not None and role is not None and not isinstance(role, bool):
            await kv.check_remote(role, len(job.prompt_ids[0]))
        job.request_id += uuid_hex()
        vocab = self.server.vocab_size

        def plans() -> list[list[generation.Plan]]:
            return [
                [
                    generation.plan(
                        ids, sampling, limit, j, _seed(job.request_id, sampling.seed, p, j), vocab
                    )
                    for j in range(sampling.n)
                ]
                for p, (ids, limit) in enumerate(zip(job.prompt_ids, limits, strict=True))
            ]

        planned = await _maybe_off_loop(sum(limits) * sampling.n, plans)
        queue: asyncio.Queue[tuple[int, int, bool]] = asyncio.Queue()
        try:
            for p, (ids, choices) in enumerate(zip(job.prompt_ids, planned, strict=True)):
                for j, plan in enumerate(choices):
                    job.choices.append(self.server.submit(ids, plan, p * sampling.n + j, queue, role))
            if kv is not None:
                first = job.choices[0].request
                job.kv_response = lambda: kv.response_params(first)
            if sampling.stream:
                return await stream(http, job, self.server.model_name, queue)
            return await complete(job, self.server.model_name, queue)
        finally:
            for choice in job.choices:
                self.server.abort(choice)


def uuid_hex() -> str:
    """A fresh request id."""
    return uuid.uuid4().hex


def _seed(request_id: str, seed: int | None, prompt: int, index: int) -> str:
    """Text generator seed of one choice (reproducible when the request gives ``seed``)."""
    return f"{seed}:{prompt}:{index}" if seed is not None else f"{request_id}:{prompt}:{index}"


async def _maybe_off_loop(size: int, func: Callable[..., T], *args: Any) -> T:
    """``func(*args)``, in a worker thread when ``size`` says it is large (the event loop keeps
    serving ``/health`` meanwhile)."""
    if size > OFF_LOOP_SIZE:
        return await asyncio.to_thread(func, *args)
    return func(*args)
