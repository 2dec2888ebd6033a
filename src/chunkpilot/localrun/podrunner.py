"""The local stand-in for the kubelet: one simulator process per scheduled engine pod.

KWOK gives the local control plane nodes and pod status, but runs no containers. The pod runner
fills that gap for engine pods (label ``chunkpilot.io/service``): it watches them through the API,
starts ``chunkpilot sim serve`` with the container's args on a free loopback port for every pod
bound to a node, probes ``/health`` like a readiness probe, publishes healthy engines as Prometheus
file_sd targets with the pod's labels, and writes what it sees back into the pod status (Ready
condition, container state, restart count), so Deployments, the operator and the tuner react to
crashes as on a real cluster. Crashed engines are restarted with the kubelet's exponential back-off
(CrashLoopBackOff). Deleted pods get SIGTERM, then SIGKILL after their grace period.

Router pods (``chunkpilot.io/component: router``, a disaggregated service's ``vllm-router``) are
run the same way, with the installed ``vllm-router``: its Kubernetes service discovery would find
KWOK's unreachable pod IPs, so it gets static lists of the Ready engine processes its prefill and
decode selectors match, and is restarted (debounced) when those sets change; it starts once both
pools have a Ready engine (see :mod:`chunkpilot.localrun.router`).

It also answers which endpoints of a service are Ready (the stand-in for kube-proxy: a service with
a router sends its traffic to the router), and can make a pod's engine crash on demand (fault
injection).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from chunkpilot.devcluster.ports import LOOPBACK, free_port
from chunkpilot.localrun.endpoints import SERVICE_LABEL, Endpoint, EndpointSource, service_front
from chunkpilot.localrun.podspec import (
    ContainerPhase,
    ContainerReport,
    CrashInjection,
    EnginePod,
    EnvConfigError,
    Manifest,
    PodSpecError,
    RefKind,
    Termination,
    decode_secret_data,
    desired_signature,
    engine_command,
    expand_args,
    literal_env,
    observed_signature,
    parse_crash_injection,
    parse_pod,
    resolve_env,
    status_patch,
)
from chunkpilot.localrun.process import EngineProcess
from chunkpilot.localrun.router import (
    DEFAULT_ROUTER_COMMAND,
    RouterBackends,
    RouterSpec,
    Worker,
    backends_for,
    parse_router_args,
    router_command,
    router_missing,
)
from chunkpilot.localrun.targets import FileSDTargets

log = logging.getLogger(__name__)

DEFAULT_ENGINE_COMMAND: tuple[str, ...] = (sys.executable, "-m", "chunkpilot.cli", "sim", "serve")
STRATEGIC_MERGE = "application/strategic-merge-patch+json"
#: Hardware every simulated engine runs on, whatever its pod says: an accelerator profile (name or
#: JSON path) and a step profile JSON. Neither is visible in the cluster, so the tuner is not told.
ENV_SIM_GPU = "CHUNKPILOT_SIM_GPU"
ENV_SIM_STEP_PROFILE = "CHUNKPILOT_SIM_STEP_PROFILE"


def hardware_from_env() -> tuple[str, ...]:
    """The simulator flags of :data:`ENV_SIM_GPU` and :data:`ENV_SIM_STEP_PROFILE` (empty: unset)."""
    flags: list[str] = []
    for env, flag in ((ENV_SIM_GPU, "--gpu"), (ENV_SIM_STEP_PROFILE, "--step-profile")):
        value = os.environ.get(env, "")
        if value:
            flags += [flag, value]
    return tuple(flags)


FIELD_MANAGER = "chunkpilot-podrunner"


@dataclass(frozen=True, slots=True)
class RunnerSettings:
    """How the pod runner runs engines."""

    engine_command: tuple[str, ...] = DEFAULT_ENGINE_COMMAND
    time_scale: float | None = None
    host: str = LOOPBACK
    log_dir: Path = Path("/tmp/chunkpilot-podrunner")
    namespace: str | None = None
    restart_backoff_s: float = 10.0
    max_restart_backoff_s: float = 300.0
    max_grace_period_s: float = 10.0
    readiness_period_s: float = 2.0
    readiness_failure_threshold: int = 3
    tick_s: float = 0.2
    report_status: bool = True
    config_retry_s: float = 2.0
    #: Simulator hardware flags replacing every pod's own (default: from the environment).
    hardware: tuple[str, ...] = field(default_factory=hardware_from_env)
    #: How router pods are run (the installed ``vllm-router``).
    router_command: tuple[str, ...] = DEFAULT_ROUTER_COMMAND
    #: How long a router's set of Ready workers must stay unchanged before it is restarted with it.
    router_debounce_s: float = 1.0


@dataclass(frozen=True, slots=True)
class PodReport:
    """What the runner is doing for one pod (for tests and progress output)."""

    namespace: str
    pod: str
    service: str
    track: str
    phase: ContainerPhase
    restart_count: int
    port: int
    pid: int | None
    log_path: Path
    role: str = ""
    router: bool = False
    #: A router's workers as it runs now (None: not running, or not a router).
    workers: RouterBackends | None = None


@dataclass(slots=True)
class _Container:
    pod: EnginePod
    port: int
    log_path: Path
    phase: ContainerPhase = ContainerPhase.STARTING
    process: EngineProcess | None = None
    restart_count: int = 0
    consecutive_failures: int = 0
    started_at: datetime | None = None
    last_termination: Termination | None = None
    backoff_s: float = 0.0
    backoff_until: float = 0.0
    crash_at: float | None = None
    crash_every_start: bool = False
    last_probe: float = 0.0
    probe_failures: int = 0
    last_patch: tuple[tuple[bool, int, str], float] | None = None
    spawn_error: str | None = field(default=None)
    config_error: str = ""
    config_retry_at: float = 0.0
    #: A router pod's selectors (None for engines).
    router: RouterSpec | None = None
    #: The workers the router process runs with, and the set it should run with since when.
    workers: RouterBackends | None = None
    wanted_workers: RouterBackends | None = None
    wanted_since: float | None = None

    def report(self) -> ContainerReport:
        return ContainerReport(
            container=self.pod.container,
            phase=self.phase,
            restart_count=self.restart_count,
            started_at=self.started_at,
            last_termination=self.last_termination,
            backoff_s=self.backoff_s,
            config_error=self.config_error,
        )

    def endpoint(self, host: str) -> Endpoint:
        pod = self.pod
        return Endpoint(
            pod.namespace,
            pod.name,
            pod.service,
            pod.track,
            pod.config_hash,
            host,
            self.port,
            pod.role,
            pod.metrics_path,
        )


@dataclass(slots=True)
class _CrashRule:
    service: str | None
    track: str | None
    remaining: int

    def matches(self, pod: EnginePod) -> bool:
        return (self.service is None or pod.service == self.service) and (
            self.track is None or pod.track == self.track
        )


def core_api_from_kubeconfig(kubeconfig: Path | str) -> client.CoreV1Api:
    """A CoreV1Api bound to the cluster of a kubeconfig file."""
    api_client = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]  # untyped in the client
    return client.CoreV1Api(api_client)


class PodRunner:
    """Runs an engine process for every scheduled engine pod and mirrors its health into the API."""

    def __init__(
        self,
        api: client.CoreV1Api,
        *,
        targets: FileSDTargets | None = None,
        settings: RunnerSettings | None = None,
    ) -> None:
        self.api = api
        self.targets = targets
        self.settings = settings or RunnerSettings()
        self._serializer = api.api_client
        self._pods: dict[str, dict[str, Any]] = {}  # uid -> manifest, fed by the watch
        self._pods_lock = threading.Lock()
        self._synced = threading.Event()
        self._containers: dict[tuple[str, str], _Container] = {}
        self._terminating: list[tuple[EngineProcess, float]] = []
        self._state_lock = threading.RLock()
        self._crash_rules: list[_CrashRule] = []
        self._invalid: set[str] = set()
        self._stopping = threading.Event()
        self._watch: watch.Watch | None = None
        self._threads: list[threading.Thread] = []

    # ---------------------------------------------------------------- lifecycle

    def start(self, sync_timeout_s: float = 30.0) -> PodRunner:
        """Start watching pods and running engines; returns once the first pod list is in."""
        self.settings.log_dir.mkdir(parents=True, exist_ok=True)
        self._stopping.clear()
        self._threads = [
            threading.Thread(target=self._watch_loop, name="podrunner-watch", daemon=True),
            threading.Thread(target=self._reconcile_loop, name="podrunner-reconcile", daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        if not self._synced.wait(sync_timeout_s):
            self.stop()
            raise TimeoutError(f"the pod runner could not list pods within {sync_timeout_s:g}s")
        return self

    def stop(self) -> None:
        """Stop every engine process (SIGTERM, then SIGKILL), deregister all targets, stop watching."""
        self._stopping.set()
        current = self._watch
        if current is not None:
            current.stop()  # type: ignore[no-untyped-call]  # untyped in the client
        for thread in self._threads:
            thread.join(timeout=15)
        with self._state_lock:
            processes = [c.process for c in self._containers.values() if c.process is not None]
            processes += [process for process, _ in self._terminating]
            for container in self._containers.values():
                self._deregister(container)
            self._containers.clear()
            self._terminating.clear()
        for process in processes:
            process.terminate()
        for process in processes:
            process.stop(grace_s=self.settings.max_grace_period_s)
        if self.targets is not None:
            self.targets.clear()

    def __enter__(self) -> PodRunner:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---------------------------------------------------------------- queries

    def ready_endpoints(self, service: str, namespace: str | None = None) -> list[Endpoint]:
        """Endpoints of a service's pods that are Ready in the API and healthy here (kube-proxy's view).

        Prefill and decode engines are reached through a router only: a disaggregated service's
        Service selects its router pods (the stable one's, and a colocated topology trial's canary
        router in front of its canary engines); a colocated service's its engines and the canary
        router of a topology trial, which takes its share of the traffic to the canary pools behind it.
        """
        with self._pods_lock:
            ready_pods = _ready_pod_keys(self._pods.values())
        with self._state_lock:
            own = [
                container
                for container in self._containers.values()
                if container.pod.service == service
                and (namespace is None or container.pod.namespace == namespace)
            ]
            serving = [c for c in own if c.phase is ContainerPhase.RUNNING and c.pod.key in ready_pods]
            return service_front(
                [c.endpoint(self.settings.host) for c in serving if not c.pod.router],
                [c.endpoint(self.settings.host) for c in serving if c.pod.router],
                routed=any(c.pod.router and c.pod.track == "stable" for c in own),  # Ready or not
            )

    def endpoint_source(self, service: str, namespace: str | None = None) -> EndpointSource:
        """A callable returning the service's Ready endpoints, for the load generator."""
        return lambda: self.ready_endpoints(service, namespace)

    def pods(self) -> list[PodReport]:
        """What the runner is doing for each pod it runs."""
        with self._state_lock:
            return sorted(
                (
                    PodReport(
                        namespace=c.pod.namespace,
                        pod=c.pod.name,
                        service=c.pod.service,
                        track=c.pod.track,
                        phase=c.phase,
                        restart_count=c.restart_count,
                        port=c.port,
                        pid=c.process.pid
                        if c.process is not None and c.process.exit_code() is None
                        else None,
                        log_path=c.log_path,
                        role=c.pod.role,
                        router=c.pod.router,
                        workers=c.workers if c.process is not None else None,
                    )
                    for c in self._containers.values()
                ),
                key=lambda report: (report.namespace, report.pod),
            )

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float, poll_s: float = 0.2) -> bool:
        """Poll ``predicate`` until it holds or ``timeout_s`` passes; returns its last value."""
        deadline = time.monotonic() + timeout_s
        while True:
            if predicate():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)

    # ---------------------------------------------------------------- fault injection

    def crash(self, pod: str, namespace: str = "default") -> bool:
        """Kill a pod's engine now (SIGKILL); the runner then restarts it after back-off.

        Returns False when the runner has no live process for that pod.
        """
        with self._state_lock:
            container = self._containers.get((namespace, pod))
            if container is None or container.process is None or container.process.exit_code() is not None:
                return False
            log.info("injecting a crash into %s/%s", namespace, pod)
            container.process.kill()
            return True

    def crash_next(self, *, service: str | None = None, track: str | None = None, count: int = 1) -> None:
        """Make the next ``count`` new pods matching ``service``/``track`` crash at every start.

        Such a pod never becomes Ready and goes into CrashLoopBackOff, like a container with a
        broken configuration; the same as the ``chunkpilot.io/inject-crash: "true"`` annotation.
        """
        with self._state_lock:
            self._crash_rules.append(_CrashRule(service, track, count))

    # ---------------------------------------------------------------- watch

    def _manifest(self, obj: Any) -> dict[str, Any]:
        manifest: dict[str, Any] = self._serializer.sanitize_for_serialization(obj)
        return manifest

    def _list(self) -> str:
        if self.settings.namespace is None:
            listing = self.api.list_pod_for_all_namespaces(label_selector=SERVICE_LABEL)
        else:
            listing = self.api.list_namespaced_pod(self.settings.namespace, label_selector=SERVICE_LABEL)
        items = [self._manifest(item) for item in listing.items or []]
        with self._pods_lock:
            self._pods = {str(item["metadata"]["uid"]): item for item in items}
        self._synced.set()
        return str(listing.metadata.resource_version if listing.metadata is not None else "")

    def _watch_loop(self) -> None:
        resource_version: str | None = None
        while not self._stopping.is_set():
            try:
                if resource_version is None:
                    resource_version = self._list()
                self._watch = watch.Watch()  # type: ignore[no-untyped-call]  # untyped in the client
                if self.settings.namespace is None:
                    stream = self._watch.stream(  # type: ignore[no-untyped-call]  # untyped in the client
                        self.api.list_pod_for_all_namespaces,
                        label_selector=SERVICE_LABEL,
                        resource_version=resource_version,
                        timeout_seconds=10,
                        allow_watch_bookmarks=True,
                    )
                else:
                    stream = self._watch.stream(  # type: ignore[no-untyped-call]  # untyped in the client
                        self.api.list_namespaced_pod,
                        self.settings.namespace,
                        label_selector=SERVICE_LABEL,
                        resource_version=resource_version,
                        timeout_seconds=10,
                        allow_watch_bookmarks=True,
                    )
                for event in stream:
                    raw = event.get("raw_object") or {}
                    metadata = raw.get("metadata") or {}
                    resource_version = str(metadata.get("resourceVersion", resource_version))
                    kind = event.get("type")
                    if kind in ("ADDED", "MODIFIED"):
                        with self._pods_lock:
                            self._pods[str(metadata["uid"])] = raw
                    elif kind == "DELETED":
                        with self._pods_lock:
                            self._pods.pop(str(metadata["uid"]), None)
                    if self._stopping.is_set():
                        break
            except ApiException as error:
                if error.status != 410:
                    log.warning("pod watch failed (%s); listing again", error.reason)
                    self._stopping.wait(1.0)
                resource_version = None
            except Exception as error:  # connection drops: list again after a pause
                if self._stopping.is_set():
                    break
                log.warning("pod watch interrupted (%s); listing again", error)
                resource_version = None
                self._stopping.wait(1.0)

    # ---------------------------------------------------------------- reconcile

    def _reconcile_loop(self) -> None:
        self._synced.wait()
        while not self._stopping.is_set():
            try:
                self._reconcile_once()
            except Exception:
                log.exception("pod runner reconcile failed; retrying")
            self._stopping.wait(self.settings.tick_s)

    def _reconcile_once(self) -> None:
        with self._pods_lock:
            manifests = {uid: manifest for uid, manifest in self._pods.items()}
        wanted: dict[tuple[str, str], tuple[EnginePod, dict[str, Any]]] = {}
        routers: dict[tuple[str, str], RouterSpec] = {}
        for uid, manifest in manifests.items():
            try:
                pod = parse_pod(manifest)
                if pod.router:
                    routers[pod.key] = parse_router_args(expand_args(pod.args, literal_env(pod.env)))
            except PodSpecError as error:
                if uid not in self._invalid:
                    self._invalid.add(uid)
                    log.error("cannot run pod: %s", error)
                continue
            if pod.should_run:
                wanted[pod.key] = (pod, manifest)
        with self._state_lock:
            for key, container in list(self._containers.items()):
                entry = wanted.get(key)
                if entry is None or entry[0].uid != container.pod.uid:
                    self._stop_container(container)
                    del self._containers[key]
            for key, (pod, _) in wanted.items():
                existing = self._containers.get(key)
                if existing is None:
                    self._containers[key] = self._start_container(pod, routers.get(key))
                else:
                    existing.pod = pod
                    existing.router = routers.get(key, existing.router)
            now = time.monotonic()
            workers = self._ready_workers(_ready_pod_keys(m for _, m in wanted.values()))
            for key, container in self._containers.items():
                if container.router is not None:
                    self._sync_router(container, backends_for(container.router, workers), now)
                self._advance(container, now)
                self._report(container, wanted[key][1])
            self._terminating = [
                (process, grace) for process, grace in self._terminating if not process.reap(grace)
            ]

    def _free_port(self) -> int:
        used = {c.port for c in self._containers.values()}
        port = free_port(self.settings.host)
        while port in used:
            port = free_port(self.settings.host)
        return port

    def _start_container(self, pod: EnginePod, router: RouterSpec | None = None) -> _Container:
        log_path = self.settings.log_dir / f"{pod.namespace}_{pod.name}.log"
        container = _Container(pod=pod, port=self._free_port(), log_path=log_path, router=router)
        for rule in self._crash_rules:
            if rule.remaining > 0 and rule.matches(pod):
                rule.remaining -= 1
                container.crash_every_start = True
                log.info("pod %s/%s will crash at every start (fault injection)", pod.namespace, pod.name)
                break
        self._spawn(container)
        return container

    def _read_object_data(self, kind: RefKind, namespace: str, name: str) -> dict[str, str] | None:
        """A Secret's (decoded) or ConfigMap's data from the API; None when it does not exist."""
        try:
            if kind is RefKind.SECRET:
                secret = self.api.read_namespaced_secret(name, namespace)
                return decode_secret_data({str(k): str(v) for k, v in (secret.data or {}).items()})
            config_map = self.api.read_namespaced_config_map(name, namespace)
            return {str(key): str(value) for key, value in (config_map.data or {}).items()}
        except ApiException as error:
            if error.status == 404:
                return None
            raise EnvConfigError(
                f"cannot read {kind.value} {namespace}/{name}: {error.status} {error.reason}"
            ) from error

    def _environment(self, container: _Container) -> dict[str, str] | None:
        """The engine's environment, or None (the container waits in CreateContainerConfigError)."""
        pod = container.pod
        try:
            env = resolve_env(pod.env, pod.namespace, self._read_object_data)
        except EnvConfigError as error:
            message = str(error)
            if message != container.config_error:
                log.warning(
                    "pod %s/%s: not starting the engine (CreateContainerConfigError): %s; retrying every %gs",
                    pod.namespace,
                    pod.name,
                    message,
                    self.settings.config_retry_s,
                )
            self._deregister(container)
            container.phase = ContainerPhase.CONFIG_ERROR
            container.config_error = message
            container.config_retry_at = time.monotonic() + self.settings.config_retry_s
            container.process = None
            return None
        if container.config_error:
            log.info("pod %s/%s: env references resolved; starting the engine", pod.namespace, pod.name)
            container.config_error = ""
        # HOME names the pod's emptyDir, which only the kubelet mounts: a local engine keeps this
        # machine's.
        return {key: value for key, value in env.items() if key != "HOME"}

    def _ready_workers(self, ready_pods: set[tuple[str, str]]) -> list[Worker]:
        """Engines a router may send to: healthy here and Ready in the API."""
        return [
            Worker(c.pod.namespace, dict(c.pod.labels), c.endpoint(self.settings.host).url)
            for key, c in self._containers.items()
            if not c.pod.router and c.phase is ContainerPhase.RUNNING and key in ready_pods
        ]

    def _sync_router(self, container: _Container, backends: RouterBackends, now: float) -> None:
        """Restart a router whose Ready workers changed, once the new set has held for the debounce.

        vllm-router takes no new PD workers at runtime, so a new set means a new process (on a new
        port; the old one is stopped with the pod's grace period). Without a Ready engine in each
        pool it needs, no router runs and the pod is not Ready.
        """
        spec = container.router
        if spec is None or container.phase in (ContainerPhase.BACKOFF, ContainerPhase.CONFIG_ERROR):
            container.wanted_workers = backends if spec and backends.complete(spec.disaggregated) else None
            return
        target = backends if backends.complete(spec.disaggregated) else None
        running = container.workers if container.process is not None else None
        if target == running:
            container.wanted_workers, container.wanted_since = target, None
            return
        if container.wanted_since is None or container.wanted_workers != target:
            container.wanted_workers, container.wanted_since = target, now
        if now - container.wanted_since < self.settings.router_debounce_s:
            return
        pod = container.pod
        log.info(
            "pod %s/%s: router workers now %s; %s",
            pod.namespace,
            pod.name,
            target.describe() if target else f"none Ready for {spec.describe()}",
            "stopping it" if target is None else "restarting it" if running is not None else "starting it",
        )
        container.wanted_since = None
        if container.process is not None:
            self._stop_container(container)
            container.port = self._free_port()
        self._spawn(container)

    def _command(self, container: _Container, env: dict[str, str]) -> list[str] | None:
        """What to run for a container; None for a router without the workers it needs."""
        pod = container.pod
        args = expand_args(pod.args, env)
        if container.router is None:
            return engine_command(
                self.settings.engine_command,
                args,
                host=self.settings.host,
                port=container.port,
                time_scale=self.settings.time_scale,
                hardware=self.settings.hardware,
            )
        container.workers = container.wanted_workers
        if container.workers is None:
            return None
        return router_command(
            self.settings.router_command,
            args,
            host=self.settings.host,
            port=container.port,
            metrics_port=self._free_port(),
            backends=container.workers,
        )

    def _spawn(self, container: _Container) -> None:
        pod = container.pod
        env = self._environment(container)
        if env is None:
            return
        command = self._command(container, env)
        if command is None:
            container.phase = ContainerPhase.NO_WORKERS
            container.process = None
            return
        container.phase = ContainerPhase.STARTING
        container.started_at = datetime.now(UTC)
        container.crash_at = None
        container.probe_failures = 0
        missing = router_missing(command) if container.router is not None else None
        if missing is not None:
            container.process, container.spawn_error = None, missing
            log.error("pod %s/%s: %s", pod.namespace, pod.name, missing)
            self._crashed(container, 128, time.monotonic())
            return
        try:
            container.process = EngineProcess(
                command,
                host=self.settings.host,
                port=container.port,
                log_path=container.log_path,
                env=env,
                health_path=pod.health_path,
            )
        except OSError as error:
            container.process = None
            container.spawn_error = f"cannot start {command[0]}: {error.strerror}"
            log.error("pod %s/%s: %s", pod.namespace, pod.name, container.spawn_error)
            self._crashed(container, 128, time.monotonic())
            return
        log.info(
            "pod %s/%s: %s started (pid %d, port %d)",
            pod.namespace,
            pod.name,
            "router" if container.router is not None else "engine",
            container.process.pid,
            container.port,
        )
        if container.crash_every_start or self._injection(pod)[0] is CrashInjection.AT_START:
            log.info(
                "pod %s/%s: crashing the engine right after start (fault injection)", pod.namespace, pod.name
            )
            container.process.kill()

    def _injection(self, pod: EnginePod) -> tuple[CrashInjection, float]:
        try:
            return parse_crash_injection(pod.inject_crash)
        except PodSpecError as error:
            if pod.uid not in self._invalid:
                self._invalid.add(pod.uid)
                log.error("pod %s/%s: %s", pod.namespace, pod.name, error)
            return CrashInjection.NONE, 0.0

    def _advance(self, container: _Container, now: float) -> None:
        pod = container.pod
        if container.phase is ContainerPhase.NO_WORKERS:
            return  # _sync_router starts it once its pools have Ready engines
        if container.phase is ContainerPhase.CONFIG_ERROR:
            if now >= container.config_retry_at:
                self._spawn(container)
            return
        if container.phase is ContainerPhase.BACKOFF:
            if now >= container.backoff_until:
                container.restart_count += 1
                self._spawn(container)
            return
        process = container.process
        if process is None:
            return
        code = process.exit_code()
        if code is not None:
            self._crashed(container, code, now)
            return
        injection, delay = self._injection(pod)
        if container.crash_every_start or injection is CrashInjection.AT_START:
            process.kill()
            return
        if now - container.last_probe < (
            0.0 if container.phase is ContainerPhase.STARTING else self.settings.readiness_period_s
        ):
            return
        container.last_probe = now
        healthy = process.healthy()
        if container.phase is ContainerPhase.STARTING:
            if healthy:
                container.phase = ContainerPhase.RUNNING
                container.consecutive_failures = 0
                if injection is CrashInjection.AFTER_DELAY:
                    container.crash_at = now + delay
                self._register(container)
                log.info("pod %s/%s: engine healthy on port %d", pod.namespace, pod.name, container.port)
            return
        if container.crash_at is None and injection is CrashInjection.AFTER_DELAY:
            container.crash_at = now + delay
        if container.crash_at is not None and now >= container.crash_at:
            log.info("pod %s/%s: crashing the engine (fault injection)", pod.namespace, pod.name)
            container.crash_at = None
            process.kill()
            return
        container.probe_failures = 0 if healthy else container.probe_failures + 1
        if container.probe_failures >= self.settings.readiness_failure_threshold:
            log.warning("pod %s/%s: readiness probe failing; not Ready", pod.namespace, pod.name)
            container.phase = ContainerPhase.STARTING
            self._deregister(container)

    def _crashed(self, container: _Container, code: int, now: float) -> None:
        pod = container.pod
        self._deregister(container)
        exit_code = 128 - code if code < 0 else code
        message = container.spawn_error or (container.process.log_tail() if container.process else "")
        container.spawn_error = None
        container.last_termination = Termination(
            exit_code=exit_code,
            reason="Completed" if exit_code == 0 else "Error",
            started_at=container.started_at or datetime.now(UTC),
            finished_at=datetime.now(UTC),
            message=message,
        )
        container.process = None
        container.backoff_s = min(
            self.settings.max_restart_backoff_s,
            self.settings.restart_backoff_s * (2**container.consecutive_failures),
        )
        container.consecutive_failures += 1
        container.backoff_until = now + container.backoff_s
        container.phase = ContainerPhase.BACKOFF
        log.warning(
            "pod %s/%s: engine exited with code %d; restarting in %gs",
            pod.namespace,
            pod.name,
            exit_code,
            container.backoff_s,
        )

    def _stop_container(self, container: _Container) -> None:
        self._deregister(container)
        if container.process is not None and container.process.exit_code() is None:
            log.info("pod %s/%s: stopping the engine", container.pod.namespace, container.pod.name)
            container.process.terminate()
            grace = min(container.pod.grace_period_s, self.settings.max_grace_period_s)
            self._terminating.append((container.process, grace))
        container.process = None

    def _register(self, container: _Container) -> None:
        if self.targets is not None:
            self.targets.register(container.endpoint(self.settings.host), router=container.pod.router)

    def _deregister(self, container: _Container) -> None:
        if self.targets is not None:
            self.targets.deregister(container.pod.namespace, container.pod.name)

    def _report(self, container: _Container, manifest: dict[str, Any]) -> None:
        """Patch the pod status when it disagrees with the engine's real state.

        Only once KWOK has written the pod's first Running/Ready status: its pod-ready stage selects
        pods in phase Pending only, so from then on the runner's status is the one that stays.
        """
        pod = container.pod
        if not self.settings.report_status or not pod.started_by_node or pod.terminating:
            return
        report = container.report()
        desired = desired_signature(report)
        if observed_signature(manifest, pod.container) == desired:
            return
        now = time.monotonic()
        if (
            container.last_patch is not None
            and container.last_patch[0] == desired
            and now - container.last_patch[1] < 2
        ):
            return
        container.last_patch = (desired, now)
        try:
            updated = self.api.patch_namespaced_pod_status(
                pod.name,
                pod.namespace,
                status_patch(report, pod.name, datetime.now(UTC)),
                field_manager=FIELD_MANAGER,
                _content_type=STRATEGIC_MERGE,
            )
        except ApiException as error:
            if error.status != 404:
                log.warning("pod %s/%s: status update failed: %s", pod.namespace, pod.name, error.reason)
            return
        fresh = self._manifest(updated)
        with self._pods_lock:
            uid = str(fresh["metadata"]["uid"])
            if uid in self._pods:
                self._pods[uid] = fresh


