"""``chunkpilot cluster``: fetch the binaries, start/stop a detached local control plane, print its env."""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from chunkpilot.devcluster import binaries, paths, prometheus
from chunkpilot.devcluster.controlplane import (
    ControlPlane,
    ControlPlaneConfig,
    ControlPlaneError,
    cluster_env,
    process_alive,
    read_state,
    stop_recorded,
)
from chunkpilot.devcluster.fakenodes import GPU_PRODUCTS, gpu_node_specs
from chunkpilot.devcluster.processes import StartupError

DEFAULT_NAME = "default"


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _state_dir(name: str) -> Path:
    return paths.clusters_dir() / name


def find_crds_folder(start: Path | None = None) -> Path | None:
    """The repository's ``crds/`` folder: from ``start`` (default: cwd) upwards, then next to the source."""
    here = (start or Path.cwd()).resolve()
    source_root = Path(__file__).resolve().parents[3]
    for folder in (here, *here.parents, source_root):
        candidate = folder / "crds"
        if candidate.is_dir() and any(candidate.glob("*.y*ml")):
            return candidate
    return None


def _fetch(args: argparse.Namespace) -> int:
    started = time.monotonic()
    found = binaries.ensure_all(progress=_progress, parallelism=args.jobs)
    for binary, path in found.paths.items():
        print(f"{binary.value:<24} {path}")
    if not args.skip_prometheus:
        print(f"{'prometheus':<24} {prometheus.ensure_prometheus(_progress)}")
    _progress(f"all binaries ready in {time.monotonic() - started:.1f}s (cache: {paths.cache_root()})")
    return 0


def _up(args: argparse.Namespace) -> int:
    state_dir = _state_dir(args.name)
    state = read_state(state_dir)
    if state is not None and any(process_alive(p) for p in state.processes):
        _progress(
            f"cluster {args.name!r} is already running (kubeconfig {state.kubeconfig}); "
            f"stop it with `chunkpilot cluster down --name {args.name}`"
        )
        return 1
    if state_dir.exists():
        shutil.rmtree(state_dir)
    found = binaries.ensure_all(progress=_progress)
    config = ControlPlaneConfig(
        state_dir=state_dir,
        nodes=gpu_node_specs(args.nodes, accelerator=args.accelerator, gpus=args.gpus),
        startup_timeout=args.timeout,
    )
    control_plane = ControlPlane(config, found)
    _progress(f"starting control plane {args.name!r} in {state_dir}")
    try:
        control_plane.start()
        crds = args.crds if args.crds is not None else find_crds_folder()
        if crds is not None and not args.no_crds:
            names = control_plane.apply_manifests([crds])
            _progress(f"installed CRDs from {crds}: {', '.join(names) or 'none'}")
    except (StartupError, ControlPlaneError, OSError) as error:
        control_plane.stop()
        _progress(f"error: {error}")
        return 1
    # The servers run in their own sessions and outlive this command; `down` stops them.
    name_flag = "" if args.name == DEFAULT_NAME else f" --name {args.name}"
    print(
        f"control plane {args.name!r} is up: {control_plane.server} with {args.nodes} fake "
        f"{args.accelerator} node(s) of {args.gpus} GPUs\n"
        f"  kubeconfig: {control_plane.kubeconfig}\n"
        f"  logs:       {control_plane.logs_dir}\n"
        f'use it:   eval "$(chunkpilot cluster env{name_flag})" && kubectl get nodes\n'
        f"stop it:  chunkpilot cluster down{name_flag}"
    )
    return 0


def _down(args: argparse.Namespace) -> int:
    state_dir = _state_dir(args.name)
    stopped = stop_recorded(state_dir)
    if not args.keep_state and state_dir.exists():
        shutil.rmtree(state_dir)
    if stopped:
        print(f"stopped {', '.join(stopped)} of cluster {args.name!r}")
    else:
        print(f"cluster {args.name!r} is not running")
    return 0


def _env(args: argparse.Namespace) -> int:
    state = read_state(_state_dir(args.name))
    if state is None:
        _progress(f"cluster {args.name!r} is not running; start it with `chunkpilot cluster up`")
        return 1
    path = ":".join([*state.path_entries, "$PATH"])
    print(f"export KUBECONFIG={shlex.quote(state.kubeconfig)}")
    print(f'export PATH="{path}"')
    return 0


def _status(args: argparse.Namespace) -> int:
    state = read_state(_state_dir(args.name))
    if state is None:
        print(f"cluster {args.name!r} is not running")
        return 1
    alive = {p.name: process_alive(p) for p in state.processes}
    for name, up in alive.items():
        print(f"{name:<24} {'running' if up else 'STOPPED'}")
    print(f"{'server':<24} {state.server}")
    print(f"{'kubeconfig':<24} {state.kubeconfig}")
    if all(alive.values()):
        kubectl = str(Path(state.path_entries[0]) / "kubectl") if state.path_entries else "kubectl"
        env = cluster_env(Path(state.kubeconfig), state.path_entries)
        result = subprocess.run(
            [kubectl, "get", "nodes"], env=env, capture_output=True, text=True, timeout=30, check=False
        )
        print(result.stdout or result.stderr, end="")
    return 0 if all(alive.values()) else 1


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``cluster`` command group."""
    parser = subparsers.add_parser(
        "cluster",
        help="local Kubernetes control plane (etcd, kube-apiserver, controllers, KWOK GPU nodes)",
        description="Build or locate the control-plane binaries and run a local cluster with fake GPU nodes.",
    )
    commands = parser.add_subparsers(dest="cluster_command", metavar="SUBCOMMAND", required=True)

    fetch = commands.add_parser("fetch", help="locate or build every binary (first build: tens of minutes)")
    fetch.add_argument("--jobs", type=int, default=2, help="parallel Go compile jobs (default 2)")
    fetch.add_argument("--skip-prometheus", action="store_true", help="do not locate/install Prometheus")
    fetch.set_defaults(func=_fetch)

    up = commands.add_parser("up", help="start a detached control plane")
    up.add_argument(
        "--name", default=DEFAULT_NAME, help="cluster name (state in ~/.cache/chunkpilot/clusters/NAME)"
    )
    up.add_argument("--nodes", type=int, default=2, help="number of fake GPU nodes (default 2)")
    up.add_argument("--gpus", type=int, default=8, help="nvidia.com/gpu per node (default 8)")
    up.add_argument(
        "--accelerator", default="h100", choices=sorted(GPU_PRODUCTS), help="GPU type of the nodes"
    )
    up.add_argument(
        "--crds", type=Path, default=None, help="folder of CRDs to install (default: the repo's crds/)"
    )
    up.add_argument("--no-crds", action="store_true", help="do not install CRDs")
    up.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for each server")
    up.set_defaults(func=_up)

    down = commands.add_parser("down", help="stop a detached control plane and delete its state")
    down.add_argument("--name", default=DEFAULT_NAME)
    down.add_argument("--keep-state", action="store_true", help="keep the state folder (logs, etcd data)")
    down.set_defaults(func=_down)

    env = commands.add_parser("env", help="print shell exports (KUBECONFIG, PATH with kubectl/helm/kwok)")
    env.add_argument("--name", default=DEFAULT_NAME)
    env.set_defaults(func=_env)

    status = commands.add_parser("status", help="show whether each server runs, and the nodes")
    status.add_argument("--name", default=DEFAULT_NAME)
    status.set_defaults(func=_status)
