"""Reading objects back from a test's cluster through its ``kubectl``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol


class Kubectl(Protocol):
    """What the readers need of a cluster: ``kubectl(*args, check=...)`` returning a completed process."""

    def kubectl(self, *args: str, check: bool = True) -> Any: ...


def get_object(cluster: Kubectl, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
    """The object as JSON; None when it does not exist (any other error fails the test)."""
    result = cluster.kubectl("get", kind, name, "-n", namespace, "-o", "json", check=False)
    if result.returncode != 0:
        if "NotFound" in result.stderr:
            return None
        raise AssertionError(result.stderr)
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def condition_of(body: Mapping[str, Any] | None, type_: str) -> dict[str, Any] | None:
    """The condition ``type_`` in an object's status; None when it has none."""
    for item in ((body or {}).get("status") or {}).get("conditions") or []:
        if item.get("type") == type_:
            found: dict[str, Any] = item
            return found
    return None
