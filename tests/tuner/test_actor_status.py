"""The tuner's status write: a field that the stored status already holds is not written again."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from typing import Any

from chunkpilot.tuner.act.actor import Actor
from chunkpilot.tuner.decide.plan import Plan

from chunkpilot.testing.services import a_service_body
from chunkpilot.testing.tuner import a_snapshot

WAITING = {"state": "Waiting", "message": "stable served 0 requests in 5m; 100 needed"}


class Server:
    """The service as the API server holds it; patches are recorded and merged."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body
        self.patches: list[Mapping[str, Any]] = []

    async def get(self, path: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.body)

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        self.patches.append(patch)
        return self.body


def write(stored_twin: dict[str, Any], written: dict[str, Any]) -> list[Mapping[str, Any]]:
    body = a_service_body(status={"twin": stored_twin})
    body["metadata"]["resourceVersion"] = "7"
    server = Server(body)
    plan = Plan(a_snapshot(body))
    plan.status["twin"] = written
    asyncio.run(Actor(server).write_status(plan))  # type: ignore[arg-type]
    return server.patches


def test_a_status_object_the_service_already_holds_is_not_patched_again() -> None:
    # The stored twin holds more (an empty candidate list): the written fields are all there.
    assert write({**WAITING, "candidates": []}, WAITING) == []


def test_a_changed_field_is_patched() -> None:
    (patch,) = write({**WAITING, "candidates": []}, {**WAITING, "message": "now 20 requests"})
    assert patch["status"] == {"twin": {**WAITING, "message": "now 20 requests"}}
    assert patch["metadata"] == {"resourceVersion": "7"}
