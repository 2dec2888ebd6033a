"""Live-adjustment routes for vLLM's API server (a ``vllm.endpoint_plugins`` entry point).

``GET  /chunkpilot/v1/scheduler/limits``  start-up, requested and applied limits.
``PUT  /chunkpilot/v1/scheduler/limits``  lower ``max_num_batched_tokens``,
``max_num_seqs`` and/or ``max_num_active_seqs`` (JSON body, any subset).

Off by default, twice over: vLLM loads endpoint plugins only when named in
``VLLM_PLUGINS``, and the routes answer 503 unless ``CHUNKPILOT_LIVE_ADJUST_TOKEN``
is set; every call must then carry ``Authorization: Bearer <token>``.

The API server and the scheduler run in different processes (the engine core
is a child process in vLLM V1, one per data-parallel rank). The routes write
the requested limits to the control file named by the plugin configuration;
each scheduler polls it once per step, applies lowered values and reports what
it applied in ``<control file>.applied``. A PUT waits briefly for that report:
200 when applied, 202 when the engine has not stepped yet (an idle engine
applies the limits with its next step).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from argparse import Namespace
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chunkpilot.engine.live_adjust import (
    LIVE_ADJUST_ROUTE,
    LIVE_ADJUST_TOKEN_ENV,
    LimitRaiseError,
    LiveLimits,
    PluginConfigError,
    access_problem,
    lowered_limits,
)
from chunkpilot.engine.vllm_plugin.config import (
    applied_file,
    load_plugin_config,
    write_json_atomic,
)
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

ROUTE = LIVE_ADJUST_ROUTE
STATE_ATTR = "chunkpilot_live_adjust"
# How long a PUT waits for the scheduler to confirm.
APPLY_WAIT_S = 3.0


@dataclass
class LiveAdjustState:
    """Per-app state: where to write, what the ceilings are, who may call."""

    startup: LiveLimits | None
    control_file: Path | None
    token: str | None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def refusal(self, request: Request) -> JSONResponse | None:
        """An error response when the call is not allowed, else None."""
        problem = access_problem(
            self.token,
            request.headers.get("authorization"),
            configured=self.startup is not None and self.control_file is not None,
        )
        if problem is None:
            return None
        headers = {"WWW-Authenticate": "Bearer"} if problem.status == 401 else None
        return _error(problem.status, problem.message, headers=headers)


def _error(status: int, message: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=dict(headers or {}))


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return data


def startup_limits(vllm_config: Any) -> LiveLimits:
    """The scheduler's start-up limits, as the engine configuration resolved them."""
    sched = vllm_config.scheduler_config
    budget = sched.max_num_scheduled_tokens or sched.max_num_batched_tokens
    return LiveLimits(
        max_num_batched_tokens=int(budget),
        max_num_seqs=int(sched.max_num_seqs),
        max_num_active_seqs=int(sched.max_num_active_seqs or sched.max_num_seqs),
    )


def _snapshot(state: LiveLimitsView) -> dict[str, Any]:
    return {
        "startup": state.startup.to_json(),
        "requested": state.requested,
        "applied": state.applied,
    }


@dataclass
class LiveLimitsView:
    startup: LiveLimits
    requested: dict[str, Any] | None
    applied: dict[str, Any] | None


def _view(state: LiveAdjustState) -> LiveLimitsView:
    assert state.startup is not None and state.control_file is not None
    return LiveLimitsView(
        startup=state.startup,
        requested=_read_json(state.control_file),
        applied=_read_json(applied_file(state.control_file)),
    )


def _state(request: Request) -> LiveAdjustState:
    state: LiveAdjustState = getattr(request.app.state, STATE_ATTR)
    return state


async def get_limits(request: Request) -> JSONResponse:
    """Start-up, last requested and currently applied limits."""
    state = _state(request)
    refusal = state.refusal(request)
    if refusal is not None:
        return refusal
    return JSONResponse(_snapshot(_view(state)))


async def put_limits(request: Request) -> JSONResponse:
    """Lower one or more limits; refuse values above the start-up ones."""
    state = _state(request)
    refusal = state.refusal(request)
    if refusal is not None:
        return refusal
    assert state.startup is not None and state.control_file is not None
    try:
        body = await request.json()
    except ValueError:
        return _error(400, 'the body must be a JSON object such as {"max_num_batched_tokens": 1024}')
    if not isinstance(body, dict):
        return _error(400, 'the body must be a JSON object such as {"max_num_batched_tokens": 1024}')
    async with state.lock:
        view = _view(state)
        current = state.startup
        generation = 0
        if view.requested is not None:
            current = LiveLimits.from_json(view.requested["limits"])
            generation = int(view.requested["generation"])
        try:
            new = lowered_limits(state.startup, current, body)
        except LimitRaiseError as exc:
            return _error(409, str(exc))
        except PluginConfigError as exc:
            return _error(422, str(exc))
        generation += 1
        write_json_atomic(state.control_file, {"generation": generation, "limits": new.to_json()})
        deadline = time.monotonic() + APPLY_WAIT_S
        while time.monotonic() < deadline:
            applied = _read_json(applied_file(state.control_file))
            if applied is not None and applied.get("generation") == generation:
                status = 409 if applied.get("error") else 200
                return JSONResponse(_snapshot(_view(state)), status_code=status)
            await asyncio.sleep(0.05)
    return JSONResponse(_snapshot(_view(state)), status_code=202)


class LiveAdjustEndpoint:
    """``vllm.endpoint_plugins`` factory: the live-adjustment routes."""

    name = "chunkpilot_live_adjust"
    required_tasks = ("generate",)

    def attach_router(self, app: FastAPI) -> None:
        app.add_api_route(ROUTE, get_limits, methods=["GET"])
        app.add_api_route(ROUTE, put_limits, methods=["PUT"])

    async def init_state(self, engine_client: Any, state: Any, args: Namespace) -> None:
        del args
        vllm_config = getattr(engine_client, "vllm_config", None)
        startup = None
        control_file = None
        if vllm_config is not None:
            additional = vllm_config.additional_config
            config = load_plugin_config(additional if isinstance(additional, Mapping) else None)
            startup = startup_limits(vllm_config)
            if config.control_file:
                control_file = Path(config.control_file)
        setattr(
            state,
            STATE_ATTR,
            LiveAdjustState(
                startup=startup, control_file=control_file, token=os.environ.get(LIVE_ADJUST_TOKEN_ENV)
            ),
        )
