"""Prometheus file-based service discovery (file_sd) for locally running engines.

The pod runner publishes each healthy engine process as one target group with the pod's labels;
Prometheus watches the file and scrapes the new target within seconds. The same file tells a
load generator in another process which endpoints a service has. Ready router pods (in front of a
disaggregated service) are listed in a companion file next to it (:func:`routers_path`), which
Prometheus does not read: they are where such a service's traffic goes, not engines to scrape.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from chunkpilot.localrun.endpoints import Endpoint, service_front


class TargetsFileError(ValueError):
    """A file_sd file that cannot be read as targets, with the reason in the message."""


def render_target_groups(endpoints: Iterable[Endpoint]) -> list[dict[str, Any]]:
    """The file_sd JSON document for ``endpoints`` (one group per endpoint, stable order)."""
    return [
        {"targets": [endpoint.address], "labels": endpoint.prometheus_labels()}
        for endpoint in sorted(endpoints)
    ]


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` so readers never see a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as stream:
            stream.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def routers_path(path: Path | str) -> Path:
    """The companion file of a file_sd file that lists Ready routers (``targets.routers.json``)."""
    path = Path(path)
    return path.with_name(f"{path.stem}.routers{path.suffix or '.json'}")


class FileSDTargets:
    """The set of registered engine endpoints, mirrored into one file_sd JSON file.

    Routers registered with ``router=True`` go to the companion file :func:`routers_path` instead.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.routers_path = routers_path(self.path)
        self._endpoints: dict[tuple[str, str], Endpoint] = {}
        self._routers: dict[tuple[str, str], Endpoint] = {}
        self._lock = threading.Lock()
        self._flush()

    def register(self, endpoint: Endpoint, *, router: bool = False) -> None:
        """Add or replace the target of ``endpoint``'s pod (a router's in the companion file)."""
        with self._lock:
            (self._routers if router else self._endpoints)[(endpoint.namespace, endpoint.pod)] = endpoint
            self._flush()

    def deregister(self, namespace: str, pod: str) -> None:
        """Remove the target of a pod (no-op when it is not registered)."""
        with self._lock:
            engine = self._endpoints.pop((namespace, pod), None)
            router = self._routers.pop((namespace, pod), None)
            if engine is not None or router is not None:
                self._flush()

    def clear(self) -> None:
        """Remove every target."""
        with self._lock:
            self._endpoints.clear()
            self._routers.clear()
            self._flush()

    def endpoints(self) -> list[Endpoint]:
        """The registered endpoints, sorted."""
        with self._lock:
            return sorted(self._endpoints.values())

    def _flush(self) -> None:
        document = render_target_groups(self._endpoints.values())
        write_atomically(self.path, json.dumps(document, indent=2) + "\n")
        if self._routers or self.routers_path.exists():
            routers = render_target_groups(self._routers.values())
            write_atomically(self.routers_path, json.dumps(routers, indent=2) + "\n")


def read_targets(path: Path | str) -> list[Endpoint]:
    """Endpoints listed in a file_sd file written by :class:`FileSDTargets`."""
    path = Path(path)
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except json.JSONDecodeError as error:
        raise TargetsFileError(f"{path}: not a file_sd JSON document: {error}") from None
    if not isinstance(document, list):
        raise TargetsFileError(f"{path}: a file_sd document is a JSON list of target groups")
    endpoints: list[Endpoint] = []
    for group in document:
        labels = group.get("labels", {}) if isinstance(group, dict) else {}
        for target in group.get("targets", []) if isinstance(group, dict) else []:
            host, _, port = str(target).rpartition(":")
            if not host or not port.isdigit():
                raise TargetsFileError(f"{path}: target {target!r} is not host:port")
            endpoints.append(
                Endpoint(
                    namespace=str(labels.get("namespace", "")),
                    pod=str(labels.get("pod", target)),
                    service=str(labels.get("service", "")),
                    track=str(labels.get("track", "")),
                    config_hash=str(labels.get("config_hash", "")),
                    host=host,
                    port=int(port),
                    role=str(labels.get("role", "")),
                    metrics_path=str(labels.get("__metrics_path__", "/metrics")),
                )
            )
    return sorted(endpoints)


def targets_file_source(path: Path | str, service: str, namespace: str | None = None) -> list[Endpoint]:
    """Where one service's traffic goes, from a file_sd file (all namespaces unless one is given).

    Its colocated engines and its Ready routers from the companion file: prefill and decode
    engines are reached through a router only (a disaggregated service's Service selects its
    routers; a colocated one's its engines and a topology trial's canary router). A service with a
    stable router is disaggregated: its routers only (a colocated topology trial's canary engines
    are reached through their canary router).
    """

    def of_service(endpoints: list[Endpoint]) -> list[Endpoint]:
        return [
            e for e in endpoints if e.service == service and (namespace is None or e.namespace == namespace)
        ]

    routers = of_service(read_targets(routers_path(path)))
    routed = any(r.track == "stable" for r in routers)
    return service_front(of_service(read_targets(path)), routers, routed=routed)
