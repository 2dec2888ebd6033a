"""``chunkpilot operator bench``: how fast the operator reacts, what it costs, and how it holds a fleet.

Figures, printed (never asserted):

* apply -> Deployment-exists latency, p50/p99 over N InferenceServices created one after
  another (each waits for its Deployment, so this is reaction time, not queueing);
* a burst: the other M - N created at once (``--burst-workers`` clients in parallel) and the time
  until all are reconciled (status written), with the operator's CPU seconds over it and the
  whole machine's, by process (the API server, etcd, the controllers, ...): what the burst costs
  outside the operator bounds how fast any operator could reconcile it on this machine;
* the operator's resident memory once all M are reconciled;
* with ``--autotune``, the fleet at rest: every service autotuned against an SLO, the operator
  given a Prometheus, and over ``--observe`` seconds the operator's CPU (cores), memory, tuner
  ticks per second with their latency p50/p99 (``chunkpilot_tuner_tick_seconds``) and its API
  requests per second (``chunkpilot_kube_requests_total``), read from the operator's own metrics.

The operator runs as a real process (``chunkpilot operator``) against a real API server: a
throw-away local control plane by default, or the cluster of ``--kubeconfig``. Services are
created with ``replicas: 0`` unless asked otherwise, so no engine pods load the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from chunkpilot.api import GROUP, ISVC_PLURAL, VERSION
from chunkpilot.operator.builders import deployment_name
from chunkpilot.operator.testing import OperatorProcess, operator_env, wait_for

BENCH_NAMESPACE = "chunkpilot-bench"
#: Seconds between the burst's last reconcile and the window at rest. The burst's work goes on after
#: it: the Deployment controller (20 requests a second, kube-controller-manager's default) writes
#: the new Deployments' status a median 72 s and up to 110 s after the operator created them, and
#: each write is a child event the operator reconciles; and each new service's first measurements
#: rewrite its status. 70 s after a 79 s burst: tick p99 4.3 s and 77 API requests a second; 150 s
#: after: 1.0 s and 16 a second.
SETTLE_S = 150.0


@dataclass(frozen=True)
class FleetFigures:
    """The operator over a window with every service reconciled (and, with ``--autotune``, tuned)."""

    window_s: float
    cpu_cores: float
    rss_bytes: int
    ticks_per_s: float
    tick_p50_s: float
    tick_p99_s: float
    api_requests_per_s: float
    #: API requests by verb and resource over the window, most first.
    api_requests: dict[str, float]

    def report(self, services: int) -> str:
        top = ", ".join(
            f"{key} {value / self.window_s:.1f}/s" for key, value in list(self.api_requests.items())[:5]
        )
        return "\n".join(
            [
                f"{services} autotuned services at rest, over {self.window_s:.0f} s:",
                f"  operator CPU {self.cpu_cores:.2f} cores;"
                f" resident memory {self.rss_bytes / 2**20:.1f} MiB",
                f"  tuner ticks {self.ticks_per_s:.1f}/s; tick latency p50 {1000 * self.tick_p50_s:.0f} ms,"
                f" p99 {1000 * self.tick_p99_s:.0f} ms",
                f"  API requests {self.api_requests_per_s:.1f}/s ({top})",
            ]
        )


#: The processes of the local control plane (and its Prometheus), by their ``/proc`` command name
#: (the kernel keeps 15 characters of it), as the burst's CPU accounting names them.
COMPONENTS: Final = {
    "kube-apiserver": "API server",
    "etcd": "etcd",
    "kube-controller": "controller manager",
    "kube-scheduler": "scheduler",
    "kwok": "KWOK",
    "prometheus": "Prometheus",
}
OPERATOR = "operator"
CLIENTS = "benchmark clients"
OTHER = "other"


@dataclass(frozen=True)
class MachineCpu:
    """The machine's CPU over a window: busy CPU seconds in all, and by process."""

    window_s: float
    cores: int
    busy_s: float
    #: CPU seconds by component (:data:`COMPONENTS`, the operator with its worker processes, this
    #: benchmark's clients, and everything else), most first.
    by_component: dict[str, float]

    @property
    def outside_operator_s(self) -> float:
        """CPU seconds the machine spent on everything but the operator's own processes."""
        return max(0.0, self.busy_s - self.by_component.get(OPERATOR, 0.0))

    def fastest_s(self) -> float:
        """The least time the work outside the operator takes on these cores, spread perfectly: no
        operator making the same API requests can finish the window's work sooner on this machine."""
        return self.outside_operator_s / self.cores if self.cores > 0 else 0.0

    def report(self, services: int) -> str:
        parts = ", ".join(f"{name} {value:.1f}" for name, value in self.by_component.items() if value >= 0.05)
        fastest = self.fastest_s()
        bound = (
            f"; the work outside the operator alone takes {fastest:.1f} s on {self.cores} cores: at most"
            f" {services / fastest:.1f} services/s for an operator that made the same API requests at no"
            " CPU cost of its own"
            if fastest > 0
            else ""
        )
        return (
            f"  machine CPU over the burst: {self.busy_s:.1f} CPU s of {self.cores * self.window_s:.1f}"
            f" ({self.cores} cores x {self.window_s:.1f} s): {parts}{bound}"
        )


