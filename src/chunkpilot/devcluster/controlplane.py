"""A real local Kubernetes control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, KWOK.

Everything listens on 127.0.0.1 on free ports, keeps its state and logs in one directory and runs
as its own process group, so :meth:`ControlPlane.stop` (or ``chunkpilot cluster down`` for a
detached cluster) leaves nothing behind. KWOK plays the kubelet for fake GPU nodes, so Deployments
are scheduled by the real scheduler and become Available.
"""

from __future__ import annotations

import functools
import json
import os
import ssl
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from chunkpilot.devcluster import certs, processes
from chunkpilot.devcluster.binaries import BinarySet
from chunkpilot.devcluster.components import Binary
from chunkpilot.devcluster.fakenodes import (
    KWOK_NODE_SELECTOR,
    GpuNodeSpec,
    gpu_node_manifest,
    gpu_node_specs,
    kwok_stages_yaml,
)
from chunkpilot.devcluster.kubeconfig import render_kubeconfig, write_kubeconfig
from chunkpilot.devcluster.ports import LOOPBACK, free_ports
from chunkpilot.devcluster.processes import ManagedProcess, StartupError, start_or_undo

STATE_FILE = "state.json"
SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/16"
POD_CIDR = "10.244.0.1/16"


class ControlPlaneError(RuntimeError):
    """The control plane could not be started, reached or used."""


@dataclass(frozen=True)
class ControlPlaneConfig:
    """What to start: where state goes, how many fake GPU nodes, how long to wait."""

    state_dir: Path
    nodes: Sequence[GpuNodeSpec] = field(default_factory=lambda: gpu_node_specs(2))
    startup_timeout: float = 120.0
    extra_apiserver_args: Sequence[str] = ()

    def __post_init__(self) -> None:
        names = [node.name for node in self.nodes]
        if len(names) != len(set(names)):
            raise ValueError(f"nodes: node names must be unique, got {names}")
        if self.startup_timeout <= 0:
            raise ValueError(f"startup_timeout: must be > 0 seconds, got {self.startup_timeout}")


@dataclass(frozen=True)
class Ports:
    """The loopback ports of one control plane."""

    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    kwok: int

    @classmethod
    def allocate(cls) -> Ports:
        """Pick six distinct free ports."""
        return cls(*free_ports(6))


@dataclass(frozen=True)
class RecordedProcess:
    """A started server as recorded in ``state.json``: enough to find and stop it later."""

    name: str
    pid: int
    executable: str
    log: str


@dataclass(frozen=True)
class ClusterState:
    """The contents of ``state.json`` of a running control plane."""

    kubeconfig: str
    server: str
    processes: list[RecordedProcess]
    path_entries: list[str]
    nodes: list[str]
    started_at: float

    def to_json(self) -> str:
        """Serialise for ``state.json``."""
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> ClusterState:
        """Parse ``state.json``."""
        raw = json.loads(text)
        raw["processes"] = [RecordedProcess(**item) for item in raw["processes"]]
        return cls(**raw)


def etcd_args(binary: Path, data_dir: Path, ports: Ports) -> list[str]:
    """Command line of a single-member etcd on loopback (fsync off: the data is throw-away)."""
    client = f"http://{LOOPBACK}:{ports.etcd_client}"
    peer = f"http://{LOOPBACK}:{ports.etcd_peer}"
    return [
        str(binary),
        "--name=chunkpilot",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=chunkpilot={peer}",
        "--unsafe-no-fsync=true",
        "--log-level=warn",
    ]


def apiserver_args(
    binary: Path, pki: certs.PkiFiles, cert_dir: Path, ports: Ports, extra: Sequence[str] = ()
) -> list[str]:
    """Command line of kube-apiserver: TLS with client certificates, RBAC, service-account tokens."""
    return [
        str(binary),
        f"--etcd-servers=http://{LOOPBACK}:{ports.etcd_client}",
        f"--bind-address={LOOPBACK}",
        f"--advertise-address={LOOPBACK}",
        f"--secure-port={ports.apiserver}",
        f"--cert-dir={cert_dir}",
        f"--tls-cert-file={pki.serving_cert}",
        f"--tls-private-key-file={pki.serving_key}",
        f"--client-ca-file={pki.ca_cert}",
        "--authorization-mode=RBAC",
        f"--service-account-issuer=https://{LOOPBACK}:{ports.apiserver}",
        f"--service-account-key-file={pki.service_account_public_key}",
        f"--service-account-signing-key-file={pki.service_account_key}",
        f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
        "--allow-privileged=true",
        "--profiling=false",
        # The loopback address may not be published as the `kubernetes` Service endpoint.
        "--endpoint-reconciler-type=none",
        *extra,
    ]


