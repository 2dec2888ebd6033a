"""Twin work on the cluster: when a ranking runs as a Kubernetes Job, and the objects that carry it.

The operator ranks on the twin in its own worker process while that fits its CPU budget
(:class:`Offload`); a ranking beyond it runs as a Job, so a thousand services do not queue behind
one process. Everything here is a pure function of plain values; the API calls are
:class:`chunkpilot.tuner.observe.twinjobs.TwinJobs`'. Per ranking (one per service and twin key):

* the **Job** ``chunkpilot-twin-<service>-<digest>``, owned by the InferenceService: one container
  running ``chunkpilot twin work`` from the operator's image, restricted (non-root, no privilege
  escalation, no capabilities, read-only root, an emptyDir ``/tmp``), with a deadline, a retry limit
  and a time-to-live after it finishes;
* the **request** ConfigMap ``<job>-request`` (key ``request.json``, a
  :mod:`~chunkpilot.tuner.twin.wire` ``RankingRequest``), owned by the Job and mounted at ``/twin``;
* the **result** ConfigMap ``<job>-result`` (key ``result.json``, a ``RankingResult``), which the
  Job writes, owned by the Job (its uid from the pod's ``batch.kubernetes.io/controller-uid`` label),
  so that everything goes when the Job's time-to-live ends;
* the Job's ServiceAccount ``chunkpilot-twin-worker`` with a Role that may create ConfigMaps and
  nothing else.

All of it is found again by name, so a restarted operator collects the Job its predecessor started.
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
    "COMPONENT",
    "REQUEST_KEY",
    "RESULT_KEY",
    "WORKER_ACCOUNT",
    "JobPhase",
    "JobState",
    "Offload",
    "OffloadMode",
    "build_job",
    "build_request_configmap",
    "build_result_configmap",
    "build_worker_rbac",
    "job_name",
    "job_state",
    "request_configmap_name",
    "result_configmap_name",
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
REQUEST_KEY: Final = "request.json"
RESULT_KEY: Final = "result.json"
REQUEST_MOUNT: Final = "/twin"
#: Pod labels the Job controller sets: the worker learns its Job from them (downward API).
JOB_UID_LABEL: Final = "batch.kubernetes.io/controller-uid"
JOB_NAME_LABEL: Final = "batch.kubernetes.io/job-name"
ENV_JOB_UID: Final = "CHUNKPILOT_TWIN_JOB_UID"
ENV_JOB_NAME: Final = "CHUNKPILOT_TWIN_JOB_NAME"

#: Failed pods the Job controller replaces before the Job fails.
BACKOFF_LIMIT: Final = 2
#: How long a finished Job (and its ConfigMaps) is kept for the operator to collect.
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


def request_configmap_name(job: str) -> str:
    return f"{job}-request"


def result_configmap_name(job: str) -> str:
    return f"{job}-result"


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
) -> dict[str, Any]:
    """The ranking Job, owned by the InferenceService ``service``."""
    deadline = max(MIN_DEADLINE_S, math.ceil(DEADLINE_FACTOR * cpu_budget_s))
    labels = {**MANAGED_BY, LABEL_COMPONENT: COMPONENT}
    pod_labels = {**labels, LABEL_TWIN_WORKER: "true"}
    command = [
        "chunkpilot",
        "twin",
        "work",
        "--request",
        f"{REQUEST_MOUNT}/{REQUEST_KEY}",
        "--result-configmap",
        result_configmap_name(name),
        "--namespace",
        namespace,
    ]
    container = {
        "name": "twin",
        "image": image,
        "command": command,
        "env": [
            {
                "name": ENV_JOB_NAME,
                "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{JOB_NAME_LABEL}']"}},
            },
            {
                "name": ENV_JOB_UID,
                "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{JOB_UID_LABEL}']"}},
            },
            {"name": "HOME", "value": "/tmp"},
        ],
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
                "metadata": {"labels": pod_labels},
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
                        {"name": "request", "configMap": {"name": request_configmap_name(name)}},
                        {"name": "tmp", "emptyDir": {}},
                    ],
                },
            },
        },
    }


def _configmap(name: str, namespace: str, key: str, text: str, owner: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {**MANAGED_BY, LABEL_COMPONENT: COMPONENT},
            "ownerReferences": [dict(owner)],
        },
        "data": {key: text},
    }


def build_request_configmap(job: str, namespace: str, job_uid: str, request_json: str) -> dict[str, Any]:
    """The request ConfigMap, owned by the Job ``job``."""
    owner = _owner("Job", "batch/v1", job, job_uid)
    return _configmap(request_configmap_name(job), namespace, REQUEST_KEY, request_json, owner)


def build_result_configmap(job: str, namespace: str, job_uid: str, result_json: str) -> dict[str, Any]:
    """The result ConfigMap the Job writes, owned by the Job (it goes with the Job's time-to-live)."""
    owner = _owner("Job", "batch/v1", job, job_uid)
    return _configmap(result_configmap_name(job), namespace, RESULT_KEY, result_json, owner)


def build_worker_rbac(namespace: str) -> list[dict[str, Any]]:
    """The Jobs' ServiceAccount, and a Role and RoleBinding that let it create ConfigMaps, nothing more."""
    meta = {
        "name": WORKER_ACCOUNT,
        "namespace": namespace,
        "labels": {**MANAGED_BY, LABEL_COMPONENT: COMPONENT},
    }
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": dict(meta)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": dict(meta),
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": dict(meta),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": WORKER_ACCOUNT},
            "subjects": [{"kind": "ServiceAccount", "name": WORKER_ACCOUNT, "namespace": namespace}],
        },
    ]


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
    #: Pods that failed so far (each one retried until :data:`BACKOFF_LIMIT`).
    failed_pods: int = 0


def job_state(job: Mapping[str, Any], has_result: bool) -> JobState:
    """The phase of a ranking Job from its status and whether its result ConfigMap exists.

    A result settles it (a Job that wrote it succeeded, even before the Job controller says so); a
    Job that completed without one failed.
    """
    status = job.get("status") or {}
    failed = int(status.get("failed") or 0)
    if has_result:
        return JobState(JobPhase.SUCCEEDED, failed_pods=failed)
    for condition in status.get("conditions") or []:
        if condition.get("status") != "True":
            continue
        if condition.get("type") == "Failed":
            why = condition.get("message") or condition.get("reason") or "the Job failed"
            return JobState(JobPhase.FAILED, str(why), failed)
        if condition.get("type") == "Complete":
            return JobState(JobPhase.FAILED, "the Job completed without writing its result", failed)
    retried = f"; {failed} failed pod(s) retried" if failed else ""
    return JobState(JobPhase.RUNNING, f"{status.get('active') or 0} pod(s) active{retried}", failed)
