"""Observing a disaggregated service: its stable engines are its pools, read by role."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

import pytest
from chunkpilot.operator.objects import isvc_path
from chunkpilot.tuner.observe.observer import Observer

from chunkpilot.testing.kube import MemoryKube
from chunkpilot.testing.services import NOW, a_service_body

TOPOLOGY = {
    "mode": "disaggregated",
    "prefill": {"replicas": 2, "maxNumBatchedTokens": 8192},
    "decode": {"replicas": 3, "maxNumSeqs": 64},
}


def pools_answer(query: str, at: datetime) -> float | None:
    """A Prometheus whose prefill pool reads 0.2 (s, req/s, pods alike) and decode pool 0.03;
    nothing else has series (the pool pods carry their own knobs' config hash, not the spec's)."""
    if 'role="prefill"' in query:
        return 0.2
    if 'role="decode"' in query:
        return 0.03
    return None


@pytest.mark.parametrize("scaling", [{"mode": "Off"}, {"mode": "Advise", "maxReplicas": 4}])
def test_a_disaggregated_services_stable_reading_is_its_pools_as_clients_see_them(
    scaling: dict[str, Any],
) -> None:
    asked: list[str] = []

    def query(q: str, at: datetime) -> float | None:
        asked.append(q)
        return pools_answer(q, at)

    body = a_service_body(itl_ms=50, ttft_ms=600, spec={"topology": TOPOLOGY, "scaling": scaling})
    kube = MemoryKube({isvc_path("default", "chat"): body})
    snap = asyncio.run(Observer(kube, query, inline=True).observe("default", "chat", NOW))
    assert snap is not None
    pools, stable = snap.pools_reading.value, snap.stable_reading.value
    assert pools is not None and stable is not None
    assert (pools.prefill.ttft_ms, pools.decode.itl_ms) == (pytest.approx(200.0), pytest.approx(30.0))
    # As clients see it: the decode pool's ITL, the two pools' TTFT one after the other.
    assert stable.itl_ms == pytest.approx(30.0) and stable.ttft_ms == pytest.approx(230.0)
    assert stable.track == "stable" and stable.request_rate == pytest.approx(0.03)
    assert all('role="' in q for q in asked), [q for q in asked if 'role="' not in q][:1]


def test_the_stable_pods_are_read_for_their_start_up_only_while_the_planner_looks_for_it() -> None:
    pod = {"metadata": {"name": "chat-decode-0", "labels": {}}, "status": {}}
    spec = {"topology": TOPOLOGY, "scaling": {"mode": "Auto", "maxReplicas": 4}}

    def observed(status: dict[str, Any]) -> tuple[int, list[str | None]]:
        body = a_service_body(itl_ms=50, ttft_ms=600, spec=spec, status=status)
        kube = MemoryKube({isvc_path("default", "chat"): body}, pods=[pod])
        snap = asyncio.run(Observer(kube, pools_answer, inline=True).observe("default", "chat", NOW))
        assert snap is not None
        return len(snap.stable_pods), [s for p, s in kube.listed if p.endswith("/pods")]

    count, selectors = observed({})
    assert count == 1 and selectors == ["chunkpilot.io/service=chat,chunkpilot.io/track=stable"]
    measured = {"scaling": {"startupSeconds": 90.0, "lastScaleTime": "2026-01-01T10:00:00Z"}}
    assert observed(measured) == (0, [])  # measured, and no scale in the last 15 minutes
    recent = {"scaling": {"startupSeconds": 90.0, "lastScaleTime": "2026-01-01T11:55:00Z"}}
    assert observed(recent)[0] == 1
