"""End to end: a disaggregated InferenceService serves through the real vllm-router on the local stack.

The operator renders a prefill pool, a decode pool and a router Deployment; the pod runner runs
simulator processes in the prefill and decode roles (the KV cache of each request moves from the
prefill engine to the decode engine at the configured bandwidth) and the installed ``vllm-router``
in front of them, with the Ready engines its selectors match. Streaming requests go where the
Service sends them, to the router; the real Prometheus, selecting by the pools' ``role`` label,
shows the prefill pool computing the prompts (and one token per request) and the decode pool
generating the rest.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from chunkpilot.devcluster.prometheus import PrometheusServer
from chunkpilot.localrun.stack import LocalStack
from chunkpilot.testing.e2e import (
    apply_service,
    disaggregated_service_manifest,
    fresh_service,
    stream_completions,
    wait_until,
)
from chunkpilot.testing.kube import get_json
from chunkpilot.testing.metrics import query_value
from chunkpilot.testing.stack import StartStack

pytestmark = [pytest.mark.e2e, pytest.mark.cluster, pytest.mark.prometheus, pytest.mark.timeout(600)]

MODEL = "llama-8b"
#: (prompt words, output tokens): short chats and a few longer prompts, kept cheap to replay.
REQUESTS = [(60 + 37 * (i % 7), 4 + i % 9) for i in range(24)]


@pytest.fixture
def stack(start_stack: StartStack) -> LocalStack:
    return start_stack("disagg", tuner=False)


def test_disaggregated_service_streams_through_the_router_with_both_pools_counting(
    stack: LocalStack, prometheus: PrometheusServer
) -> None:
    started = time.monotonic()
    plane, runner, namespace, name = fresh_service(stack, "disagg", "pd")
    cluster = apply_service(stack, disaggregated_service_manifest(name, namespace, MODEL))
    try:
        # The Service's traffic goes to the router, the only endpoint of a disaggregated service.
        if not runner.wait_for(lambda: bool(runner.ready_endpoints(name, namespace)), 180):
            stack.check_operator()
            pytest.fail(
                f"no Ready router after 180s; pods: {runner.pods()}; "
                f"conditions: {cluster.status().get('conditions')}"
            )
        (endpoint,) = runner.ready_endpoints(name, namespace)
        reports = [r for r in runner.pods() if r.namespace == namespace]
        (router,) = [r for r in reports if r.router]
        assert endpoint.pod == router.pod and router.workers is not None
        engines = {r.role: r for r in reports if not r.router}
        assert sorted(engines) == ["decode", "prefill"]
        assert router.workers.prefill == (f"http://127.0.0.1:{engines['prefill'].port}",)
        assert router.workers.decode == (f"http://127.0.0.1:{engines['decode'].port}",)
        # The operator's Service selects exactly what the local kube-proxy sends to: the router pod.
        selector = get_json(plane, namespace, "service", name)["spec"]["selector"]
        pods = get_json(plane, namespace, "pods")["items"]
        selected = [
            p["metadata"]["name"] for p in pods if selector.items() <= p["metadata"]["labels"].items()
        ]
        assert selected == [router.pod]
        serving_s = time.monotonic() - started

        answers = stream_completions(endpoint.url, MODEL, REQUESTS, concurrency=4)
        assert [a.error for a in answers] == [""] * len(REQUESTS)
        # Each stream carries exactly the tokens asked for, and its usage says so.
        assert [a.text_chunks for a in answers] == [m for _, m in REQUESTS]
        assert [a.completion_tokens for a in answers] == [m for _, m in REQUESTS]
        assert all(a.prompt_tokens >= words for a, (words, _) in zip(answers, REQUESTS, strict=True))

        where = f'namespace="{namespace}",service="{name}"'
        prompt_tokens = sum(a.prompt_tokens for a in answers)
        expected = {
            # The prefill pool computes every prompt and one token per request (discarded by the router).
            f'sum(vllm:prompt_tokens_total{{{where},role="prefill"}})': prompt_tokens,
            f'sum(vllm:generation_tokens_total{{{where},role="prefill"}})': len(REQUESTS),
            f'sum(vllm:request_success_total{{{where},role="prefill"}})': len(REQUESTS),
            # The decode pool generates what the client received.
            f'sum(vllm:generation_tokens_total{{{where},role="decode"}})': sum(m for _, m in REQUESTS),
            f'sum(vllm:request_success_total{{{where},role="decode"}})': len(REQUESTS),
            # Each request's KV reached the decode engine in one transfer (vLLM's NIXL metrics).
            f'sum(vllm:nixl_xfer_time_seconds_count{{{where},role="decode"}})': len(REQUESTS),
        }

        def scraped() -> dict[str, float]:
            return {promql: query_value(prometheus, promql) for promql in expected}

        assert runner.wait_for(lambda: scraped() == expected, 60), scraped()

        # The status shows both pools and the router Ready.
        def ready_topology() -> dict[str, Any] | None:
            topology: dict[str, Any] = cluster.status().get("topology") or {}
            parts = ("prefill", "decode", "router")
            return topology if all((topology.get(p) or {}).get("readyReplicas") == 1 for p in parts) else None

        topology = wait_until("the status to show both pools ready", ready_topology, 60, cluster)
        print(
            json.dumps(
                {
                    "seconds_to_serving": round(serving_s, 1),
                    "seconds_total": round(time.monotonic() - started, 1),
                    "ttft_ms_median": round(sorted(a.ttft_s for a in answers)[len(answers) // 2] * 1000, 1),
                    "prompt_tokens": prompt_tokens,
                    "topology": topology,
                }
            )
        )
    finally:
        cluster.close()
        plane.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
