"""The end-to-end tier's kit: one local-stack factory over the session's control plane and Prometheus."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from chunkpilot.devcluster.controlplane import ControlPlane
from chunkpilot.devcluster.prometheus import PrometheusServer
from chunkpilot.testing.stack import StartStack, stack_factory


@pytest.fixture
def start_stack(
    control_plane: ControlPlane, prometheus: PrometheusServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StartStack]:
    """``start_stack(name, **tuner_env)``: a running local stack, stopped when the test ends."""
    with stack_factory(control_plane, prometheus, tmp_path_factory.mktemp) as start:
        yield start
