"""The operator's own metrics, scraped over real HTTP."""

from __future__ import annotations

import socket
import urllib.request
import uuid

from chunkpilot import telemetry


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_metrics_are_served_and_forgotten() -> None:
    port = _free_port()
    ns = f"ns-{uuid.uuid4().hex[:8]}"  # the registry is process-wide: other tests' series share it
    telemetry.start_metrics_server(port, address="127.0.0.1")
    telemetry.TOKEN_BUDGET.labels(ns, "chat", "stable").set(2048)
    telemetry.TOKEN_BUDGET.labels(ns, "other", "stable").set(512)
    telemetry.record_slo_targets(ns, "chat", ((0.99, 50), (0.95, 2000)))
    telemetry.TRIALS_FINISHED.labels(ns, "chat", "Promoted").inc()

    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert f'chunkpilot_token_budget_tokens{{namespace="{ns}",service="chat",track="stable"}} 2048.0' in body
    slo_labels = f'metric="itl",namespace="{ns}",quantile="0.99",service="chat"'
    slo_line = "chunkpilot_slo_target_seconds{" + slo_labels + "} 0.05"
    assert slo_line in body
    assert (
        f'chunkpilot_trials_finished_total{{namespace="{ns}",service="chat",verdict="Promoted"}} 1.0' in body
    )

    telemetry.forget_service(ns, "chat")
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert f'namespace="{ns}",service="chat"' not in body
    assert f'namespace="{ns}",quantile="0.99",service="chat"' not in body
    assert f'namespace="{ns}",service="other"' in body
