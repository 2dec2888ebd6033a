"""Pure functions the pod runner uses: what to run for a pod, and what to report back about it.

Pods are handled as manifest dictionaries (camelCase, as the API serves them), so these functions
are testable with literal manifests.
"""

from __future__ import annotations

import base64
import binascii
import enum
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from chunkpilot.localrun.endpoints import (
    COMPONENT_LABEL,
    CONFIG_HASH_LABEL,
    ROLE_LABEL,
    ROUTER_COMPONENT,
    SERVICE_LABEL,
    TRACK_LABEL,
)

INJECT_CRASH_ANNOTATION = "chunkpilot.io/inject-crash"
#: The operator's ``chunkpilot.operator.builders.ANNOTATION_METRICS_PATH`` (what a PodMonitor scrapes).
METRICS_PATH_ANNOTATION = "prometheus.io/path"
ENGINE_CONTAINER_NAME = "engine"
ROUTER_CONTAINER_NAME = "router"
# Flags the runner owns: where the process listens and how fast simulated time runs.
RUNNER_OWNED_FLAGS = ("--host", "--port", "--time-scale")
MAX_TERMINATION_MESSAGE = 1024

Manifest = Mapping[str, Any]


class PodSpecError(ValueError):
    """A pod the runner cannot run, with the reason in the message."""


class EnvConfigError(RuntimeError):
    """An env reference that cannot be resolved now (the kubelet's ``CreateContainerConfigError``)."""


class RefKind(enum.Enum):
    """What an env entry's ``valueFrom`` points at."""

    SECRET = "Secret"
    CONFIG_MAP = "ConfigMap"


@dataclass(frozen=True, slots=True)
class EnvRef:
    """A ``secretKeyRef``/``configMapKeyRef``: one key of a Secret or ConfigMap in the pod's namespace."""

    kind: RefKind
    name: str
    key: str
    optional: bool = False


#: Reads a Secret's or ConfigMap's data (decoded) in a namespace; None when it does not exist.
ObjectDataLookup = Callable[[RefKind, str, str], Mapping[str, str] | None]


@dataclass(frozen=True, slots=True)
class EnginePod:
    """The parts of an engine pod the runner needs."""

    namespace: str
    name: str
    uid: str
    service: str
    track: str
    config_hash: str
    container: str
    args: tuple[str, ...]
    env: tuple[tuple[str, str | EnvRef], ...]
    node_name: str | None
    pod_ip: str | None
    phase: str
    terminating: bool
    finished: bool
    grace_period_s: float
    inject_crash: str | None
    #: The pod's labels, sorted (routers select their workers by them).
    labels: tuple[tuple[str, str], ...] = ()
    #: ``chunkpilot.io/role`` (``prefill``/``decode``) of a disaggregated service's engine, else empty.
    role: str = ""
    #: Whether this is a router pod (``chunkpilot.io/component: router``) rather than an engine.
    router: bool = False
    #: The readiness probe's HTTP path (``/health`` unless the container's ``readinessProbe`` says).
    health_path: str = "/health"
    #: Where the engine serves Prometheus metrics (``/metrics`` unless the pod's
    #: ``prometheus.io/path`` annotation says, as for TensorRT-LLM's ``/prometheus/metrics``).
    metrics_path: str = "/metrics"

    @property
    def key(self) -> tuple[str, str]:
        """``(namespace, name)``."""
        return (self.namespace, self.name)

    @property
    def scheduled(self) -> bool:
        """Whether the scheduler has bound the pod to a node (a kubelet would now start it)."""
        return self.node_name is not None

    @property
    def started_by_node(self) -> bool:
        """Whether the node agent (KWOK) has written the pod's first Running status.

        From then on the runner owns the Ready condition: KWOK's pod-ready stage selects only
        pods still in phase Pending.
        """
        return self.phase == "Running"

    @property
    def should_run(self) -> bool:
        """Whether an engine process should be running for this pod."""
        return self.scheduled and not self.terminating and not self.finished


def engine_container(containers: Sequence[Manifest], name: str = ENGINE_CONTAINER_NAME) -> Manifest:
    """The container to run: the one named ``name`` (a router pod's ``router``), else the first."""
    if not containers:
        raise PodSpecError("the pod has no containers")
    for container in containers:
        if container.get("name") == name:
            return container
    return containers[0]


