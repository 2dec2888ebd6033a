"""End to end: pools a topology trial promoted are tried colocated again, on the local stack.

A colocated chat service in ``scaling.mode: Auto`` (two replicas a pool at least) with
``allowTopologyChange``, whose status records 2 prefill + 2 decode pools as a topology trial's
promotion writes them: the operator runs them behind the real vllm-router. At 3 req/s, which a
colocated replica or two serve, the planner sizes the pools on their own twin and proposes two or
three colocated replicas (``minReplicas`` at least, three quarters of the pools' four at most); the
tuner tries them as a colocated topology trial: for two, one colocated canary engine behind a
one-pod canary router in its regular mode, to which the Service's spread over router pods gives
half the traffic, what each proposed replica would carry (for three, two engines behind two pods).
The real Prometheus measures the canary engines on their own. Promoted (both SLOs met at that
load), ``bestTopology`` is cleared and the operator runs the colocated Deployment on the trial's
replicas (or more, should the planner scale up at once) and removes the pools and the routers;
rolled back (an SLO missed on a loaded machine), the pools serve on and the canary's objects go.
About 2-4 minutes.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from chunkpilot.tuner.decide.topology_trial import colocated_canary

from chunkpilot.localrun.stack import LocalStack
from chunkpilot.testing.e2e import (
    ServiceObjects,
    apply_service,
    fresh_service,
    sim_service_manifest,
    start_poisson_load,
    wait_until,
)
from chunkpilot.testing.kube import patch_status
from chunkpilot.testing.stack import StartStack

pytestmark = [pytest.mark.e2e, pytest.mark.cluster, pytest.mark.prometheus, pytest.mark.timeout(900)]

#: The SLO and trial window: the canary's share of a window's Poisson arrivals through the router
#: pods is a draw; at 3 req/s, 30 s keeps it within the verdict's 15% of its expectation.
WINDOW = "30s"
#: The pools a topology trial promoted: two replicas each (the planner's floor here).
POOLS = {
    "mode": "disaggregated",
    "prefill": {"replicas": 2, "maxNumBatchedTokens": 4096, "maxNumSeqs": 16},
    "decode": {"replicas": 2, "maxNumBatchedTokens": 512, "maxNumSeqs": 64},
}


@pytest.fixture
def stack(start_stack: StartStack) -> LocalStack:
    return start_stack("colocated-trial")


def manifest(name: str, namespace: str) -> dict[str, Any]:
    """Llama-3.1-8B on simulated H100s, paused until its status holds the promoted pools."""
    body = sim_service_manifest(
        name,
        namespace,
        max_trials=1,
        window=WINDOW,
        warmup="5s",
        paused=True,
        allowTopologyChange=True,
        abort={"minSamples": 20},
    )
    body["spec"]["replicas"] = 2
    body["spec"]["engine"].update(maxNumBatchedTokens=2048, maxNumSeqs=64)
    body["spec"]["scaling"] = {"mode": "Auto", "minReplicas": 2, "maxReplicas": 4}
    return body


def ready(plane: Any, namespace: str, deployment: str, replicas: int | None) -> bool:
    """``deployment`` runs ``replicas`` Ready pods (None: it is gone)."""
    found = plane.kubectl("get", "deployment", deployment, "-n", namespace, "-o", "json", check=False)
    if found.returncode != 0:
        return replicas is None
    spec = json.loads(found.stdout)
    return (
        replicas is not None
        and spec["spec"]["replicas"] == replicas
        and (spec.get("status") or {}).get("readyReplicas") == replicas
    )


def colocated_trial(cluster: ServiceObjects) -> dict[str, Any] | None:
    return next(
        (t for t in cluster.trials() if (t["spec"].get("topology") or {}).get("mode") == "colocated"), None
    )


def test_promoted_pools_are_tried_colocated_again_and_give_way_or_stay(stack: LocalStack) -> None:
    plane, runner, namespace, name = fresh_service(stack, "back", "colo")
    cluster = apply_service(stack, manifest(name, namespace))
    load = None
    try:
        wait_until(
            "both colocated engines", lambda: ready(plane, namespace, f"{name}-stable", 2), 120, cluster
        )
        pools = [{"role": "prefill", "desiredReplicas": 2}, {"role": "decode", "desiredReplicas": 2}]
        status = {
            "bestTopology": POOLS,
            "bestTopologyTrial": f"{name}-trial-0",  # the trial that promoted them (not kept here)
            "scaling": {"mode": "Auto", "topology": "disaggregated", "desiredReplicas": 4, "pools": pools},
        }
        patch_status(plane, "cpis", name, namespace, status)
        wait_until(
            "the promoted pools and their router, Ready, in place of the colocated engines",
            lambda: all(
                ready(plane, namespace, f"{name}-{part}", count)
                for part, count in (("prefill", 2), ("decode", 2), ("router", 1), ("stable", None))
            ),
            180,
            cluster,
        )
        load = start_poisson_load(
            stack, name, namespace, rate=3.0, max_prompt_tokens=2000, max_output_tokens=32, duration_s=900
        )
        unpause = {"spec": {"autotune": {"paused": False}}}
        plane.kubectl("patch", "cpis", name, "-n", namespace, "--type=merge", "-p", json.dumps(unpause))
        trial = wait_until("the colocated topology trial", lambda: colocated_trial(cluster), 240, cluster)
        replicas = trial["spec"]["replicas"]
        assert 2 <= replicas <= 3, trial["spec"]  # minReplicas at least, three quarters of four at most
        sized = colocated_canary(replicas, 1)
        assert sized is not None
        proposal = (cluster.status().get("scaling") or {}).get("proposal") or {}
        assert proposal.get("topology") in ("colocated", None), proposal
        condition = cluster.condition("TopologyChange") or {}
        assert condition.get("reason") in ("TopologyTrialRunning", "TopologyPromoted", "TopologyRolledBack")

        def canary_serving() -> bool:
            phase = (colocated_trial(cluster) or {}).get("status", {}).get("phase")
            if phase in ("Promoted", "RolledBack", "Failed"):
                return True  # judged already
            routers = [
                r for r in runner.pods() if r.namespace == namespace and r.router and r.track == "canary"
            ]
            return len(routers) == sized.routers and ready(plane, namespace, f"{name}-canary", sized.engines)

        wait_until("the canary engines behind their canary router", canary_serving, 120, cluster)

        def judged() -> dict[str, Any] | None:
            found = (colocated_trial(cluster) or {}).get("status") or {}
            return found if found.get("verdict") else None

        verdict = wait_until("the colocated trial's verdict", judged, 240, cluster)
        print(json.dumps({"verdict": verdict.get("verdict"), "reason": verdict.get("reason")}))
        assert verdict["verdict"] in ("Promoted", "Discarded"), verdict
        canary = verdict.get("canary") or {}
        assert canary.get("requestRate", 0) > 0 and canary.get("itlMs") is not None, verdict
        if verdict["verdict"] == "Promoted":
            assert "meets both SLOs at the load it would carry" in verdict["reason"]
            parts = ("prefill", "decode", "router", "router-canary", "canary")
            try:
                wait_until(
                    "colocated on the trial's replicas, the pools and routers gone",
                    # The planner may scale up at once from the trial's replicas (down it holds).
                    lambda: (
                        any(ready(plane, namespace, f"{name}-stable", n) for n in range(replicas, 5))
                        and all(ready(plane, namespace, f"{name}-{part}", None) for part in parts)
                    ),
                    180,
                    cluster,
                )
            except AssertionError as error:
                listing = plane.kubectl("get", "deployments", "-n", namespace, check=False).stdout
                scaling = json.dumps(cluster.status().get("scaling"))
                raise AssertionError(f"{error}\ndeployments:\n{listing}\nscaling: {scaling}") from None
            final = cluster.status()
            assert "bestTopology" not in final and final.get("bestTopologyTrial") == trial["metadata"]["name"]
        else:
            assert "misses" in verdict["reason"], verdict["reason"]
            wait_until(
                "the canary's objects gone, the pools serving on",
                lambda: (
                    all(ready(plane, namespace, f"{name}-{p}", None) for p in ("router-canary", "canary"))
                    and ready(plane, namespace, f"{name}-router", 1)
                ),
                120,
                cluster,
            )
    finally:
        if load is not None:
            load.stop()
        cluster.close()
        plane.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
