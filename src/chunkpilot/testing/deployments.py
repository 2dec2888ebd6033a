"""Deployments as the operator reads them once rolled out: their state, and their manifests' status."""

from __future__ import annotations

from typing import Any

from chunkpilot.operator.status import DeploymentState


def a_ready_state(replicas: int = 1) -> DeploymentState:
    """A Deployment of ``replicas``, every one ready, updated and available, its generation observed."""
    return DeploymentState(
        desired=replicas,
        replicas=replicas,
        ready=replicas,
        updated=replicas,
        available=replicas,
        generation=1,
        observed_generation=1,
    )


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
