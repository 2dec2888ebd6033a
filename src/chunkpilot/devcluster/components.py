"""The pinned control-plane components: which Go module, which main packages, which version stamp.

Versions are chosen so that the Go module proxy serves every module and the installed Go toolchain
builds them. Kubernetes cannot be required as a plain module (its staging modules are ``v0.0.0``
placeholders), so ``gomod/kubernetes.mod`` pins each staging module with a ``replace``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

KUBERNETES_VERSION = "v1.36.3"
ETCD_VERSION = "v3.6.16"
KWOK_VERSION = "v0.8.0"
HELM_VERSION = "v3.22.0"

# Publication times reported by the module proxy, used as the stamped build date.
_KUBERNETES_RELEASE_DATE = "2026-07-22T18:07:38Z"


class Binary(enum.StrEnum):
    """Every executable the local control plane and its tests need."""

    ETCD = "etcd"
    KUBE_APISERVER = "kube-apiserver"
    KUBE_CONTROLLER_MANAGER = "kube-controller-manager"
    KUBE_SCHEDULER = "kube-scheduler"
    KUBECTL = "kubectl"
    KWOK = "kwok"
    HELM = "helm"


@dataclass(frozen=True)
class Command:
    """One executable: its name, the Go main package, and how to ask it for its version."""

    binary: Binary
    package: str
    version_args: tuple[str, ...]
    # Text the version output must contain for a pre-installed binary to be accepted.
    version_marker: str


@dataclass(frozen=True)
class GoComponent:
    """A Go module built from a pinned ``gomod/<name>.mod`` into one or more executables."""

    name: str
    module: str
    version: str
    commands: tuple[Command, ...]
    ldflags: tuple[str, ...]

    @property
    def key(self) -> str:
        """Folder name of the built binaries, e.g. ``kubernetes-v1.36.3``."""
        return f"{self.name}-{self.version}"


def _kubernetes_ldflags(version: str, build_date: str) -> tuple[str, ...]:
    major, minor = version.removeprefix("v").split(".")[:2]
    flags: list[str] = []
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {package}.gitVersion={version}",
            f"-X {package}.gitMajor={major}",
            f"-X {package}.gitMinor={minor}",
            f"-X {package}.gitTreeState=clean",
            f"-X {package}.buildDate={build_date}",
            f"-X {package}.gitCommit=",
        ]
    return tuple(flags)


def _kube_command(binary: Binary) -> Command:
    return Command(
        binary=binary,
        package=f"k8s.io/kubernetes/cmd/{binary.value}",
        version_args=("--version",),
        version_marker=f"Kubernetes {KUBERNETES_VERSION}",
    )


KUBERNETES = GoComponent(
    name="kubernetes",
    module="k8s.io/kubernetes",
    version=KUBERNETES_VERSION,
    commands=(
        _kube_command(Binary.KUBE_APISERVER),
        _kube_command(Binary.KUBE_CONTROLLER_MANAGER),
        _kube_command(Binary.KUBE_SCHEDULER),
        Command(
            binary=Binary.KUBECTL,
            package="k8s.io/kubernetes/cmd/kubectl",
            version_args=("version", "--client"),
            version_marker=f"Client Version: {KUBERNETES_VERSION}",
        ),
    ),
    ldflags=_kubernetes_ldflags(KUBERNETES_VERSION, _KUBERNETES_RELEASE_DATE),
)

ETCD = GoComponent(
    name="etcd",
    module="go.etcd.io/etcd/server/v3",
    version=ETCD_VERSION,
    commands=(
        Command(
            binary=Binary.ETCD,
            package="go.etcd.io/etcd/server/v3",
            version_args=("--version",),
            version_marker=f"etcd Version: {ETCD_VERSION.removeprefix('v')}",
        ),
    ),
    ldflags=(f"-X go.etcd.io/etcd/api/v3/version.GitSHA={ETCD_VERSION}",),
)

KWOK = GoComponent(
    name="kwok",
    module="sigs.k8s.io/kwok",
    version=KWOK_VERSION,
    commands=(
        Command(
            binary=Binary.KWOK,
            package="sigs.k8s.io/kwok/cmd/kwok",
            version_args=("--version",),
            version_marker=KWOK_VERSION.removeprefix("v"),
        ),
    ),
    ldflags=(f"-X sigs.k8s.io/kwok/pkg/consts.Version={KWOK_VERSION.removeprefix('v')}",),
)

HELM = GoComponent(
    name="helm",
    module="helm.sh/helm/v3",
    version=HELM_VERSION,
    commands=(
        Command(
            binary=Binary.HELM,
            package="helm.sh/helm/v3/cmd/helm",
            version_args=("version", "--short"),
            version_marker=HELM_VERSION,
        ),
    ),
    ldflags=(
        f"-X helm.sh/helm/v3/internal/version.version={HELM_VERSION}",
        "-X helm.sh/helm/v3/internal/version.gitTreeState=clean",
        # The Kubernetes version `helm template` assumes: that of helm's client-go (v0.37).
        "-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1",
        "-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=37",
        "-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1",
        "-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=37",
    ),
)

# Build order: the long Kubernetes build first, so a failure there shows early.
COMPONENTS: tuple[GoComponent, ...] = (KUBERNETES, ETCD, KWOK, HELM)


def component_of(binary: Binary) -> GoComponent:
    """The component that builds ``binary``."""
    for component in COMPONENTS:
        if any(command.binary is binary for command in component.commands):
            return component
    raise KeyError(binary)  # pragma: no cover - every Binary has a component


def command_of(binary: Binary) -> Command:
    """The build and version-probe recipe of ``binary``."""
    for command in component_of(binary).commands:
        if command.binary is binary:
            return command
    raise KeyError(binary)  # pragma: no cover
