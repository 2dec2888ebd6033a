"""The whole product on one machine: control plane, CRDs, Prometheus, operator, engines and load.

:class:`LocalStack` starts, in order: the local control plane (etcd, kube-apiserver, controller
manager, scheduler, KWOK with fake GPU nodes), the CRDs generated from the API model, a real
Prometheus whose scrape targets come from a file_sd file, the pod runner (simulator processes for
engine pods, registered in that file, and the real ``vllm-router`` for a disaggregated service's
router pods) and the operator as a subprocess pointed at that Prometheus,
authenticated as the Helm chart's ServiceAccount under the chart's own RBAC (see
:mod:`chunkpilot.localrun.chart`), so what the chart does not grant fails here too.
Load generators started through :meth:`LocalStack.start_load` replay traces against a service's
Ready engines (a disaggregated service's Ready routers). Leaving the ``with`` block — normally,
on an exception or on Ctrl-C — stops everything it started, newest first, process groups included.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from types import FrameType

from chunkpilot.devcluster import binaries as devbinaries
from chunkpilot.devcluster.controlplane import ControlPlane, ControlPlaneConfig
from chunkpilot.devcluster.fakenodes import gpu_node_specs
from chunkpilot.devcluster.ports import free_port
from chunkpilot.devcluster.processes import ManagedProcess, start_or_undo
from chunkpilot.devcluster.prometheus import PrometheusServer
from chunkpilot.localrun.chart import chart_dir, install_operator_identity, watch_values
from chunkpilot.localrun.endpoints import DEFAULT_ROUTING, balancer_for
from chunkpilot.localrun.loadgen import BackgroundLoad, LoadOptions
from chunkpilot.localrun.podrunner import PodRunner, RunnerSettings, core_api_from_kubeconfig
from chunkpilot.localrun.targets import FileSDTargets
from chunkpilot.localrun.traces import cap_lengths, iter_wall_schedule, read_trace, scale_load

Progress = Callable[[str], None]

#: How the operator is started (this interpreter, so the same installation is used).
DEFAULT_OPERATOR_COMMAND: tuple[str, ...] = (
    sys.executable,
    "-m",
    "chunkpilot.cli",
    "operator",
    "--all-namespaces",
    "--standalone",
    "--pod-monitor=disabled",
)
#: The operator's own metrics endpoint on the local stack (a free port is chosen when None).
OPERATOR_METRICS_FLAG = "--metrics-port"
ENV_PROMETHEUS_URL = "CHUNKPILOT_PROMETHEUS_URL"
#: Where the tuner looks up engine addresses (fake-node pod IPs are not reachable locally).
ENV_POD_TARGETS_FILE = "CHUNKPILOT_POD_TARGETS_FILE"
#: ``off`` when the installation grants no Secret access (``chunkpilot.operator.config``).
ENV_LIVE_ADJUST = "CHUNKPILOT_LIVE_ADJUST"


class OperatorIdentity(StrEnum):
    """Whose credentials the operator process uses."""

    #: The chart's ServiceAccount and RBAC (rendered with ``helm``); the chart must be found.
    CHART = "chart"
    #: The control plane's admin kubeconfig.
    ADMIN = "admin"
    #: The chart's when it is found (a checkout, ``$CHUNKPILOT_CHART_DIR``), else admin.
    AUTO = "auto"


#: The chart value that grants the Secrets of live adjustment; without it the chart's operator
#: Deployment runs with ``CHUNKPILOT_LIVE_ADJUST=off``, and so does the local stack's operator.
LIVE_ADJUST_CHART_VALUE = "liveAdjust.enabled=true"
#: The chart value that grants a disaggregated service's router RBAC (its ServiceAccount, Role and
#: RoleBinding); without it the chart's operator runs with ``CHUNKPILOT_DISAGGREGATION=off``.
DISAGGREGATION_CHART_VALUE = "disaggregation.enabled=true"
#: Chart values of the local stack's operator identity: the stack runs every autotuner feature.
DEFAULT_CHART_VALUES: tuple[str, ...] = (LIVE_ADJUST_CHART_VALUE, DISAGGREGATION_CHART_VALUE)


def chart_env(charted: bool, chart_values: Sequence[str]) -> dict[str, str]:
    """The environment the chart's operator Deployment gets from ``chart_values`` that the local
    operator needs too: under the chart's RBAC without the Secrets of live adjustment (no
    :data:`LIVE_ADJUST_CHART_VALUE`), ``CHUNKPILOT_LIVE_ADJUST=off``. None under the admin kubeconfig."""
    if charted and LIVE_ADJUST_CHART_VALUE not in chart_values:
        return {ENV_LIVE_ADJUST: "off"}
    return {}


#: How a refused API call shows in the operator's log: Kopf's, the client's, the inventory's.
DENIAL_MARKERS: tuple[str, ...] = ("Forbidden", "forbidden", "HTTP 403", "undeclared Kubernetes API call")
#: A 403 that is no RBAC denial: the API server refuses new objects in a namespace being deleted.
NOT_DENIAL_MARKERS: tuple[str, ...] = ("because it is being terminated",)


class DeniedApiCallsError(RuntimeError):
    """The operator made API calls its RBAC (or the declared inventory) did not allow."""

    def __init__(self, lines: Sequence[str]) -> None:
        self.lines = list(lines)
        shown = "\n".join(self.lines[:10])
        super().__init__(
            f"{len(self.lines)} operator log line(s) show refused API calls; grant them in the chart "
            f"(charts/chunkpilot/templates/_helpers.tpl) and declare them in "
            f"chunkpilot.operator.apicalls.API_CALLS:\n{shown}"
        )


def print_progress(prefix: str = "chunkpilot") -> Progress:
    """A progress printer for humans: ``[chunkpilot  12.3s] message`` on stderr."""
    origin = time.monotonic()

    def emit(message: str) -> None:
        print(f"[{prefix} {time.monotonic() - origin:6.1f}s] {message}", file=sys.stderr, flush=True)

    return emit


@dataclass(frozen=True)
class StackOptions:
    """What the local stack runs and how."""

    state_dir: Path
    nodes: int = 2
    accelerator: str = "h100"
    time_scale: float | None = None
    operator: bool = True
    operator_command: Sequence[str] = DEFAULT_OPERATOR_COMMAND
    operator_env: dict[str, str] = field(default_factory=dict)
    operator_identity: OperatorIdentity = OperatorIdentity.AUTO
    chart_values: Sequence[str] = DEFAULT_CHART_VALUES
    scrape_interval: str = "1s"
    restart_backoff_s: float = 10.0
    startup_timeout_s: float = 180.0

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise ValueError(f"nodes: must be >= 1, got {self.nodes}")
        if self.time_scale is not None and self.time_scale <= 0:
            raise ValueError(f"time_scale: must be > 0 (1 = real time), got {self.time_scale}")


class LocalStack:
    """Brings the local stack up and down; use it as a context manager.

    A ``control_plane`` or ``prometheus`` passed in (for example pytest session fixtures) is used
    as is and left running at the end; everything the stack starts itself, it stops.
    """

    def __init__(
        self,
        options: StackOptions,
        *,
        control_plane: ControlPlane | None = None,
        prometheus: PrometheusServer | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.options = options
        self.progress: Progress = progress or (lambda _message: None)
        self._given_control_plane = control_plane
        self._given_prometheus = prometheus
        self.control_plane: ControlPlane | None = control_plane
        self.prometheus: PrometheusServer | None = prometheus
        self.runner: PodRunner | None = None
        self.operator: ManagedProcess | None = None
        self.operator_metrics_port: int | None = None
        #: The kubeconfig the operator runs with (the chart's ServiceAccount unless told otherwise).
        self.operator_kubeconfig: Path | None = None
        self._loads: list[BackgroundLoad] = []
        self._exit = contextlib.ExitStack()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> LocalStack:
        """Start every component; on failure, stop what was started and re-raise."""
        start_or_undo(self._start, self.stop)
        return self

    def _start(self) -> None:
        options = self.options
        options.state_dir.mkdir(parents=True, exist_ok=True)
        if self.control_plane is None:
            self.progress(
                "starting the control plane (etcd, kube-apiserver, controller manager, scheduler, KWOK)"
            )
            config = ControlPlaneConfig(
                state_dir=options.state_dir / "cluster",
                nodes=gpu_node_specs(options.nodes, accelerator=options.accelerator),
                startup_timeout=options.startup_timeout_s,
            )
            # Builds the pinned binaries on first use (tens of minutes, with progress); cached after.
            plane = ControlPlane(config, devbinaries.ensure_all(progress=self.progress))
            self._exit.callback(self._stopping("control plane", plane.stop))
            self.control_plane = plane.start()
        plane = self.control_plane
        self.progress(f"control plane up: {plane.server} (KUBECONFIG={plane.kubeconfig})")
        self._apply_crds(plane)
        if self.prometheus is None:
            self.progress("starting Prometheus")
            server = PrometheusServer(
                options.state_dir / "prometheus", scrape_interval=options.scrape_interval
            )
            self._exit.callback(self._stopping("Prometheus", server.stop))
            self.prometheus = server.start()
        self.progress(f"Prometheus up: {self.prometheus.url}")
        targets = FileSDTargets(self.prometheus.targets_file)
        runner = PodRunner(
            core_api_from_kubeconfig(plane.kubeconfig),
            targets=targets,
            settings=RunnerSettings(
                time_scale=options.time_scale,
                log_dir=options.state_dir / "engines",
                restart_backoff_s=options.restart_backoff_s,
            ),
        )
        self._exit.callback(self._stopping("engines", runner.stop))
        self.runner = runner.start()
        self.progress(f"pod runner up: engine logs in {options.state_dir / 'engines'}")
        if options.operator:
            self.operator = self._start_operator(plane, self.prometheus)

    def _apply_crds(self, plane: ControlPlane) -> None:
        from chunkpilot.api.crdgen import write_crds

        crds_dir = self.options.state_dir / "crds"
        write_crds(crds_dir)
        names = plane.apply_manifests([crds_dir])
        self.progress(f"CRDs established: {', '.join(names)}")

    def _operator_kubeconfig(self, plane: ControlPlane, argv: Sequence[str]) -> Path:
        """The chart's ServiceAccount (its RBAC applied first) or the admin kubeconfig."""
        identity = self.options.operator_identity
        if identity is OperatorIdentity.ADMIN or (identity is OperatorIdentity.AUTO and chart_dir() is None):
            self.progress("operator identity: the admin kubeconfig (no chart found)")
            return plane.kubeconfig
        sets = [*watch_values(argv), *self.options.chart_values]
        kubeconfig = install_operator_identity(plane, self.options.state_dir / "operator.kubeconfig", sets)
        self.progress(f"operator identity: the chart's ServiceAccount and RBAC ({', '.join(sets)})")
        return kubeconfig

    def _start_operator(self, plane: ControlPlane, prometheus: PrometheusServer) -> ManagedProcess:
        argv = list(self.options.operator_command)
        self.operator_kubeconfig = self._operator_kubeconfig(plane, argv)
        charted = self.operator_kubeconfig != plane.kubeconfig
        env = {
            **plane.env,
            "KUBECONFIG": str(self.operator_kubeconfig),
            ENV_PROMETHEUS_URL: prometheus.url,
            ENV_POD_TARGETS_FILE: str(prometheus.targets_file),
            **chart_env(charted, self.options.chart_values),
            **self.options.operator_env,
        }
        if not any(arg.startswith(OPERATOR_METRICS_FLAG) for arg in argv):
            self.operator_metrics_port = free_port()
            argv.append(f"{OPERATOR_METRICS_FLAG}={self.operator_metrics_port}")
        process = ManagedProcess(
            name="operator",
            argv=argv,
            log_path=self.options.state_dir / "operator.log",
            env=env,
        )
        self._exit.callback(self._stopping("operator", process.stop))
        process.start()
        time.sleep(0.5)
        if not process.running():
            raise RuntimeError(f"the operator exited at once; its log ends with:\n{process.tail()}")
        self.progress(
            f"operator running (pid {process.pid}, log {process.log_path}, "
            f"metrics on port {self.operator_metrics_port or 'as configured'})"
        )
        return process

    def _stopping(self, what: str, stop: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            self.progress(f"stopping {what}")
            try:
                stop()
            except Exception as error:  # keep tearing down the rest
                self.progress(f"stopping {what} failed: {error}")

        return run

    def stop(self) -> None:
        """Stop load, operator, engines, Prometheus and control plane (what this stack started)."""
        for load in self._loads:
            with contextlib.suppress(Exception):
                load.stop(timeout_s=30)
        self._loads.clear()
        with _deferred_interrupts():
            self._exit.close()
        self.runner = None
        self.operator = None
        self.control_plane = self._given_control_plane
        self.prometheus = self._given_prometheus

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        denied = self.denied_calls()
        self.stop()
        if exc_type is None and denied:
            raise DeniedApiCallsError(denied)

    def denied_calls(self) -> list[str]:
        """Lines of the operator's log where the API server (or the client's inventory) refused a call."""
        if self.operator is None or not self.operator.log_path.exists():
            return []
        text = self.operator.log_path.read_text(errors="replace")
        return [
            line
            for line in text.splitlines()
            if any(marker in line for marker in DENIAL_MARKERS)
            and not any(marker in line for marker in NOT_DENIAL_MARKERS)
        ]

    # ------------------------------------------------------------------ use

    def check_operator(self) -> None:
        """Raise RuntimeError with the end of its log if the operator this stack started has exited."""
        if self.operator is not None and not self.operator.running():
            raise RuntimeError(f"the operator exited; its log ends with:\n{self.operator.tail()}")

    @property
    def kubeconfig(self) -> Path:
        """The kubeconfig of the stack's cluster."""
        if self.control_plane is None:
            raise RuntimeError("the local stack is not started")
        return self.control_plane.kubeconfig

    def start_load(
        self,
        service: str,
        trace: str | Path,
        *,
        namespace: str | None = None,
        rate: float | None = None,
        load_factor: float = 1.0,
        duration_s: float = 300.0,
        max_requests: int = 100_000,
        repeat: bool = True,
        max_prompt_tokens: int | None = None,
        max_output_tokens: int | None = None,
        seed: int = 0,
        routing: str = DEFAULT_ROUTING,
    ) -> BackgroundLoad:
        """Replay ``trace`` against ``service``'s Ready engines (or routers) in the background, spread
        over them as ``routing`` says (:data:`~chunkpilot.localrun.endpoints.ROUTINGS`)."""
        if self.runner is None:
            raise RuntimeError("the local stack is not started")
        time_scale = self.options.time_scale or 1.0
        requests = scale_load(read_trace(trace, rate=rate, seed=seed), load_factor)
        requests = cap_lengths(
            requests, max_prompt_tokens=max_prompt_tokens, max_output_tokens=max_output_tokens
        )
        schedule = iter_wall_schedule(
            requests, time_scale=time_scale, duration_s=duration_s, max_requests=max_requests, repeat=repeat
        )
        load = BackgroundLoad(
            schedule,
            balancer_for(routing, self.runner.endpoint_source(service, namespace), seed),
            LoadOptions(time_scale=time_scale, duration_s=duration_s, seed=seed),
        )
        self._loads.append(load)
        self.progress(f"replaying {trace} against {service} for up to {duration_s:g}s")
        return load.start()


@contextlib.contextmanager
def _deferred_interrupts() -> Iterator[None]:
    """Let teardown finish even if Ctrl-C is pressed again; re-raise the interrupt afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may install signal handlers
        return
    received: list[int] = []

    def remember(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)

    previous = signal.signal(signal.SIGINT, remember)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if received:
        raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM into KeyboardInterrupt so ``kill PID`` tears the stack down like Ctrl-C."""

    def interrupt(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


__all__ = [
    "DEFAULT_CHART_VALUES",
    "DEFAULT_OPERATOR_COMMAND",
    "DISAGGREGATION_CHART_VALUE",
    "LIVE_ADJUST_CHART_VALUE",
    "DeniedApiCallsError",
    "LocalStack",
    "OperatorIdentity",
    "StackOptions",
    "chart_env",
    "print_progress",
    "sigterm_as_interrupt",
]
