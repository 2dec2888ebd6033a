"""The security context of every pod Chunkpilot creates: engines, routers and probe Jobs.

By default a pod passes the Kubernetes Pod Security Standards "restricted" profile: it runs as a
non-root UID, cannot gain privileges, drops every Linux capability and uses the runtime's default
seccomp profile. The process's HOME (and with it the Hugging Face, vLLM, Triton and torch caches)
is an emptyDir that UID can write. A UID of 0 runs an image that needs root as root, outside the
profile (a namespace that enforces it refuses such a pod).
"""

from __future__ import annotations

from typing import Any, Final

from chunkpilot.api.inferenceservice import NON_ROOT_UID

#: The engine's HOME, an emptyDir: caches and anything else an engine writes under ``~``.
HOME_PATH: Final = "/home/chunkpilot"
HOME_VOLUME: Final = "home"
#: The user name ``getpass.getuser()`` reads (a UID without a passwd entry has no name otherwise,
#: which some libraries fail on).
USER_NAME: Final = "chunkpilot"


def pod_security_context(uid: int = NON_ROOT_UID) -> dict[str, Any]:
    """The pod's ``securityContext`` (files on its emptyDirs belong to the UID's group)."""
    context: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
    if uid != 0:
        context.update(runAsNonRoot=True, runAsUser=uid, runAsGroup=uid, fsGroup=uid)
    return context


def container_security_context(uid: int = NON_ROOT_UID) -> dict[str, Any]:
    """A container's ``securityContext``: no privilege escalation, no capabilities (as non-root)."""
    if uid == 0:
        return {"allowPrivilegeEscalation": False}
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def home_env() -> list[dict[str, str]]:
    """HOME on the writable emptyDir, and a user name for ``getpass``."""
    return [
        {"name": "HOME", "value": HOME_PATH},
        {"name": "USER", "value": USER_NAME},
        {"name": "LOGNAME", "value": USER_NAME},
    ]


def home_volume() -> tuple[dict[str, Any], dict[str, Any]]:
    """The HOME emptyDir: its volume and its mount."""
    return {"name": HOME_VOLUME, "emptyDir": {}}, {"name": HOME_VOLUME, "mountPath": HOME_PATH}
