"""Engine endpoints and how clients spread requests over them (the stand-in for kube-proxy)."""

from __future__ import annotations

import abc
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

SERVICE_LABEL = "chunkpilot.io/service"
TRACK_LABEL = "chunkpilot.io/track"
CONFIG_HASH_LABEL = "chunkpilot.io/config-hash"
#: What a pod is: ``router`` for the router in front of a disaggregated service's engines.
COMPONENT_LABEL = "chunkpilot.io/component"
ROUTER_COMPONENT = "router"
#: An engine's pool in a disaggregated service: ``prefill`` or ``decode``.
ROLE_LABEL = "chunkpilot.io/role"


@dataclass(frozen=True, slots=True, order=True)
class Endpoint:
    """One serving engine process standing in for a pod: where it listens and which pod it is."""

    namespace: str
    pod: str
    service: str
    track: str
    config_hash: str
    host: str
    port: int
    #: The engine's pool (``prefill``/``decode``) in a disaggregated service; empty when colocated.
    role: str = ""
    #: Where Prometheus scrapes the engine (TensorRT-LLM: ``/prometheus/metrics``).
    metrics_path: str = "/metrics"

    @property
    def address(self) -> str:
        """``host:port`` as Prometheus targets spell it."""
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """Base URL of the engine's HTTP server."""
        return f"http://{self.host}:{self.port}"

    def prometheus_labels(self) -> dict[str, str]:
        """Target labels, so PromQL can select for example ``track="canary"`` (or ``role="decode"``)."""
        labels = {
            "namespace": self.namespace,
            "pod": self.pod,
            "service": self.service,
            "track": self.track,
            "config_hash": self.config_hash,
        }
        if self.role:
            labels["role"] = self.role
        if self.metrics_path != "/metrics":
            labels["__metrics_path__"] = self.metrics_path  # file_sd's way to set a target's path
        return labels


EndpointSource = Callable[[], Sequence[Endpoint]]
"""Returns the endpoints that may receive traffic now (Ready pods of one service)."""


class Balancer(Protocol):
    """Picks the endpoint for the next request."""

    def pick(self) -> Endpoint | None:
        """An endpoint, or ``None`` when the service has no Ready endpoint."""
        ...


class _ReadyEndpointBalancer(abc.ABC):
    """Reads the Ready endpoints on every pick (pods that become Ready join at once, pods that stop
    being Ready leave at once) and chooses one of them, in order, under a lock."""

    def __init__(self, source: EndpointSource) -> None:
        self._source = source
        self._lock = threading.Lock()

    def pick(self) -> Endpoint | None:
        """The chosen endpoint, or ``None`` when the service has no Ready endpoint."""
        endpoints = sorted(self._source())
        if not endpoints:
            return None
        with self._lock:
            return self._choose(endpoints)

    @abc.abstractmethod
    def _choose(self, endpoints: Sequence[Endpoint]) -> Endpoint:
        """One of ``endpoints`` (sorted, never empty), called under the lock."""


class RoundRobinBalancer(_ReadyEndpointBalancer):
    """Hands out endpoints in turn, one share per Ready pod, like kube-proxy's round-robin mode.

    A canary with one pod next to three stable pods receives a quarter of the requests.
    """

    def __init__(self, source: EndpointSource) -> None:
        super().__init__(source)
        self._counter = 0

    def _choose(self, endpoints: Sequence[Endpoint]) -> Endpoint:
        position = self._counter % len(endpoints)
        self._counter += 1
        return endpoints[position]


class RandomBalancer(_ReadyEndpointBalancer):
    """Sends each request to a Ready endpoint drawn at random, like kube-proxy's iptables mode.

    A random split of Poisson arrivals leaves every endpoint Poisson arrivals (what the tuner's twin
    assumes of a live engine); a strict rotation makes each endpoint's arrivals more regular than
    that, so it queues less at the same rate. ``seed`` makes the split reproducible.
    """

    def __init__(self, source: EndpointSource, seed: int = 0) -> None:
        super().__init__(source)
        self._random = random.Random(seed)

    def _choose(self, endpoints: Sequence[Endpoint]) -> Endpoint:
        return self._random.choice(endpoints)


#: How a client spreads requests over a service's Ready endpoints, by the name ``--routing`` takes.
ROUTINGS: Final[dict[str, Callable[[EndpointSource, int], Balancer]]] = {
    "random": lambda source, seed: RandomBalancer(source, seed),
    "round-robin": lambda source, seed: RoundRobinBalancer(source),
}
#: kube-proxy's default (iptables and nftables modes pick an endpoint at random); ``round-robin`` is
#: its IPVS mode's default, under which each engine's arrivals are more regular than the Poisson
#: arrivals the tuner's twin assumes, so the twin over-predicts its latency quantiles.
DEFAULT_ROUTING: Final = "random"


def service_front(
    engines: Sequence[Endpoint], routers: Sequence[Endpoint], *, routed: bool
) -> list[Endpoint]:
    """What a service's Service reaches, sorted: its routers, and unless it is ``routed`` (a
    disaggregated service: a stable router runs) its engines that belong to no pool."""
    return sorted([*routers, *([] if routed else [e for e in engines if not e.role])])


def balancer_for(routing: str, source: EndpointSource, seed: int = 0) -> Balancer:
    """The balancer ``routing`` names (one of :data:`ROUTINGS`) over ``source``."""
    try:
        return ROUTINGS[routing](source, seed)
    except KeyError:
        raise ValueError(f"routing {routing!r}: use one of {', '.join(ROUTINGS)}") from None


def static_source(endpoints: Sequence[Endpoint]) -> EndpointSource:
    """An endpoint source that always returns the same endpoints."""
    frozen = tuple(endpoints)
    return lambda: frozen
