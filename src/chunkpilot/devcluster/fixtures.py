"""Pytest plugin: a real local control plane, Prometheus and PostgreSQL for the test session.

Enable it with ``pytest_plugins = ["chunkpilot.devcluster.fixtures"]`` in ``tests/conftest.py``.
Tests that use these fixtures carry the ``cluster``, ``prometheus`` or ``postgres`` marker. The
control-plane binaries are not built here (a cold build takes far longer than a test timeout):
run ``chunkpilot cluster fetch`` first, as ``make test`` does.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from chunkpilot.devcluster import binaries
from chunkpilot.devcluster.controlplane import ControlPlane, ControlPlaneConfig
from chunkpilot.devcluster.fakenodes import gpu_node_specs
from chunkpilot.devcluster.postgres import PostgresServer, PostgresUnavailableError
from chunkpilot.devcluster.prometheus import PrometheusError, PrometheusServer, locate_prometheus

# Two fake H100 nodes with 8 GPUs each: enough for canary + stable tracks without crowding etcd.
SESSION_NODES = 2
_DATABASE_NUMBERS = itertools.count(1)


@pytest.fixture(scope="session")
def control_plane_binaries() -> binaries.BinarySet:
    """Paths of the pinned control-plane binaries; fails with the fix if they are not built."""
    try:
        return binaries.locate_all()
    except binaries.BinaryError as error:
        pytest.fail(str(error), pytrace=False)


@pytest.fixture(scope="session")
def control_plane(
    tmp_path_factory: pytest.TempPathFactory, control_plane_binaries: binaries.BinarySet
) -> Iterator[ControlPlane]:
    """A running control plane (etcd, kube-apiserver, controller manager, scheduler, KWOK GPU nodes).

    Started once per session. Useful members: ``kubeconfig`` (path), ``kubectl(*args)``
    (a ``CompletedProcess``; raises on failure unless ``check=False``), ``api_client()`` (a new
    ``kubernetes.client.ApiClient``), ``env`` (environment for subprocesses), ``apply_manifests``
    and ``create_gpu_nodes``.
    """
    state_dir = tmp_path_factory.mktemp("control-plane")
    config = ControlPlaneConfig(state_dir=state_dir, nodes=gpu_node_specs(SESSION_NODES))
    with ControlPlane(config, control_plane_binaries) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def prometheus_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    """One real Prometheus for the session, scraping every second."""
    binary: Path | None = locate_prometheus()
    if binary is None:
        pytest.fail(
            str(PrometheusError("Prometheus is not installed; run `chunkpilot cluster fetch` (installs it)")),
            pytrace=False,
        )
    with PrometheusServer(tmp_path_factory.mktemp("prometheus"), binary=binary) as server:
        yield server


@pytest.fixture
def prometheus(prometheus_server: PrometheusServer) -> Iterator[PrometheusServer]:
    """The session's Prometheus with no scrape targets; set them with ``set_targets([...])``."""
    prometheus_server.set_targets([])
    yield prometheus_server
    prometheus_server.set_targets([])


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One real PostgreSQL for the session (Debian package, installed on demand when root)."""
    try:
        server = PostgresServer()
    except PostgresUnavailableError as error:
        pytest.skip(str(error))
    with server:
        yield server


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    """SQLAlchemy URL of a fresh, empty database on the session's PostgreSQL."""
    return postgres_server.create_database(f"test_{next(_DATABASE_NUMBERS)}")