def controller_manager_args(
    binary: Path, pki: certs.PkiFiles, kubeconfig: Path, cert_dir: Path, ports: Ports
) -> list[str]:
    """Command line of kube-controller-manager with every default controller (garbage collector included)."""
    return _kube_component_args(
        binary,
        kubeconfig,
        cert_dir,
        ports.controller_manager,
        "--controllers=*",
        f"--service-account-private-key-file={pki.service_account_key}",
        f"--root-ca-file={pki.ca_cert}",
        f"--cluster-signing-cert-file={pki.ca_cert}",
        f"--cluster-signing-key-file={pki.ca_key}",
        f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
    )


def scheduler_args(binary: Path, kubeconfig: Path, cert_dir: Path, ports: Ports) -> list[str]:
    """Command line of kube-scheduler."""
    return _kube_component_args(binary, kubeconfig, cert_dir, ports.scheduler)


def _kube_component_args(
    binary: Path, kubeconfig: Path, cert_dir: Path, secure_port: int, *own_flags: str
) -> list[str]:
    """A controller's command line: the admin kubeconfig for everything, serving on loopback,
    ``own_flags``, and no leader election or profiling."""
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        f"--bind-address={LOOPBACK}",
        f"--secure-port={secure_port}",
        f"--cert-dir={cert_dir}",
        *own_flags,
        "--leader-elect=false",
        "--profiling=false",
    ]


def kwok_args(binary: Path, kubeconfig: Path, stages: Path, ports: Ports) -> list[str]:
    """Command line of KWOK managing only the nodes annotated as fake."""
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--config={stages}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={KWOK_NODE_SELECTOR}",
        "--node-lease-duration-seconds=40",
        f"--cidr={POD_CIDR}",
        f"--server-address={LOOPBACK}:{ports.kwok}",
    ]


def admin_tls_context(pki: certs.PkiFiles) -> ssl.SSLContext:
    """A TLS context that trusts the cluster CA and presents the admin client certificate."""
    context = ssl.create_default_context(cafile=str(pki.ca_cert))
    context.load_cert_chain(str(pki.admin_cert), str(pki.admin_key))
    return context


def crd_names(documents: Iterable[Any]) -> list[str]:
    """Names of the CustomResourceDefinitions among parsed manifest documents."""
    names: list[str] = []
    for document in documents:
        if not isinstance(document, dict):
            continue
        if document.get("kind") == "List":
            names += crd_names(document.get("items", []))
        elif document.get("kind") == "CustomResourceDefinition":
            names.append(str(document["metadata"]["name"]))
    return names


