"""Run the GPU calibration probe as a one-shot Job when an InferenceService asks for it.

A person (or a pipeline) annotates a service with ``chunkpilot.io/probe: request``.
The operator then

1. applies the probe's ServiceAccount, Role and RoleBinding in the namespace and
   creates the Job ``chunkpilot-probe-<accelerator>-<model>-tp<N>`` (one per
   accelerator type, model and tensor-parallel size; services that share them
   share the Job and its profile). The Job's init container runs
   ``chunkpilot probe … --device cuda --out /profile/profile.json`` on one GPU,
   its second container ``chunkpilot probe publish`` stores the profile in the
   ConfigMap ``chunkpilot-profile-<accelerator>-<model>-tp<N>`` (key ``profile.json``);
2. marks the service ``chunkpilot.io/probe: running`` and records the ConfigMap's
   name in ``chunkpilot.io/profile-configmap``, with a ``ProbeStarted`` Event;
3. when the ConfigMap appears (or changes), marks every service waiting for it
   ``done`` (Event ``ProbeSucceeded`` with the knee and the ITL-feasible budget);
   when the Job fails, ``failed`` (Event ``ProbeFailed`` with the Job's reason).

``chunkpilot.io/probe-message`` carries a one-line summary of the latest step.
The tuner reads the profile with :func:`read_profile`. The builders here are pure;
:class:`ProbeRunner` does the API calls and the Kopf handlers at the bottom are thin.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final, Protocol

import kopf
from chunkpilot.engine.probe.kube import (
    LABEL_COMPONENT,
    PROBE_COMPONENT,
    ProbeJobSpec,
    build_probe_job,
    build_probe_rbac,
    is_probe_object,
    probe_job_name,
    profile_configmap_name,
    profile_from_configmap,
)
from chunkpilot.engine.probe.profile import ProfileError, StepProfile
from chunkpilot.operator.config import (
    ENV_PROBE_IMAGE,
    ENV_PROBE_JOBS,
    FIELD_MANAGER,
    probe_jobs_enabled,
)
from chunkpilot.operator.events import EventSpec, EventType, post_event
from chunkpilot.operator.kube import APPLY_PATCH, KubeError, object_path, resource_path
from chunkpilot.operator.objects import NameConflictError

from chunkpilot import __version__
from chunkpilot.api import GROUP, ISVC_PLURAL, VERSION, InferenceService
from chunkpilot.api.engines import with_registry

__all__ = [
    "ANNOTATION_PROBE",
    "ANNOTATION_PROBE_IMAGE",
    "ANNOTATION_PROBE_MESSAGE",
    "ANNOTATION_PROFILE_CONFIGMAP",
    "DEFAULT_PROBE_IMAGE_REPOSITORY",
    "ENV_PROBE_IMAGE",
    "ENV_PROBE_JOBS",
    "ProbeRunner",
    "ProbeState",
    "ProbeTarget",
    "annotation_patch",
    "build_probe_job_for",
    "default_probe_image",
    "job_failure",
    "probe_image",
    "probe_job_spec",
    "probe_jobs_enabled",
    "probe_target",
    "read_profile",
    "register_handlers",
    "services_waiting_for",
]

logger = logging.getLogger(__name__)

ANNOTATION_PROBE: Final = "chunkpilot.io/probe"
ANNOTATION_PROBE_MESSAGE: Final = "chunkpilot.io/probe-message"
ANNOTATION_PROFILE_CONFIGMAP: Final = "chunkpilot.io/profile-configmap"
ANNOTATION_PROBE_IMAGE: Final = "chunkpilot.io/probe-image"
DEFAULT_PROBE_IMAGE_REPOSITORY: Final = "ghcr.io/chunkpilot/chunkpilot-probe"
ISVC_API_VERSION: Final = f"{GROUP}/{VERSION}"


class ProbeState(StrEnum):
    """Values of the ``chunkpilot.io/probe`` annotation."""

    REQUEST = "request"  # set by a person: run the probe
    RUNNING = "running"  # the Job exists; waiting for the profile
    DONE = "done"  # the profile ConfigMap is there
    FAILED = "failed"  # the Job failed (see chunkpilot.io/probe-message); set request to retry


@dataclass(frozen=True)
class ProbeTarget:
    """What one profile is measured for: accelerator type, model and tensor-parallel size."""

    accelerator: str
    model: str
    tensor_parallel_size: int

    @property
    def configmap(self) -> str:
        return profile_configmap_name(self.accelerator, self.model, self.tensor_parallel_size)

    @property
    def job(self) -> str:
        return probe_job_name(self.accelerator, self.model, self.tensor_parallel_size)


# --------------------------------------------------------------------------- pure builders


def probe_target(isvc: InferenceService) -> ProbeTarget:
    """The (accelerator, model, TP) a service runs on."""
    spec = isvc.spec
    return ProbeTarget(str(spec.resources.accelerator), spec.model.name, spec.engine.tensor_parallel_size)


def default_probe_image() -> str:
    """The Chunkpilot probe image of this operator's version (``engine_image/probe/Dockerfile``)."""
    return f"{DEFAULT_PROBE_IMAGE_REPOSITORY}:{__version__}"


