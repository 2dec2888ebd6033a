"""Writing a service's status: conditional on the object read, and no request when nothing changes."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from typing import Any

from chunkpilot.operator.kube import KubeError
from chunkpilot.operator.objects import write_service_status


class Server:
    """One InferenceService; a merge patch conflicts unless it names the current resourceVersion."""

    def __init__(self) -> None:
        self.body: dict[str, Any] = {
            "metadata": {"name": "chat", "resourceVersion": "2"},
            "status": {"phase": "Ready"},
        }
        self.gets = 0
        self.patches: list[Mapping[str, Any]] = []

    async def get(self, path: str) -> dict[str, Any] | None:
        self.gets += 1
        return copy.deepcopy(self.body)

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        if patch["metadata"]["resourceVersion"] != self.body["metadata"]["resourceVersion"]:
            raise KubeError(409, "PATCH", path, '{"message": "conflict"}')
        self.patches.append(patch)
        self.body["status"].update(patch["status"])
        self.body["metadata"]["resourceVersion"] = str(int(self.body["metadata"]["resourceVersion"]) + 1)
        return self.body


def set_phase(phase: str) -> Any:
    def patcher(fresh: Mapping[str, Any]) -> dict[str, Any]:
        return {} if fresh["status"].get("phase") == phase else {"phase": phase}

    return patcher


def test_the_callers_read_is_used_first_and_nothing_to_write_costs_no_request() -> None:
    server = Server()
    read = copy.deepcopy(server.body)
    assert asyncio.run(write_service_status(server, "ns", "chat", set_phase("Ready"), read=read))
    assert server.gets == 0 and server.patches == []
    assert asyncio.run(write_service_status(server, "ns", "chat", set_phase("Degraded"), read=read))
    assert server.gets == 0 and server.body["status"]["phase"] == "Degraded"


def test_a_stale_read_conflicts_and_is_read_again() -> None:
    server = Server()
    stale = copy.deepcopy(server.body)
    server.body["metadata"]["resourceVersion"] = "3"  # someone wrote meanwhile
    assert asyncio.run(write_service_status(server, "ns", "chat", set_phase("Degraded"), read=stale))
    assert server.gets == 1 and len(server.patches) == 1
    assert server.patches[0]["metadata"]["resourceVersion"] == "3"


def test_without_a_read_the_object_is_read_first() -> None:
    server = Server()
    assert asyncio.run(write_service_status(server, "ns", "chat", set_phase("Degraded")))
    assert server.gets == 1 and server.body["status"]["phase"] == "Degraded"
