"""The operator benchmark's CPU accounting over a burst: the machine's busy time, by process."""

from __future__ import annotations

import os
import time

import pytest

from chunkpilot.bench.operator_load import (
    CLIENTS,
    OPERATOR,
    OTHER,
    component_cpu_s,
    machine_busy_s,
    machine_cpu,
)


def _spin(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_the_machines_busy_time_and_this_process_share_grow_with_work() -> None:
    busy, mine = machine_busy_s(), component_cpu_s(operator_pid=-1).get(CLIENTS, 0.0)
    _spin(0.3)
    assert machine_busy_s() - busy >= 0.2  # this process alone kept a core busy that long
    assert component_cpu_s(operator_pid=-1)[CLIENTS] - mine >= 0.2


def test_the_operator_is_its_process_and_its_children() -> None:
    # The test's own process stands in for the operator: its CPU is counted as the operator's.
    totals = component_cpu_s(operator_pid=os.getpid())
    assert totals[OPERATOR] > 0 and CLIENTS not in totals


def test_the_work_outside_the_operator_bounds_the_burst() -> None:
    before = {"API server": 10.0, "etcd": 5.0, OPERATOR: 2.0}
    after = {"API server": 40.0, "etcd": 15.0, OPERATOR: 22.0, "KWOK": 1.0}
    cpu = machine_cpu(50.0, 100.0, 170.0, before, after)
    assert cpu.busy_s == pytest.approx(70.0)
    # Everything the named processes do not account for is "other"; ordered most first.
    assert cpu.by_component[OTHER] == pytest.approx(70.0 - 30.0 - 10.0 - 20.0 - 1.0)
    assert list(cpu.by_component) == ["API server", OPERATOR, "etcd", OTHER, "KWOK"]
    # 50 CPU s outside the operator take at least 50 / cores seconds, whatever the operator costs.
    assert cpu.outside_operator_s == pytest.approx(50.0)
    assert cpu.fastest_s() == pytest.approx(50.0 / cpu.cores)
    report = cpu.report(services=900)
    assert "API server 30.0" in report and f"at most {900 / cpu.fastest_s():.1f} services/s" in report