def probe_image(
    annotations: Mapping[str, str], configured: str | None = None, *, annotation_allowed: bool = False
) -> str:
    """The service's ``chunkpilot.io/probe-image`` where the installation allows it
    (``annotation_allowed``: :attr:`OperatorConfig.probe_image_annotation`), else the operator's
    (``configured``, from ``CHUNKPILOT_PROBE_IMAGE``), else the default."""
    chosen = annotations.get(ANNOTATION_PROBE_IMAGE) if annotation_allowed else None
    return chosen or configured or default_probe_image()


def probe_job_spec(isvc: InferenceService, image: str) -> ProbeJobSpec:
    """The probe Job's parameters for ``isvc``: its hardware, model, TP, placement and ITL target."""
    target = probe_target(isvc)
    resources = isvc.spec.resources
    assert isvc.metadata.namespace is not None
    return ProbeJobSpec(
        accelerator=target.accelerator,
        model=target.model,
        namespace=isvc.metadata.namespace,
        image=image,
        tensor_parallel_size=target.tensor_parallel_size,
        itl_target_ms=isvc.spec.slo.itl.max_ms if isvc.spec.slo is not None else None,
        node_selector=dict(resources.node_selector),
        tolerations=[t.to_k8s() for t in resources.tolerations],
    )


def build_probe_job_for(isvc: InferenceService, body: Mapping[str, Any], image: str) -> dict[str, Any]:
    """The probe Job for ``isvc``, owned by the requesting service (deleting it stops the probe).

    The profile ConfigMap has no owner: it describes the hardware, not the service,
    and outlives both.
    """
    job = build_probe_job(probe_job_spec(isvc, image))
    meta = body["metadata"]
    job["metadata"]["ownerReferences"] = [
        {
            "apiVersion": body.get("apiVersion", ISVC_API_VERSION),
            "kind": body.get("kind", "InferenceService"),
            "name": meta["name"],
            "uid": meta["uid"],
            "controller": False,
            "blockOwnerDeletion": False,
        }
    ]
    return job


def annotation_patch(state: ProbeState, message: str, configmap: str | None = None) -> dict[str, Any]:
    """A merge patch setting the probe annotations of a service."""
    annotations = {ANNOTATION_PROBE: state.value, ANNOTATION_PROBE_MESSAGE: message}
    if configmap is not None:
        annotations[ANNOTATION_PROFILE_CONFIGMAP] = configmap
    return {"metadata": {"annotations": annotations}}


def _annotations(body: Mapping[str, Any]) -> Mapping[str, str]:
    return (body.get("metadata") or {}).get("annotations") or {}