def machine_busy_s() -> float:
    """Busy CPU seconds of the whole machine since boot (``/proc/stat``: all but idle and iowait)."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    guest = sum(values[8:10]) if len(values) > 9 else 0  # already counted in user and nice
    return (sum(values) - idle - guest) / os.sysconf("SC_CLK_TCK")


def component_cpu_s(operator_pid: int) -> dict[str, float]:
    """CPU seconds so far of each live process by component: :data:`COMPONENTS` by name, the operator
    and its children (its twin worker), this process (the benchmark's clients)."""
    tick = os.sysconf("SC_CLK_TCK")
    totals: dict[str, float] = {}
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:  # gone since listed
            continue
        head, _, rest = text.rpartition(")")
        comm, fields = head.partition("(")[2], rest.split()
        pid, ppid = int(entry.name), int(fields[1])
        if pid == operator_pid or ppid == operator_pid:
            name = OPERATOR
        elif pid == me:
            name = CLIENTS
        else:
            name = next((label for prefix, label in COMPONENTS.items() if comm.startswith(prefix)), "")
        if name:
            totals[name] = totals.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return totals


def machine_cpu(
    window_s: float,
    busy_before: float,
    busy_after: float,
    before: Mapping[str, float],
    after: Mapping[str, float],
) -> MachineCpu:
    """The window's :class:`MachineCpu` from two readings of :func:`machine_busy_s` and
    :func:`component_cpu_s` (a process that ended within the window takes its CPU with it)."""
    by = {name: max(0.0, after.get(name, 0.0) - before.get(name, 0.0)) for name in after}
    busy = max(0.0, busy_after - busy_before)
    by[OTHER] = max(0.0, busy - sum(by.values()))
    ordered = dict(sorted(by.items(), key=lambda item: -item[1]))
    return MachineCpu(window_s, os.cpu_count() or 1, busy, ordered)


@dataclass(frozen=True)
class BenchResult:
    """Measured figures of one run."""

    latencies_s: list[float]
    rss_idle_bytes: int
    rss_bytes: int
    rss_peak_bytes: int
    reconciled: int
    reconcile_all_s: float
    #: Seconds the burst's creates took (the clients' part of ``reconcile_all_s``).
    create_s: float = 0.0
    #: The operator's CPU seconds from the burst's first create until all were reconciled.
    burst_cpu_s: float = 0.0
    #: The operator's API requests from the burst's first create until all were reconciled, by
    #: ``verb resource`` (the client's own requests; Kopf's watches and patches are not counted).
    burst_requests: dict[str, float] = field(default_factory=dict)
    fleet: FleetFigures | None = None
    #: The whole machine's CPU over the burst, by process.
    burst_machine: MachineCpu | None = None

    @property
    def requests_per_service(self) -> float:
        """The operator's API requests per service of the burst."""
        burst = self.reconciled - len(self.latencies_s)
        return sum(self.burst_requests.values()) / burst if burst > 0 else 0.0

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies_s)
        index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
        return ordered[index]

    def report(self) -> str:
        ms = [1000 * value for value in self.latencies_s]
        mib = 1024 * 1024
        return "\n".join(
            [
                f"apply -> Deployment exists, {len(ms)} InferenceServices (sequential):",
                f"  p50 {1000 * self.percentile(0.5):7.1f} ms   p99 {1000 * self.percentile(0.99):7.1f} ms"
                f"   mean {statistics.fmean(ms):7.1f} ms   max {max(ms):7.1f} ms",
                f"operator resident memory: idle {self.rss_idle_bytes / mib:.1f} MiB;"
                f" with {self.reconciled} InferenceServices reconciled {self.rss_bytes / mib:.1f} MiB"
                f" (peak {self.rss_peak_bytes / mib:.1f} MiB)",
                f"  the last {self.reconciled - len(ms)} created in a burst"
                f" ({self.create_s:.1f} s of creates)"
                f" were all reconciled in {self.reconcile_all_s:.1f} s"
                f" ({self.burst_rate:.1f} services/s; operator CPU {self.burst_cpu_s:.1f} s)",
                f"  {self.requests_per_service:.1f} API requests per service of the burst"
                f" ({self._top_calls()})",
                *([self.burst_machine.report(self.reconciled - len(ms))] if self.burst_machine else []),
                *([self.fleet.report(self.reconciled)] if self.fleet else []),
            ]
        )

    def _top_calls(self) -> str:
        burst = max(1, self.reconciled - len(self.latencies_s))
        return ", ".join(f"{key} {value / burst:.2f}" for key, value in list(self.burst_requests.items())[:6])

    @property
    def burst_rate(self) -> float:
        """Services of the burst reconciled per second."""
        burst = self.reconciled - len(self.latencies_s)
        return burst / self.reconcile_all_s if self.reconcile_all_s > 0 else 0.0


