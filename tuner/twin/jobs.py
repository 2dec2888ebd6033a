"""Twin work on the cluster: when a ranking runs as a Kubernetes Job, and the objects that carry it.

The operator ranks on the twin in its own worker process while that fits its CPU budget
(:class:`Offload`); a ranking beyond it runs as a Job, so a thousand services do not queue behind
one process. Everything here is a pure function of plain values; the API calls are
:class:`chunkpilot.tuner.observe.twinjobs.TwinJobs`'. Per ranking (one per service and twin key):

* the **Job** ``chunkpilot-twin-<service>-<digest>``, owned by the InferenceService: one container
  running ``chunkpilot twin work`` from the operator's image, restricted (non-root, no privilege
  escalation, no capabilities, read-only root, an emptyDir ``/tmp``, no API token but its own),
  with a deadline, a retry limit and a time-to-live after it finishes. The **request** (a
  :mod:`~chunkpilot.tuner.twin.wire` ``RankingRequest``) is an annotation of its pod template,
  which the downward API mounts as ``/twin/request.json``; the worker writes the **result** (a
  ``RankingResult``) into an annotation of the Job itself;
* a **Role and RoleBinding** per Job, owned by it, that let the Jobs' ServiceAccount
  ``chunkpilot-twin-worker`` patch that one Job and nothing else.

No ConfigMap or Secret is written, and everything but the ServiceAccount goes with the Job's
time-to-live. It is all found again by name, so a restarted operator collects the Job its
predecessor started.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

from chunkpilot.api import API_VERSION as SERVICE_API_VERSION

__all__ = [
    "ANNOTATION_REQUEST",
    "ANNOTATION_RESULT",
    "COMPONENT",
    "WORKER_ACCOUNT",
    "JobPhase",
    "JobState",
    "Offload",
    "OffloadMode",
    "build_job",
    "build_job_rbac",
    "build_worker_account",
    "job_name",
    "job_state",
    "result_of",
    "result_patch",
]

#: ``chunkpilot.io/component`` of the twin Jobs and their pods.
COMPONENT: Final = "twin-worker"
LABEL_COMPONENT: Final = "chunkpilot.io/component"
#: The label of a twin Job's pods (the local cluster leaves them to whoever plays their kubelet).
LABEL_TWIN_WORKER: Final = "chunkpilot.io/twin-worker"
#: The Job's label naming the InferenceService it ranks for.
LABEL_SERVICE_OF: Final = "chunkpilot.io/twin-of"
MANAGED_BY: Final = {"app.kubernetes.io/managed-by": "chunkpilot"}
WORKER_ACCOUNT: Final = "chunkpilot-twin-worker"
#: The pod template's annotation holding the request, mounted as :data:`REQUEST_FILE`.
ANNOTATION_REQUEST: Final = "chunkpilot.io/twin-request"
#: The Job's annotation the worker writes the result into.
ANNOTATION_RESULT: Final = "chunkpilot.io/twin-result"
REQUEST_MOUNT: Final = "/twin"
REQUEST_FILE: Final = f"{REQUEST_MOUNT}/request.json"
#: The pod label the Job controller sets to its Job's name.
JOB_NAME_LABEL: Final = "batch.kubernetes.io/job-name"

#: Failed pods the Job controller replaces before the Job fails.
BACKOFF_LIMIT: Final = 2
#: How long a finished Job is kept for the operator to collect.
TTL_AFTER_FINISHED_S: Final = 3600
#: A Job's deadline: this many times the ranking's CPU budget, at least :data:`MIN_DEADLINE_S`
#: (image pull, start-up, retries).
DEADLINE_FACTOR: Final = 4.0
MIN_DEADLINE_S: Final = 600
_NAME_SAFE = re.compile(r"[^a-z0-9-]+")


class OffloadMode(StrEnum):
    """``CHUNKPILOT_TWIN_JOBS``: where rankings run."""

    #: Always in the operator's worker process (the default).
    OFF = "off"
    #: In the worker process within its CPU budget; beyond it, as Jobs.
    AUTO = "auto"
    #: Always as Jobs.
    ALWAYS = "always"


@dataclass
class Offload:
    """The operator's CPU budget for twin work: how many cores' worth it spends, averaged over a window.

    :meth:`local` says whether a ranking that may cost ``cpu_s`` still fits; :meth:`spent` records
    what one cost. Only rankings are offloaded: fits and canary checks are one simulation or a few
    and stay local.
    """

    mode: OffloadMode = OffloadMode.OFF
    #: Cores the operator's twin work may use on average (``CHUNKPILOT_TWIN_LOCAL_CORES``).
    cores: float = 0.5
    window_s: float = 600.0
    _spent: deque[tuple[float, float]] = field(default_factory=deque, repr=False)

    def __post_init__(self) -> None:
        if not (self.cores >= 0 and math.isfinite(self.cores)):
            raise ValueError(f"the twin's local CPU budget must be a number of cores ≥ 0, not {self.cores}")

    @property
    def allowance_s(self) -> float:
        """CPU seconds the window allows."""
        return self.cores * self.window_s

    def used_s(self, now: float) -> float:
        """CPU seconds spent within the window ending at ``now``."""
        while self._spent and self._spent[0][0] <= now - self.window_s:
            self._spent.popleft()
        return sum(cpu for _, cpu in self._spent)

    def spent(self, now: float, cpu_s: float) -> None:
        """Record ``cpu_s`` of local twin work finished at ``now``."""
        self._spent.append((now, max(0.0, cpu_s)))

    def local(self, now: float, cpu_s: float) -> bool:
        """Whether a ranking of up to ``cpu_s`` CPU seconds runs in the operator's worker process."""
        if self.mode is OffloadMode.OFF:
            return True
        if self.mode is OffloadMode.ALWAYS:
            return False
        return self.used_s(now) + cpu_s <= self.allowance_s


