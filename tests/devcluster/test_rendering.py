"""Pure rendering: kubeconfig, server command lines, fake nodes, KWOK stages, build recipes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from chunkpilot.devcluster import binaries, components, controlplane, fakenodes, kubeconfig
from chunkpilot.devcluster.components import Binary


def test_kubeconfig_points_at_the_server_with_client_certs(tmp_path: Path) -> None:
    doc = kubeconfig.render_kubeconfig(
        "https://127.0.0.1:6443", tmp_path / "ca.crt", tmp_path / "a.crt", tmp_path / "a.key"
    )
    assert doc["current-context"] == "chunkpilot"
    assert doc["clusters"][0]["cluster"] == {
        "server": "https://127.0.0.1:6443",
        "certificate-authority": str(tmp_path / "ca.crt"),
    }
    assert doc["users"][0]["user"]["client-key"] == str(tmp_path / "a.key")
    written = kubeconfig.write_kubeconfig(tmp_path / "kubeconfig", doc)
    assert yaml.safe_load(written.read_text()) == doc
    assert (written.stat().st_mode & 0o777) == 0o600


def test_kubeconfig_rejects_plain_http(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="server"):
        kubeconfig.render_kubeconfig("http://127.0.0.1:8080", tmp_path, tmp_path, tmp_path)


def test_gpu_node_advertises_gpus_and_is_managed_by_kwok() -> None:
    node = fakenodes.gpu_node_manifest(fakenodes.GpuNodeSpec(name="gpu-0", accelerator="h200", gpus=4))
    assert node["metadata"]["annotations"][fakenodes.KWOK_ANNOTATION] == "fake"
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "4"
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "4"
    assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H200"
    assert node["metadata"]["labels"]["chunkpilot.io/accelerator"] == "h200"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"name": "Bad_Name"}, "name"),
        ({"name": "n", "accelerator": "tpu"}, "accelerator"),
        ({"name": "n", "gpus": -1}, "gpus"),
    ],
)
def test_gpu_node_spec_names_the_bad_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}:"):
        fakenodes.GpuNodeSpec(**kwargs)  # type: ignore[arg-type]


def test_node_specs_are_numbered() -> None:
    assert [spec.name for spec in fakenodes.gpu_node_specs(3)] == ["gpu-node-0", "gpu-node-1", "gpu-node-2"]


def test_kwok_stages_cover_nodes_and_pods() -> None:
    stages = list(yaml.safe_load_all(fakenodes.kwok_stages_yaml()))
    assert all(stage["kind"] == "Stage" for stage in stages)
    kinds = {stage["spec"]["resourceRef"]["kind"] for stage in stages}
    assert kinds == {"Node", "Pod"}
    assert any(stage["spec"]["next"].get("delete") for stage in stages)


def test_control_plane_listens_on_loopback_only(tmp_path: Path) -> None:
    ports = controlplane.Ports(2379, 2380, 6443, 10257, 10259, 10247)
    pki = controlplane.certs.PkiFiles(*(tmp_path / name for name in "abcdefgh"))
    apiserver = controlplane.apiserver_args(Path("kube-apiserver"), pki, tmp_path, ports)
    assert "--bind-address=127.0.0.1" in apiserver
    assert "--authorization-mode=RBAC" in apiserver
    assert "--secure-port=6443" in apiserver
    etcd = controlplane.etcd_args(Path("etcd"), tmp_path, ports)
    assert "--listen-client-urls=http://127.0.0.1:2379" in etcd
    kcm = controlplane.controller_manager_args(Path("kcm"), pki, tmp_path / "kc", tmp_path, ports)
    assert "--controllers=*" in kcm
    kwok = controlplane.kwok_args(Path("kwok"), tmp_path / "kc", tmp_path / "stages", ports)
    assert "--manage-all-nodes=false" in kwok
    assert "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake" in kwok


def test_crd_names_are_found_in_lists_and_documents() -> None:
    docs = [
        {"kind": "CustomResourceDefinition", "metadata": {"name": "a.example.io"}},
        {
            "kind": "List",
            "items": [{"kind": "CustomResourceDefinition", "metadata": {"name": "b.example.io"}}],
        },
        {"kind": "ConfigMap", "metadata": {"name": "c"}},
        None,
    ]
    assert controlplane.crd_names(docs) == ["a.example.io", "b.example.io"]


def test_cluster_state_round_trips() -> None:
    state = controlplane.ClusterState(
        kubeconfig="/k",
        server="https://127.0.0.1:1",
        processes=[controlplane.RecordedProcess("etcd", 12, "/bin/etcd", "/l")],
        path_entries=["/bin"],
        nodes=["gpu-node-0"],
        started_at=1.0,
    )
    assert controlplane.ClusterState.from_json(state.to_json()) == state


def test_every_binary_has_a_pinned_build_module_and_its_checksums() -> None:
    for binary in Binary:
        component = components.component_of(binary)
        assert components.command_of(binary).binary is binary
        gomod = Path(
            binaries.resources.files("chunkpilot.devcluster.gomod").joinpath(f"{component.name}.mod")
        )
        assert component.module in gomod.read_text()
        assert component.version in gomod.read_text()
        # Its checksums are committed too: every module the build downloads is verified against them.
        gosum = gomod.with_suffix(".sum").read_text().splitlines()
        assert f"{component.module} {component.version} h1:" in "\n".join(gosum)
        assert all(len(line.split()) == 3 and line.split()[2].startswith("h1:") for line in gosum)


def test_kubernetes_build_stamps_the_release_version(tmp_path: Path) -> None:
    command = components.command_of(Binary.KUBECTL)
    argv = binaries.build_arguments(components.KUBERNETES, command, tmp_path / "kubectl", 2)
    ldflags = argv[argv.index("-ldflags") + 1]
    assert f"k8s.io/component-base/version.gitVersion={components.KUBERNETES_VERSION}" in ldflags
    assert f"k8s.io/client-go/pkg/version.gitVersion={components.KUBERNETES_VERSION}" in ldflags
    assert argv[-1] == "k8s.io/kubernetes/cmd/kubectl"


def test_build_environment_keeps_caches_in_the_chunkpilot_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CHUNKPILOT_CACHE", str(tmp_path))
    env = binaries.build_environment()
    assert env["GOPATH"] == str(tmp_path / "go")
    assert env["GOCACHE"] == str(tmp_path / "go-build")
    assert env["GOFLAGS"] == "-mod=mod"
    assert (
        binaries.cached_binary_path(Binary.ETCD)
        == tmp_path / "bin" / f"etcd-{components.ETCD_VERSION}" / "etcd"
    )
