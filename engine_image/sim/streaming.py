"""Response bodies of the simulator's generation routes: one JSON answer or an SSE stream.

Both follow vLLM's OpenAI server: ``finish_reason`` and ``stop_reason`` per choice, a
``system_fingerprint``, ``usage`` (at the end with ``stream_options.include_usage``, on every chunk
with ``continuous_usage_stats``), synthetic but well-formed ``logprobs``, ``echo``, ``n`` choices
per prompt and one choice per prompt of a batch.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web
from chunkpilot.engine.sim import generation
from chunkpilot.engine.sim.jobs import Choice, Job

#: ``system_fingerprint`` of every response.
SYSTEM_FINGERPRINT = "fp_chunkpilot_sim"

Queue = asyncio.Queue[tuple[int, int, bool]]


def _prompt_tokens(job: Job) -> int:
    return sum(len(ids) for ids in job.prompt_ids)


def usage(job: Job, completion_tokens: int | None = None) -> dict[str, int]:
    """The ``usage`` object (completion tokens: those generated so far unless given)."""
    prompt = _prompt_tokens(job)
    done = sum(c.delivered for c in job.choices) if completion_tokens is None else completion_tokens
    return {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done}


def _echo(job: Job, choice: Choice) -> str:
    return job.echo_texts[choice.index // job.sampling.n]


def _logprobs(job: Job, choice: Choice, start: int, stop: int) -> dict[str, Any] | None:
    k = job.sampling.logprobs
    if k is None:
        return None
    texts = choice.plan.tokens(start, stop)
    if job.chat:
        return generation.chat_logprobs(texts, start, k)
    echo = job.sampling.echo and start == 0
    prompt = job.echo_tokens[choice.index // job.sampling.n] if echo else []
    offset = 0 if echo else len(_echo(job, choice)) + len(choice.plan.text(0, start))
    return generation.completion_logprobs([*prompt, *texts], start, offset, k, len(prompt))


def _choice_body(
    job: Job, choice: Choice, text: str, finished: bool, start: int, stop: int
) -> dict[str, Any]:
    plan = choice.plan
    body: dict[str, Any] = {"index": choice.index}
    if job.chat:
        body["message" if not job.sampling.stream else "delta"] = (
            {"role": "assistant", "content": text} if not job.sampling.stream else {"content": text}
        )
    else:
        body["text"] = text
    body["logprobs"] = _logprobs(job, choice, start, stop)
    body["finish_reason"] = plan.finish_reason if finished else None
    body["stop_reason"] = plan.stop_reason if finished else None
    return body


def _envelope(job: Job, model: str, choices: list[dict[str, Any]], chunk: bool) -> dict[str, Any]:
    kind = ("chat.completion.chunk" if chunk else "chat.completion") if job.chat else "text_completion"
    return {
        "id": job.request_id,
        "object": kind,
        "created": job.created,
        "model": model,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "choices": choices,
    }


async def complete(job: Job, model: str, queue: Queue) -> web.Response:
    """Wait for every choice to finish; answer one JSON body."""
    pending = len(job.choices)
    while pending:
        index, count, finished = await queue.get()
        job.choices[index].delivered += count
        pending -= finished
    bodies = []
    for choice in job.choices:
        text = (_echo(job, choice) if job.sampling.echo else "") + choice.plan.text(0, choice.delivered)
        bodies.append(_choice_body(job, choice, text, True, 0, choice.delivered))
    payload = _envelope(job, model, bodies, chunk=False)
    payload["usage"] = usage(job)
    if job.kv_response is not None:
        payload["kv_transfer_params"] = job.kv_response()
    return web.json_response(payload)


async def _send(response: web.StreamResponse, payload: dict[str, Any]) -> None:
    await response.write(f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode())


async def stream(http: web.Request, job: Job, model: str, queue: Queue) -> web.StreamResponse:
    """Server-sent events: one chunk per choice per engine step, then usage and ``[DONE]``."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(http)
    sampling = job.sampling
    if job.chat:
        for choice in job.choices:
            first = {"index": choice.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                     "finish_reason": None}  # fmt: skip
            await _send(response, _chunk(job, model, first))
    pending = len(job.choices)
    while pending:
        index, count, finished = await queue.get()
        choice = job.choices[index]
        start = choice.delivered
        choice.delivered += count
        pending -= finished
        text = choice.plan.text(start, choice.delivered)
        if start == 0 and sampling.echo:
            text = _echo(job, choice) + text
        body = _choice_body(job, choice, text, finished, start, choice.delivered)
        if job.chat:
            body.pop("message", None)
        await _send(response, _chunk(job, model, body))
    if sampling.include_usage:
        await _send(response, {**_envelope(job, model, [], chunk=True), "usage": usage(job)})
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


def _chunk(job: Job, model: str, choice: dict[str, Any]) -> dict[str, Any]:
    chunk = _envelope(job, model, [choice], chunk=True)
    if job.sampling.include_usage or job.sampling.continuous_usage:
        chunk["usage"] = usage(job) if job.sampling.continuous_usage else None
    return chunk
