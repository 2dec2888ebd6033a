"""A test's cluster through its ``kubectl``: a namespace of its own, manifests applied, objects read back."""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol

from chunkpilot.devcluster.controlplane import ControlPlane
from chunkpilot.operator.objects import trial_path


class Kubectl(Protocol):
    """What the readers need of a cluster: ``kubectl(*args, check=...)`` returning a completed process."""

    def kubectl(self, *args: str, check: bool = True) -> Any: ...


def get_object(cluster: Kubectl, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
    """The object as JSON; None when it does not exist (any other error fails the test)."""
    result = cluster.kubectl("get", kind, name, "-n", namespace, "-o", "json", check=False)
    if result.returncode != 0:
        if "NotFound" in result.stderr:
            return None
        raise AssertionError(result.stderr)
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def merge_into(target: dict[str, Any], patch: Mapping[str, Any]) -> None:
    """Apply a JSON merge patch (RFC 7386) to ``target`` in place, as the API server does.

    None removes a key, a mapping merges into a mapping, anything else replaces (a copy of it).
    """
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(target.get(key), dict):
            merge_into(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def condition_of(body: Mapping[str, Any] | None, type_: str) -> dict[str, Any] | None:
    """The condition ``type_`` in an object's status; None when it has none."""
    for item in ((body or {}).get("status") or {}).get("conditions") or []:
        if item.get("type") == type_:
            found: dict[str, Any] = item
            return found
    return None


@contextmanager
def scratch_namespace(plane: ControlPlane, prefix: str, digits: int = 6) -> Iterator[str]:
    """A new namespace ``<prefix>-<random hex>``, deleted (without waiting) when the block ends."""
    name = f"{prefix}-{uuid.uuid4().hex[:digits]}"
    plane.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        plane.kubectl("delete", "namespace", name, "--wait=false", check=False)


def ensure_namespace(plane: ControlPlane, name: str) -> None:
    """Namespace ``name``, applied (a namespace that is already there stays as it is)."""
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    plane.kubectl("apply", "-f", "-", input=json.dumps(namespace))


def apply_manifest(plane: ControlPlane, namespace: str, manifest: Mapping[str, Any]) -> None:
    """``kubectl apply`` of one object into ``namespace``."""
    plane.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(manifest))


def patch_status(
    plane: ControlPlane, kind: str, name: str, namespace: str, status: Mapping[str, Any]
) -> None:
    """Merge ``status`` into the object's status subresource, the way the operator writes it."""
    plane.kubectl(
        "patch", kind, name, "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": status}),
    )  # fmt: skip


def get_json(plane: ControlPlane, namespace: str, *what: str) -> dict[str, Any]:
    """``kubectl get -n NAMESPACE WHAT... -o json``, parsed (a missing object fails the test)."""
    document: dict[str, Any] = json.loads(plane.kubectl("get", "-n", namespace, *what, "-o", "json").stdout)
    return document


def service_endpoints(cluster: Kubectl, namespace: str, service: str) -> set[str]:
    """The pods kube-controller-manager's EndpointSlices give ``service``'s ``http`` port.

    A selected pod without a port of that name is listed in a slice without ports, which no
    client uses for the Service's port (kube-proxy matches slices to a Service port by name).
    """
    selector = f"kubernetes.io/service-name={service}"
    found = cluster.kubectl("get", "endpointslices", "-n", namespace, "-l", selector, "-o", "json")
    listing = json.loads(found.stdout)
    return {
        endpoint["targetRef"]["name"]
        for item in listing["items"]
        if any(port.get("name") == "http" for port in item.get("ports") or [])
        for endpoint in item.get("endpoints") or []
        if (endpoint.get("targetRef") or {}).get("name")
    }


def pod_ready(plane: ControlPlane, namespace: str, pod: str) -> bool:
    """Whether the pod's Ready condition is True."""
    status = get_json(plane, namespace, "pod", pod).get("status", {})
    return any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", []))


def someone_elses_role_binding(name: str, namespace: str, role: str = "view") -> dict[str, Any]:
    """A RoleBinding of ``name`` that Chunkpilot did not create (no labels, no owner): a name taken."""
    kind = "ClusterRole" if role == "view" else "Role"
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": namespace}],
    }


class MemoryKube:
    """The read verbs of the tuner's API client over a dict of objects by path (namespace
    ``default``); pods listed whatever the selector, every call remembered."""

    def __init__(
        self, objects: Mapping[str, dict[str, Any]], pods: list[dict[str, Any]] | None = None
    ) -> None:
        self.objects, self.pods = dict(objects), list(pods or [])
        self.listed: list[tuple[str, str | None]] = []

    async def get(self, path: str) -> dict[str, Any] | None:
        return self.objects.get(path)

    async def list(self, path: str, *, label_selector: str | None = None) -> list[dict[str, Any]]:
        self.listed.append((path, label_selector))
        if path.endswith("/pods"):
            return self.pods
        if path == trial_path("default"):
            return [o for p, o in self.objects.items() if p.startswith(trial_path("default") + "/")]
        return []
