"""Prometheus metrics the operator and the tuner export about themselves.

Engine latency comes from the engines' own ``vllm:*`` metrics; these series add
what only the control loop knows (the budget each track runs, the SLO targets,
trial progress), so dashboards can draw SLO lines, budget over time and trials
as annotations. Served by :func:`start_metrics_server` in the operator process.

Each series has one writer: the reconciler sets the engine-config gauges and the SLO
targets from what it observes (``chunkpilot.operator.reconcile.export_metrics``); the
tuner sets the trial gauge and counts finished trials.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

REGISTRY: Final = CollectorRegistry(auto_describe=True)


def _engine_config_gauge(name: str, flag: str) -> Gauge:
    """The value of the engine flag ``flag`` per track of a service."""
    return Gauge(
        name,
        f"{flag} the track's engine pods run with.",
        ["namespace", "service", "track"],
        registry=REGISTRY,
    )


TOKEN_BUDGET: Final = _engine_config_gauge("chunkpilot_token_budget_tokens", "max-num-batched-tokens")
MAX_NUM_SEQS: Final = _engine_config_gauge("chunkpilot_max_num_seqs", "max-num-seqs")
SLO_TARGET_SECONDS: Final = Gauge(
    "chunkpilot_slo_target_seconds",
    "Declared latency SLO: the quantile of the metric must stay at or below this value.",
    ["namespace", "service", "metric", "quantile"],
    registry=REGISTRY,
)
CURRENT_TRIAL: Final = Gauge(
    "chunkpilot_current_trial_number",
    "Number of the trial now running (0 when none).",
    ["namespace", "service"],
    registry=REGISTRY,
)
DESIRED_REPLICAS: Final = Gauge(
    "chunkpilot_desired_replicas",
    "Stable replicas the capacity planner asks for (spec.scaling.mode Advise or Auto).",
    ["namespace", "service"],
    registry=REGISTRY,
)
CAPACITY_PER_REPLICA: Final = Gauge(
    "chunkpilot_capacity_per_replica_requests_per_second",
    "The twin's capacity at SLO of one stable replica, less its error: what the planner sizes with.",
    ["namespace", "service"],
    registry=REGISTRY,
)
KUBE_REQUESTS: Final = Counter(
    "chunkpilot_kube_requests",
    "Kubernetes API requests the operator and the tuner sent through their own client (Kopf's "
    "watches and patches not included), by the RBAC verb and resource they need.",
    ["verb", "resource"],
    registry=REGISTRY,
)
TUNER_TICK_SECONDS: Final = Histogram(
    "chunkpilot_tuner_tick_seconds",
    "Wall-clock seconds of one tuning step of one service (observe, decide, act), queueing included.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0),
    registry=REGISTRY,
)
TRIALS_FINISHED: Final = Counter(
    "chunkpilot_trials_finished",
    "Finished tuning trials by verdict.",
    ["namespace", "service", "verdict"],
    registry=REGISTRY,
)


def record_slo_targets(
    namespace: str, service: str, targets: tuple[tuple[float, float], tuple[float, float]] | None
) -> None:
    """Export the ITL and TTFT targets, each ``(quantile, max_ms)``; None: the service has no SLO.

    A changed quantile replaces the series of the old one.
    """
    wanted = {}
    if targets is not None:
        for metric, (quantile, max_ms) in zip(("itl", "ttft"), targets, strict=True):
            wanted[(namespace, service, metric, f"{quantile:g}")] = max_ms / 1000.0
    _forget(SLO_TARGET_SECONDS, namespace, service, keep=wanted.keys())
    for labels, seconds in wanted.items():
        SLO_TARGET_SECONDS.labels(*labels).set(seconds)


def record_scaling(namespace: str, service: str, desired: int | None, capacity_req_s: float | None) -> None:
    """Export the planner's desired replicas and capacity per replica (None: drop the series)."""
    for gauge, value in ((DESIRED_REPLICAS, desired), (CAPACITY_PER_REPLICA, capacity_req_s)):
        if value is None:
            _forget(gauge, namespace, service)
        else:
            gauge.labels(namespace, service).set(value)


def _forget(
    metric: Gauge | Counter, namespace: str, service: str, keep: Iterable[tuple[str, ...]] = ()
) -> None:
    kept = set(keep)
    for labels in list(metric._metrics):  # prometheus_client keeps children keyed by label values
        if labels[:2] == (namespace, service) and labels not in kept:
            metric.remove(*labels)


def forget_service(namespace: str, service: str) -> None:
    """Drop every series of a deleted service."""
    for metric in (
        TOKEN_BUDGET,
        MAX_NUM_SEQS,
        SLO_TARGET_SECONDS,
        CURRENT_TRIAL,
        TRIALS_FINISHED,
        DESIRED_REPLICAS,
        CAPACITY_PER_REPLICA,
    ):
        _forget(metric, namespace, service)


def start_metrics_server(port: int, address: str = "0.0.0.0") -> None:
    """Serve ``/metrics`` for :data:`REGISTRY` on ``address:port`` in a background thread."""
    start_http_server(port, addr=address, registry=REGISTRY)