def service_manifest(name: str, replicas: int, *, autotune: bool = False) -> dict[str, Any]:
    """A small simulator InferenceService (``autotune``: tuned against an SLO)."""
    spec: dict[str, Any] = {
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "maxModelLen": 8192},
        "engine": {"kind": "sim", "maxNumBatchedTokens": 2048, "maxNumSeqs": 64},
        "resources": {"accelerator": "h100"},
        "replicas": replicas,
    }
    if autotune:
        spec["slo"] = {"itl": {"quantile": 0.99, "maxMs": 50}, "ttft": {"quantile": 0.95, "maxMs": 2000}}
        spec["autotune"] = {"enabled": True}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": spec,
    }


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of ``pid`` and its finished children so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = sum(int(value) for value in fields[11:15])  # utime, stime, cutime, cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus text exposition, keyed by name and sorted labels."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


Samples = Mapping[tuple[str, tuple[tuple[str, str], ...]], float]


def histogram_quantile(q: float, before: Samples, after: Samples, name: str) -> float:
    """Prometheus' ``histogram_quantile`` over the increase of ``name`` between two scrapes."""
    buckets = sorted(
        (float(dict(labels)["le"]), after[(key, labels)] - before.get((key, labels), 0.0))
        for key, labels in after
        if key == f"{name}_bucket"
    )
    total = buckets[-1][1] if buckets else 0.0
    if total <= 0:
        return float("nan")
    rank, lower, below = q * total, 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if upper == float("inf"):
                return lower
            return lower + (upper - lower) * (rank - below) / max(count - below, 1e-12)
        lower, below = upper, count
    return lower


