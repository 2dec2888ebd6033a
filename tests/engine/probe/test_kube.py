"""Pure builders for the probe Job, its RBAC and the profile ConfigMap."""

from __future__ import annotations

import re

import pytest
from chunkpilot.engine.probe import ProfileError
from chunkpilot.engine.probe.kube import (
    LABEL_MODEL,
    PROFILE_KEY,
    PUBLISHER_ROLE_NAME,
    ProbeJobSpec,
    build_probe_job,
    build_probe_rbac,
    build_profile_configmap,
    canonical_model_name,
    probe_job_name,
    profile_configmap_name,
    profile_from_configmap,
)
from chunkpilot.engine.probe.profile import StepProfile

from chunkpilot.testing.argv import flags

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def test_configmap_name_follows_the_scheme_and_aliases_share_it() -> None:
    assert profile_configmap_name("h200", "llama-3.1-8b", 1) == "chunkpilot-profile-h200-llama-3-1-8b-tp1"
    assert profile_configmap_name("h200", "meta-llama/Llama-3.1-8B-Instruct", 1) == (
        "chunkpilot-profile-h200-llama-3-1-8b-tp1"
    )
    assert profile_configmap_name("H100", "meta-llama/Llama-3.1-70B-Instruct", 4) == (
        "chunkpilot-profile-h100-llama-3-1-70b-tp4"
    )
    assert canonical_model_name("org/unknown-model") == "org/unknown-model"
    assert profile_configmap_name("a100-80gb", "org/Unknown_Model", 2) == (
        "chunkpilot-profile-a100-80gb-org-unknown-model-tp2"
    )


def test_long_names_are_bounded_and_stay_distinct() -> None:
    a = profile_configmap_name("h200", "some-org/" + "a-very-long-model-name-" * 4 + "one", 8)
    b = profile_configmap_name("h200", "some-org/" + "a-very-long-model-name-" * 4 + "two", 8)
    for name in (a, b, probe_job_name("h200", "x" * 100, 1)):
        assert len(name) <= 63
        assert DNS_LABEL.match(name), name
    assert a != b
    with pytest.raises(ValueError, match="at least 1"):
        profile_configmap_name("h200", "llama-3.1-8b", 0)
    with pytest.raises(ValueError, match="no letters or digits"):
        profile_configmap_name("h200", "///", 1)


def _job(**overrides: object) -> dict[str, object]:
    spec = ProbeJobSpec(
        accelerator="h200",
        model="meta-llama/Llama-3.1-70B-Instruct",
        namespace="serving",
        image="ghcr.io/chunkpilot/engine:0.1.0",
        tensor_parallel_size=4,
        **overrides,  # type: ignore[arg-type]
    )
    return build_probe_job(spec)


def test_probe_job_runs_the_probe_on_one_gpu_then_publishes() -> None:
    job = _job(itl_target_ms=50.0, node_selector={"gpu": "h200"}, tolerations=[{"key": "nvidia.com/gpu"}])
    assert job["apiVersion"] == "batch/v1"
    meta = job["metadata"]
    assert meta["name"] == "chunkpilot-probe-h200-llama-3-1-70b-tp4"  # type: ignore[index]
    assert meta["namespace"] == "serving"  # type: ignore[index]
    assert meta["labels"][LABEL_MODEL] == "llama-3-1-70b"  # type: ignore[index]
    pod = job["spec"]["template"]["spec"]  # type: ignore[index]
    assert pod["restartPolicy"] == "Never"
    assert pod["nodeSelector"] == {"gpu": "h200"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu"}]
    (probe,) = pod["initContainers"]
    assert probe["image"] == "ghcr.io/chunkpilot/engine:0.1.0"
    assert probe["resources"]["limits"] == {"nvidia.com/gpu": "1"}  # one shard on one GPU, whatever the TP
    command = probe["command"]
    assert command[:2] == ["chunkpilot", "probe"]
    named = ("--model", "--tensor-parallel-size", "--device", "--accelerator", "--out", "--itl-target-ms")
    assert flags(command, *named) == {
        "--model": "meta-llama/Llama-3.1-70B-Instruct",
        "--tensor-parallel-size": "4",
        "--device": "cuda",
        "--accelerator": "h200",
        "--out": "/profile/profile.json",
        "--itl-target-ms": "50",
    }
    (publish,) = pod["containers"]
    assert publish["command"] == [
        "chunkpilot",
        "probe",
        "publish",
        "--file",
        "/profile/profile.json",
        "--configmap",
        "chunkpilot-profile-h200-llama-3-1-70b-tp4",
        "--namespace",
        "serving",
    ]
    assert "nvidia.com/gpu" not in publish["resources"].get("limits", {})
    assert {v["name"] for v in pod["volumes"]} == {"profile", "home"}  # the probe's HOME: an emptyDir
    assert pod["serviceAccountName"] == "chunkpilot-probe"
    # Within the "restricted" Pod Security profile: non-root, no escalation, no capabilities.
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in (probe, publish):
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert container["securityContext"]["allowPrivilegeEscalation"] is False


def test_probe_job_mounts_a_model_config_for_models_without_a_profile() -> None:
    job = _job(model_config_map="my-model-config", tokens=[1, 64, 4096])
    pod = job["spec"]["template"]["spec"]  # type: ignore[index]
    command = pod["initContainers"][0]["command"]
    assert command[command.index("--model") + 1] == "/model-config/config.json"
    assert command[command.index("--tokens") + 1] == "1,64,4096"
    assert {"name": "model-config", "configMap": {"name": "my-model-config"}} in pod["volumes"]


def test_rbac_allows_exactly_configmap_writes() -> None:
    account, role, binding = build_probe_rbac("serving")
    assert account["kind"] == "ServiceAccount"
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "create", "update", "patch"]}
    ]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "chunkpilot-probe", "namespace": "serving"}
    ]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]


def test_with_the_installations_publisher_role_only_a_binding_to_it_is_written() -> None:
    account, binding = build_probe_rbac("serving", publisher_role=("ClusterRole", PUBLISHER_ROLE_NAME))
    assert account["kind"] == "ServiceAccount" and binding["kind"] == "RoleBinding"
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "chunkpilot-probe-publisher",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "chunkpilot-probe", "namespace": "serving"}
    ]


def test_configmap_round_trip(small_profile: StepProfile) -> None:
    name = profile_configmap_name(
        small_profile.accelerator, small_profile.model, small_profile.tensor_parallel_size
    )
    configmap = build_profile_configmap(small_profile, name, "serving")
    assert configmap["metadata"]["name"] == name
    assert configmap["metadata"]["annotations"]["chunkpilot.io/knee-tokens"] == str(small_profile.knee_tokens)
    assert set(configmap["data"]) == {PROFILE_KEY}
    assert profile_from_configmap(configmap) == small_profile


def test_configmap_without_a_profile_is_a_clear_error() -> None:
    with pytest.raises(ProfileError, match=r"has no 'profile\.json' key"):
        profile_from_configmap({"metadata": {"name": "x"}, "data": {}})
    with pytest.raises(ProfileError, match="not valid JSON"):
        profile_from_configmap({"metadata": {"name": "x"}, "data": {PROFILE_KEY: "{"}})
