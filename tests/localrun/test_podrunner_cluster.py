"""The pod runner on the real local control plane, with real simulator processes and Prometheus."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chunkpilot.devcluster.controlplane import ControlPlane
from chunkpilot.devcluster.prometheus import PrometheusServer
from chunkpilot.localrun.endpoints import CONFIG_HASH_LABEL, SERVICE_LABEL, TRACK_LABEL, RoundRobinBalancer
from chunkpilot.localrun.loadgen import LoadOptions, run_load
from chunkpilot.localrun.podrunner import PodRunner
from chunkpilot.localrun.podspec import INJECT_CRASH_ANNOTATION, ContainerPhase
from chunkpilot.localrun.process import probe_health
from chunkpilot.localrun.targets import read_targets
from chunkpilot.localrun.traces import TraceRequest, wall_schedule
from chunkpilot.testing.deployments import sim_deployment
from chunkpilot.testing.kube import apply_manifest, get_json, pod_ready, scratch_namespace
from chunkpilot.testing.metrics import query_value

pytestmark = [pytest.mark.cluster, pytest.mark.prometheus, pytest.mark.slow, pytest.mark.timeout(300)]

ENGINE_ARGS = ["llama-3.1-8b", "--max-num-batched-tokens", "512", "--max-num-seqs", "32", "--gpu", "h100"]
WAIT_S = 90.0


def engine_deployment(
    name: str, service: str, track: str, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    """A Deployment shaped like the operator's engine Deployments (simulator engine)."""
    labels = {SERVICE_LABEL: service, TRACK_LABEL: track, CONFIG_HASH_LABEL: "0123abcd"}
    return sim_deployment(
        name,
        labels,
        [*ENGINE_ARGS, "--host", "0.0.0.0", "--port", "8000"],
        selector={SERVICE_LABEL: service, TRACK_LABEL: track},
        annotations=annotations or {},
        http_port=True,
    )


@pytest.fixture
def namespace(control_plane: ControlPlane) -> Iterator[str]:
    with scratch_namespace(control_plane, "localrun") as name:
        yield name


def engine_pods(runner: PodRunner, namespace: str, service: str) -> list[str]:
    return [
        report.pod for report in runner.pods() if report.namespace == namespace and report.service == service
    ]


def available_replicas(control_plane: ControlPlane, namespace: str, deployment: str) -> int:
    status = get_json(control_plane, namespace, "deployment", deployment).get("status", {})
    return int(status.get("availableReplicas") or 0)


def test_engine_pod_runs_serves_is_scraped_and_stops_with_its_pod(
    control_plane: ControlPlane, prometheus: PrometheusServer, pod_runner: PodRunner, namespace: str
) -> None:
    apply_manifest(control_plane, namespace, engine_deployment("chat-canary", "chat", "canary"))
    assert pod_runner.wait_for(lambda: len(pod_runner.ready_endpoints("chat", namespace)) == 1, WAIT_S), (
        f"no Ready engine; runner state: {pod_runner.pods()}"
    )
    (endpoint,) = pod_runner.ready_endpoints("chat", namespace)
    assert endpoint.track == "canary" and endpoint.config_hash == "0123abcd"
    assert pod_runner.wait_for(
        lambda: available_replicas(control_plane, namespace, "chat-canary") == 1, WAIT_S
    )

    # Prometheus discovers the engine through file_sd and keeps the pod's labels on its series.
    prometheus.wait_for_target_up(endpoint.address, timeout=WAIT_S)
    up = prometheus.query(f'up{{track="canary",namespace="{namespace}"}}')
    assert [series["metric"]["pod"] for series in up] == [endpoint.pod]

    # The load generator completes every request against the Ready endpoint.
    schedule = wall_schedule([TraceRequest(i * 0.05, 64 + i, 8) for i in range(20)])
    balancer = RoundRobinBalancer(pod_runner.endpoint_source("chat", namespace))
    summary = asyncio.run(run_load(schedule, balancer, LoadOptions(duration_s=60, request_timeout_s=60)))
    assert summary.completed == 20, summary.format()
    assert summary.by_track == {"canary": 20}
    assert summary.ttft_ms.count == 20 and summary.itl_ms.count == 20 * 7
    promql = f'sum(vllm:request_success_total{{track="canary",namespace="{namespace}"}})'
    assert pod_runner.wait_for(lambda: query_value(prometheus, promql) >= 20, WAIT_S)

    # Deleting the pod's Deployment stops the engine and removes the scrape target.
    control_plane.kubectl("delete", "-n", namespace, "deployment", "chat-canary", "--wait=false")
    assert pod_runner.wait_for(lambda: not engine_pods(pod_runner, namespace, "chat"), WAIT_S)
    assert pod_runner.wait_for(lambda: not probe_health(endpoint.host, endpoint.port), WAIT_S)
    assert endpoint not in read_targets(prometheus.targets_file)
    assert pod_runner.ready_endpoints("chat", namespace) == []