def parse_pod(pod: Manifest) -> EnginePod:
    """Extract an :class:`EnginePod` from a pod manifest."""
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    labels = metadata.get("labels") or {}
    annotations = metadata.get("annotations") or {}
    router = labels.get(COMPONENT_LABEL) == ROUTER_COMPONENT
    container = engine_container(
        spec.get("containers") or [], ROUTER_CONTAINER_NAME if router else ENGINE_CONTAINER_NAME
    )
    args = [str(arg) for arg in container.get("args") or []]
    if not args:
        expected = "vllm-router flags" if router else "[MODEL, --flag, ...]"
        raise PodSpecError(
            f"pod {metadata.get('namespace')}/{metadata.get('name')}: container "
            f"{container.get('name')!r} has no args; its args are {expected}"
        )
    env = parse_env(
        container.get("env") or [],
        f"pod {metadata.get('namespace')}/{metadata.get('name')}",
        {"metadata.namespace": str(metadata.get("namespace", "default"))},
    )
    grace = spec.get("terminationGracePeriodSeconds")
    return EnginePod(
        namespace=str(metadata.get("namespace", "default")),
        name=str(metadata.get("name", "")),
        uid=str(metadata.get("uid", "")),
        service=str(labels.get(SERVICE_LABEL, "")),
        track=str(labels.get(TRACK_LABEL, "stable")),
        config_hash=str(labels.get(CONFIG_HASH_LABEL, "")),
        container=str(container.get("name", ENGINE_CONTAINER_NAME)),
        args=tuple(args),
        env=env,
        node_name=spec.get("nodeName") or None,
        pod_ip=status.get("podIP") or None,
        phase=str(status.get("phase") or "Pending"),
        terminating=metadata.get("deletionTimestamp") is not None,
        finished=status.get("phase") in ("Succeeded", "Failed"),
        grace_period_s=float(30 if grace is None else grace),
        inject_crash=annotations.get(INJECT_CRASH_ANNOTATION),
        labels=tuple(sorted((str(k), str(v)) for k, v in labels.items())),
        role=str(labels.get(ROLE_LABEL, "")),
        router=router,
        health_path=str(
            ((container.get("readinessProbe") or {}).get("httpGet") or {}).get("path") or "/health"
        ),
        metrics_path=str(annotations.get(METRICS_PATH_ANNOTATION) or "/metrics"),
    )


_REF_KINDS = {"secretKeyRef": RefKind.SECRET, "configMapKeyRef": RefKind.CONFIG_MAP}


def parse_env(
    entries: Sequence[Manifest], where: str, fields: Mapping[str, str] | None = None
) -> tuple[tuple[str, str | EnvRef], ...]:
    """A container's env in order: literal values and Secret/ConfigMap key references.

    A ``fieldRef`` whose ``fieldPath`` is in ``fields`` (:func:`parse_pod` gives
    ``metadata.namespace``, which the router's args use as ``$(POD_NAMESPACE)``) becomes its literal
    value. Other ``valueFrom`` sources (other ``fieldRef`` paths, ``resourceFieldRef``) are not
    supported locally and are left out.
    """
    env: list[tuple[str, str | EnvRef]] = []
    for item in entries:
        if "name" not in item:
            continue
        name = str(item["name"])
        source = item.get("valueFrom")
        if source is None:
            env.append((name, str(item.get("value") or "")))
            continue
        field_path = (source.get("fieldRef") or {}).get("fieldPath")
        if field_path is not None:
            if fields is not None and field_path in fields:
                env.append((name, fields[field_path]))
            continue
        for field_name, kind in _REF_KINDS.items():
            ref = source.get(field_name)
            if ref is None:
                continue
            if not ref.get("name") or not ref.get("key"):
                raise PodSpecError(f"{where}: env {name}: valueFrom.{field_name} needs both 'name' and 'key'")
            env.append((name, EnvRef(kind, str(ref["name"]), str(ref["key"]), bool(ref.get("optional")))))
            break
    return tuple(env)


def resolve_env(
    env: Sequence[tuple[str, str | EnvRef]], namespace: str, lookup: ObjectDataLookup
) -> dict[str, str]:
    """The process environment for a container: references replaced by the referenced values.

    Later entries override earlier ones of the same name, as in Kubernetes. Each Secret/ConfigMap
    is looked up once. Raises :class:`EnvConfigError` naming the object and key when a required
    reference is missing (an optional one is left out).
    """
    cache: dict[tuple[RefKind, str], Mapping[str, str] | None] = {}
    resolved: dict[str, str] = {}
    for name, value in env:
        if isinstance(value, str):
            resolved[name] = value
            continue
        if (value.kind, value.name) not in cache:
            cache[(value.kind, value.name)] = lookup(value.kind, namespace, value.name)
        data = cache[(value.kind, value.name)]
        if data is None:
            if value.optional:
                continue
            raise EnvConfigError(f"env {name}: {value.kind.value.lower()} {value.name!r} not found")
        if value.key not in data:
            if value.optional:
                continue
            raise EnvConfigError(
                f"env {name}: couldn't find key {value.key!r} in {value.kind.value} {namespace}/{value.name}"
            )
        resolved[name] = data[value.key]
    return resolved


