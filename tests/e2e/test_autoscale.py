"""End to end: the replica planner follows a load that steps up threefold and back, in Advise then Auto.

The local stack (real control plane, the operator with the tuner, simulator engines run by the pod
runner on a hidden slow truth, a real Prometheus, load in real time). The service is Llama-3.1-8B on
what the tuner is told is an H100 but runs at 0.4x its compute and HBM bandwidth with twice its
per-step overhead: one replica of the service's budget 512 sustains about 3.9 requests/s within
ITL p99 <= 100 ms and TTFT p95 <= 2 s (measured offline on the truth). The load is 2.5 requests/s,
then 8, then 2.5 again, each phase started once the previous one has shown what it must.
"""

from __future__ import annotations

import itertools
import math
import time
from datetime import datetime
from typing import Any

import pytest
from chunkpilot.engine.sim.engine import SimConfig

from chunkpilot.api import GROUP, ISVC_PLURAL, VERSION, Track
from chunkpilot.bench.twin_truth import Perturbation, write_truth
from chunkpilot.localrun.loadgen import BackgroundLoad
from chunkpilot.localrun.podrunner import ENV_SIM_GPU, ENV_SIM_STEP_PROFILE
from chunkpilot.localrun.stack import LocalStack
from chunkpilot.testing.e2e import (
    ServiceObjects,
    serve_service,
    sim_service_manifest,
    start_poisson_load,
    wait_until,
)
from chunkpilot.testing.stack import StartStack

pytestmark = [pytest.mark.e2e, pytest.mark.cluster, pytest.mark.prometheus]

TRUTH = Perturbation(compute=0.4, memory=0.4, overhead=2.0)
LOW, HIGH = 2.5, 8.0
ITL_MS, TTFT_MS = 100, 2000
WINDOW_S = 20
STARTUP_BOUND_S = 60
DOWN_WINDOW_S = 45
LOAD_S = 900


