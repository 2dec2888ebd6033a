"""``chunkpilot cluster up|env|status|down`` on a detached control plane."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from chunkpilot.devcluster import binaries, paths
from chunkpilot.devcluster.controlplane import process_alive, read_state

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def _chunkpilot(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chunkpilot.cli", "cluster", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_up_env_status_down_leaves_nothing_running(control_plane_binaries: binaries.BinarySet) -> None:
    name = f"pytest-{uuid.uuid4().hex[:8]}"
    state_dir = paths.clusters_dir() / name
    up = _chunkpilot("up", "--name", name, "--nodes", "1", "--no-crds")
    try:
        assert up.returncode == 0, up.stderr
        state = read_state(state_dir)
        assert state is not None
        assert [p.name for p in state.processes] == [
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kwok",
        ]

        env_out = _chunkpilot("env", "--name", name)
        assert env_out.returncode == 0, env_out.stderr
        assert f"export KUBECONFIG={state.kubeconfig}" in env_out.stdout

        env = {**os.environ, "KUBECONFIG": state.kubeconfig}
        kubectl = str(control_plane_binaries[binaries.Binary.KUBECTL])
        nodes = subprocess.run(
            [kubectl, "get", "nodes", "-o", "json"], env=env, capture_output=True, text=True, check=True
        )
        assert [n["metadata"]["name"] for n in json.loads(nodes.stdout)["items"]] == ["gpu-node-0"]

        status = _chunkpilot("status", "--name", name)
        assert status.returncode == 0, status.stdout + status.stderr
        assert "gpu-node-0" in status.stdout
    finally:
        down = _chunkpilot("down", "--name", name)
    assert down.returncode == 0, down.stderr
    assert "stopped" in down.stdout
    assert not any(process_alive(p) for p in state.processes)
    assert not state_dir.exists()


def test_up_twice_is_refused(control_plane_binaries: binaries.BinarySet) -> None:
    name = f"pytest-{uuid.uuid4().hex[:8]}"
    try:
        assert _chunkpilot("up", "--name", name, "--nodes", "0", "--no-crds").returncode == 0
        again = _chunkpilot("up", "--name", name, "--no-crds")
        assert again.returncode == 1
        assert "already running" in again.stderr
    finally:
        _chunkpilot("down", "--name", name)