_VARIABLE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand_args(args: Sequence[str], env: Mapping[str, str]) -> tuple[str, ...]:
    """Kubernetes' ``$(VAR)`` expansion of a container's args from its environment.

    ``$(VAR)`` becomes VAR's value when the container's env defines it and stays as written
    otherwise; ``$$`` is a literal ``$`` (so ``$$(VAR)`` stays ``$(VAR)``).
    """

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "$"
        return env.get(name, match.group(0))

    return tuple(_VARIABLE.sub(replace, arg) for arg in args)


def literal_env(env: Sequence[tuple[str, str | EnvRef]]) -> dict[str, str]:
    """The env values known without reading Secrets or ConfigMaps (later entries win)."""
    return {name: value for name, value in env if isinstance(value, str)}


def decode_secret_data(data: Mapping[str, str] | None) -> dict[str, str]:
    """A Secret's ``data`` (base64 values, as the API serves them) as text."""
    decoded: dict[str, str] = {}
    for key, encoded in (data or {}).items():
        try:
            decoded[key] = base64.b64decode(encoded, validate=True).decode("utf-8", errors="replace")
        except (binascii.Error, ValueError):
            continue
    return decoded


def strip_flags(args: Sequence[str], flags: Sequence[str]) -> list[str]:
    """Remove ``flags`` (``--flag VALUE`` and ``--flag=VALUE`` forms) from an argument list."""
    kept: list[str] = []
    skip_value = False
    for arg in args:
        if skip_value:
            skip_value = False
            continue
        if arg in flags:
            skip_value = True
            continue
        if any(arg.startswith(f"{flag}=") for flag in flags):
            continue
        kept.append(arg)
    return kept


#: The simulator's hardware flags a runner-wide hardware override replaces in every pod's args.
HARDWARE_FLAGS = ("--gpu", "--step-profile")


def engine_command(
    base_command: Sequence[str],
    args: Sequence[str],
    *,
    host: str,
    port: int,
    time_scale: float | None,
    hardware: Sequence[str] = (),
) -> list[str]:
    """The simulator command line for a pod: its args with host, port and time scale set by the runner.

    ``hardware`` (e.g. ``["--gpu", "truth.json", "--step-profile", "truth-profile.json"]``) replaces
    the pod's own hardware flags: the engines then run on hardware the manifests do not name.
    """
    owned = (*RUNNER_OWNED_FLAGS, *HARDWARE_FLAGS) if hardware else RUNNER_OWNED_FLAGS
    command = [*base_command, *strip_flags(args, owned), *hardware, "--host", host, "--port", str(port)]
    if time_scale is not None:
        command += ["--time-scale", f"{time_scale:g}"]
    return command


class CrashInjection(enum.Enum):
    """What the ``chunkpilot.io/inject-crash`` annotation asks for."""

    NONE = "none"
    AT_START = "at-start"
    AFTER_DELAY = "after-delay"


_DURATION = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(ms|s|m)$")


def parse_crash_injection(value: str | None) -> tuple[CrashInjection, float]:
    """Interpret the annotation: ``true`` crashes every start, a duration (``30s``) crashes after it.

    The delay counts from the moment the engine became healthy. ``false`` or absence means no crash.
    """
    if value is None or value.strip().lower() in ("", "false", "no", "0"):
        return CrashInjection.NONE, 0.0
    text = value.strip().lower()
    if text in ("true", "yes", "1", "start"):
        return CrashInjection.AT_START, 0.0
    match = _DURATION.match(text)
    if match is None:
        raise PodSpecError(
            f"annotation {INJECT_CRASH_ANNOTATION}={value!r}: use 'true' (crash at every start) "
            "or a duration such as '30s' (crash that long after becoming healthy)"
        )
    number, unit = float(match.group(1)), match.group(2)
    return CrashInjection.AFTER_DELAY, number * {"ms": 0.001, "s": 1.0, "m": 60.0}[unit]


