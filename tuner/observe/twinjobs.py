"""Rankings on the twin as Kubernetes Jobs: start one, or collect the one already started.

:meth:`TwinJobs.ranking` is called on every tick a ranking is due and not run locally (see
:class:`~chunkpilot.tuner.twin.jobs.Offload`). The first call creates the Job, its request ConfigMap
and (once per namespace) the worker's ServiceAccount and Role; later calls read the Job and its
result. Nothing is kept in memory: the Job's name follows from the service and the twin's key, so an
operator that restarted mid-ranking collects its predecessor's Job instead of starting another, and
a result written while no operator ran is still there (until the Job's time-to-live ends).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
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
        self._rbac_ready: set[str] = set()

    async def ranking(self, namespace: str, service: str, service_uid: str, request: Request) -> JobRanking:
        """The ranking of ``request`` for ``service``: started now, running, failed or done."""
        name = jobs.job_name(namespace, service, request.key)
        job = await self.kube.get(resource_path("batch/v1", "jobs", namespace, name))
        if job is None:
            await self._start(namespace, service, service_uid, name, request)
            return JobRanking(name, JobState(JobPhase.RUNNING, "Job created"), created=True)
        uid = str(job["metadata"].get("uid") or "")
        if (
            await self.kube.get(
                resource_path("v1", "configmaps", namespace, jobs.request_configmap_name(name))
            )
            is None
        ):
            # The operator stopped between creating the Job and its request: finish the start.
            await self._create_request(namespace, name, uid, request)
        found = await self.kube.get(
            resource_path("v1", "configmaps", namespace, jobs.result_configmap_name(name))
        )
        state = jobs.job_state(job, found is not None)
        if found is None:
            return JobRanking(name, state)
        text = (found.get("data") or {}).get(jobs.RESULT_KEY, "")
        try:
            result = decode_result(text)
        except WireError as error:
            return JobRanking(name, JobState(JobPhase.FAILED, f"its result is unreadable: {error}"))
        if result.key != request.key:
            return JobRanking(
                name, JobState(JobPhase.FAILED, f"its result ranks twin {result.key}, not {request.key}")
            )
        return JobRanking(name, state, result)

    async def _start(
        self, namespace: str, service: str, service_uid: str, name: str, request: Request
    ) -> None:
        await self._ensure_rbac(namespace)
        manifest = jobs.build_job(
            name=name,
            namespace=namespace,
            service=service,
            service_uid=service_uid,
            image=self.image,
            cpu_budget_s=request.cpu_budget_s,
        )
        try:
            created = await self.kube.create(resource_path("batch/v1", "jobs", namespace), manifest)
        except KubeError as error:
            if not error.conflict:
                raise
            created = await self.kube.get(object_path(manifest)) or {}
        uid = str((created.get("metadata") or {}).get("uid") or "")
        await self._create_request(namespace, name, uid, request)
        log.info("ranking on the twin of %s/%s runs as Job %s", namespace, service, name)

    async def _create_request(self, namespace: str, name: str, job_uid: str, request: Request) -> None:
        body = jobs.build_request_configmap(name, namespace, job_uid, encode_request(request))
        try:
            await self.kube.create(resource_path("v1", "configmaps", namespace), body)
        except KubeError as error:
            if not error.conflict:
                raise

    async def _ensure_rbac(self, namespace: str) -> None:
        """The worker's ServiceAccount, Role and RoleBinding (created once; existing ones are kept)."""
        if namespace in self._rbac_ready:
            return
        for manifest in jobs.build_worker_rbac(namespace):
            path = object_path(manifest)
            if await self.kube.get(path) is not None:
                continue
            try:
                await self.kube.create(path.rsplit("/", 1)[0], manifest)
            except KubeError as error:
                if not error.conflict:
                    raise
        self._rbac_ready.add(namespace)