def services_waiting_for(services: Sequence[Mapping[str, Any]], configmap: str) -> list[Mapping[str, Any]]:
    """The services whose probe is running (or requested) and whose profile goes to ``configmap``."""
    waiting = {ProbeState.RUNNING.value, ProbeState.REQUEST.value}
    return [
        body
        for body in services
        if _annotations(body).get(ANNOTATION_PROBE) in waiting
        and _annotations(body).get(ANNOTATION_PROFILE_CONFIGMAP) == configmap
    ]


def job_failure(job: Mapping[str, Any]) -> str | None:
    """The Job's failure message when its ``Failed`` condition is true, else None."""
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Failed" and condition.get("status") == "True":
            reason = condition.get("reason") or "Failed"
            return f"{reason}: {condition.get('message') or 'the probe Job failed'}"
    return None


def _job_finished(job: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") in {"Complete", "Failed"} and c.get("status") == "True"
        for c in (job.get("status") or {}).get("conditions") or []
    )


def profile_summary(profile: StepProfile) -> str:
    """One line for the Event and the annotation: knee and ITL-feasible budget."""
    text = f"knee {profile.knee_tokens} tokens"
    if profile.itl_target_ms is not None:
        text += f", ITL {profile.itl_target_ms:g} ms budget {profile.itl_feasible_budget_tokens} tokens"
    return text


# --------------------------------------------------------------------------- API side


class Kube(Protocol):
    """The verbs used here (``chunkpilot.operator.kube.KubeClient`` has them)."""

    async def get(self, path: str) -> dict[str, Any] | None: ...
    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]: ...
    async def delete(self, path: str) -> None: ...
    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any]: ...
    async def list(self, path: str, *, label_selector: str | None = None) -> list[dict[str, Any]]: ...
    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str = "application/json",
        params: Mapping[str, str] | None = None,
    ) -> dict[str, Any]: ...


PostEvent = Callable[[Mapping[str, Any], EventSpec], None]


def probe_name_conflict(found: Mapping[str, Any]) -> NameConflictError:
    """An object the probe needs (its Job, ServiceAccount, Role or RoleBinding) that is not the probe's."""
    return NameConflictError(
        found,
        owner="the probe",
        mark=f"no {LABEL_COMPONENT}={PROBE_COMPONENT} label",
        remedy="run the probe in another namespace or remove",
    )


async def read_profile(kube: Kube, namespace: str, target: ProbeTarget) -> StepProfile | None:
    """The measured profile for ``target`` from its ConfigMap, or None when there is none yet.

    Raises :class:`~chunkpilot.engine.probe.profile.ProfileError` when the ConfigMap
    holds something that is not a valid profile.
    """
    configmap = await kube.get(resource_path("v1", "configmaps", namespace, target.configmap))
    return None if configmap is None else profile_from_configmap(configmap)