def increase(before: Samples, after: Samples, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Each series of ``name``: how much it grew between two scrapes."""
    return {
        labels: value - before.get((key, labels), 0.0)
        for (key, labels), value in after.items()
        if key == name
    }


def api_requests(before: Samples, after: Samples) -> dict[str, float]:
    """The operator's API requests between two scrapes by ``verb resource``, most first."""
    by_call = {
        f"{dict(labels)['verb']} {dict(labels)['resource']}": value
        for labels, value in increase(before, after, "chunkpilot_kube_requests_total").items()
        if value > 0
    }
    return dict(sorted(by_call.items(), key=lambda item: -item[1]))


def fleet_figures(before: Samples, after: Samples, window_s: float, cpu_s: float, rss: int) -> FleetFigures:
    """The steady window's figures from two scrapes of the operator's metrics."""
    by_call = api_requests(before, after)
    ticks = sum(increase(before, after, "chunkpilot_tuner_tick_seconds_count").values())
    return FleetFigures(
        window_s=window_s,
        cpu_cores=cpu_s / window_s,
        rss_bytes=rss,
        ticks_per_s=ticks / window_s,
        tick_p50_s=histogram_quantile(0.5, before, after, "chunkpilot_tuner_tick_seconds"),
        tick_p99_s=histogram_quantile(0.99, before, after, "chunkpilot_tuner_tick_seconds"),
        api_requests_per_s=sum(by_call.values()) / window_s,
        api_requests=by_call,
    )


class FirstSeen:
    """Records when each object of a namespace is first seen meeting ``ready`` (a watch in a thread).

    A watch costs the API server what it sends the operator anyway; polling a list of a thousand
    services every second would load the machine the operator is measured on.
    """

    def __init__(
        self, what: str, lister: Callable[..., Any], *args: Any, ready: Callable[[Any], bool] = bool
    ) -> None:
        import kubernetes

        self._what, self._lister, self._args, self._ready = what, lister, args, ready
        self._watch = kubernetes.watch.Watch()  # type: ignore[no-untyped-call]
        self._seen: dict[str, float] = {}
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=f"{what}-watch", daemon=True)
        self._started = threading.Event()
        self._stopping = False

    @classmethod
    def deployments(cls, api_client: Any, namespace: str) -> FirstSeen:
        """Deployments of ``namespace``, when each first exists."""
        import kubernetes

        return cls(
            "Deployment", kubernetes.client.AppsV1Api(api_client).list_namespaced_deployment, namespace
        )

    @classmethod
    def reconciled(cls, custom: Any, namespace: str) -> FirstSeen:
        """InferenceServices of ``namespace``, when the operator first wrote each one's status."""
        return cls(
            "InferenceService",
            custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            ISVC_PLURAL,
            ready=lambda body: bool((body.get("status") or {}).get("observedGeneration")),
        )

    def start(self) -> FirstSeen:
        self._thread.start()
        self._started.wait(30)
        return self

    def _run(self) -> None:
        listed = self._lister(*self._args)
        for item in _items(listed):
            self._saw(item)
        self._started.set()
        stream = self._watch.stream(  # type: ignore[no-untyped-call]
            self._lister, *self._args, resource_version=_list_version(listed)
        )
        try:
            for event in stream:
                self._saw(event["object"])
        except Exception:
            if not self._stopping:
                raise  # a broken stream while measuring; closing the client ends it otherwise

    def _saw(self, item: Any) -> None:
        if not self._ready(item):
            return
        name = item["metadata"]["name"] if isinstance(item, dict) else item.metadata.name
        with self._changed:
            self._seen.setdefault(name, time.monotonic())
            self._changed.notify_all()

    def wait(self, name: str, timeout: float) -> float:
        """The monotonic time ``name`` was first seen; raises TimeoutError."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while name not in self._seen:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{self._what} {name} did not appear within {timeout:.0f}s")
                self._changed.wait(left)
            return self._seen[name]

    def wait_count(self, count: int, timeout: float) -> float:
        """The monotonic time the ``count``-th object was first seen; raises TimeoutError."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(self._seen) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{len(self._seen)} of {count} {self._what}s within {timeout:.0f}s")
                self._changed.wait(left)
            return max(self._seen.values())

    def stop(self) -> None:
        self._stopping = True
        self._watch.stop()  # type: ignore[no-untyped-call]


