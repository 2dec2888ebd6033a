"""The Helm chart's own identity for the operator on the local control plane.

The local stack and the tests run the operator (with the autotuner inside it) as the
ServiceAccount the chart creates, authorised by the (Cluster)Role the chart renders, instead of an
admin kubeconfig: :func:`install_operator_identity` renders ``charts/chunkpilot`` with the pinned
``helm``, applies its ServiceAccount and RBAC objects and writes a kubeconfig holding a token of
that ServiceAccount. KWOK runs no containers, so the operator itself still runs as a local process.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import yaml

from chunkpilot.devcluster.components import Binary
from chunkpilot.devcluster.controlplane import ControlPlane

#: Where the chart is looked for first (a checkout elsewhere, an unpacked chart).
ENV_CHART_DIR: Final = "CHUNKPILOT_CHART_DIR"
RELEASE: Final = "chunkpilot"
RELEASE_NAMESPACE: Final = "chunkpilot-system"
#: Kinds of the chart that make up the operator's identity.
IDENTITY_KINDS: Final = frozenset(
    {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
)
TOKEN_DURATION: Final = "24h"


class ChartError(RuntimeError):
    """``helm`` refused the chart or its values."""


def chart_dir() -> Path | None:
    """``$CHUNKPILOT_CHART_DIR``, else ``charts/chunkpilot`` of the checkout this package runs from."""
    configured = os.environ.get(ENV_CHART_DIR)
    if configured:
        return Path(configured)
    # A strict editable install links the checkout's files: resolve the link to find the checkout.
    candidate = Path(__file__).resolve().parents[3] / "charts" / "chunkpilot"
    return candidate if (candidate / "Chart.yaml").is_file() else None


def run_helm(
    helm: Path, *args: str, env: Mapping[str, str] | None = None, timeout: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """``helm ARGS`` (never raises on a non-zero exit)."""
    return subprocess.run(
        [str(helm), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=None if env is None else dict(env),
        check=False,
    )


def render(
    helm: Path,
    chart: Path,
    sets: Iterable[str] = (),
    *,
    release: str = RELEASE,
    namespace: str = RELEASE_NAMESPACE,
) -> list[dict[str, Any]]:
    """``helm template`` of ``chart`` with ``--set`` values: the rendered documents."""
    argv = ["template", release, str(chart), "--namespace", namespace]
    for item in sets:
        argv += ["--set", item]
    result = run_helm(helm, *argv)
    if result.returncode != 0:
        raise ChartError(f"helm template {chart} failed: {result.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def by_kind(documents: Iterable[Mapping[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The documents of one kind."""
    return [dict(doc) for doc in documents if doc["kind"] == kind]


def rules_of(role: Mapping[str, Any]) -> dict[tuple[str, str], set[str]]:
    """``(apiGroup, resource) -> verbs`` of a Role or ClusterRole."""
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    return granted


def grants_by_name(role: Mapping[str, Any]) -> dict[tuple[str, str], list[tuple[frozenset[str], set[str]]]]:
    """``(apiGroup, resource) -> [(resourceNames, verbs), ...]`` of a Role or ClusterRole, one per rule
    (empty names: the rule covers every object)."""
    granted: dict[tuple[str, str], list[tuple[frozenset[str], set[str]]]] = {}
    for rule in role["rules"]:
        names = frozenset(rule.get("resourceNames") or ())
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), []).append((names, set(rule["verbs"])))
    return granted


def watch_values(operator_args: Sequence[str]) -> list[str]:
    """The chart's ``watch.*`` values matching the operator's ``--all-namespaces``/``--namespace`` flags."""
    namespaces: list[str] = []
    args = list(operator_args)
    for index, arg in enumerate(args):
        if arg in {"-n", "--namespace"} and index + 1 < len(args):
            namespaces.append(args[index + 1])
        elif arg.startswith("--namespace="):
            namespaces.append(arg.split("=", 1)[1])
    if "--all-namespaces" in args or "-A" in args or not namespaces:
        return ["watch.mode=cluster"]
    return ["watch.mode=namespaced", f"watch.namespaces={{{','.join(namespaces)}}}"]


def service_account_kubeconfig(
    plane: ControlPlane, account: str, namespace: str, path: Path, *, duration: str = TOKEN_DURATION
) -> Path:
    """A kubeconfig for ``plane`` authenticating with a new token of ServiceAccount ``namespace/account``."""
    from chunkpilot.operator.testing import token_kubeconfig

    token = plane.kubectl(
        "create", "token", account, "-n", namespace, f"--duration={duration}"
    ).stdout.strip()
    return token_kubeconfig(plane.kubeconfig, token, path, namespace)


def install_operator_identity(
    plane: ControlPlane,
    kubeconfig_path: Path,
    sets: Iterable[str] = (),
    *,
    chart: Path | None = None,
    release: str = RELEASE,
    namespace: str = RELEASE_NAMESPACE,
) -> Path:
    """Apply the chart's ServiceAccount and RBAC to ``plane``; a kubeconfig with that account's token.

    ``sets`` are chart values (``watch.mode=cluster``, ``liveAdjust.enabled=true``, …). Raises
    :class:`FileNotFoundError` when no chart is found and :class:`ChartError` when ``helm`` refuses it.
    """
    chart = chart or chart_dir()
    if chart is None:
        raise FileNotFoundError(
            "the Helm chart charts/chunkpilot was not found: run from a checkout or set "
            f"{ENV_CHART_DIR} to the chart's folder"
        )
    documents = render(plane.binaries[Binary.HELM], chart, sets, release=release, namespace=namespace)
    identity = [doc for doc in documents if doc["kind"] in IDENTITY_KINDS]
    (account,) = by_kind(identity, "ServiceAccount")
    for needed in {namespace, *(doc["metadata"].get("namespace") for doc in identity)} - {None}:
        plane.kubectl("create", "namespace", str(needed), check=False)
    plane.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": identity})
    )
    return service_account_kubeconfig(plane, account["metadata"]["name"], namespace, kubeconfig_path)


__all__ = [
    "ENV_CHART_DIR",
    "RELEASE_NAMESPACE",
    "ChartError",
    "by_kind",
    "chart_dir",
    "install_operator_identity",
    "render",
    "rules_of",
    "run_helm",
    "service_account_kubeconfig",
    "watch_values",
]
