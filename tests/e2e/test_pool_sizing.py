"""End to end: the planner sizes a disaggregated service's prefill and decode pools on the local stack.

The operator with the tuner, the pod runner's simulator engines in both roles behind the real
vllm-router, a real Prometheus selecting each pool by its ``role`` label, load in real time. In
Advise the tuner judges the service's SLOs on its pools, fits the pools' twin on their own
telemetry and publishes each pool's decision with one replica's capacity of that pool, acting on
nothing; in Auto (with two replicas a pool at
least) the operator renders each pool's decision and the runner starts the new engines.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from chunkpilot.localrun.stack import LocalStack
from chunkpilot.testing.e2e import (
    ServiceObjects,
    apply_service,
    disaggregated_service_manifest,
    fresh_service,
    start_poisson_load,
    wait_until,
)
from chunkpilot.testing.stack import StartStack

pytestmark = [pytest.mark.e2e, pytest.mark.cluster, pytest.mark.prometheus, pytest.mark.timeout(600)]

WINDOW = "20s"


@pytest.fixture
def stack(start_stack: StartStack) -> LocalStack:
    return start_stack("poolsizing")


def manifest(name: str, namespace: str) -> dict[str, Any]:
    body = disaggregated_service_manifest(name, namespace)
    spec = body["spec"]
    spec["slo"]["window"] = WINDOW
    spec["autotune"] = {"enabled": True, "trialWindow": WINDOW, "warmup": "5s", "abort": {"minSamples": 20}}
    spec["scaling"] = {"mode": "Advise", "minReplicas": 1, "maxReplicas": 3}
    return body


def pools(cluster: ServiceObjects) -> dict[str, dict[str, Any]]:
    """The planner's decision per pool, once both pools have one with a capacity."""
    found = {p["role"]: p for p in (cluster.status().get("scaling") or {}).get("pools") or []}
    ready = len(found) == 2 and all(
        p.get("desiredReplicas") and p.get("capacityPerReplicaReqS") for p in found.values()
    )
    return found if ready else {}


def test_advise_publishes_each_pools_decision_and_auto_runs_it(stack: LocalStack) -> None:
    plane, runner, namespace, name = fresh_service(stack, "pools", "pd")
    cluster = apply_service(stack, manifest(name, namespace))
    load = None
    try:
        if not runner.wait_for(lambda: bool(runner.ready_endpoints(name, namespace)), 180):
            stack.check_operator()
            pytest.fail(f"no Ready router after 180s; pods: {runner.pods()}")
        load = start_poisson_load(
            stack, name, namespace, rate=3.0, max_prompt_tokens=2000, max_output_tokens=32, duration_s=400
        )
        # Advise: each pool's decision and one replica's capacity of that pool, on the pools' own twin.
        advised = wait_until("both pools sized in Advise", lambda: pools(cluster), 240, cluster)
        prefill, decode = advised["prefill"], advised["decode"]
        assert prefill["reason"].startswith("prefill: ") and decode["reason"].startswith("decode: ")
        assert prefill["capacityLowReqS"] < prefill["capacityPerReplicaReqS"]
        scaling = cluster.status()["scaling"]
        assert scaling["mode"] == "Advise" and scaling["liveRateReqS"] > 0
        assert scaling["desiredReplicas"] == prefill["desiredReplicas"] + decode["desiredReplicas"]
        # The service's SLO state is read from its pools, as its clients see them.
        slo_met = wait_until(
            "SLOMet judged from the pools",
            lambda: (c := cluster.condition("SLOMet")) and c.get("reason") != "InsufficientData" and c,
            60,
            cluster,
        )
        assert slo_met["status"] in ("True", "False") and "ITL" in slo_met["message"]
        for role in ("prefill", "decode"):  # Advise acts on nothing
            assert (
                plane.kubectl(
                    "get", "deployment", f"{name}-{role}", "-n", namespace, "-o", "jsonpath={.spec.replicas}"
                ).stdout
                == "1"
            )
        # Auto with two replicas a pool at least: the operator renders each pool's decision.
        patch = {"spec": {"scaling": {"mode": "Auto", "minReplicas": 2}}}
        plane.kubectl("patch", "cpis", name, "-n", namespace, "--type=merge", "-p", json.dumps(patch))

        def rendered() -> bool:
            decided = pools(cluster)
            if not decided or cluster.status()["scaling"].get("mode") != "Auto":
                return False
            for role, pool in decided.items():
                replicas = plane.kubectl(
                    "get",
                    "deployment",
                    f"{name}-{role}",
                    "-n",
                    namespace,
                    "-o",
                    "jsonpath={.status.readyReplicas}",
                ).stdout
                if pool["desiredReplicas"] < 2 or replicas != str(pool["desiredReplicas"]):
                    return False
            return True

        wait_until("each pool's decision run in Auto", rendered, 180, cluster)
        print(json.dumps({"advised": advised, "auto": pools(cluster)}))
        engines = [r for r in runner.pods() if r.namespace == namespace and not r.router]
        assert sorted(r.role for r in engines).count("decode") >= 2
    finally:
        if load is not None:
            load.stop()
        cluster.close()
        plane.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
