"""End to end: an infeasible colocated service gets the twin's disaggregation recommendation.

The local stack (real control plane, the operator with the tuner, simulator engines run by the pod
runner, a real Prometheus, trace replay in real time). One simulated L40S serves Llama-3.1-8B with
the arXiv summarisation lengths (prompts up to 4,000 tokens) at 1.5 req/s under ITL p99 <= 35 ms
and TTFT p95 <= 600 ms. Measured offline on the simulator with this trace, no colocated
configuration of the service's search space meets both at the live load: a step that carries a
prompt chunk large enough for TTFT (a few hundred tokens or more) takes longer than the ITL
target, and chunks small enough for ITL take the long prompts past the TTFT target (the best
capacity at SLO of the space is about 0.35 req/s per replica, the live load 0.75-1.5 req/s per
engine). One prefill plus one decode replica meets both up to about 2 req/s on the twin: decode
steps never carry a prompt, and the prefill replica computes a prompt in one or two large steps.

The tuner's twin predicts the infeasibility; two canaries (three on a busy machine) confirm it and
the tuner declares ``SLOInfeasible`` (after six without a twin), then evaluates the prefill/decode
split on the twin and writes it into the condition, an Event and ``status.recommendation``, all of
which ``kubectl describe`` shows. About 2.5 minutes on a 2-core machine.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest

from chunkpilot.localrun.loadgen import BackgroundLoad
from chunkpilot.localrun.stack import LocalStack
from chunkpilot.testing.e2e import (
    apply_service,
    fresh_service,
    infeasible_service_manifest,
    start_infeasible_load,
    wait_until,
)
from chunkpilot.testing.stack import StartStack

pytestmark = [pytest.mark.e2e, pytest.mark.cluster, pytest.mark.prometheus, pytest.mark.timeout(600)]

#: Requests/s over the whole service (stable and canary share it while a trial runs).
RATE = 1.5


@pytest.fixture
def stack(start_stack: StartStack) -> LocalStack:
    # A short ranking: the space is small, and every configuration in it misses by a wide margin.
    return start_stack("infeasible", CHUNKPILOT_TWIN_CPU_SECONDS="8")


def manifest(name: str, namespace: str) -> dict[str, Any]:
    """The shared scenario's service on an L40S with tight targets; at most 4 trials (6 would be needed
    without the twin, so the test fails rather than passes slowly if the twin's evidence is not used)."""
    return infeasible_service_manifest(name, namespace, max_trials=4)


def describe_block(text: str, heading: str) -> str:
    """The lines under ``heading:`` in ``kubectl describe`` output (those indented deeper)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == f"{heading}:")
    indent = len(lines[start]) - len(lines[start].lstrip())
    block = []
    for line in lines[start + 1 :]:
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break
        block.append(line)
    return "\n".join(block)


def describe_field(block: str, field: str) -> str | None:
    """The value of ``field`` (kubectl's title-cased name) in a block of ``kubectl describe`` output."""
    found = re.search(rf"^\s*{re.escape(field)}:\s*(\S.*)$", block, re.MULTILINE)
    return found.group(1).strip() if found else None


def test_an_infeasible_colocated_service_gets_the_disaggregation_recommendation_in_kubectl_describe(
    stack: LocalStack,
) -> None:
    started = time.monotonic()
    plane, runner, namespace, name = fresh_service(stack, "infeasible", "tight")
    cluster = apply_service(stack, manifest(name, namespace))
    load: BackgroundLoad | None = None
    try:
        wait_until(
            "the stable engine to serve", lambda: runner.ready_endpoints(name, namespace), 120, cluster
        )
        load = start_infeasible_load(stack, name, namespace, rate=RATE, duration_s=480)

        def infeasible() -> dict[str, Any] | None:
            found = cluster.condition("SLOInfeasible")
            if found is not None and found["status"] == "True":
                return found
            tuning = cluster.condition("Tuning") or {}
            if tuning.get("status") == "False" and tuning.get("reason") not in (None, "SLOInfeasible"):
                pytest.fail(f"tuning stopped without SLOInfeasible: {tuning}; trials: {cluster.verdicts()}")
            return None

        declared = wait_until("SLOInfeasible", infeasible, 360, cluster)
        declared_s = time.monotonic() - started
        recommendation = wait_until(
            "the recommendation", lambda: cluster.status().get("recommendation"), 180, cluster
        )
        recommended_s = time.monotonic() - started
        trials = cluster.verdicts()
        load.stop(timeout_s=60)
        load = None

        # Declared on the twin's evidence after two canaries, or three when the second one's error
        # read above the tolerance (the twin must be confirmed on the newest canary; on two busy
        # cores one CI run measured its ITL p99 at 45 ms against 54 predicted, 15.x% off): never
        # after six, which the four trials allowed cannot reach.
        measured = len(trials)
        assert measured in (2, 3) and all(v in ("Pruned", "Discarded") for _, v, _ in trials), trials
        assert f"no configuration of {measured} measured meets both SLOs" in declared["message"], declared
        assert "the twin predicts at most" in declared["message"], declared
        assert (recommendation["prefillReplicas"], recommendation["decodeReplicas"]) == (1, 1)
        assert recommendation["meetsSlo"] is True, recommendation
        capacity, colocated = recommendation["capacityReqS"], recommendation["colocatedCapacityReqS"]
        assert capacity > colocated >= 0, recommendation

        described = plane.kubectl("describe", "inferenceservice", name, "-n", namespace).stdout
        # The status block: the split and both predicted capacities.
        block = describe_block(described, "Recommendation")
        assert describe_field(block, "Prefill Replicas") == "1", described
        assert describe_field(block, "Decode Replicas") == "1", described
        assert float(describe_field(block, "Capacity Req S") or "nan") == capacity, described
        assert float(describe_field(block, "Colocated Capacity Req S") or "nan") == colocated, described
        flat = " ".join(block.split())  # kubectl wraps long messages
        assert "1 prefill + 1 decode replicas" in flat and "meet ITL p99 ≤ 35 ms" in flat, described
        # The condition says it too, with the twin's evidence.
        conditions = " ".join(describe_block(described, "Conditions").split())
        assert "the twin predicts at most" in conditions and "1 prefill + 1 decode replicas" in conditions
        # The Events: the infeasibility and the recommendation.
        events = described[described.index("Events:") :]
        assert "SLOInfeasible" in events and "TopologyRecommendation" in events, events
        print(
            json.dumps(
                {
                    "seconds_to_infeasible": round(declared_s, 1),
                    "seconds_to_recommendation": round(recommended_s, 1),
                    "trials": trials,
                    "recommendation": {k: v for k, v in recommendation.items() if k != "message"},
                    "infeasible": declared["message"],
                    "message": recommendation["message"],
                }
            )
        )
    finally:
        if load is not None:
            load.stop(timeout_s=60)
        cluster.close()
        plane.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
