"""``chunkpilot demo --fast`` end to end, as a user runs it: a promoted config that meets both SLOs,
the replicas following the load surge up and back down, the report written with its timeline, and
no process left behind.
"""

from __future__ import annotations

import csv
import signal
import subprocess
import time

import pytest

from chunkpilot.testing.demo import DemoRun

pytestmark = [pytest.mark.e2e, pytest.mark.cluster, pytest.mark.prometheus, pytest.mark.slow]


# The demo's own limit (below), not pytest's default: beside the other end-to-end tests on two
# cores it has taken 790 s against 611 s alone.
@pytest.mark.timeout(1500)
def test_fast_demo_promotes_a_config_that_meets_both_slos(demo: DemoRun) -> None:
    result = demo.run(timeout=1500)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert "Both SLOs met." in output
    report = demo.reports / "code-assist" / "report.md"
    assert "Report:" in output
    assert "Promoted" in report.read_text()
    assert list(report.parent.glob("*.png"))
    # The surge: the planner, turned to Auto, added replicas and took them away again.
    assert "load surge:" in output
    with (report.parent / "timeline.csv").open() as handle:
        replicas = [int(r["replicas"]) for r in csv.DictReader(handle) if r["replicas"]]
    assert max(replicas) >= 2, f"the replicas never rose: {replicas}"
    assert replicas[-1] < max(replicas), f"the replicas did not come back down: {replicas}"
    assert "## Load, replicas and latency over the run" in report.read_text()
    assert (report.parent / "timeline.png").stat().st_size > 0
    left = demo.leftovers()
    assert not left, f"the demo left processes running: {left}"


def _default_sigint() -> None:
    """Ctrl-C's default in the demo's process: a test run in the background (``nohup … &``) ignores
    SIGINT, the child inherits that, and Python then installs no KeyboardInterrupt handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_mid_run_tears_everything_down(demo: DemoRun) -> None:
    process = subprocess.Popen(
        demo.command(),
        env=demo.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=_default_sigint,
    )
    assert process.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + 600
    for line in process.stdout:
        seen.append(line)
        if "replaying" in line or time.monotonic() > deadline:
            break
    assert any("replaying" in line for line in seen), "".join(seen)[-4000:]
    process.send_signal(signal.SIGINT)
    rest, _ = process.communicate(timeout=420)  # teardown, not speed: slow on a loaded machine
    output = "".join(seen) + rest
    assert process.returncode == 130, output[-4000:]
    assert "Interrupted; every process the demo started has been stopped." in output
    assert not demo.leftovers(), "Ctrl-C left processes running"