class ContainerPhase(enum.Enum):
    """The container state the runner reports, as the kubelet would."""

    STARTING = "starting"  # process running, not yet answering /health
    NO_WORKERS = "no-workers"  # a router with no Ready engine in a pool it needs: not started yet
    RUNNING = "running"  # healthy: the pod is Ready
    BACKOFF = "backoff"  # exited; waiting to restart (CrashLoopBackOff)
    CONFIG_ERROR = "config-error"  # not started: an env reference is missing (CreateContainerConfigError)


@dataclass(frozen=True, slots=True)
class Termination:
    """How the last run of the container ended."""

    exit_code: int
    reason: str
    started_at: datetime
    finished_at: datetime
    message: str


@dataclass(frozen=True, slots=True)
class ContainerReport:
    """What the runner knows about a pod's engine container."""

    container: str
    phase: ContainerPhase
    restart_count: int
    started_at: datetime | None
    last_termination: Termination | None
    backoff_s: float = 0.0
    config_error: str = ""

    @property
    def ready(self) -> bool:
        """Whether the pod should be Ready."""
        return self.phase is ContainerPhase.RUNNING


def rfc3339(moment: datetime) -> str:
    """A Kubernetes timestamp (UTC, seconds precision)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def observed_signature(pod: Manifest, container: str) -> tuple[bool, int, str]:
    """``(ready, restartCount, state)`` as the pod's status reports them now."""
    status = pod.get("status") or {}
    ready = any(
        condition.get("type") == "Ready" and condition.get("status") == "True"
        for condition in status.get("conditions") or []
    )
    for entry in status.get("containerStatuses") or []:
        if entry.get("name") == container:
            state = entry.get("state") or {}
            kind = next((key for key in ("waiting", "running", "terminated") if state.get(key)), "unknown")
            return ready, int(entry.get("restartCount") or 0), kind
    return ready, 0, "unknown"


def desired_signature(report: ContainerReport) -> tuple[bool, int, str]:
    """``(ready, restartCount, state)`` the runner wants the pod's status to show."""
    waiting = report.phase in (ContainerPhase.BACKOFF, ContainerPhase.CONFIG_ERROR)
    kind = "waiting" if waiting else "running"
    return report.ready, report.restart_count, kind


def status_patch(report: ContainerReport, pod_name: str, now: datetime) -> dict[str, Any]:
    """A strategic-merge patch of ``pods/status`` that states the container's real condition.

    Conditions merge by ``type`` and container statuses by ``name``; state keys the container is
    no longer in are set to null so that exactly one remains.
    """
    stamp = rfc3339(now)
    if report.ready:
        condition: dict[str, Any] = {"status": "True", "reason": None, "message": None}
    else:
        condition = {
            "status": "False",
            "reason": "ContainersNotReady",
            "message": f"containers with unready status: [{report.container}]",
        }
    state: dict[str, Any]
    if report.phase is ContainerPhase.BACKOFF:
        state = {
            "running": None,
            "terminated": None,
            "waiting": {
                "reason": "CrashLoopBackOff",
                "message": (
                    f"back-off {report.backoff_s:g}s restarting failed "
                    f"container={report.container} pod={pod_name}"
                ),
            },
        }
    elif report.phase is ContainerPhase.CONFIG_ERROR:
        state = {
            "running": None,
            "terminated": None,
            "waiting": {"reason": "CreateContainerConfigError", "message": report.config_error},
        }
    else:
        started = rfc3339(report.started_at or now)
        state = {"waiting": None, "terminated": None, "running": {"startedAt": started}}
    container_status: dict[str, Any] = {
        "name": report.container,
        "ready": report.ready,
        "started": report.phase not in (ContainerPhase.BACKOFF, ContainerPhase.CONFIG_ERROR),
        "restartCount": report.restart_count,
        "state": state,
    }
    if report.last_termination is not None:
        last = report.last_termination
        container_status["lastState"] = {
            "terminated": {
                "exitCode": last.exit_code,
                "reason": last.reason,
                "startedAt": rfc3339(last.started_at),
                "finishedAt": rfc3339(last.finished_at),
                "message": last.message[-MAX_TERMINATION_MESSAGE:],
            }
        }
    conditions = [
        {"type": kind, "lastTransitionTime": stamp, **condition} for kind in ("Ready", "ContainersReady")
    ]
    return {"status": {"conditions": conditions, "containerStatuses": [container_status]}}
