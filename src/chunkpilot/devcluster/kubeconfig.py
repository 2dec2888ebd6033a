"""Render a kubeconfig that reaches the local kube-apiserver with the admin client certificate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

DEFAULT_CONTEXT = "chunkpilot"


def render_kubeconfig(
    server: str,
    ca_cert: Path,
    client_cert: Path,
    client_key: Path,
    context: str = DEFAULT_CONTEXT,
    namespace: str = "default",
) -> dict[str, Any]:
    """A kubeconfig document (as a dict) with one cluster, one user and one current context."""
    if not server.startswith("https://"):
        raise ValueError(f"server: expected an https:// URL of the kube-apiserver, got {server!r}")
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": context, "cluster": {"server": server, "certificate-authority": str(ca_cert)}},
        ],
        "users": [
            {
                "name": context,
                "user": {"client-certificate": str(client_cert), "client-key": str(client_key)},
            },
        ],
        "contexts": [
            {"name": context, "context": {"cluster": context, "user": context, "namespace": namespace}},
        ],
        "current-context": context,
        "preferences": {},
    }


def write_kubeconfig(path: Path, document: dict[str, Any]) -> Path:
    """Write ``document`` to ``path`` (mode 0600, like kubectl does) and return the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    path.chmod(0o600)
    return path
