"""Router pods on the real local control plane: the real ``vllm-router`` in front of simulator pools.

Hand-made Deployments shaped like the operator's disaggregated rendering: a router pod whose
``vllm-router`` uses Kubernetes service discovery with prefill and decode selectors, and one
Deployment per pool with ``chunkpilot.io/role`` labels. The pod runner runs the router with
static lists of the Ready engine processes instead, and the service's traffic goes to the router.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from chunkpilot.devcluster.controlplane import ControlPlane
from chunkpilot.devcluster.prometheus import PrometheusServer
from chunkpilot.localrun.endpoints import COMPONENT_LABEL, CONFIG_HASH_LABEL, ROLE_LABEL, SERVICE_LABEL
from chunkpilot.localrun.endpoints import TRACK_LABEL as TRACK
from chunkpilot.localrun.podrunner import PodReport, PodRunner
from chunkpilot.localrun.podspec import ContainerPhase
from chunkpilot.localrun.targets import read_targets, targets_file_source
from chunkpilot.testing.deployments import router_args, sim_deployment
from chunkpilot.testing.e2e import stream_completions
from chunkpilot.testing.kube import apply_manifest, get_json, pod_ready, scratch_namespace
from chunkpilot.testing.metrics import query_value

pytestmark = [pytest.mark.cluster, pytest.mark.prometheus, pytest.mark.slow, pytest.mark.timeout(300)]

MODEL = "llama-8b"
ENGINE_ARGS = ["llama-3.1-8b", "--served-model-name", MODEL, "--max-num-seqs", "32", "--gpu", "h100"]
#: Both roles of vLLM's NIXL connector; the simulator moves each request's KV at this bandwidth.
KV_ARGS = [
    "--kv-transfer-config",
    '{"kv_connector":"NixlConnector","kv_role":"kv_both"}',
    "--kv-bandwidth-gbps",
    "25",
    "--kv-latency-ms",
    "1",
]
WAIT_S = 90.0


def pool_deployment(service: str, role: str, replicas: int = 1) -> dict[str, Any]:
    """One pool of a disaggregated service, labelled as the operator labels it."""
    labels = {SERVICE_LABEL: service, TRACK: "stable", CONFIG_HASH_LABEL: f"{role}0000", ROLE_LABEL: role}
    return sim_deployment(
        f"{service}-{role}",
        labels,
        [*ENGINE_ARGS, "--host", "0.0.0.0", "--port", "8000", *KV_ARGS],
        selector={SERVICE_LABEL: service, TRACK: "stable", ROLE_LABEL: role},
        replicas=replicas,
    )


def router_deployment(service: str, namespace: str) -> dict[str, Any]:
    """The router in front of both pools: vllm-router with Kubernetes service discovery.

    ``namespace`` may be ``$(POD_NAMESPACE)``: the container's env has it from the pod's namespace.
    """
    labels = {SERVICE_LABEL: service, COMPONENT_LABEL: "router"}
    args = router_args(service, namespace, "round_robin")
    probe = {"httpGet": {"path": "/readiness", "port": "http"}}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": f"{service}-router", "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": 5,
                    "containers": [
                        {
                            "name": "router",
                            "image": "ghcr.io/chunkpilot/chunkpilot:test",
                            "command": ["vllm-router"],
                            "args": args,
                            "ports": [{"name": "http", "containerPort": 8000}],
                            "readinessProbe": probe,
                            "env": [
                                {
                                    "name": "POD_NAMESPACE",
                                    "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
                                }
                            ],
                        }
                    ],
                },
            },
        },
    }


@pytest.fixture
def namespace(control_plane: ControlPlane) -> Iterator[str]:
    with scratch_namespace(control_plane, "router") as name:
        yield name


def router_report(runner: PodRunner, namespace: str) -> PodReport | None:
    return next((r for r in runner.pods() if r.namespace == namespace and r.router), None)


def test_router_serves_a_disaggregated_service_through_both_pools(
    control_plane: ControlPlane, prometheus: PrometheusServer, pod_runner: PodRunner, namespace: str
) -> None:
    service = f"pd-{uuid.uuid4().hex[:6]}"
    apply_manifest(control_plane, namespace, router_deployment(service, namespace))
    apply_manifest(control_plane, namespace, pool_deployment(service, "prefill"))

    # Without a Ready decode engine no router can run: the pod is not Ready, the service has no
    # endpoint, and the prefill engine alone is not reachable as the service.
    assert pod_runner.wait_for(
        lambda: (
            any(
                r.namespace == namespace and r.role == "prefill" and r.phase is ContainerPhase.RUNNING
                for r in pod_runner.pods()
            )
            and router_report(pod_runner, namespace) is not None
        ),
        WAIT_S,
    ), pod_runner.pods()
    waiting = router_report(pod_runner, namespace)
    assert waiting is not None and waiting.phase is ContainerPhase.NO_WORKERS and waiting.pid is None
    assert pod_runner.ready_endpoints(service, namespace) == []
    assert targets_file_source(prometheus.targets_file, service, namespace) == []
    assert pod_runner.wait_for(lambda: not pod_ready(control_plane, namespace, waiting.pod), WAIT_S)

    apply_manifest(control_plane, namespace, pool_deployment(service, "decode"))
    assert pod_runner.wait_for(lambda: len(pod_runner.ready_endpoints(service, namespace)) == 1, WAIT_S), (
        pod_runner.pods()
    )
    (endpoint,) = pod_runner.ready_endpoints(service, namespace)
    report = router_report(pod_runner, namespace)
    assert report is not None and endpoint.pod == report.pod and report.workers is not None
    engines = {r.role: r for r in pod_runner.pods() if r.namespace == namespace and not r.router}
    assert report.workers.prefill == (f"http://127.0.0.1:{engines['prefill'].port}",)
    assert report.workers.decode == (f"http://127.0.0.1:{engines['decode'].port}",)
    assert pod_runner.wait_for(lambda: pod_ready(control_plane, namespace, report.pod), WAIT_S)
    # A load generator in another process finds the router, not the engines, in the targets files.
    assert targets_file_source(prometheus.targets_file, service, namespace) == [endpoint]

    # Streaming requests through the router: every stream carries exactly the tokens asked for.
    requests = [(40 + 3 * i, 6 + i % 5) for i in range(16)]
    answers = stream_completions(endpoint.url, MODEL, requests)
    assert [a.error for a in answers] == [""] * len(requests)
    assert [a.completion_tokens for a in answers] == [m for _, m in requests]
    assert [a.text_chunks for a in answers] == [m for _, m in requests]
    prompt_tokens = sum(a.prompt_tokens for a in answers)
    assert prompt_tokens >= sum(words for words, _ in requests)

    # The pools' engines are scrape targets with their role; the router is not an engine target.
    roles = {e.role for e in read_targets(prometheus.targets_file) if e.namespace == namespace}
    assert roles == {"prefill", "decode"}
    where = f'namespace="{namespace}",service="{service}"'
    # The prefill pool computed each prompt and one token per request; decode streamed the rest.
    generated = sum(m for _, m in requests)
    expected = {
        f'sum(vllm:request_success_total{{{where},role="prefill"}})': len(requests),
        f'sum(vllm:prompt_tokens_total{{{where},role="prefill"}})': prompt_tokens,
        f'sum(vllm:generation_tokens_total{{{where},role="prefill"}})': len(requests),
        f'sum(vllm:generation_tokens_total{{{where},role="decode"}})': generated,
        f'sum(vllm:request_success_total{{{where},role="decode"}})': len(requests),
        # Each request's KV reached the decode engine in one transfer (vLLM's NIXL metrics).
        f'sum(vllm:nixl_xfer_time_seconds_count{{{where},role="decode"}})': len(requests),
    }

    def scraped() -> dict[str, float]:
        return {promql: query_value(prometheus, promql) for promql in expected}

    assert pod_runner.wait_for(lambda: scraped() == expected, WAIT_S), scraped()


def test_router_follows_its_pools_restarts_after_a_crash_and_stops_without_a_decode_engine(
    control_plane: ControlPlane, pod_runner: PodRunner, namespace: str
) -> None:
    service = f"pd-{uuid.uuid4().hex[:6]}"
    apply_manifest(control_plane, namespace, pool_deployment(service, "prefill"))
    apply_manifest(control_plane, namespace, pool_deployment(service, "decode"))
    apply_manifest(control_plane, namespace, router_deployment(service, "$(POD_NAMESPACE)"))
    assert pod_runner.wait_for(lambda: len(pod_runner.ready_endpoints(service, namespace)) == 1, WAIT_S)

    # A second prefill replica becomes Ready: the router is restarted with both.
    apply_manifest(control_plane, namespace, pool_deployment(service, "prefill", replicas=2))

    def prefill_workers() -> int:
        report = router_report(pod_runner, namespace)
        return 0 if report is None or report.workers is None else len(report.workers.prefill)

    assert pod_runner.wait_for(lambda: prefill_workers() == 2, WAIT_S), pod_runner.pods()
    assert pod_runner.wait_for(lambda: len(pod_runner.ready_endpoints(service, namespace)) == 1, WAIT_S)
    (endpoint,) = pod_runner.ready_endpoints(service, namespace)
    answers = stream_completions(endpoint.url, MODEL, [(30, 4)] * 4)
    assert [a.completion_tokens for a in answers] == [4] * 4, answers
    report = router_report(pod_runner, namespace)
    assert report is not None and report.restart_count == 0

    # A crashed router is restarted after back-off, like an engine; the restart shows in the API.
    assert pod_runner.crash(report.pod, namespace)
    assert pod_runner.wait_for(lambda: not pod_ready(control_plane, namespace, report.pod), WAIT_S)
    assert pod_runner.wait_for(lambda: pod_ready(control_plane, namespace, report.pod), WAIT_S)
    (container,) = get_json(control_plane, namespace, "pod", report.pod)["status"]["containerStatuses"]
    assert container["name"] == "router" and container["restartCount"] == 1
    assert container["lastState"]["terminated"]["exitCode"] == 137

    # Without a decode engine the router stops and the service has no endpoint until one is back.
    control_plane.kubectl("delete", "-n", namespace, "deployment", f"{service}-decode", "--wait=false")

    def router_phase() -> ContainerPhase | None:
        found = router_report(pod_runner, namespace)
        return None if found is None else found.phase

    assert pod_runner.wait_for(lambda: router_phase() is ContainerPhase.NO_WORKERS, WAIT_S), pod_runner.pods()
    assert pod_runner.ready_endpoints(service, namespace) == []
    assert pod_runner.wait_for(lambda: not pod_ready(control_plane, namespace, report.pod), WAIT_S)
