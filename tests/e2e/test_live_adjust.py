"""End to end: ``autotune.liveAdjust`` lowers a parked canary's limits instead of rolling it out.

The local stack (real control plane, operator with the tuner, simulator engines run by the pod
runner, real Prometheus, trace replay). The simulator gets its live-adjustment token from the
operator's Secret through ``secretKeyRef`` (resolved by the pod runner) and the tuner reaches the
engines through the pod runner's file_sd targets. Three short trials (20 s windows): the first
rolls out a canary at the top of the search space, the later ones take over the parked canary
and lower its limits through the engine route. The namespace enforces the "restricted" Pod
Security profile, so every engine pod of the flow is admitted under it.
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import aiohttp
import pytest

from chunkpilot.localrun.stack import LocalStack
from chunkpilot.testing.e2e import (
    ServiceObjects,
    serve_service,
    sim_service_manifest,
    start_scenario_load,
    wait_until,
)
from chunkpilot.testing.stack import StartStack

pytestmark = [pytest.mark.e2e, pytest.mark.cluster, pytest.mark.prometheus]

TRIALS = 3
LIMITS_PATH = "/chunkpilot/v1/scheduler/limits"


def live_manifest(name: str, namespace: str) -> dict[str, Any]:
    """The autotune end-to-end scenario with live adjustment, short windows and no early aborts."""
    return sim_service_manifest(
        name,
        namespace,
        max_trials=TRIALS,
        window="20s",
        warmup="5s",
        liveAdjust=True,
        # Only the live limits are tuned, so every later trial can take over the parked canary.
        bounds={"longPrefillTokenThreshold": {"min": 0, "max": 0}},
        abort={"minSamples": 20, "itlFactor": 100, "ttftFactor": 100},
    )


@pytest.fixture
def stack(start_stack: StartStack) -> LocalStack:
    # A short ranking: what this test proves is the canary's reuse, not the ranking's quality, and the
    # ranking after the last trial delays the Tuning condition the test waits for by its length.
    return start_stack("live-adjust", CHUNKPILOT_TWIN_CPU_SECONDS="8")


def token(cluster: ServiceObjects, name: str) -> str:
    """The canary track's token (the one the tuner sends the canary's pods)."""
    secret = cluster.core.read_namespaced_secret("chunkpilot-live-adjust", cluster.namespace)
    return base64.b64decode(str((secret.data or {})[f"{name}.canary"])).decode()


def engine_limits(address: str, bearer: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The engine's start-up limits and what its scheduler applies now (None before any PUT)."""

    async def get() -> dict[str, Any]:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
            session.get(f"http://{address}{LIMITS_PATH}", headers={"Authorization": f"Bearer {bearer}"}) as r,
        ):
            r.raise_for_status()
            body: dict[str, Any] = await r.json()
            return body

    body = asyncio.run(get())
    applied = body.get("applied")
    return dict(body["startup"]), None if applied is None else dict(applied["applied"])


def test_live_adjust_lowers_a_parked_canary_without_new_rollouts(stack: LocalStack) -> None:
    namespace, name = "live-adjust-e2e", "live"
    assert stack.control_plane is not None and stack.runner is not None
    runner = stack.runner
    # The namespace enforces the "restricted" Pod Security profile: the stable and canary engine
    # pods are admitted (non-root, no privilege escalation, no capabilities, RuntimeDefault seccomp)
    # and run, so the whole flow below happens under it.
    stack.control_plane.kubectl("create", "namespace", namespace)
    stack.control_plane.kubectl(
        "label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted", "--overwrite"
    )
    cluster = serve_service(stack, live_manifest(name, namespace))
    try:
        load = start_scenario_load(stack, name, namespace, duration_s=400)
        bearer = token(cluster, name)
        canary_uids: set[str] = set()
        seen_limits: dict[int, dict[str, Any]] = {}

        def observe() -> bool:
            """Record the canary's identity and, while a trial measures, the limits its engine applies."""
            canary = cluster.canary()
            if canary is not None:
                canary_uids.add(canary.metadata.uid)
            for trial in cluster.trials():
                status = trial.get("status") or {}
                number = trial["spec"]["number"]
                if status.get("phase") != "Measuring" or number in seen_limits:
                    continue
                endpoints = [e for e in runner.ready_endpoints(name, namespace) if e.track == "canary"]
                if not endpoints:
                    continue
                startup, limits = engine_limits(endpoints[0].address, bearer)
                budget = trial["spec"]["params"]["maxNumBatchedTokens"]
                if limits is not None and limits["max_num_batched_tokens"] == budget:
                    seen_limits[number] = {"startup": startup, "applied": limits}
            tuning = cluster.condition("Tuning")
            return len(cluster.trials()) == TRIALS and tuning is not None and tuning["status"] == "False"

        wait_until("tuning to stop after maxTrials", observe, 360, cluster, poll_s=0.5)
        trials = cluster.trials()
        progress = {t["spec"]["number"]: (t.get("status") or {}).get("progress") or {} for t in trials}
        marks = {number: p.get("liveAdjusted") for number, p in progress.items()}
        results = cluster.verdicts()
        print(json.dumps({"live_adjusted": marks, "applied": seen_limits, "trials": results}, default=str))

        # Every trial after the first took over the parked canary: adjusted live, no new rollout.
        assert all(marks[n] is True for n in range(2, TRIALS + 1)), marks
        assert len(canary_uids) == 1, f"canary rolled out {len(canary_uids)} times: {canary_uids}"
        # The canary engine applied each trial's budget, lowered from its start-up budget.
        assert set(seen_limits) == set(range(1, TRIALS + 1)), f"limits seen on the canary: {seen_limits}"
        assert any(
            seen["applied"]["max_num_batched_tokens"] < seen["startup"]["max_num_batched_tokens"]
            for seen in seen_limits.values()
        ), seen_limits
        # The study ended with a verdict for every trial and no canary left.
        assert [n for n, _, _ in results] == list(range(1, TRIALS + 1))
        assert all(verdict is not None for _, verdict, _ in results), results
        wait_until("the canary to be removed", lambda: cluster.canary() is None, 60, cluster)
        load.stop(timeout_s=60)
    finally:
        cluster.close()
