"""``chunkpilot operator bench``: how fast the operator reacts and how much memory it holds.

Two figures, printed (never asserted):

* apply -> Deployment-exists latency, p50/p99 over N InferenceServices created one after
  another (each waits for its Deployment, so this is reaction time, not queueing);
* the operator's resident memory once M InferenceServices are reconciled (status written).

The operator runs as a real process (``chunkpilot operator``) against a real API server: a
throw-away local control plane by default, or the cluster of ``--kubeconfig``. Services are
created with ``replicas: 0`` unless asked otherwise, so no engine pods load the machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chunkpilot.api import GROUP, ISVC_PLURAL, VERSION
from chunkpilot.operator.builders import deployment_name
from chunkpilot.operator.testing import OperatorProcess, operator_env, wait_for

BENCH_NAMESPACE = "chunkpilot-bench"


@dataclass(frozen=True)
class BenchResult:
    """Measured figures of one run."""

    latencies_s: list[float]
    rss_idle_bytes: int
    rss_bytes: int
    rss_peak_bytes: int
    reconciled: int
    reconcile_all_s: float

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
                f"  the last {self.reconciled - len(ms)} created in a burst were all reconciled"
                f" in {self.reconcile_all_s:.1f} s",
            ]
        )


def service_manifest(name: str, replicas: int) -> dict[str, Any]:
    """A small simulator InferenceService."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "maxModelLen": 8192},
            "engine": {"kind": "sim", "maxNumBatchedTokens": 2048, "maxNumSeqs": 64},
            "resources": {"accelerator": "h100"},
            "replicas": replicas,
        },
    }


class DeploymentWatch:
    """Records when each Deployment of a namespace is first seen (a watch in a thread)."""

    def __init__(self, api_client: Any, namespace: str) -> None:
        import kubernetes

        self._apps = kubernetes.client.AppsV1Api(api_client)
        self._watch = kubernetes.watch.Watch()  # type: ignore[no-untyped-call]
        self._namespace = namespace
        self._seen: dict[str, float] = {}
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="deployment-watch", daemon=True)
        self._started = threading.Event()
        self._stopping = False

    def start(self) -> DeploymentWatch:
        self._thread.start()
        self._started.wait(30)
        return self

    def _run(self) -> None:
        listed = self._apps.list_namespaced_deployment(self._namespace)
        self._started.set()
        stream = self._watch.stream(  # type: ignore[no-untyped-call]
            self._apps.list_namespaced_deployment,
            self._namespace,
            resource_version=listed.metadata.resource_version if listed.metadata else None,
        )
        try:
            for event in stream:
                name = event["object"].metadata.name
                with self._changed:
                    self._seen.setdefault(name, time.monotonic())
                    self._changed.notify_all()
        except Exception:
            if not self._stopping:
                raise  # a broken stream while measuring; closing the client ends it otherwise

    def wait(self, name: str, timeout: float) -> float:
        """The monotonic time ``name`` was first seen; raises TimeoutError."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while name not in self._seen:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"Deployment {name} did not appear within {timeout:.0f}s")
                self._changed.wait(left)
            return self._seen[name]

    def stop(self) -> None:
        self._stopping = True
        self._watch.stop()  # type: ignore[no-untyped-call]


@contextmanager
def _local_cluster(state_dir: Path) -> Iterator[tuple[Path, dict[str, str]]]:
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
    *, count: int, total: int, replicas: int, kubeconfig: Path | None, work_dir: Path, log: Any = print
) -> BenchResult:
    """Run the benchmark; ``kubeconfig`` None starts (and stops) a local control plane."""
    import kubernetes

    if total < count:
        raise ValueError(f"--services ({total}) must be >= --count ({count})")
    with ExitStack() as stack:
        if kubeconfig is None:
            log("starting a local control plane ...")
            kubeconfig, env = stack.enter_context(_local_cluster(work_dir / "control-plane"))
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

        operator = OperatorProcess(
            ["-n", namespace, "--standalone", "--metrics-port", "0", "--kubeconfig", str(kubeconfig)],
            env=operator_env(env),
            log_path=work_dir / "operator.log",
        )
        stack.callback(lambda: _cleanup(core, custom, namespace, operator))
        operator.start()
        time.sleep(2.0)
        assert operator.process is not None
        rss_idle, _ = _rss(operator.process.pid)
        watch = DeploymentWatch(api_client, namespace).start()
        stack.callback(watch.stop)

        log(f"measuring apply -> Deployment over {count} InferenceServices ...")
        latencies: list[float] = []
        for index in range(count):
            name = f"bench-{index:04d}"
            started = time.monotonic()
            custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, ISVC_PLURAL, service_manifest(name, replicas)
            )
            latencies.append(watch.wait(deployment_name(name, "stable"), timeout=60) - started)

        log(f"creating {total - count} more and waiting until all {total} are reconciled ...")
        burst_started = time.monotonic()
        for index in range(count, total):
            custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, ISVC_PLURAL, service_manifest(f"bench-{index:04d}", replicas)
            )

        def all_reconciled() -> bool:
            listed = _services(custom, namespace)
            done = [item for item in listed if (item.get("status") or {}).get("observedGeneration")]
            return len(done) >= total

        wait_for(all_reconciled, timeout=max(120.0, total * 2.0), interval=1.0, what=f"{total} reconciled")
        burst_s = time.monotonic() - burst_started
        time.sleep(2.0)
        rss, peak = _rss(operator.process.pid)
        return BenchResult(latencies, rss_idle, rss, peak, total, burst_s)
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
        }
        print(json.dumps(figures, indent=2))
    else:
        print(result.report())
    return 0
