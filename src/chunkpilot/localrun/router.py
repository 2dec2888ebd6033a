"""Router pods on the local stack: the real ``vllm-router`` in front of the engine processes.

A disaggregated service has a router pod (label ``chunkpilot.io/component: router``) whose container
runs ``vllm-router`` with Kubernetes service discovery: ``--service-discovery`` and label selectors
for the prefill and decode pools (``--prefill-selector``/``--decode-selector``, or ``--selector``
in its regular mode). Locally the pod IPs behind those selectors are KWOK's and unreachable, so the
pod runner starts the router with static ``--prefill``/``--decode`` (``--worker-urls``) lists of the
Ready engine processes the selectors match, and restarts it when those sets change. These are the
pure parts: reading the router's args, matching engines, and the command line.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from chunkpilot.localrun.endpoints import COMPONENT_LABEL, ROLE_LABEL, ROUTER_COMPONENT
from chunkpilot.localrun.podspec import PodSpecError, strip_flags

#: The installed router (same interpreter, so the same environment's ``vllm-router``).
DEFAULT_ROUTER_COMMAND: tuple[str, ...] = (sys.executable, "-m", "vllm_router.launch_router")

PD_FLAG = "--vllm-pd-disaggregation"
#: Flags replaced locally: discovery, static worker lists, where it listens and exports metrics.
_MULTI_VALUE_FLAGS = ("--selector", "--prefill-selector", "--decode-selector", "--worker-urls", "--prefill")
_SINGLE_VALUE_FLAGS = (
    "--host",
    "--port",
    "--prometheus-host",
    "--prometheus-port",
    "--service-discovery-port",
    "--service-discovery-namespace",
    "--decode",
    "--worker-startup-timeout-secs",
    "--worker-startup-check-interval",
)
_SWITCHES = ("--service-discovery",)
#: Every worker the router is given is already Ready, so its start-up check can be quick.
WORKER_STARTUP_TIMEOUT_S = 60
WORKER_STARTUP_CHECK_INTERVAL_S = 1

Selector = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class RouterSpec:
    """What a router pod's args ask for: its mode and the label selectors of its workers."""

    disaggregated: bool
    prefill: Selector
    decode: Selector
    workers: Selector
    namespace: str | None

    def describe(self) -> str:
        """The selectors, for log lines."""
        if self.disaggregated:
            return f"prefill {_show(self.prefill)}, decode {_show(self.decode)}"
        return f"workers {_show(self.workers)}"


@dataclass(frozen=True, slots=True, order=True)
class RouterBackends:
    """The worker URLs a router process is started with."""

    prefill: tuple[str, ...] = ()
    decode: tuple[str, ...] = ()
    workers: tuple[str, ...] = ()

    def complete(self, disaggregated: bool) -> bool:
        """Whether the router can start: it needs a prefill and a decode worker (PD), or a worker."""
        return bool(self.prefill and self.decode) if disaggregated else bool(self.workers)

    def describe(self) -> str:
        """The URLs, for log lines."""
        if self.workers:
            return f"workers {' '.join(self.workers)}"
        return f"prefill {' '.join(self.prefill) or '-'}, decode {' '.join(self.decode) or '-'}"


@dataclass(frozen=True, slots=True)
class Worker:
    """A Ready engine process a router may send to."""

    namespace: str
    labels: Mapping[str, str]
    url: str


def router_missing(command: Sequence[str]) -> str | None:
    """Why the default router command cannot run here (vllm-router not installed), else None."""
    if tuple(command[1:3]) == DEFAULT_ROUTER_COMMAND[1:3] and importlib.util.find_spec("vllm_router") is None:
        return (
            "vllm-router is not installed in this environment; a disaggregated service's router needs "
            "it: pip install 'chunkpilot[router]'"
        )
    return None


def is_router(labels: Mapping[str, str]) -> bool:
    """Whether a pod with these labels is a router pod."""
    return labels.get(COMPONENT_LABEL) == ROUTER_COMPONENT


def _show(selector: Selector) -> str:
    return ",".join(f"{key}={value}" for key, value in selector) or "{}"


def _split_multi(args: Sequence[str], flag: str) -> tuple[list[str], list[str]]:
    """Every value of a multi-valued flag (``--flag A B`` or ``--flag=A``), over all its occurrences,
    and the arguments that are not the flag or its values."""
    values: list[str] = []
    rest: list[str] = []
    taking = False
    for arg in args:
        if arg.startswith("--"):
            taking = arg == flag
            if arg.startswith(f"{flag}="):
                values.append(arg.split("=", 1)[1])
            elif not taking:
                rest.append(arg)
        elif taking:
            values.append(arg)
        else:
            rest.append(arg)
    return values, rest


