"""Deployments as the operator reads them once rolled out (their state, their manifests' status), and
hand-made simulator Deployments for the local pod runner."""

from __future__ import annotations

from typing import Any

from chunkpilot.localrun.endpoints import ROLE_LABEL, SERVICE_LABEL
from chunkpilot.operator.status import DeploymentState


def a_deployment_state(
    desired: int = 1,
    *,
    ready: int | None = None,
    updated: int | None = None,
    replicas: int | None = None,
    **fields: Any,
) -> DeploymentState:
    """A Deployment of ``desired`` replicas, its generation observed: ``replicas`` of them, ``ready``
    (and as many available) and ``updated`` (each all of them unless told); ``fields`` set the rest."""
    return DeploymentState(
        desired=desired,
        replicas=desired if replicas is None else replicas,
        ready=desired if ready is None else ready,
        updated=desired if updated is None else updated,
        available=desired if ready is None else ready,
        generation=1,
        observed_generation=1,
        **fields,
    )


def a_ready_state(replicas: int = 1) -> DeploymentState:
    """A Deployment of ``replicas``, every one ready, updated and available, its generation observed."""
    return a_deployment_state(replicas)


def after_rollout(manifest: dict[str, Any], ready: bool = True) -> dict[str, Any]:
    """``manifest`` (a Deployment) as the API server returns it after its rollout, edited in place.

    Generation 1, observed; all replicas updated, and ready and available unless not ``ready``.
    """
    wanted = manifest["spec"]["replicas"]
    manifest["metadata"]["generation"] = 1
    manifest["status"] = {
        "replicas": wanted,
        "readyReplicas": wanted if ready else 0,
        "updatedReplicas": wanted,
        "availableReplicas": wanted if ready else 0,
        "observedGeneration": 1,
    }
    return manifest


def sim_deployment(
    name: str,
    labels: dict[str, str],
    args: list[str],
    *,
    selector: dict[str, str] | None = None,
    replicas: int = 1,
    annotations: dict[str, str] | None = None,
    http_port: bool = False,
) -> dict[str, Any]:
    """A Deployment of ``chunkpilot sim serve ARGS`` shaped like the operator's engine Deployments.

    ``labels`` are on it and its pods, ``selector`` (the labels unless told) matches them;
    ``annotations`` go on the pods when given; ``http_port`` declares the container's port 8000 as
    ``http`` (the port a Service's EndpointSlices list).
    """
    pod_metadata: dict[str, Any] = {"labels": labels}
    if annotations is not None:
        pod_metadata["annotations"] = annotations
    container: dict[str, Any] = {
        "name": "engine",
        "image": "ghcr.io/chunkpilot/chunkpilot:test",
        "command": ["chunkpilot", "sim", "serve"],
        "args": args,
    }
    if http_port:
        container["ports"] = [{"name": "http", "containerPort": 8000}]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector if selector is not None else labels},
            "template": {
                "metadata": pod_metadata,
                "spec": {"terminationGracePeriodSeconds": 5, "containers": [container]},
            },
        },
    }


#: The pools of a disaggregated service, as their role labels spell them.
ROLES = ("prefill", "decode")


def router_args(service: str, namespace: str, policy: str) -> list[str]:
    """A ``vllm-router`` command line shaped like the operator's: prefill/decode mode, both pools of
    ``service`` found by Kubernetes service discovery in ``namespace`` (engines on port 8000), routed
    by ``policy``; it listens on 8000 and serves its metrics on 29000, on every interface."""
    selectors = {role: (f"{SERVICE_LABEL}={service}", f"{ROLE_LABEL}={role}") for role in ROLES}
    return [
        *("--vllm-pd-disaggregation", "--service-discovery", "--service-discovery-namespace", namespace),
        *("--prefill-selector", *selectors["prefill"], "--decode-selector", *selectors["decode"]),
        *("--service-discovery-port", "8000", "--host", "0.0.0.0", "--port", "8000", "--policy", policy),
        *("--prometheus-host", "0.0.0.0", "--prometheus-port", "29000"),
    ]
