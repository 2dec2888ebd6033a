"""Rankings on the twin as Kubernetes Jobs: start one, or collect the one already started.

:meth:`TwinJobs.ranking` is called on every tick a ranking is due and not run locally (see
:class:`~chunkpilot.tuner.twin.jobs.Offload`). The first call creates the Job (its request in its
pod template), the Role that lets its worker write the result into it and (once per namespace) the
worker's ServiceAccount; later calls read the Job, result included. Nothing is kept in memory: the
Job's name follows from the service and the twin's key, so an operator that restarted mid-ranking
collects its predecessor's Job instead of starting another, and a result written while no operator
ran is still there (until the Job's time-to-live ends)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace
from typing import Any, Protocol

from chunkpilot.operator.kube import KubeError, object_path, resource_path
from chunkpilot.tuner.twin import jobs
from chunkpilot.tuner.twin.jobs import JobPhase, JobState, Offload
from chunkpilot.tuner.twin.online import Request
from chunkpilot.tuner.twin.wire import RankingResult, WireError, decode_result, encode_request

log = logging.getLogger(__name__)


class JobsApi(Protocol):
    """The API verbs twin Jobs need (``chunkpilot.operator.kube.KubeClient`` has them)."""

    async def get(self, path: str) -> dict[str, Any] | None: ...

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]: ...


@dataclass(frozen=True)
class JobRanking:
    """A ranking Job's state, and its result once it has one."""

    job: str
    state: JobState
    result: RankingResult | None = None
    #: The Job was created by this call.
    created: bool = False


class TwinJobs:
    """Starts and collects ranking Jobs in the services' namespaces."""

    def __init__(self, kube: JobsApi, image: str, offload: Offload) -> None:
        self.kube = kube
        #: The worker's image: the operator's own (it holds the same package).
        self.image = image
        #: When a ranking runs here rather than as a Job (the operator's CPU budget for twin work).
        self.offload = offload
        self._accounts: set[str] = set()
        self._account_locks: dict[str, asyncio.Lock] = {}
        #: The Jobs (by uid) whose Role and RoleBinding this process made or found: a later tick
        #: reads the Job alone.
        self._granted: set[str] = set()

    async def ranking(self, namespace: str, service: str, service_uid: str, request: Request) -> JobRanking:
        """The ranking of ``request`` for ``service``: started now, running, failed or done."""
        name = jobs.job_name(namespace, service, request.key)
        job = await self.kube.get(resource_path("batch/v1", "jobs", namespace, name))
        if job is None:
            await self._start(namespace, service, service_uid, name, request)
            return JobRanking(name, JobState(JobPhase.RUNNING, "Job created"), created=True)
        state = jobs.job_state(job)
        text = jobs.result_of(job)
        if state.phase is not JobPhase.RUNNING:
            self._granted.discard(str(job["metadata"].get("uid") or ""))  # no tick asks again
        if text is None:
            if state.phase is JobPhase.RUNNING:
                # The operator may have stopped between creating the Job and its Role: finish that
                # (once per Job and process).
                await self._grant(namespace, name, str(job["metadata"].get("uid") or ""))
            return JobRanking(name, state)
        try:
            result = decode_result(text)
        except WireError as error:
            return JobRanking(name, JobState(JobPhase.FAILED, f"its result is unreadable: {error}"))
        if result.key != request.key:
            why = f"its result ranks twin {result.key}, not {request.key}"
            return JobRanking(name, JobState(JobPhase.FAILED, why))
        return JobRanking(name, state, result)

    async def _start(
        self, namespace: str, service: str, service_uid: str, name: str, request: Request
    ) -> None:
        await self._ensure_account(namespace)
        manifest = jobs.build_job(
            name=name,
            namespace=namespace,
            service=service,
            service_uid=service_uid,
            image=self.image,
            cpu_budget_s=request.cpu_budget_s,
            # The ranking does not use the planner's minutes; an annotation holds at most 256 KiB.
            request_json=encode_request(replace(request, workload=replace(request.workload, segments=()))),
        )
        fresh = True
        try:
            created = await self.kube.create(resource_path("batch/v1", "jobs", namespace), manifest)
        except KubeError as error:
            if not error.conflict:
                raise
            created, fresh = await self.kube.get(object_path(manifest)) or {}, False
        # A Job this call created has no Role yet (they are its own): made without a look first.
        uid = str((created.get("metadata") or {}).get("uid") or "")
        await self._grant(namespace, name, uid, look=not fresh)
        log.info("ranking on the twin of %s/%s runs as Job %s", namespace, service, name)

    async def _grant(self, namespace: str, name: str, job_uid: str, *, look: bool = True) -> None:
        """The Job's Role and RoleBinding (patching that one Job), when they do not exist yet; looked
        up (with ``look``) once per Job and process."""
        if job_uid and job_uid in self._granted:
            return
        for manifest in jobs.build_job_rbac(name, namespace, job_uid):
            await self._create_absent(manifest, look=look)
        if job_uid:
            self._granted.add(job_uid)

    async def _ensure_account(self, namespace: str) -> None:
        """The worker's ServiceAccount, looked up once per namespace and process: the rankings a tick
        starts at once in one namespace wait for the first to make it."""
        if namespace in self._accounts:
            return
        async with self._account_locks.setdefault(namespace, asyncio.Lock()):
            if namespace not in self._accounts:
                await self._create_absent(jobs.build_worker_account(namespace))
                self._accounts.add(namespace)

    async def _create_absent(self, manifest: dict[str, Any], *, look: bool = True) -> None:
        """Create ``manifest`` unless it exists (``look``: read it first; else a conflict says so)."""
        path = object_path(manifest)
        if look and await self.kube.get(path) is not None:
            return
        try:
            await self.kube.create(path.rsplit("/", 1)[0], manifest)
        except KubeError as error:
            if not error.conflict:
                raise
