"""Kubernetes side of the probe: pure builders for the probe Job and the profile ConfigMap, and publishing.

One profile per (accelerator, model, tensor-parallel size) lives in a ConfigMap
named ``chunkpilot-profile-<accelerator>-<model>-tp<N>`` in the service's
namespace, under the key ``profile.json``. The probe Job measures on one GPU (a
tensor-parallel run is probed one shard at a time: every shard does the same
work) in an init container and a small second container publishes the result.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chunkpilot.engine.podsecurity import (
    container_security_context,
    home_env,
    home_volume,
    pod_security_context,
)
from chunkpilot.engine.probe.profile import ProfileError, StepProfile, parse_profile
from chunkpilot.engine.sim.profiles.loader import ProfileError as SimProfileError
from chunkpilot.engine.sim.profiles.loader import load_model

__all__ = [
    "LABEL_ACCELERATOR",
    "LABEL_COMPONENT",
    "LABEL_MODEL",
    "LABEL_TENSOR_PARALLEL",
    "PROBE_COMPONENT",
    "PROFILE_KEY",
    "PROFILE_MOUNT_PATH",
    "PUBLISHER_ROLE_NAME",
    "ProbeJobSpec",
    "build_probe_job",
    "build_probe_rbac",
    "build_profile_configmap",
    "canonical_model_name",
    "in_cluster_namespace",
    "is_probe_object",
    "probe_job_name",
    "profile_configmap_name",
    "profile_from_configmap",
    "profile_labels",
    "publish_profile",
]

PROFILE_KEY = "profile.json"
PROFILE_MOUNT_PATH = "/profile"
MODEL_CONFIG_MOUNT_PATH = "/model-config"
PROBE_COMPONENT = "step-profile"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_ACCELERATOR = "chunkpilot.io/accelerator"
LABEL_MODEL = "chunkpilot.io/model"
LABEL_TENSOR_PARALLEL = "chunkpilot.io/tensor-parallel-size"
_MAX_NAME = 63  # a DNS label: Job names end up in the pods' job-name label
_SERVICE_ACCOUNT_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def _slug(text: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    if not slug:
        raise ValueError(f"{text!r} has no letters or digits to name a Kubernetes object after")
    return slug


def _bounded(name: str) -> str:
    """Keep a name within 63 characters, replacing the overflow by a short stable hash."""
    if len(name) <= _MAX_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: _MAX_NAME - 9].rstrip('-')}-{digest}"


def canonical_model_name(model: str) -> str:
    """The simulator profile name of a built-in model or alias (``meta-llama/Llama-3.1-8B``: llama-3.1-8b).

    Other names (a path, an unknown id) are returned unchanged, so both the
    operator and the tuner derive the same object names from the service's model.
    """
    try:
        return load_model(model).name
    except SimProfileError:
        return model


def _identity(accelerator: str, model: str, tensor_parallel_size: int) -> str:
    if tensor_parallel_size < 1:
        raise ValueError(f"tensor_parallel_size must be at least 1, got {tensor_parallel_size}")
    return f"{_slug(accelerator)}-{_slug(canonical_model_name(model))}-tp{tensor_parallel_size}"


def profile_configmap_name(accelerator: str, model: str, tensor_parallel_size: int) -> str:
    """``chunkpilot-profile-<accelerator>-<model>-tp<N>`` (DNS-safe, at most 63 characters)."""
    return _bounded(f"chunkpilot-profile-{_identity(accelerator, model, tensor_parallel_size)}")


def probe_job_name(accelerator: str, model: str, tensor_parallel_size: int) -> str:
    """``chunkpilot-probe-<accelerator>-<model>-tp<N>`` (DNS-safe, at most 63 characters)."""
    return _bounded(f"chunkpilot-probe-{_identity(accelerator, model, tensor_parallel_size)}")


def is_probe_object(manifest: Mapping[str, Any]) -> bool:
    """Whether ``manifest`` carries the labels the probe's objects are created with (its Job, its
    ServiceAccount, Role and RoleBinding, its profile ConfigMaps): anything else of those names is
    someone else's and never written over or deleted."""
    labels = (manifest.get("metadata") or {}).get("labels") or {}
    named = labels.get("app.kubernetes.io/name") == "chunkpilot"
    return named and labels.get(LABEL_COMPONENT) == PROBE_COMPONENT