def _items(listed: Any) -> list[Any]:
    return list(listed["items"] if isinstance(listed, dict) else listed.items)


def _list_version(listed: Any) -> str | None:
    if isinstance(listed, dict):
        return (listed.get("metadata") or {}).get("resourceVersion")
    return listed.metadata.resource_version if listed.metadata else None


@contextmanager
def local_cluster(state_dir: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """A throw-away local control plane (one GPU node) with the CRDs applied: its kubeconfig and env."""
    from chunkpilot.devcluster import binaries
    from chunkpilot.devcluster.controlplane import ControlPlane, ControlPlaneConfig
    from chunkpilot.devcluster.fakenodes import gpu_node_specs

    config = ControlPlaneConfig(state_dir=state_dir, nodes=gpu_node_specs(1))
    with ControlPlane(config, binaries.locate_all()) as cluster:
        cluster.apply_manifests([_crds_folder()])
        yield cluster.kubeconfig, cluster.env


def _crds_folder() -> Path:
    from chunkpilot.devcluster.cli import find_crds_folder

    folder = find_crds_folder()
    if folder is None:
        raise FileNotFoundError("crds/ not found: run the benchmark from the repository checkout")
    return folder


def _rss(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of ``pid`` in bytes."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) * 1024
    return values.get("VmRSS", 0), values.get("VmHWM", 0)


def run_bench(
    *,
    count: int,
    total: int,
    replicas: int,
    kubeconfig: Path | None,
    work_dir: Path,
    log: Any = print,
    autotune: bool = False,
    observe_s: float = 60.0,
    settle_s: float = SETTLE_S,
    burst_workers: int = 8,
    prometheus_url: str | None = None,
) -> BenchResult:
    """Run the benchmark; ``kubeconfig`` None starts (and stops) a local control plane.

    ``autotune``: the services are tuned, the operator gets ``prometheus_url`` (None: a local
    Prometheus is started) and the fleet is then observed for ``observe_s`` seconds, ``settle_s``
    after the burst was reconciled.
    """
    import kubernetes

    from chunkpilot.devcluster.ports import free_port

    if total < count:
        raise ValueError(f"--services ({total}) must be >= --count ({count})")
    with ExitStack() as stack:
        if kubeconfig is None:
            log("starting a local control plane ...")
            kubeconfig, env = stack.enter_context(local_cluster(work_dir / "control-plane"))
        else:
            env = operator_env(KUBECONFIG=str(kubeconfig))
        api_client = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        stack.callback(api_client.close)
        core = kubernetes.client.CoreV1Api(api_client)
        custom: Any = kubernetes.client.CustomObjectsApi(api_client)
        namespace = f"{BENCH_NAMESPACE}-{int(time.time())}"
        core.create_namespace(
            kubernetes.client.V1Namespace(metadata=kubernetes.client.V1ObjectMeta(name=namespace))
        )

        if autotune and prometheus_url is None:
            from chunkpilot.devcluster.prometheus import PrometheusServer

            log("starting a local Prometheus ...")
            prometheus = PrometheusServer(work_dir / "prometheus").start()
            stack.callback(prometheus.stop)
            prometheus_url = prometheus.url
        metrics_port = free_port()
        flags = ["--prometheus-url", prometheus_url] if autotune and prometheus_url else []
        operator = OperatorProcess(
            [
                "-n",
                namespace,
                "--standalone",
                "--metrics-port",
                str(metrics_port),
                "--kubeconfig",
                str(kubeconfig),
                *flags,
            ],
            env=operator_env(env, CHUNKPILOT_AUTOTUNER="on" if autotune else "off"),
            log_path=work_dir / "operator.log",
        )
        metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        stack.callback(lambda: _cleanup(core, custom, namespace, operator))
        operator.start()
        time.sleep(2.0)
        assert operator.process is not None
        rss_idle, _ = _rss(operator.process.pid)
        watch = FirstSeen.deployments(api_client, namespace).start()
        stack.callback(watch.stop)
        reconciled = FirstSeen.reconciled(custom, namespace).start()
        stack.callback(reconciled.stop)

        log(f"measuring apply -> Deployment over {count} InferenceServices ...")
        latencies: list[float] = []
        for index in range(count):
            name = f"bench-{index:04d}"
            started = time.monotonic()
            custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, ISVC_PLURAL, service_manifest(name, replicas, autotune=autotune)
            )
            latencies.append(watch.wait(deployment_name(name, "stable"), timeout=60) - started)

        log(f"creating {total - count} more at once and waiting until all {total} are reconciled ...")
        burst_cpu_before = cpu_seconds(operator.process.pid)
        burst_scrape = scrape(metrics_url)
        machine_before = machine_busy_s(), component_cpu_s(operator.process.pid)
        burst_started = time.monotonic()

        def create(index: int) -> None:
            manifest = service_manifest(f"bench-{index:04d}", replicas, autotune=autotune)
            custom.create_namespaced_custom_object(GROUP, VERSION, namespace, ISVC_PLURAL, manifest)

        with ThreadPoolExecutor(max_workers=max(1, burst_workers)) as pool:
            list(pool.map(create, range(count, total)))
        created = time.monotonic()
        create_s = created - burst_started

        # The watch may show the last status write before the clients have read the last create's
        # answer: the burst is over when both are.
        done = max(created, reconciled.wait_count(total, timeout=max(120.0, total * 2.0)))
        burst_s = done - burst_started
        burst_cpu = cpu_seconds(operator.process.pid) - burst_cpu_before
        burst_machine = machine_cpu(
            burst_s,
            machine_before[0],
            machine_busy_s(),
            machine_before[1],
            component_cpu_s(operator.process.pid),
        )
        burst_requests = api_requests(burst_scrape, scrape(metrics_url))
        time.sleep(2.0)
        rss, peak = _rss(operator.process.pid)
        fleet = None
        if autotune:
            if settle_s > 0:
                log(f"letting the burst settle for {settle_s:.0f} s ...")
                time.sleep(settle_s)
            log(f"observing the {total} autotuned services for {observe_s:.0f} s ...")
            before, cpu_before, started = (
                scrape(metrics_url),
                cpu_seconds(operator.process.pid),
                time.monotonic(),
            )
            time.sleep(observe_s)
            after, cpu_after = scrape(metrics_url), cpu_seconds(operator.process.pid)
            window = time.monotonic() - started
            fleet = fleet_figures(
                before, after, window, cpu_after - cpu_before, _rss(operator.process.pid)[0]
            )
            peak = _rss(operator.process.pid)[1]
        return BenchResult(
            latencies,
            rss_idle,
            rss,
            peak,
            total,
            burst_s,
            create_s,
            burst_cpu,
            burst_requests,
            fleet,
            burst_machine,
        )
    raise AssertionError("unreachable")  # pragma: no cover


def _services(custom: Any, namespace: str) -> list[dict[str, Any]]:
    listed = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, ISVC_PLURAL)
    items: list[dict[str, Any]] = listed["items"]
    return items