class ProbeRunner:
    """Starts probe Jobs and reports their outcome on the services that asked for them."""

    def __init__(
        self,
        kube: Kube,
        post_event: PostEvent,
        field_manager: str = FIELD_MANAGER,
        *,
        image: str | None = None,
        image_annotation: bool = False,
        publisher_role: tuple[str, str] | None = None,
    ) -> None:
        self.kube = kube
        self.post_event = post_event
        self.field_manager = field_manager
        #: The operator's probe image (:attr:`OperatorConfig.probe_image`; None: the default).
        self.image = image
        #: Whether a service's probe-image annotation may choose another
        #: (:attr:`OperatorConfig.probe_image_annotation`).
        self.image_annotation = image_annotation
        #: The installation's publisher role to bind (:attr:`OperatorConfig.probe_publisher_role`).
        self.publisher_role = publisher_role

    async def _apply(self, manifest: Mapping[str, Any]) -> None:
        """Apply one of the probe's objects; raises :class:`NameConflictError` when an object of its
        name exists that is not the probe's (:func:`is_probe_object`): it is left as it is."""
        current = await self.kube.get(object_path(manifest))
        if current is not None and not is_probe_object(current):
            raise probe_name_conflict(current)
        params = {"fieldManager": self.field_manager, "force": "true"}
        await self.kube.request(
            "PATCH", object_path(manifest), body=dict(manifest), content_type=APPLY_PATCH, params=params
        )

    async def _refuse(self, body: Mapping[str, Any], message: str) -> None:
        """The probe cannot run: a name it needs is taken (the service's probe annotation says so)."""
        await self._annotate(body, annotation_patch(ProbeState.FAILED, message))
        self.post_event(body, EventSpec(EventType.WARNING, "NameConflict", message))

    async def _annotate(self, body: Mapping[str, Any], patch: Mapping[str, Any]) -> None:
        meta = body["metadata"]
        path = resource_path(ISVC_API_VERSION, ISVC_PLURAL, meta["namespace"], meta["name"])
        try:
            await self.kube.merge_patch(path, patch)
        except KubeError as error:
            if not error.not_found:
                raise

    async def start(self, body: Mapping[str, Any]) -> str:
        """Create (or join) the probe Job of the service in ``body``; returns the Job's name."""
        isvc = InferenceService.from_manifest({k: v for k, v in body.items() if k != "status"})
        target = probe_target(isvc)
        namespace = body["metadata"]["namespace"]
        image = probe_image(_annotations(body), self.image, annotation_allowed=self.image_annotation)
        job = build_probe_job_for(isvc, body, image)
        try:
            for manifest in build_probe_rbac(namespace, publisher_role=self.publisher_role):
                await self._apply(manifest)
        except NameConflictError as conflict:
            await self._refuse(body, f"probe not started: {conflict}")
            return target.job
        jobs = resource_path("batch/v1", "jobs", namespace)
        try:
            await self.kube.create(jobs, job)
            verb = "started"
        except KubeError as error:
            if not error.conflict:
                raise
            existing = await self.kube.get(resource_path("batch/v1", "jobs", namespace, target.job))
            if existing is not None and not is_probe_object(existing):
                await self._refuse(body, f"probe not started: {probe_name_conflict(existing)}")
                return target.job
            if existing is not None and _job_finished(existing):
                # A finished run of an earlier request: run again (Background: pods go with it).
                await self.kube.request(
                    "DELETE",
                    resource_path("batch/v1", "jobs", namespace, target.job),
                    body={"propagationPolicy": "Background"},
                )
                await self.kube.create(jobs, job)
                verb = "restarted"
            else:
                verb = "joined"
        message = (
            f"probe Job {target.job} {verb} ({target.accelerator}, {target.model},"
            f" tp={target.tensor_parallel_size}); the profile goes to ConfigMap {target.configmap}"
        )
        await self._annotate(body, annotation_patch(ProbeState.RUNNING, message, target.configmap))
        self.post_event(body, EventSpec(EventType.NORMAL, "ProbeStarted", message))
        return target.job

    async def _waiting(self, namespace: str, configmap: str) -> list[Mapping[str, Any]]:
        services = await self.kube.list(resource_path(ISVC_API_VERSION, ISVC_PLURAL, namespace))
        return services_waiting_for(services, configmap)

    async def profile_published(self, configmap: Mapping[str, Any]) -> int:
        """A profile ConfigMap was written: mark the services waiting for it done; returns how many."""
        meta = configmap["metadata"]
        try:
            profile = profile_from_configmap(configmap)
        except ProfileError as error:
            logger.warning("ignoring ConfigMap %s/%s: %s", meta["namespace"], meta["name"], error)
            return 0
        waiting = await self._waiting(meta["namespace"], meta["name"])
        message = f"profile stored in ConfigMap {meta['name']}: {profile_summary(profile)}"
        for body in waiting:
            await self._annotate(body, annotation_patch(ProbeState.DONE, message))
            self.post_event(body, EventSpec(EventType.NORMAL, "ProbeSucceeded", message))
        return len(waiting)

    async def job_changed(self, job: Mapping[str, Any]) -> int:
        """A probe Job changed: when it failed, mark the services waiting for it failed; returns how many."""
        failure = job_failure(job)
        if failure is None:
            return 0
        meta = job["metadata"]
        configmap = _configmap_of_job(job) or ""
        waiting = [
            body
            for body in await self._waiting(meta["namespace"], configmap)
            if _annotations(body).get(ANNOTATION_PROBE) == ProbeState.RUNNING.value
        ]
        message = (
            f"probe Job {meta['name']} failed ({failure}); see `kubectl logs job/{meta['name']} -c probe`;"
            f" set {ANNOTATION_PROBE}: request to retry"
        )
        for body in waiting:
            await self._annotate(body, annotation_patch(ProbeState.FAILED, message))
            self.post_event(body, EventSpec(EventType.WARNING, "ProbeFailed", message))
        return len(waiting)