def _values_after(args: Sequence[str], flag: str) -> list[str]:
    """Every value of a multi-valued flag (``--flag A B`` or ``--flag=A``), over all its occurrences."""
    return _split_multi(args, flag)[0]


def _value_of(args: Sequence[str], flag: str) -> str | None:
    for index, arg in enumerate(args):
        if arg == flag and index + 1 < len(args):
            return args[index + 1]
        if arg.startswith(f"{flag}="):
            return arg.split("=", 1)[1]
    return None


def parse_selector(values: Iterable[str], flag: str) -> Selector:
    """``key=value`` terms (also several in one argument, space-separated) as a sorted selector."""
    terms: dict[str, str] = {}
    for value in values:
        for term in value.split():
            key, sep, wanted = term.partition("=")
            if not sep or not key:
                raise PodSpecError(f"router arg {flag}: {term!r} is not key=value")
            terms[key] = wanted
    return tuple(sorted(terms.items()))


def parse_router_args(args: Sequence[str]) -> RouterSpec:
    """The mode and selectors of a router container's args (``vllm-router`` flags)."""
    disaggregated = PD_FLAG in args
    spec = RouterSpec(
        disaggregated=disaggregated,
        prefill=parse_selector(_values_after(args, "--prefill-selector"), "--prefill-selector"),
        decode=parse_selector(_values_after(args, "--decode-selector"), "--decode-selector"),
        workers=parse_selector(_values_after(args, "--selector"), "--selector"),
        namespace=_value_of(args, "--service-discovery-namespace"),
    )
    if "--service-discovery" not in args:
        raise PodSpecError(
            "router args: locally the router's workers are found through --service-discovery "
            "and its label selectors; static --prefill/--decode/--worker-urls name pod IPs "
            "that do not exist here"
        )
    if disaggregated and not (spec.prefill and spec.decode):
        raise PodSpecError(f"router args: {PD_FLAG} needs both --prefill-selector and --decode-selector")
    if not disaggregated and not spec.workers:
        raise PodSpecError("router args: --service-discovery needs --selector (or PD mode's selectors)")
    return spec


def matches(selector: Selector, labels: Mapping[str, str]) -> bool:
    """Whether ``labels`` carry every ``key=value`` of ``selector`` (an empty one matches nothing)."""
    return bool(selector) and all(labels.get(key) == value for key, value in selector)


def backends_for(spec: RouterSpec, workers: Iterable[Worker]) -> RouterBackends:
    """The Ready engines each of the router's selectors matches (sorted URLs)."""
    eligible = [w for w in workers if spec.namespace is None or w.namespace == spec.namespace]
    if spec.disaggregated:
        return RouterBackends(
            prefill=tuple(sorted(w.url for w in eligible if matches(spec.prefill, w.labels))),
            decode=tuple(sorted(w.url for w in eligible if matches(spec.decode, w.labels))),
        )
    return RouterBackends(workers=tuple(sorted(w.url for w in eligible if matches(spec.workers, w.labels))))


def router_command(
    base_command: Sequence[str],
    args: Sequence[str],
    *,
    host: str,
    port: int,
    metrics_port: int,
    backends: RouterBackends,
) -> list[str]:
    """The router's command line: its args without discovery, with static workers, host and ports."""
    kept = list(args)
    for flag in _MULTI_VALUE_FLAGS:
        kept = _strip_multi(kept, flag)
    kept = [arg for arg in strip_flags(kept, _SINGLE_VALUE_FLAGS) if arg not in _SWITCHES]
    workers: list[str] = []
    for url in backends.prefill:
        workers += ["--prefill", url]
    for url in backends.decode:
        workers += ["--decode", url]
    if backends.workers:
        workers += ["--worker-urls", *backends.workers]
    return [
        *base_command,
        *kept,
        *workers,
        "--host",
        host,
        "--port",
        str(port),
        "--prometheus-host",
        host,
        "--prometheus-port",
        str(metrics_port),
        "--worker-startup-timeout-secs",
        str(WORKER_STARTUP_TIMEOUT_S),
        "--worker-startup-check-interval",
        str(WORKER_STARTUP_CHECK_INTERVAL_S),
    ]


def _strip_multi(args: Sequence[str], flag: str) -> list[str]:
    return _split_multi(args, flag)[1]


__all__ = [
    "COMPONENT_LABEL",
    "DEFAULT_ROUTER_COMMAND",
    "ROLE_LABEL",
    "ROUTER_COMPONENT",
    "RouterBackends",
    "RouterSpec",
    "Worker",
    "backends_for",
    "is_router",
    "matches",
    "parse_router_args",
    "parse_selector",
    "router_command",
    "router_missing",
]