def manifest_files(paths: Iterable[Path]) -> list[Path]:
    """Every YAML/JSON manifest file in ``paths`` (folders are searched recursively), sorted."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files += sorted(p for p in path.rglob("*") if p.suffix in {".yaml", ".yml", ".json"})
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"manifest path {path} does not exist")
    return files


class Kubectl:
    """Runs the pinned ``kubectl`` against one kubeconfig."""

    def __init__(self, binary: Path, kubeconfig: Path, env: dict[str, str]) -> None:
        self.binary = binary
        self.kubeconfig = kubeconfig
        self.env = env

    def __call__(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        """Run ``kubectl ARGS``; with ``check`` a non-zero exit raises with stderr in the message."""
        argv = [str(self.binary), f"--kubeconfig={self.kubeconfig}", *args]
        result = subprocess.run(
            argv, input=input, capture_output=True, text=True, env=self.env, timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            raise ControlPlaneError(
                f"kubectl {' '.join(args)} failed (exit {result.returncode}):\n{result.stderr.strip()}"
            )
        return result


class ControlPlane:
    """Start, use and stop one local control plane. Use as a context manager or call start/stop."""

    def __init__(self, config: ControlPlaneConfig, binaries: BinarySet) -> None:
        self.config = config
        self.binaries = binaries
        self.state_dir = config.state_dir
        self.kubeconfig = self.state_dir / "kubeconfig"
        self.ports: Ports | None = None
        self.pki: certs.PkiFiles | None = None
        self._processes: list[ManagedProcess] = []

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def server(self) -> str:
        """The kube-apiserver URL."""
        if self.ports is None:
            raise ControlPlaneError("the control plane is not started")
        return f"https://{LOOPBACK}:{self.ports.apiserver}"

    @property
    def logs_dir(self) -> Path:
        """Where each server writes its log."""
        return self.state_dir / "logs"

    def start(self) -> ControlPlane:
        """Start every server, create the fake GPU nodes and wait until they are Ready."""
        start_or_undo(self._start, self.stop)
        return self

    def _start(self) -> None:
        timeout = self.config.startup_timeout
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.pki = pki = certs.write_pki(self.state_dir / "pki")
        self.ports = ports = Ports.allocate()
        write_kubeconfig(
            self.kubeconfig, render_kubeconfig(self.server, pki.ca_cert, pki.admin_cert, pki.admin_key)
        )
        stages = self.state_dir / "kwok-stages.yaml"
        stages.write_text(kwok_stages_yaml())

        etcd = self._launch("etcd", etcd_args(self.binaries[Binary.ETCD], self.state_dir / "etcd", ports))
        etcd_health = f"http://{LOOPBACK}:{ports.etcd_client}/health"
        etcd.wait_until(lambda: processes.http_ok(etcd_health), timeout, f"GET {etcd_health} answered 200")

        apiserver = self._launch(
            "kube-apiserver",
            apiserver_args(
                self.binaries[Binary.KUBE_APISERVER],
                pki,
                self.state_dir / "apiserver",
                ports,
                self.config.extra_apiserver_args,
            ),
        )
        tls = admin_tls_context(pki)
        apiserver.wait_until(
            lambda: processes.http_ok(f"{self.server}/readyz", tls), timeout, f"GET {self.server}/readyz"
        )

        insecure = processes.insecure_tls_context()
        controller_manager = self._launch(
            "kube-controller-manager",
            controller_manager_args(
                self.binaries[Binary.KUBE_CONTROLLER_MANAGER],
                pki,
                self.kubeconfig,
                self.state_dir / "controller-manager",
                ports,
            ),
        )
        scheduler = self._launch(
            "kube-scheduler",
            scheduler_args(
                self.binaries[Binary.KUBE_SCHEDULER], self.kubeconfig, self.state_dir / "scheduler", ports
            ),
        )
        kwok = self._launch("kwok", kwok_args(self.binaries[Binary.KWOK], self.kubeconfig, stages, ports))
        for process, url, context in (
            (controller_manager, f"https://{LOOPBACK}:{ports.controller_manager}/healthz", insecure),
            (scheduler, f"https://{LOOPBACK}:{ports.scheduler}/healthz", insecure),
            (kwok, f"http://{LOOPBACK}:{ports.kwok}/healthz", None),
        ):
            process.wait_until(functools.partial(processes.http_ok, url, context), timeout, f"GET {url}")

        self._wait_for_default_service_account(timeout)
        self.create_gpu_nodes(self.config.nodes, timeout=timeout)
        self._write_state()

    def _launch(self, name: str, argv: list[str]) -> ManagedProcess:
        process = ManagedProcess(name=name, argv=argv, log_path=self.logs_dir / f"{name}.log").start()
        self._processes.append(process)
        return process

    def _wait_for_default_service_account(self, timeout: float) -> None:
        """Pods are refused until the controller manager has created ``default/default``."""
        deadline = time.monotonic() + timeout
        while self.kubectl("get", "serviceaccount", "default", "-n", "default", check=False).returncode != 0:
            if time.monotonic() > deadline:
                tail = processes.log_tail(self.logs_dir / "kube-controller-manager.log")
                raise StartupError(
                    "kube-controller-manager did not create the `default` service account within "
                    f"{timeout:.0f}s; last log lines:\n{tail}"
                )
            time.sleep(0.5)

    def _write_state(self) -> None:
        state = ClusterState(
            kubeconfig=str(self.kubeconfig),
            server=self.server,
            processes=[
                RecordedProcess(name=p.name, pid=p.pid, executable=str(p.argv[0]), log=str(p.log_path))
                for p in self._processes
            ],
            path_entries=self.binaries.path_entries(),
            nodes=[node.name for node in self.config.nodes],
            started_at=time.time(),
        )
        (self.state_dir / STATE_FILE).write_text(state.to_json())

    def stop(self) -> None:
        """Stop every server, newest first; safe to call twice."""
        while self._processes:
            self._processes.pop().stop()
        (self.state_dir / STATE_FILE).unlink(missing_ok=True)

    def running(self) -> list[str]:
        """Names of the servers that are still alive."""
        return [process.name for process in self._processes if process.running()]

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- use ---------------------------------------------------------------------------------

    @property
    def env(self) -> dict[str, str]:
        """Environment for subprocesses: ``KUBECONFIG`` set and the pinned binaries first on ``PATH``."""
        return cluster_env(self.kubeconfig, self.binaries.path_entries())

    @property
    def kubectl(self) -> Kubectl:
        """``kubectl`` bound to this cluster: ``cp.kubectl("get", "nodes")``."""
        return Kubectl(self.binaries[Binary.KUBECTL], self.kubeconfig, self.env)

    def api_client(self) -> Any:
        """A new ``kubernetes.client.ApiClient`` for this cluster (close it when done)."""
        from kubernetes import config as kube_config

        # The kubernetes package ships no type hints.
        return kube_config.new_client_from_config(config_file=str(self.kubeconfig))  # type: ignore[no-untyped-call]

    def create_gpu_nodes(self, nodes: Sequence[GpuNodeSpec], timeout: float = 60.0) -> None:
        """Create fake GPU nodes (KWOK makes them Ready) and wait until every one is Ready."""
        if not nodes:
            return
        manifest = {"apiVersion": "v1", "kind": "List", "items": [gpu_node_manifest(node) for node in nodes]}
        self.kubectl("apply", "-f", "-", input=json.dumps(manifest))
        names = [f"node/{node.name}" for node in nodes]
        self.kubectl(
            "wait", "--for=condition=Ready", f"--timeout={int(timeout)}s", *names, timeout=timeout + 10
        )

    def apply_manifests(self, paths: Iterable[Path], timeout: float = 60.0) -> list[str]:
        """``kubectl apply`` (server-side) every manifest in ``paths``; wait for CRDs to be Established.

        Returns the names of the CustomResourceDefinitions that were applied.
        """
        files = manifest_files(paths)
        if not files:
            return []
        args = ["apply", "--server-side", "--force-conflicts", "--field-manager=chunkpilot-devcluster"]
        for file in files:
            args += ["-f", str(file)]
        self.kubectl(*args)
        crds: list[str] = []
        for file in files:
            crds += crd_names(yaml.safe_load_all(file.read_text()))
        if crds:
            self.kubectl(
                "wait",
                "--for=condition=Established",
                f"--timeout={int(timeout)}s",
                *[f"crd/{name}" for name in crds],
                timeout=timeout + 10,
            )
        return crds


def cluster_env(kubeconfig: Path, path_entries: Sequence[str]) -> dict[str, str]:
    """The current environment with ``KUBECONFIG`` and the binary folders in front of ``PATH``."""
    env = dict(os.environ)
    env["KUBECONFIG"] = str(kubeconfig)
    env["PATH"] = os.pathsep.join([*path_entries, env.get("PATH", "")])
    return env


def read_state(state_dir: Path) -> ClusterState | None:
    """The recorded state of a detached cluster in ``state_dir``, or ``None`` if there is none."""
    path = state_dir / STATE_FILE
    if not path.is_file():
        return None
    return ClusterState.from_json(path.read_text())


def process_alive(process: RecordedProcess) -> bool:
    """Whether the recorded pid still runs the recorded executable (guards against reused pids)."""
    command_line = processes.process_command_line(process.pid)
    return bool(command_line) and command_line is not None and command_line[0] == process.executable


def stop_recorded(state_dir: Path, timeout: float = 10.0) -> list[str]:
    """Stop the servers of a detached cluster (newest first); returns the names that were stopped."""
    state = read_state(state_dir)
    if state is None:
        return []
    stopped: list[str] = []
    for process in reversed(state.processes):
        if process_alive(process):
            processes.terminate_group(process.pid, timeout)
            stopped.append(process.name)
    (state_dir / STATE_FILE).unlink(missing_ok=True)
    return stopped
