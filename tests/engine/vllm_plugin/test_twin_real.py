"""The twin against the real vLLM CPU engine: fit at one load and budget, predict others.

One engine (the session server): the twin is fitted from the step telemetry of one window at the
start-up budget, then the budget is lowered live for the other windows (the route only lowers) and
restored at the end. The measured quantiles are the engine's own fine ``chunkpilot:*`` histograms.

On shared CPU cores the engine's latency tails are set by the machine more than by the model
(decode steps have been seen to take 50x their median while other processes ran), and
its pace drifts between windows, so the test asserts what holds whatever the machine does: every
window has its quantiles, the fitted step model fits its own window, and it explains every held-out
window's step telemetry better than the datasheet prior. The latency quantiles' errors depend on the
machine's speed and noise (on a machine 40% faster than the documented runs the ITL p50 error was
+34%), so they are measured, not asserted: all four quantiles' errors are printed (and written as
JSON to ``$CHUNKPILOT_TWIN_REAL_JSON`` when set); docs/benchmarks.md has measured ones.
"""

from __future__ import annotations

import json
import math
import os
import time
import urllib.error
import urllib.request
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import pytest
from chunkpilot.engine.live_adjust import LIVE_ADJUST_ROUTE
from chunkpilot.engine.sim.scheduler import SchedulerConfig
from chunkpilot.engine.vllm_plugin.launch import SERVED_MODEL_NAME
from chunkpilot.engine.vllm_plugin.testing import STARTUP_BUDGET, EngineServer
from chunkpilot.tuner.twin.fit import fit_steps
from chunkpilot.tuner.twin.predict import LatencyQuantiles

from chunkpilot.bench.twin_real import (
    PointCheck,
    compare,
    lengths,
    observe,
    poisson_requests,
    step_rms_error,
)

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]

#: The accelerator profile of the prior: a generic CPU (the fit corrects its guesses).
ACCELERATOR = "generic-cpu"
REQUESTS = 80
FIT_RATE = 6.0
#: (budget, requests/s) of the held-out windows: two other loads at the fit budget, two other
#: budgets at the fit load (budgets in descending order: the live route only lowers).
POINTS = ((STARTUP_BUDGET, FIT_RATE / 2), (STARTUP_BUDGET, FIT_RATE * 1.6), (1024, FIT_RATE), (512, FIT_RATE))
#: The fitted step model's in-sample error (measured 6-11% on a busy two-core machine).
MAX_FIT_ERROR = 0.25
QUANTILE_NAMES = tuple(f.name for f in fields(LatencyQuantiles))


def _set_budget(server: EngineServer, budget: int) -> None:
    body = json.dumps({"max_num_batched_tokens": budget}).encode()
    request = urllib.request.Request(server.url + LIVE_ADJUST_ROUTE, data=body, method="PUT")
    request.add_header("Content-Type", "application/json")
    request.add_header("Authorization", f"Bearer {server.token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status in (200, 202)  # 202: the idle engine applies it with its next step
    except urllib.error.HTTPError as error:
        raise AssertionError(f"budget {budget}: {error.code} {error.read()!r}") from error


def _table(checks: list[PointCheck]) -> str:
    header = ("budget", "req/s", "quantile", "measured", "twin", "err", "steady", "e2e", "prior")
    lines = ["{:>6} {:>5} {:<12} {:>8} {:>7} {:>6} {:>6} {:>6} {:>6}".format(*header)]
    for check in checks:
        for name in QUANTILE_NAMES:
            lines.append(
                f"{check.budget:>6} {check.rate_req_s:>5.1f} {name:<12} "
                f"{getattr(check.measured, name):>8.1f} "
                f"{getattr(check.replay, name):>7.1f} {check.replay_errors[name]:>+6.0%} "
                f"{check.steady_errors[name]:>+6.0%} "
                f"{check.captured_errors[name]:>+6.0%} {check.prior_errors[name]:>+6.0%}"
            )
        lines.append(
            f"{'':>12} step-time rms error: fitted {check.step_rms:.1%}, prior {check.prior_step_rms:.1%}"
        )
    return "\n".join(lines)


def test_twin_fitted_on_real_vllm_predicts_other_loads_and_budgets(
    vllm_server: EngineServer, startup_scheduler: SchedulerConfig, tiny_model_dir: Path, tmp_path: Path
) -> None:
    started = time.monotonic()
    url = vllm_server.url
    pairs = lengths(REQUESTS, 3, (32, 1536), (8, 64))
    try:
        _set_budget(vllm_server, STARTUP_BUDGET)
        # New batch shapes are slow the first time: one short burst first, not measured.
        observe(url, SERVED_MODEL_NAME, STARTUP_BUDGET, poisson_requests(pairs[:20], FIT_RATE, 99), FIT_RATE)
        fit_window = observe(
            url,
            SERVED_MODEL_NAME,
            STARTUP_BUDGET,
            poisson_requests(pairs, FIT_RATE, 1),
            FIT_RATE,
            offset=1000,
        )
        windows = [fit_window]
        for i, (budget, rate) in enumerate(POINTS):
            _set_budget(vllm_server, budget)
            sent = poisson_requests(pairs, rate, 10 + i)
            windows.append(observe(url, SERVED_MODEL_NAME, budget, sent, rate, offset=2000 * (i + 2)))
    finally:
        _set_budget(vllm_server, STARTUP_BUDGET)
    measured_s = time.monotonic() - started

    fit = fit_steps(fit_window.steps, str(tiny_model_dir / "config.json"), ACCELERATOR)
    checks = compare(fit, fit_window, windows, startup_scheduler, tmp_path)
    print(
        f"\nfit on {fit.steps:.0f} steps in {fit.buckets} buckets: {fit.scales}; step-time rms error "
        f"{fit.rms_relative_error:.1%} (prior {fit.prior_rms_relative_error:.1%}); "
        f"ingest {checks[0].ingest_ms:.1f} ms; traffic {measured_s:.0f}s, "
        f"total {time.monotonic() - started:.0f}s\n" + _table(checks)
    )
    report = os.environ.get("CHUNKPILOT_TWIN_REAL_JSON")
    if report:
        document: dict[str, Any] = {
            "scales": asdict(fit.scales),
            "fit_steps": fit.steps,
            "fit_rms_relative_error": fit.rms_relative_error,
            "prior_rms_relative_error": fit.prior_rms_relative_error,
            "checks": [asdict(check) for check in checks],
        }
        Path(report).write_text(json.dumps(document, indent=1) + "\n")

    # Every window saw its traffic: the engine's histograms have the quantiles.
    for check in checks:
        assert all(math.isfinite(getattr(check.measured, name)) for name in QUANTILE_NAMES), check
    # In-sample and out of sample, the fitted step model explains the step telemetry better than
    # the datasheet CPU prior (whose errors are 60-70%).
    assert fit.rms_relative_error < min(MAX_FIT_ERROR, 0.5 * fit.prior_rms_relative_error)
    roofline_only = step_rms_error(fit, fit_window.steps, corrected=False)
    assert fit.rms_relative_error == pytest.approx(roofline_only)
    # The measured buckets' corrections take out part of what the roofline's shape cannot fit.
    assert step_rms_error(fit, fit_window.steps) < roofline_only
    for check in checks[1:]:
        assert check.step_rms < check.prior_step_rms, (check.budget, check.rate_req_s)
    # The latency quantiles' errors (ITL p50 included) depend on how fast and how quiet the machine is
    # (a run 40% faster than the documented ones put the twin's ITL p50 at +34% against the prior's
    # -28%): they are measured and printed above, and kept in docs/benchmarks.md, never asserted.