def job_name(namespace: str, service: str, key: str) -> str:
    """The Job of one ranking: the same for the same service and twin key (≤ 63 characters)."""
    digest = hashlib.sha256(f"{namespace}/{service}/{key}".encode()).hexdigest()[:10]
    stem = _NAME_SAFE.sub("-", service.lower()).strip("-")[:24].rstrip("-") or "service"
    return f"chunkpilot-twin-{stem}-{digest}"


def _owner(kind: str, api_version: str, name: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "name": name, "uid": uid, "controller": True}


def build_job(
    *,
    name: str,
    namespace: str,
    service: str,
    service_uid: str,
    image: str,
    cpu_budget_s: float,
    request_json: str,
) -> dict[str, Any]:
    """The ranking Job of ``request_json``, owned by the InferenceService ``service``."""
    deadline = max(MIN_DEADLINE_S, math.ceil(DEADLINE_FACTOR * cpu_budget_s))
    labels = {**MANAGED_BY, LABEL_COMPONENT: COMPONENT}
    command = ["chunkpilot", "twin", "work", "--request", REQUEST_FILE, "--result-job", name]
    container = {
        "name": "twin",
        "image": image,
        "command": [*command, "--namespace", namespace],
        "env": [{"name": "HOME", "value": "/tmp"}],
        # One core for the ranking's budget; the search and its simulations stay well under 1 GiB.
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "request", "mountPath": REQUEST_MOUNT, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    request_item = {
        "path": REQUEST_FILE.rsplit("/", 1)[1],
        "fieldRef": {"fieldPath": f"metadata.annotations['{ANNOTATION_REQUEST}']"},
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {**labels, LABEL_SERVICE_OF: service},
            "ownerReferences": [_owner("InferenceService", SERVICE_API_VERSION, service, service_uid)],
        },
        "spec": {
            "backoffLimit": BACKOFF_LIMIT,
            "activeDeadlineSeconds": deadline,
            "ttlSecondsAfterFinished": TTL_AFTER_FINISHED_S,
            "template": {
                "metadata": {
                    "labels": {**labels, LABEL_TWIN_WORKER: "true"},
                    "annotations": {ANNOTATION_REQUEST: request_json},
                },
                "spec": {
                    "restartPolicy": "Never",
                    "serviceAccountName": WORKER_ACCOUNT,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 65532,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [container],
                    "volumes": [
                        {"name": "request", "downwardAPI": {"items": [request_item]}},
                        {"name": "tmp", "emptyDir": {}},
                    ],
                },
            },
        },
    }


def build_worker_account(namespace: str) -> dict[str, Any]:
    """The Jobs' ServiceAccount (one per namespace; what it may do, each Job's Role says)."""
    labels = {**MANAGED_BY, LABEL_COMPONENT: COMPONENT}
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": WORKER_ACCOUNT, "namespace": namespace, "labels": labels},
    }


def build_job_rbac(job: str, namespace: str, job_uid: str) -> list[dict[str, Any]]:
    """A Role and RoleBinding, owned by the Job, that let the worker patch that Job and nothing else."""
    meta = {
        "name": job,
        "namespace": namespace,
        "labels": {**MANAGED_BY, LABEL_COMPONENT: COMPONENT},
        "ownerReferences": [_owner("Job", "batch/v1", job, job_uid)],
    }
    rule = {"apiGroups": ["batch"], "resources": ["jobs"], "resourceNames": [job], "verbs": ["patch"]}
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": dict(meta),
            "rules": [rule],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": dict(meta),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": job},
            "subjects": [{"kind": "ServiceAccount", "name": WORKER_ACCOUNT, "namespace": namespace}],
        },
    ]


def result_patch(result_json: str) -> dict[str, Any]:
    """The merge patch by which the worker hands its result to the operator."""
    return {"metadata": {"annotations": {ANNOTATION_RESULT: result_json}}}


def result_of(job: Mapping[str, Any]) -> str | None:
    """The result a Job's worker wrote (None: none yet)."""
    found = ((job.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_RESULT)
    return str(found) if found else None


class JobPhase(StrEnum):
    """Where a ranking Job stands."""

    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


@dataclass(frozen=True)
class JobState:
    """A Job's phase with a one-line reason (the Job's own condition message when it failed)."""

    phase: JobPhase
    message: str = ""


def job_state(job: Mapping[str, Any]) -> JobState:
    """The phase of a ranking Job from its status and whether its worker wrote the result.

    A result settles it (a Job that wrote it succeeded, even before the Job controller says so); a
    Job that completed without one failed.
    """
    status = job.get("status") or {}
    failed = int(status.get("failed") or 0)
    if result_of(job) is not None:
        return JobState(JobPhase.SUCCEEDED)
    for condition in status.get("conditions") or []:
        if condition.get("status") != "True":
            continue
        if condition.get("type") == "Failed":
            why = condition.get("message") or condition.get("reason") or "the Job failed"
            return JobState(JobPhase.FAILED, str(why))
        if condition.get("type") == "Complete":
            return JobState(JobPhase.FAILED, "the Job completed without writing its result")
    retried = f"; {failed} failed pod(s) retried" if failed else ""
    return JobState(JobPhase.RUNNING, f"{status.get('active') or 0} pod(s) active{retried}")
