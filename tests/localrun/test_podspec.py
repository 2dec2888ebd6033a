"""What the pod runner runs for a pod, and the status it reports back."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest

from chunkpilot.localrun import podspec
from chunkpilot.localrun.podspec import (
    ContainerPhase,
    ContainerReport,
    CrashInjection,
    EnvConfigError,
    EnvRef,
    PodSpecError,
    RefKind,
    Termination,
)

NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)


def pod_manifest(**overrides: Any) -> dict[str, Any]:
    manifest: dict[str, Any] = {
        "metadata": {
            "name": "chat-canary-7d9f-abcde",
            "namespace": "demo",
            "uid": "u-1",
            "labels": {
                "chunkpilot.io/service": "chat",
                "chunkpilot.io/track": "canary",
                "chunkpilot.io/config-hash": "a1b2c3d4",
            },
        },
        "spec": {
            "nodeName": "gpu-node-0",
            "containers": [
                {"name": "sidecar", "args": ["x"]},
                {
                    "name": "engine",
                    "args": [
                        "llama-3.1-8b",
                        "--max-num-batched-tokens",
                        "2048",
                        "--port",
                        "8000",
                        "--host=0.0.0.0",
                    ],
                    "env": [
                        {"name": "A", "value": "1"},
                        {"name": "SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "token"}}},
                        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    ],
                },
            ],
        },
        "status": {"phase": "Running", "podIP": "10.244.0.5"},
    }
    manifest.update(overrides)
    return manifest


def test_parse_pod_reads_labels_args_and_state() -> None:
    pod = podspec.parse_pod(pod_manifest())
    assert (pod.namespace, pod.name, pod.service, pod.track, pod.config_hash) == (
        "demo",
        "chat-canary-7d9f-abcde",
        "chat",
        "canary",
        "a1b2c3d4",
    )
    assert pod.container == "engine"
    assert pod.args[0] == "llama-3.1-8b"
    assert pod.env == (("A", "1"), ("SECRET", EnvRef(RefKind.SECRET, "s", "token")))
    assert pod.should_run and not pod.terminating and pod.grace_period_s == 30


def test_unscheduled_terminating_and_finished_pods_do_not_run() -> None:
    unscheduled = pod_manifest()
    del unscheduled["spec"]["nodeName"]
    assert not podspec.parse_pod(unscheduled).should_run
    terminating = pod_manifest()
    terminating["metadata"]["deletionTimestamp"] = "2026-11-29T12:00:00Z"
    assert not podspec.parse_pod(terminating).should_run
    assert not podspec.parse_pod(pod_manifest(status={"phase": "Failed"})).should_run


def test_a_container_without_args_is_refused() -> None:
    with pytest.raises(PodSpecError, match=r"args are \[MODEL"):
        podspec.parse_pod(pod_manifest(spec={"nodeName": "n", "containers": [{"name": "engine"}]}))


def test_runner_owned_flags_are_replaced_in_both_spellings() -> None:
    args = ["m", "--port", "8000", "--host=0.0.0.0", "--time-scale", "5", "--max-num-seqs", "64"]
    assert podspec.strip_flags(args, ("--host", "--port", "--time-scale")) == ["m", "--max-num-seqs", "64"]
    command = podspec.engine_command(["sim", "serve"], args, host="127.0.0.1", port=4242, time_scale=10.0)
    assert command == [
        "sim",
        "serve",
        "m",
        "--max-num-seqs",
        "64",
        "--host",
        "127.0.0.1",
        "--port",
        "4242",
        "--time-scale",
        "10",
    ]
    assert "--time-scale" not in podspec.engine_command(["sim"], args, host="h", port=1, time_scale=None)


def test_a_hardware_override_replaces_the_pods_own_hardware_flags() -> None:
    args = ["m", "--gpu", "h100", "--step-profile=mine.json", "--max-num-seqs", "64"]
    hardware = ("--gpu", "/truth/accel.json", "--step-profile", "/truth/steps.json")
    command = podspec.engine_command(["sim"], args, host="h", port=1, time_scale=None, hardware=hardware)
    assert command == ["sim", "m", "--max-num-seqs", "64", *hardware, "--host", "h", "--port", "1"]
    assert "h100" in podspec.engine_command(["sim"], args, host="h", port=1, time_scale=None)  # no override


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, (CrashInjection.NONE, 0.0)),
        ("false", (CrashInjection.NONE, 0.0)),
        ("true", (CrashInjection.AT_START, 0.0)),
        ("30s", (CrashInjection.AFTER_DELAY, 30.0)),
        ("1.5m", (CrashInjection.AFTER_DELAY, 90.0)),
        ("250ms", (CrashInjection.AFTER_DELAY, 0.25)),
    ],
)
def test_crash_injection_annotation(value: str | None, expected: tuple[CrashInjection, float]) -> None:
    assert podspec.parse_crash_injection(value) == expected


def test_bad_crash_injection_annotation_names_the_forms() -> None:
    with pytest.raises(PodSpecError, match="'30s'"):
        podspec.parse_crash_injection("sometimes")


def test_healthy_engine_reports_ready_running() -> None:
    report = ContainerReport("engine", ContainerPhase.RUNNING, 0, NOW, None)
    patch = podspec.status_patch(report, "p", NOW)
    conditions = {c["type"]: c for c in patch["status"]["conditions"]}
    assert conditions["Ready"]["status"] == "True" and conditions["ContainersReady"]["status"] == "True"
    (container,) = patch["status"]["containerStatuses"]
    assert container["ready"] is True and container["state"]["running"]["startedAt"] == "2026-11-29T12:00:00Z"
    assert container["state"]["waiting"] is None


def test_crashed_engine_reports_crash_loop_back_off_with_the_last_termination() -> None:
    last = Termination(137, "Error", NOW, NOW, "x" * 5000)
    report = ContainerReport("engine", ContainerPhase.BACKOFF, 2, NOW, last, backoff_s=20)
    patch = podspec.status_patch(report, "chat-canary-1", NOW)
    ready = next(c for c in patch["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and ready["reason"] == "ContainersNotReady"
    (container,) = patch["status"]["containerStatuses"]
    assert container["ready"] is False and container["restartCount"] == 2
    assert container["state"]["running"] is None
    assert container["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert "back-off 20s" in container["state"]["waiting"]["message"]
    terminated = container["lastState"]["terminated"]
    assert terminated["exitCode"] == 137 and len(terminated["message"]) == 1024


def test_signatures_compare_what_the_api_shows_with_what_the_runner_knows() -> None:
    kwok_ready = pod_manifest(
        status={
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [
                {"name": "engine", "restartCount": 0, "state": {"running": {"startedAt": "t"}}}
            ],
        }
    )
    assert podspec.observed_signature(kwok_ready, "engine") == (True, 0, "running")
    starting = ContainerReport("engine", ContainerPhase.STARTING, 0, NOW, None)
    assert podspec.desired_signature(starting) == (False, 0, "running")
    assert podspec.desired_signature(ContainerReport("engine", ContainerPhase.RUNNING, 0, NOW, None)) == (
        True,
        0,
        "running",
    )
    assert podspec.observed_signature(pod_manifest(), "engine") == (False, 0, "unknown")


def lookup_from(
    objects: Mapping[tuple[RefKind, str], Mapping[str, str]], calls: list[str] | None = None
) -> Any:
    def lookup(kind: RefKind, namespace: str, name: str) -> Mapping[str, str] | None:
        assert namespace == "demo"
        if calls is not None:
            calls.append(name)
        return objects.get((kind, name))

    return lookup


def test_env_references_resolve_from_secrets_and_config_maps_in_order() -> None:
    env = (
        ("A", "1"),
        ("TOKEN", EnvRef(RefKind.SECRET, "chat-live-adjust", "token")),
        ("MODE", EnvRef(RefKind.CONFIG_MAP, "settings", "mode")),
        ("OTHER", EnvRef(RefKind.SECRET, "chat-live-adjust", "other")),
        ("A", "2"),
    )
    objects = {
        (RefKind.SECRET, "chat-live-adjust"): {"token": "s3cret", "other": "x"},
        (RefKind.CONFIG_MAP, "settings"): {"mode": "fast"},
    }
    calls: list[str] = []
    resolved = podspec.resolve_env(env, "demo", lookup_from(objects, calls))
    assert resolved == {"A": "2", "TOKEN": "s3cret", "MODE": "fast", "OTHER": "x"}
    assert calls == ["chat-live-adjust", "settings"]  # each object read once


def test_a_missing_secret_or_key_is_a_config_error_naming_it() -> None:
    env = (("TOKEN", EnvRef(RefKind.SECRET, "chat-live-adjust", "token")),)
    with pytest.raises(EnvConfigError, match="secret 'chat-live-adjust' not found"):
        podspec.resolve_env(env, "demo", lookup_from({}))
    with pytest.raises(EnvConfigError, match="couldn't find key 'token' in Secret demo/chat-live-adjust"):
        podspec.resolve_env(env, "demo", lookup_from({(RefKind.SECRET, "chat-live-adjust"): {"x": "y"}}))


def test_optional_references_are_left_out_when_missing() -> None:
    env = (("A", "1"), ("TOKEN", EnvRef(RefKind.SECRET, "gone", "token", optional=True)))
    assert podspec.resolve_env(env, "demo", lookup_from({})) == {"A": "1"}


def test_a_reference_without_name_or_key_is_refused() -> None:
    manifest = pod_manifest()
    manifest["spec"]["containers"][1]["env"] = [{"name": "T", "valueFrom": {"secretKeyRef": {"key": "k"}}}]
    with pytest.raises(PodSpecError, match=r"env T: valueFrom.secretKeyRef needs both 'name' and 'key'"):
        podspec.parse_pod(manifest)


def test_secret_data_is_base64_decoded() -> None:
    encoded = base64.b64encode(b"t0ken").decode()
    assert podspec.decode_secret_data({"token": encoded}) == {"token": "t0ken"}
    assert podspec.decode_secret_data(None) == {}


def test_a_container_waiting_for_its_config_reports_create_container_config_error() -> None:
    report = ContainerReport(
        "engine", ContainerPhase.CONFIG_ERROR, 0, None, None, config_error="secret 'x' not found"
    )
    assert podspec.desired_signature(report) == (False, 0, "waiting")
    (container,) = podspec.status_patch(report, "p", NOW)["status"]["containerStatuses"]
    assert container["ready"] is False and container["started"] is False
    assert container["state"]["waiting"] == {
        "reason": "CreateContainerConfigError",
        "message": "secret 'x' not found",
    }


def test_a_field_ref_to_the_pods_namespace_gives_it_and_other_field_refs_are_left_out() -> None:
    manifest = pod_manifest()
    manifest["spec"]["containers"][1]["env"] = [
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]
    pod = podspec.parse_pod(manifest)
    assert pod.env == (("POD_NAMESPACE", "demo"),)


def test_args_expand_variables_of_the_container_env_as_kubernetes_does() -> None:
    env = {"POD_NAMESPACE": "demo", "EMPTY": ""}
    args = ["--ns", "$(POD_NAMESPACE)", "x=$(POD_NAMESPACE)/$(UNSET)", "$$(POD_NAMESPACE)", "$(EMPTY)", "$5"]
    assert podspec.expand_args(args, env) == ("--ns", "demo", "x=demo/$(UNSET)", "$(POD_NAMESPACE)", "", "$5")
    assert podspec.literal_env((("A", "1"), ("S", EnvRef(RefKind.SECRET, "s", "k")), ("A", "2"))) == {
        "A": "2"
    }