def _configmap_of_job(job: Mapping[str, Any]) -> str | None:
    """The ConfigMap the Job's publish container writes (from its ``--configmap`` argument)."""
    pod = ((job.get("spec") or {}).get("template") or {}).get("spec") or {}
    for container in pod.get("containers") or []:
        command = list(container.get("command") or [])
        if "--configmap" in command[:-1]:
            return str(command[command.index("--configmap") + 1])
    return None


# --------------------------------------------------------------------------- Kopf handlers

# ``CHUNKPILOT_PROBE_JOBS=on`` (:attr:`OperatorConfig.probe_jobs`) registers the handlers below at
# start-up (the operator's RBAC must then allow Jobs, ConfigMaps, ServiceAccounts, Roles and
# RoleBindings in the watched namespaces; see docs/probe.md).
PROBE_LABELS: Final = {LABEL_COMPONENT: PROBE_COMPONENT}


def _runner(memo: kopf.Memo) -> ProbeRunner | None:
    runner: ProbeRunner | None = memo.get("probe_runner")
    if runner is None and "reconciler" in memo:
        reconciler = memo["reconciler"]
        config = reconciler.config
        runner = ProbeRunner(
            reconciler.kube,
            post_event,
            # Without one configured: the default probe image, from the installation's registry.
            image=config.probe_image or with_registry(default_probe_image(), config.image_registry),
            image_annotation=config.probe_image_annotation,
            publisher_role=config.probe_publisher_role,
        )
        memo["probe_runner"] = runner
    return runner


async def _guarded(what: str, call: Awaitable[object]) -> None:
    try:
        await call
    except KubeError as error:
        raise kopf.TemporaryError(f"{what}: {error}", delay=10) from error


async def probe_requested(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """``chunkpilot.io/probe: request`` on a service: start (or join) its probe Job."""
    runner = _runner(memo)
    if runner is not None:
        await _guarded("starting the probe Job", runner.start(dict(body)))


async def profile_configmap_event(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A profile ConfigMap was created or updated: report success on the waiting services."""
    runner = _runner(memo)
    if runner is not None and type in {"ADDED", "MODIFIED", None}:
        await _guarded("reporting the probe profile", runner.profile_published(dict(body)))


async def probe_job_event(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A probe Job changed: report a failure on the waiting services."""
    runner = _runner(memo)
    if runner is not None and type != "DELETED":
        await _guarded("reporting the probe Job's failure", runner.job_changed(dict(body)))


_registered = False


def register_handlers() -> None:
    """Register the probe handlers with Kopf (once; at start-up, when :attr:`OperatorConfig.probe_jobs`)."""
    global _registered
    if _registered:
        return
    _registered = True
    request = {ANNOTATION_PROBE: ProbeState.REQUEST.value}
    kopf.on.event(GROUP, VERSION, ISVC_PLURAL, annotations=request)(probe_requested)
    kopf.on.event("", "v1", "configmaps", labels=PROBE_LABELS)(profile_configmap_event)
    kopf.on.event("batch", "v1", "jobs", labels=PROBE_LABELS)(probe_job_event)