def _ready_pod_keys(manifests: Iterable[Manifest]) -> set[tuple[str, str]]:
    """``(namespace, name)`` of the pods Ready in the API and not being deleted."""
    return {
        (str(m["metadata"].get("namespace")), str(m["metadata"].get("name")))
        for m in manifests
        if observed_signature(m, _container_name(m))[0] and not m["metadata"].get("deletionTimestamp")
    }


def _container_name(manifest: Manifest) -> str:
    try:
        return parse_pod(manifest).container
    except PodSpecError:
        return ""


def run_pods(
    kubeconfig: Path | str,
    *,
    targets_path: Path | str | None = None,
    settings: RunnerSettings | None = None,
) -> PodRunner:
    """Start a pod runner for a kubeconfig (and a file_sd file); stop it with :meth:`PodRunner.stop`."""
    targets = FileSDTargets(targets_path) if targets_path is not None else None
    return PodRunner(core_api_from_kubeconfig(kubeconfig), targets=targets, settings=settings).start()


def all_ready(
    runner: PodRunner, service: str, count: int, namespace: str | None = None
) -> Callable[[], bool]:
    """A predicate for :meth:`PodRunner.wait_for`: the service has at least ``count`` Ready endpoints."""
    return lambda: len(runner.ready_endpoints(service, namespace)) >= count


__all__: Sequence[str] = (
    "DEFAULT_ENGINE_COMMAND",
    "PodReport",
    "PodRunner",
    "RunnerSettings",
    "all_ready",
    "core_api_from_kubeconfig",
    "run_pods",
)