def test_crashed_engine_makes_the_pod_not_ready_and_is_restarted(
    control_plane: ControlPlane, pod_runner: PodRunner, namespace: str
) -> None:
    apply_manifest(control_plane, namespace, engine_deployment("chat-stable", "chat", "stable"))
    assert pod_runner.wait_for(lambda: len(pod_runner.ready_endpoints("chat", namespace)) == 1, WAIT_S)
    (pod,) = engine_pods(pod_runner, namespace, "chat")
    assert pod_runner.wait_for(lambda: pod_ready(control_plane, namespace, pod), WAIT_S)

    assert pod_runner.crash(pod, namespace)
    assert pod_runner.wait_for(lambda: not pod_ready(control_plane, namespace, pod), WAIT_S)
    status = get_json(control_plane, namespace, "pod", pod)["status"]
    (container,) = status["containerStatuses"]
    assert container["lastState"]["terminated"]["exitCode"] == 137

    # The kubelet stand-in restarts it after back-off; the restart count shows in the API.
    assert pod_runner.wait_for(lambda: pod_ready(control_plane, namespace, pod), WAIT_S)
    (container,) = get_json(control_plane, namespace, "pod", pod)["status"]["containerStatuses"]
    assert container["restartCount"] == 1


def test_inject_crash_annotation_keeps_a_canary_in_crash_loop_back_off(
    control_plane: ControlPlane, pod_runner: PodRunner, namespace: str
) -> None:
    deployment = engine_deployment("chat-canary", "chat", "canary", {INJECT_CRASH_ANNOTATION: "true"})
    apply_manifest(control_plane, namespace, deployment)
    assert pod_runner.wait_for(lambda: len(engine_pods(pod_runner, namespace, "chat")) == 1, WAIT_S)
    (pod,) = engine_pods(pod_runner, namespace, "chat")

    def restarted_twice() -> bool:
        status = get_json(control_plane, namespace, "pod", pod).get("status", {})
        return any(c.get("restartCount", 0) >= 2 for c in status.get("containerStatuses", []))

    assert pod_runner.wait_for(restarted_twice, WAIT_S)
    (report,) = [r for r in pod_runner.pods() if r.pod == pod]
    assert report.phase is not ContainerPhase.RUNNING
    assert not pod_ready(control_plane, namespace, pod)
    assert available_replicas(control_plane, namespace, "chat-canary") == 0
    assert pod_runner.ready_endpoints("chat", namespace) == []


def test_secret_env_waits_for_the_secret_then_reaches_the_engine(
    control_plane: ControlPlane, pod_runner: PodRunner, namespace: str
) -> None:
    deployment = engine_deployment("chat-stable", "chat", "stable")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["env"] = [
        {"name": "PLAIN", "value": "1"},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "chat-token", "key": "token"}}},
    ]
    apply_manifest(control_plane, namespace, deployment)

    def waiting_reason() -> str | None:
        for pod in get_json(control_plane, namespace, "pods").get("items", []):
            for entry in pod.get("status", {}).get("containerStatuses", []):
                waiting = entry.get("state", {}).get("waiting") or {}
                return str(waiting.get("reason")) if waiting else None
        return None

    # No Secret yet: the engine is not started and the pod says why, as with the kubelet.
    assert pod_runner.wait_for(lambda: waiting_reason() == "CreateContainerConfigError", WAIT_S)
    (report,) = [r for r in pod_runner.pods() if r.namespace == namespace]
    assert report.phase is ContainerPhase.CONFIG_ERROR and report.pid is None
    assert pod_runner.ready_endpoints("chat", namespace) == []

    control_plane.kubectl(
        "create", "secret", "generic", "chat-token", "-n", namespace, "--from-literal=token=t0ken"
    )
    assert pod_runner.wait_for(lambda: len(pod_runner.ready_endpoints("chat", namespace)) == 1, WAIT_S)
    (report,) = [r for r in pod_runner.pods() if r.namespace == namespace]
    assert report.pid is not None and report.restart_count == 0
    environ = Path(f"/proc/{report.pid}/environ").read_bytes().split(b"\0")
    assert b"TOKEN=t0ken" in environ and b"PLAIN=1" in environ
