"""Manifests of fake GPU nodes that KWOK manages (no kubelet, no containers, real scheduling)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from chunkpilot.api.accelerators import gpu_products

# KWOK manages exactly the nodes carrying this annotation (``--manage-nodes-with-annotation-selector``).
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_ANNOTATION_VALUE = "fake"
KWOK_NODE_SELECTOR = f"{KWOK_ANNOTATION}={KWOK_ANNOTATION_VALUE}"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
ACCELERATOR_LABEL = "chunkpilot.io/accelerator"

# The accelerators of the InferenceService API and the product label NVIDIA's feature discovery sets
# on their nodes: the accelerator profiles that name a GPU product (``chunkpilot.api.accelerators``).
GPU_PRODUCTS: dict[str, str] = gpu_products()

_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


@dataclass(frozen=True)
class GpuNodeSpec:
    """One fake GPU node: its name, accelerator and capacity."""

    name: str
    accelerator: str = "h100"
    gpus: int = 8
    cpu: str = "96"
    memory: str = "1Ti"
    pods: int = 110
    labels: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not _NODE_NAME.match(self.name):
            raise ValueError(f"name: {self.name!r} is not a valid node name (lower-case DNS name)")
        if self.accelerator not in GPU_PRODUCTS:
            raise ValueError(
                f"accelerator: {self.accelerator!r} is unknown; use one of {', '.join(sorted(GPU_PRODUCTS))}"
            )
        if self.gpus < 0:
            raise ValueError(f"gpus: must be >= 0, got {self.gpus}")
        if self.pods < 1:
            raise ValueError(f"pods: must be >= 1, got {self.pods}")


def gpu_node_manifest(spec: GpuNodeSpec) -> dict[str, Any]:
    """The Node object for ``spec``; KWOK fills in conditions and keeps it Ready."""
    resources_ = {
        "cpu": spec.cpu,
        "memory": spec.memory,
        "pods": str(spec.pods),
        "ephemeral-storage": "1Ti",
        GPU_RESOURCE: str(spec.gpus),
    }
    labels = {
        "kubernetes.io/hostname": spec.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        GPU_PRODUCT_LABEL: GPU_PRODUCTS[spec.accelerator],
        "nvidia.com/gpu.count": str(spec.gpus),
        "nvidia.com/gpu.present": "true",
        ACCELERATOR_LABEL: spec.accelerator,
        **spec.labels,
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": spec.name,
            "annotations": {KWOK_ANNOTATION: KWOK_ANNOTATION_VALUE, "node.alpha.kubernetes.io/ttl": "0"},
            "labels": labels,
        },
        "spec": {},
        "status": {"capacity": dict(resources_), "allocatable": dict(resources_)},
    }


def gpu_node_specs(
    count: int, accelerator: str = "h100", gpus: int = 8, prefix: str = "gpu-node"
) -> list[GpuNodeSpec]:
    """``count`` identical GPU nodes named ``<prefix>-0`` … ``<prefix>-<count-1>``."""
    if count < 0:
        raise ValueError(f"count: must be >= 0, got {count}")
    return [
        GpuNodeSpec(name=f"{prefix}-{index}", accelerator=accelerator, gpus=gpus) for index in range(count)
    ]


def kwok_stages_yaml() -> str:
    """The KWOK Stage documents (node Ready + heartbeat, pod Ready, Job completion, pod deletion)."""
    return resources.files("chunkpilot.devcluster").joinpath("kwok_stages.yaml").read_text()