@pytest.fixture
def stack(
    start_stack: StartStack, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> LocalStack:
    truth: SimConfig = write_truth(
        tmp_path_factory.mktemp("truth"), TRUTH, model="llama-3.1-8b", accelerator="h100"
    )
    assert truth.step_profile is not None
    monkeypatch.setenv(ENV_SIM_GPU, truth.accelerator)
    monkeypatch.setenv(ENV_SIM_STEP_PROFILE, truth.step_profile)
    return start_stack("autoscale")


def manifest(name: str, namespace: str) -> dict[str, Any]:
    body = sim_service_manifest(
        name, namespace, max_trials=1, window=f"{WINDOW_S}s", warmup="5s", abort={"minSamples": 20}
    )
    spec = body["spec"]
    spec["engine"].update({"maxNumBatchedTokens": 512, "maxNumSeqs": 64})
    spec["slo"]["itl"]["maxMs"], spec["slo"]["ttft"]["maxMs"] = ITL_MS, TTFT_MS
    spec["scaling"] = {
        "mode": "Advise",
        "minReplicas": 1,
        "maxReplicas": 4,
        "behavior": {"scaleDown": {"stabilizationWindowSeconds": DOWN_WINDOW_S}},
    }
    return body


def load(stack: LocalStack, name: str, namespace: str, rate: float) -> BackgroundLoad:
    return start_poisson_load(
        stack, name, namespace, rate=rate, max_prompt_tokens=4000, max_output_tokens=64, duration_s=LOAD_S
    )


def scaling(cluster: ServiceObjects) -> dict[str, Any]:
    found: dict[str, Any] = cluster.status().get("scaling") or {}
    return found


def stable_replicas(cluster: ServiceObjects) -> tuple[int, int]:
    deployment = cluster.deployment(Track.STABLE)
    return deployment.spec.replicas, deployment.status.ready_replicas or 0


def settled(cluster: ServiceObjects) -> bool:
    """The service's trials have all ended and its stable Deployment's rollout is done."""
    trials = cluster.trials()
    if not trials or any(not (t.get("status") or {}).get("finishedAt") for t in trials):
        return False
    deployment = cluster.deployment(Track.STABLE)
    status, wanted = deployment.status, deployment.spec.replicas
    return bool(
        status.observed_generation == deployment.metadata.generation
        and (status.updated_replicas or 0) == wanted
        and (status.ready_replicas or 0) == wanted
        and (status.replicas or 0) == wanted
    )


def _seconds(stamp: datetime | None) -> float:
    return stamp.timestamp() if stamp is not None else 0.0


def planner_events(cluster: ServiceObjects) -> list[tuple[float, str, str]]:
    """The planner's Events on the service, oldest first: (time, reason, message)."""
    listing = cluster.core.list_namespaced_event(cluster.namespace)
    found = [
        (
            _seconds(e.last_timestamp or e.event_time or e.metadata.creation_timestamp),
            e.reason,
            e.message or "",
        )
        for e in listing.items
        if e.reason in ("ScalingAdvised", "ScaledUp", "ScaledDown") and e.involved_object.name == cluster.name
    ]
    return sorted(found)


def test_the_planner_advises_then_scales_up_and_back_down_with_the_load(stack: LocalStack) -> None:
    namespace, name = "autoscale-e2e", "chat"
    cluster = serve_service(stack, manifest(name, namespace))
    running = load(stack, name, namespace, LOW)
    try:
        # 1. At the low load the twin fits and the planner decides, in Advise, one replica or two.
        first = wait_until(
            "the planner's first decision",
            lambda: scaling(cluster).get("desiredReplicas"),
            300,
            cluster,
        )
        assert 1 <= first <= 2, scaling(cluster)
        assert scaling(cluster)["capacityLowReqS"] <= scaling(cluster)["capacityPerReplicaReqS"]

        # 2. The load steps up threefold: Advise says it would scale, and nothing acts.
        running.stop()
        running = load(stack, name, namespace, HIGH)
        advised = wait_until(
            "the planner to advise more replicas",
            lambda: (
                (scaling(cluster).get("desiredReplicas") or 0) >= 2 and scaling(cluster)["desiredReplicas"]
            ),
            180,
            cluster,
        )
        assert any(r == "ScalingAdvised" and "would scale" in m for _, r, m in planner_events(cluster))
        assert stable_replicas(cluster)[0] == 1  # Advise changes nothing

        # 3. Auto: the operator runs the decision; the replicas rise within start-up plus two windows.
        cluster.custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, ISVC_PLURAL, name, {"spec": {"scaling": {"mode": "Auto"}}}
        )
        switched = time.time()
        wait_until(
            f"{advised} ready stable replicas",
            lambda: stable_replicas(cluster)[1] >= 2,
            STARTUP_BOUND_S + 2 * WINDOW_S,
            cluster,
        )
        assert time.time() - switched <= STARTUP_BOUND_S + 2 * WINDOW_S
        # Both SLOs hold afterwards: the tuner's SLOMet condition (it turns at once when a window
        # misses), polled from two windows after the replicas settled, over three windows. The one
        # trial may end meanwhile; a promotion rolls the stable over to its configuration (new pods,
        # their first window), and the planner then sizes on that configuration's capacity: the SLOs
        # are judged once the trial has ended and the stable runs its outcome on Ready replicas.
        wait_until("the trial to end and the stable to settle", lambda: settled(cluster), 300, cluster)
        time.sleep(2 * WINDOW_S)
        checked = time.time()
        polls: list[bool] = []
        while time.time() - checked < 3 * WINDOW_S:
            polls.append(cluster.condition_is("SLOMet", "True"))
            time.sleep(5)
        assert sum(polls) >= 0.75 * len(polls), (polls, cluster.status().get("lastMeasurement"))
        peak = stable_replicas(cluster)[0]
        assert 2 <= peak <= 4

        # 4. The load falls back: after the scale-down window the count comes back down.
        running.stop()
        running = load(stack, name, namespace, LOW)
        dropped = time.time()
        wait_until(
            "the replicas to come back down",
            lambda: stable_replicas(cluster)[0] < peak,
            DOWN_WINDOW_S + 6 * WINDOW_S,
            cluster,
        )
        events = [(t, r) for t, r, _ in planner_events(cluster) if r in ("ScaledUp", "ScaledDown")]
        moves = [r for _, r in events]
        turns = sum(1 for a, b in itertools.pairwise(moves) if a != b)
        assert moves[0] == "ScaledUp" and turns <= 2, events
        # Down only once the load fell (Event times are whole seconds), or, while it was high, after
        # the trial's promotion raised one replica's capacity (the replicas follow the promoted
        # configuration; the one trial may end while the load is high).
        promoted = cluster.promoted_trial()
        raised = (
            datetime.fromisoformat(promoted["status"]["finishedAt"]).timestamp() if promoted else math.inf
        )
        assert all(t >= min(dropped, raised) - 1 for t, r in events if r == "ScaledDown"), (
            events,
            dropped,
            raised,
        )
    finally:
        running.stop()
        cluster.close()