def profile_labels(accelerator: str, model: str, tensor_parallel_size: int) -> dict[str, str]:
    """Labels shared by the probe Job, its pod and the profile ConfigMap."""
    return {
        "app.kubernetes.io/name": "chunkpilot",
        LABEL_COMPONENT: PROBE_COMPONENT,
        LABEL_ACCELERATOR: _bounded(_slug(accelerator)),
        LABEL_MODEL: _bounded(_slug(canonical_model_name(model))),
        LABEL_TENSOR_PARALLEL: str(tensor_parallel_size),
    }


@dataclass(frozen=True)
class ProbeJobSpec:
    """What the operator knows when a service asks for a probe."""

    accelerator: str  # the service's resources.accelerator (a simulator accelerator profile name)
    model: str  # the service's model.name: a built-in profile or an alias of one
    namespace: str
    image: str  # the engine image (it ships chunkpilot with the probe extra)
    tensor_parallel_size: int = 1
    dtype: str = "auto"
    itl_target_ms: float | None = None  # the service's ITL SLO, recorded with its feasible budget
    tokens: Sequence[int] | None = None  # default: 1 … 16384
    model_config_map: str | None = None  # a ConfigMap with config.json, for models without a built-in profile
    service_account: str = "chunkpilot-probe"
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: Sequence[Mapping[str, Any]] = ()
    gpu_resource: str = "nvidia.com/gpu"
    active_deadline_seconds: int = 3600
    ttl_seconds_after_finished: int = 86400
    backoff_limit: int = 1


def _probe_command(spec: ProbeJobSpec) -> list[str]:
    model = f"{MODEL_CONFIG_MOUNT_PATH}/config.json" if spec.model_config_map else spec.model
    command = [
        "chunkpilot",
        "probe",
        "--model",
        model,
        "--tensor-parallel-size",
        str(spec.tensor_parallel_size),
        "--device",
        "cuda",
        "--dtype",
        spec.dtype,
        "--accelerator",
        spec.accelerator,
        "--out",
        f"{PROFILE_MOUNT_PATH}/{PROFILE_KEY}",
    ]
    if spec.itl_target_ms is not None:
        command += ["--itl-target-ms", f"{spec.itl_target_ms:g}"]
    if spec.tokens:
        command += ["--tokens", ",".join(str(t) for t in spec.tokens)]
    return command


def build_probe_job(spec: ProbeJobSpec) -> dict[str, Any]:
    """The one-shot Job that measures a profile and stores it in the profile ConfigMap.

    The probe runs as an init container holding one GPU and writes to a shared
    emptyDir; the publish container (no GPU) then creates or updates the ConfigMap.
    The owner reference is left to the caller (``kopf.adopt``).
    """
    labels = profile_labels(spec.accelerator, spec.model, spec.tensor_parallel_size)
    configmap = profile_configmap_name(spec.accelerator, spec.model, spec.tensor_parallel_size)
    mounts: list[dict[str, Any]] = [{"name": "profile", "mountPath": PROFILE_MOUNT_PATH}]
    volumes: list[dict[str, Any]] = [{"name": "profile", "emptyDir": {}}]
    if spec.model_config_map:
        mounts.append({"name": "model-config", "mountPath": MODEL_CONFIG_MOUNT_PATH, "readOnly": True})
        volumes.append({"name": "model-config", "configMap": {"name": spec.model_config_map}})
    home, home_mount = home_volume()
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "serviceAccountName": spec.service_account,
        "initContainers": [
            {
                "name": "probe",
                "image": spec.image,
                "command": _probe_command(spec),
                "resources": {"limits": {spec.gpu_resource: "1"}, "requests": {spec.gpu_resource: "1"}},
                "volumeMounts": [*mounts, home_mount],
                "env": home_env(),
                "securityContext": container_security_context(),
            }
        ],
        "containers": [
            {
                "name": "publish",
                "image": spec.image,
                "command": [
                    "chunkpilot",
                    "probe",
                    "publish",
                    "--file",
                    f"{PROFILE_MOUNT_PATH}/{PROFILE_KEY}",
                    "--configmap",
                    configmap,
                    "--namespace",
                    spec.namespace,
                ],
                "resources": {
                    "requests": {"cpu": "50m", "memory": "128Mi"},
                    "limits": {"memory": "512Mi"},
                },
                "volumeMounts": [{"name": "profile", "mountPath": PROFILE_MOUNT_PATH, "readOnly": True}],
                "securityContext": container_security_context(),
            }
        ],
        "volumes": [*volumes, home],
        "securityContext": pod_security_context(),
    }
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in spec.tolerations]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": probe_job_name(spec.accelerator, spec.model, spec.tensor_parallel_size),
            "namespace": spec.namespace,
            "labels": labels,
        },
        "spec": {
            "backoffLimit": spec.backoff_limit,
            "activeDeadlineSeconds": spec.active_deadline_seconds,
            "ttlSecondsAfterFinished": spec.ttl_seconds_after_finished,
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


#: The role an installation ships for the probe's publisher: the operator binds it (its ``bind`` grant
#: names it) instead of writing a Role, so it need not hold ConfigMap writes itself.
PUBLISHER_ROLE_NAME = "chunkpilot-probe-publisher"


def build_probe_rbac(
    namespace: str,
    service_account: str = "chunkpilot-probe",
    *,
    publisher_role: tuple[str, str] | None = None,
) -> list[dict[str, Any]]:
    """ServiceAccount and RoleBinding (and Role) letting the publish container write profile ConfigMaps.

    ``publisher_role``: ``(kind, name)`` of the installation's role to bind (``ClusterRole`` or
    ``Role``, :data:`PUBLISHER_ROLE_NAME`); None: a Role of the probe's own (whose creator must
    hold its ConfigMap verbs).
    """
    meta = {
        "namespace": namespace,
        "labels": {"app.kubernetes.io/name": "chunkpilot", LABEL_COMPONENT: PROBE_COMPONENT},
    }
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": service_account, **meta}}
    subjects = [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}]
    if publisher_role is not None:
        kind, name = publisher_role
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": service_account, **meta},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name},
            "subjects": subjects,
        }
        return [account, binding]
    return [
        account,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": service_account, **meta},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["configmaps"],
                    "verbs": ["get", "create", "update", "patch"],
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": service_account, **meta},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": service_account},
            "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}],
        },
    ]


