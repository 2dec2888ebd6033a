"""The child writer remembers what it wrote, so the watch event answering its own write is known."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from typing import Any

from chunkpilot.operator.children import UNKNOWN, ChildWriter
from chunkpilot.operator.config import OperatorConfig

OWNER = {
    "apiVersion": "chunkpilot.io/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "chat", "namespace": "ns", "uid": "u-1"},
}


def deployment(replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "chat", "namespace": "ns", "labels": {"chunkpilot.io/service": "chat"}},
        "spec": {"replicas": replicas},
    }


class Server:
    """Applies bump the resourceVersion, as the API server does."""

    def __init__(self) -> None:
        self.version = 10

    async def get(self, path: str) -> dict[str, Any] | None:
        return None

    async def apply(self, manifest: Mapping[str, Any], *, force: bool = True) -> dict[str, Any]:
        self.version += 1
        written = copy.deepcopy(dict(manifest))
        written["metadata"]["resourceVersion"] = str(self.version)
        return written


def test_the_event_of_its_own_write_is_an_echo_and_any_later_change_is_not() -> None:
    writer = ChildWriter(Server(), OperatorConfig())  # type: ignore[arg-type]
    ensured = asyncio.run(writer.ensure(deployment(2), OWNER, UNKNOWN))
    assert ensured.written and ensured.actual is not None
    event = copy.deepcopy(ensured.actual)
    assert writer.is_echo(event)
    event["metadata"]["resourceVersion"] = "12"  # the controller wrote its status, or a person edited it
    assert not writer.is_echo(event)
    other = copy.deepcopy(ensured.actual)
    other["metadata"]["name"] = "chat-other"
    assert not writer.is_echo(other)
    writer.forget("ns", "chat")
    assert not writer.is_echo(ensured.actual)
