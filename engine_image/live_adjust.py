"""The live-adjustment route that the vLLM plugin and the simulator both serve.

Its path and bearer token, the limits it lowers at run time (:class:`LiveLimits`, never above their
start-up values: :func:`lowered_limits`) and who may call it (:func:`access_problem`). Pure Python,
so the plugin, the simulator, the operator and the tuner share one definition."""

from __future__ import annotations

import dataclasses
import hmac
from collections.abc import Mapping
from typing import Any

#: Path of the live-adjustment routes (GET and PUT) on the engine's API server.
LIVE_ADJUST_ROUTE = "/chunkpilot/v1/scheduler/limits"

# Bearer token that enables the live-adjustment routes (unset: routes refuse).
LIVE_ADJUST_TOKEN_ENV = "CHUNKPILOT_LIVE_ADJUST_TOKEN"


class PluginConfigError(ValueError):
    """A configuration value is invalid; the message names the field and the fix."""


def int_field(name: str, value: Any, source: str, minimum: int) -> int:
    """``value`` as an integer of at least ``minimum``; the error names ``name`` and ``source``."""
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            value = int(str(value))
        except ValueError:
            raise PluginConfigError(f"{source}: {name} must be an integer, got {value!r}") from None
    if value < minimum:
        raise PluginConfigError(f"{source}: {name} must be >= {minimum}, got {value}")
    return int(value)


@dataclasses.dataclass(frozen=True)
class LiveLimits:
    """Scheduler limits adjustable at run time (never above their start-up values)."""

    max_num_batched_tokens: int
    max_num_seqs: int
    max_num_active_seqs: int

    def to_json(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LiveLimits:
        return cls(**{f.name: int(data[f.name]) for f in dataclasses.fields(cls)})


class LimitRaiseError(ValueError):
    """A requested limit exceeds its start-up value (buffers are sized by it)."""


def lowered_limits(startup: LiveLimits, current: LiveLimits, request: Mapping[str, Any]) -> LiveLimits:
    """Apply a partial update to ``current``; refuse raises above ``startup``.

    ``request`` holds any of the three field names with positive integers.
    """
    names = {f.name for f in dataclasses.fields(LiveLimits)}
    unknown = sorted(set(request) - names)
    if unknown:
        raise PluginConfigError(f"unknown limit(s) {unknown}; adjustable limits are {sorted(names)}")
    if not request:
        raise PluginConfigError(f"no limit given; set one of {sorted(names)}")
    values = current.to_json()
    for name, value in request.items():
        number = int_field(name, value, "request", 1)
        ceiling = getattr(startup, name)
        if number > ceiling:
            raise LimitRaiseError(
                f"{name}={number} is above the start-up value {ceiling}; live adjustment can only "
                "lower limits (raise them with a restart, i.e. a new rollout)"
            )
        values[name] = number
    if values["max_num_batched_tokens"] < values["max_num_seqs"]:
        # vLLM requires budget >= max-num-seqs; keep the same invariant live.
        raise PluginConfigError(
            f"max_num_batched_tokens ({values['max_num_batched_tokens']}) must be >= "
            f"max_num_seqs ({values['max_num_seqs']}); lower max_num_seqs as well"
        )
    return LiveLimits(**values)


@dataclasses.dataclass(frozen=True)
class AccessProblem:
    """Why a live-adjustment call is refused: an HTTP status and a message naming the fix."""

    status: int
    message: str


def access_problem(token: str | None, authorization: str | None, *, configured: bool) -> AccessProblem | None:
    """Check a live-adjustment call; None when it may proceed.

    ``token`` is the expected bearer token (unset: the routes are off),
    ``authorization`` the request's ``Authorization`` header and ``configured``
    whether a control file and start-up limits are known.
    """
    if not token:
        return AccessProblem(503, f"live adjustment is disabled: set {LIVE_ADJUST_TOKEN_ENV} to enable it")
    scheme, _, presented = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(presented.strip().encode(), token.encode()):
        return AccessProblem(401, "missing or wrong bearer token: send 'Authorization: Bearer <token>'")
    if not configured:
        return AccessProblem(
            503,
            "live adjustment is not configured: set chunkpilot.control_file in "
            "--additional-config (or CHUNKPILOT_CONTROL_FILE) and use the Chunkpilot scheduler",
        )
    return None
