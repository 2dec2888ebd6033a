"""Pytest plugin: the pod runner and the whole local stack on the session's control plane.

Enable with ``pytest_plugins = ["chunkpilot.devcluster.fixtures", "chunkpilot.localrun.fixtures"]``.
Tests using these fixtures carry the ``cluster`` and ``prometheus`` markers (``e2e`` for the stack).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from chunkpilot.devcluster.controlplane import ControlPlane
from chunkpilot.devcluster.prometheus import PrometheusServer
from chunkpilot.localrun.podrunner import PodRunner, RunnerSettings, core_api_from_kubeconfig
from chunkpilot.localrun.stack import LocalStack, StackOptions
from chunkpilot.localrun.targets import FileSDTargets
from chunkpilot.operator.apicalls import ENFORCE, ENV_KUBE_CALLS

#: Engines in tests run this many times faster than the hardware they simulate.
ENV_TEST_TIME_SCALE = "CHUNKPILOT_TEST_TIME_SCALE"


def pytest_configure(config: pytest.Config) -> None:
    """Every Kubernetes client of the operator and tuner, in-process or in a subprocess started by a
    test, refuses API calls that :data:`chunkpilot.operator.apicalls.API_CALLS` does not declare."""
    os.environ.setdefault(ENV_KUBE_CALLS, ENFORCE)


def engine_time_scale() -> float:
    """The engines' time scale for tests (``$CHUNKPILOT_TEST_TIME_SCALE``, default 1)."""
    return float(os.environ.get(ENV_TEST_TIME_SCALE, "1"))


@pytest.fixture
def pod_runner(
    control_plane: ControlPlane, prometheus: PrometheusServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PodRunner]:
    """A running pod runner: simulator processes for engine pods, registered with ``prometheus``.

    Restarts crashed engines after 3 s, doubling to at most 6 s (the kubelet: 10 s to 5 min), to
    keep tests short.
    """
    settings = RunnerSettings(
        time_scale=engine_time_scale(),
        log_dir=tmp_path_factory.mktemp("engines"),
        restart_backoff_s=3.0,
        max_restart_backoff_s=6.0,
    )
    runner = PodRunner(
        core_api_from_kubeconfig(control_plane.kubeconfig),
        targets=FileSDTargets(prometheus.targets_file),
        settings=settings,
    )
    with runner:
        yield runner


@pytest.fixture
def local_stack(
    control_plane: ControlPlane, prometheus: PrometheusServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalStack]:
    """The local stack on the session's control plane and Prometheus: CRDs, pod runner, operator."""
    options = StackOptions(
        state_dir=tmp_path_factory.mktemp("stack"),
        time_scale=engine_time_scale(),
        restart_backoff_s=3.0,
    )
    with LocalStack(options, control_plane=control_plane, prometheus=prometheus) as stack:
        yield stack