def build_profile_configmap(profile: StepProfile, name: str, namespace: str) -> dict[str, Any]:
    """The ConfigMap holding ``profile`` as JSON under ``profile.json``, labelled with its identity."""
    labels = profile_labels(profile.accelerator, profile.model, profile.tensor_parallel_size)
    annotations = {"chunkpilot.io/knee-tokens": str(profile.knee_tokens or "")}
    if profile.itl_target_ms is not None:
        annotations["chunkpilot.io/itl-target-ms"] = f"{profile.itl_target_ms:g}"
        annotations["chunkpilot.io/itl-feasible-budget"] = str(profile.itl_feasible_budget_tokens or "")
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": labels, "annotations": annotations},
        "data": {PROFILE_KEY: profile.model_dump_json(indent=2)},
    }


def profile_from_configmap(configmap: Mapping[str, Any]) -> StepProfile:
    """Parse the profile stored in a ConfigMap (a dict as returned by the API)."""
    name = str((configmap.get("metadata") or {}).get("name", "<unnamed>"))
    text = (configmap.get("data") or {}).get(PROFILE_KEY)
    if not isinstance(text, str):
        raise ProfileError(f"ConfigMap {name} has no {PROFILE_KEY!r} key; run the probe Job to create it")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(f"ConfigMap {name}: {PROFILE_KEY} is not valid JSON: {exc}") from exc
    return parse_profile(data, source=f"ConfigMap {name}")


def api_client(kubeconfig: Path | None = None) -> Any:
    """A ``kubernetes`` API client for a Job's container: from ``kubeconfig`` when given, else the
    pod's own ServiceAccount, else ``~/.kube/config`` (None: the library's default configuration,
    which the latter two set)."""
    from kubernetes import config

    if kubeconfig is not None:
        return config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]  # untyped in the client
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]  # untyped in the client
    except config.ConfigException:
        config.load_kube_config()  # type: ignore[no-untyped-call]  # untyped in the client
    return None


def in_cluster_namespace(default: str = "default") -> str:
    """The pod's own namespace when running in a cluster, else ``default``."""
    try:
        return _SERVICE_ACCOUNT_NAMESPACE_FILE.read_text(encoding="utf-8").strip() or default
    except OSError:
        return default


def publish_profile(profile: StepProfile, name: str, namespace: str, core_api: Any) -> str:
    """Create the profile ConfigMap, or replace its content when it exists; returns ``created``/``updated``.

    ``core_api`` is a ``kubernetes.client.CoreV1Api``.
    """
    from kubernetes.client.exceptions import ApiException

    body = build_profile_configmap(profile, name, namespace)
    try:
        core_api.create_namespaced_config_map(namespace, body)
        return "created"
    except ApiException as exc:
        if exc.status != 409:
            raise
    core_api.patch_namespaced_config_map(name, namespace, body)
    return "updated"
