"""A generation request on its way through the simulator's server: the HTTP request the routes
validated (:class:`Job`) and each of its engine requests (:class:`Choice`).

The server's engine task, the OpenAI routes and the response bodies all hold these, so they live
below all three.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from chunkpilot.engine.sim.generation import Plan
from chunkpilot.engine.sim.sampling import Sampling
from chunkpilot.engine.sim.scheduler import Request

__all__ = ["Choice", "Job"]


@dataclass(slots=True)
class Choice:
    """Bridge between the engine task and one choice (one engine request) of an HTTP request.

    The choices of one HTTP request share ``queue``; the engine task puts
    ``(index, new tokens, finished)`` into it after each step.
    """

    request: Request
    index: int
    plan: Plan
    queue: asyncio.Queue[tuple[int, int, bool]]
    delivered: int = 0


@dataclass(slots=True)
class Job:
    """One validated HTTP generation request: its prompts' ids, choices and how to answer."""

    chat: bool
    sampling: Sampling
    prompt_ids: list[list[int]]
    echo_texts: list[str]
    #: Token texts of each echoed prompt (for echoed logprobs).
    echo_tokens: list[list[str]]
    choices: list[Choice]
    created: int
    request_id: str
    #: The body's ``kv_transfer_params`` (read only with ``--kv-transfer-config``).
    kv_params: Any = None
    #: The response's ``kv_transfer_params`` once the request finished (KV-connector servers).
    kv_response: Callable[[], dict[str, Any] | None] | None = None