def _cleanup(core: Any, custom: Any, namespace: str, operator: OperatorProcess) -> None:
    """Delete the services while the operator still runs (it removes its finalizers), then stop it."""

    def remaining() -> list[dict[str, Any]]:
        return _services(custom, namespace)

    try:
        for item in remaining():
            name = item["metadata"]["name"]
            custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, ISVC_PLURAL, name)
        if operator.process is not None:
            wait_for(
                lambda: not remaining(),
                timeout=120,
                interval=1.0,
                what="benchmark services deleted",
            )
        core.delete_namespace(namespace)
    finally:
        operator.stop()


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``bench`` under ``chunkpilot operator`` (which :mod:`chunkpilot.operator.cli` registered first)."""
    operator_commands = next(
        action
        for action in subparsers.choices["operator"]._actions
        if isinstance(action, argparse._SubParsersAction)
    )
    bench = operator_commands.add_parser(
        "bench",
        help="measure apply -> Deployment latency and the operator's memory (prints figures)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    bench.add_argument("--count", type=int, default=100, help="services timed one by one (default 100)")
    bench.add_argument(
        "--services", type=int, default=200, help="services reconciled when memory is read (default 200)"
    )
    bench.add_argument("--replicas", type=int, default=0, help="replicas per service (default 0: no pods)")
    bench.add_argument(
        "--kubeconfig", type=Path, help="use this cluster (default: start a throw-away local control plane)"
    )
    bench.add_argument(
        "--burst-workers", type=int, default=8, help="clients creating the burst in parallel (default 8)"
    )
    bench.add_argument(
        "--autotune",
        action="store_true",
        help="autotune every service against an SLO and observe the fleet at rest (a local Prometheus)",
    )
    bench.add_argument("--prometheus-url", help="with --autotune: this Prometheus instead of a local one")
    bench.add_argument(
        "--observe",
        type=float,
        default=60.0,
        help="with --autotune: seconds the fleet is observed (default 60)",
    )
    bench.add_argument(
        "--settle",
        type=float,
        default=SETTLE_S,
        help=f"with --autotune: seconds between the burst and the window at rest (default {SETTLE_S:g})",
    )
    bench.add_argument("--json", action="store_true", help="print the figures as JSON")
    bench.set_defaults(func=run_bench_command)


def run_bench_command(args: argparse.Namespace) -> int:
    import sys

    if args.count < 1 or args.services < args.count or args.replicas < 0:
        print(
            "chunkpilot operator bench: need --count >= 1, --services >= --count and --replicas >= 0",
            file=sys.stderr,
        )
        return 2
    with tempfile.TemporaryDirectory(prefix="chunkpilot-bench-") as folder:
        result = run_bench(
            count=args.count,
            total=args.services,
            replicas=args.replicas,
            kubeconfig=args.kubeconfig,
            work_dir=Path(folder),
            log=lambda message: print(message, file=sys.stderr),
            autotune=args.autotune,
            observe_s=args.observe,
            settle_s=args.settle,
            burst_workers=args.burst_workers,
            prometheus_url=args.prometheus_url,
        )
    if args.json:
        figures = {
            "count": len(result.latencies_s),
            "p50_ms": 1000 * result.percentile(0.5),
            "p99_ms": 1000 * result.percentile(0.99),
            "max_ms": 1000 * max(result.latencies_s),
            "services": result.reconciled,
            "rss_idle_mib": result.rss_idle_bytes / 2**20,
            "rss_mib": result.rss_bytes / 2**20,
            "rss_peak_mib": result.rss_peak_bytes / 2**20,
            "burst_reconcile_s": result.reconcile_all_s,
            "burst_create_s": result.create_s,
            "burst_per_s": result.burst_rate,
            "burst_cpu_s": result.burst_cpu_s,
            "burst_requests_per_service": result.requests_per_service,
            "burst_requests": result.burst_requests,
            "burst_machine": None
            if result.burst_machine is None
            else {
                "cores": result.burst_machine.cores,
                "busy_cpu_s": result.burst_machine.busy_s,
                "cpu_s_by_component": result.burst_machine.by_component,
                "outside_operator_cpu_s": result.burst_machine.outside_operator_s,
                "fastest_without_operator_cpu_s": result.burst_machine.fastest_s(),
            },
            "fleet": None
            if result.fleet is None
            else {
                "window_s": result.fleet.window_s,
                "cpu_cores": result.fleet.cpu_cores,
                "rss_mib": result.fleet.rss_bytes / 2**20,
                "ticks_per_s": result.fleet.ticks_per_s,
                "tick_p50_ms": 1000 * result.fleet.tick_p50_s,
                "tick_p99_ms": 1000 * result.fleet.tick_p99_s,
                "api_requests_per_s": result.fleet.api_requests_per_s,
                "api_requests": result.fleet.api_requests,
            },
        }
        print(json.dumps(figures, indent=2))
    else:
        print(result.report())
    return 0
