"""The twin observer's ranking beyond the operator's CPU budget: fitted here, ranked by a Job, collected
on a later tick, and ranked here after all when the Job fails.

The API is an in-memory store of the two verbs :class:`TwinJobs` uses (the real control plane runs the
same path in ``test_twinjobs_cluster.py``).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from chunkpilot.operator.kube import KubeError
from chunkpilot.tuner.observe.twin import TwinObserver
from chunkpilot.tuner.observe.twinjobs import TwinJobs
from chunkpilot.tuner.twin import jobs, online, wire
from chunkpilot.tuner.twin.jobs import Offload, OffloadMode

from chunkpilot.testing.tuner import a_snapshot


class Store:
    """Objects by path; ``create`` refuses a name taken, as the API server does."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self._uids = itertools.count(1)

    async def get(self, path: str) -> dict[str, Any] | None:
        return self.objects.get(path)

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        where = f"{path}/{body['metadata']['name']}"
        if where in self.objects:
            raise KubeError(409, "POST", path, '{"message": "already exists"}')
        stored = {**body, "metadata": {**body["metadata"], "uid": f"uid-{next(self._uids)}"}}
        self.objects[where] = stored
        return stored

    def kinds(self) -> list[str]:
        return sorted(o["kind"] for o in self.objects.values())


def calibrate(observer: TwinObserver, request: online.Request) -> tuple[online.Calibration, str | None]:
    return asyncio.run(observer._calibrate(a_snapshot(), request, None))


@pytest.fixture
def request_(ranking_request: online.Request, tmp_path: Path) -> online.Request:
    return replace(ranking_request, directory=str(tmp_path))


def test_beyond_the_budget_the_job_ranks_and_a_later_tick_collects_it(request_: online.Request) -> None:
    store = Store()
    observer = TwinObserver(None, inline=True, jobs=TwinJobs(store, "img:1", Offload(OffloadMode.ALWAYS)))
    fit, pending = calibrate(observer, request_)
    assert fit.ranked == () and fit.key == request_.key  # fitted here, not ranked
    assert pending is not None and "runs as Job chunkpilot-twin-" in pending
    assert store.kinds() == ["Job", "Role", "RoleBinding", "ServiceAccount"]
    _, still = calibrate(observer, request_)
    assert still is not None and store.kinds().count("Job") == 1

    (job,) = [o for o in store.objects.values() if o["kind"] == "Job"]
    # The request travels without the planner's minutes, which the ranking does not use: a long
    # window's would outgrow the annotation's 256 KiB.
    assert request_.workload.segments
    sent = wire.decode_request(job["spec"]["template"]["metadata"]["annotations"][jobs.ANNOTATION_REQUEST])
    assert sent.workload.segments == () and sent.workload.prompt_tokens == request_.workload.prompt_tokens
    result = wire.rank(request_)
    job["metadata"].setdefault("annotations", {}).update(
        jobs.result_patch(wire.encode_result(result))["metadata"]["annotations"]
    )
    ranked, done = calibrate(observer, request_)
    assert done is None and ranked.ranked == result.ranked and ranked.incumbent == result.incumbent


def test_a_failed_job_is_replaced_by_the_ranking_here(request_: online.Request) -> None:
    store = Store()
    offload = Offload(OffloadMode.ALWAYS)
    observer = TwinObserver(None, inline=True, jobs=TwinJobs(store, "img:1", offload))
    calibrate(observer, request_)
    (job,) = [o for o in store.objects.values() if o["kind"] == "Job"]
    job["status"] = {
        "failed": 3,
        "conditions": [{"type": "Failed", "status": "True", "message": "BackoffLimitExceeded"}],
    }
    ranked, pending = calibrate(observer, request_)
    assert pending is None and ranked.ranked  # the service is tuned either way
    assert offload.used_s(time.monotonic()) == pytest.approx(ranked.cpu_seconds)  # spent here


def test_within_the_budget_it_ranks_here_and_counts_the_cost(request_: online.Request) -> None:
    store = Store()
    offload = Offload(OffloadMode.AUTO, cores=1.0)
    observer = TwinObserver(None, inline=True, jobs=TwinJobs(store, "img:1", offload))
    ranked, pending = calibrate(observer, replace(request_, cpu_budget_s=60.0))
    assert pending is None and ranked.ranked and store.objects == {}
    assert offload.used_s(time.monotonic()) == pytest.approx(ranked.cpu_seconds)
    # Spent past the allowance: the next ranking goes to a Job.
    offload.spent(time.monotonic(), offload.allowance_s)
    _, pending = calibrate(observer, replace(request_, cpu_budget_s=60.0))
    assert pending is not None and "Job" in pending


class CountingStore(Store):
    """A :class:`Store` that records each call as ``verb kind`` (the path's resource)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    async def get(self, path: str) -> dict[str, Any] | None:
        await asyncio.sleep(0)  # let the other rankings of the tick interleave, as on the wire
        self.calls.append(f"get {path.split('/')[-2]}")
        return await super().get(path)

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(0)
        self.calls.append(f"create {body['kind']}")
        return await super().create(path, body)


def test_a_ticks_rankings_share_one_account_and_a_running_job_is_read_alone(
    request_: online.Request,
) -> None:
    store = CountingStore()
    twin_jobs = TwinJobs(store, "img:1", Offload(OffloadMode.ALWAYS))

    async def tick() -> None:
        await asyncio.gather(
            *(twin_jobs.ranking("ns", f"svc-{i}", f"uid-svc-{i}", request_) for i in range(20))
        )

    asyncio.run(tick())
    # Twenty Jobs started at once in one namespace: the workers' account looked up and made once.
    assert store.calls.count("get serviceaccounts") == 1 and store.calls.count("create ServiceAccount") == 1
    assert store.calls.count("create Job") == 20 and store.calls.count("create Role") == 20
    assert "get roles" not in store.calls  # a Job just made has no Role yet: none looked up
    store.calls.clear()
    asyncio.run(tick())
    # Still running: each later tick reads its Job and nothing else (its Role is known to exist).
    assert store.calls == ["get jobs"] * 20
    # A restarted operator checks each running Job's Role once, then reads the Job alone again.
    store.calls.clear()
    twin_jobs = TwinJobs(store, "img:1", Offload(OffloadMode.ALWAYS))
    asyncio.run(tick())
    assert store.calls.count("get roles") == 20 and store.calls.count("get rolebindings") == 20
    store.calls.clear()
    asyncio.run(tick())
    assert store.calls == ["get jobs"] * 20
