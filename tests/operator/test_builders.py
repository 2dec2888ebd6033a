"""Builders: names, labels, selectors and pod details of the child manifests."""

from __future__ import annotations

from typing import Any

import pytest
from chunkpilot.operator.builders import (
    RenderError,
    build_children,
    build_deployment,
    build_pod_monitor,
    build_service,
    build_stable_deployment,
    incumbent,
    promoted_config,
)
from chunkpilot.operator.served import with_best_config

from chunkpilot.api import EngineConfig, InferenceService, InferenceServiceStatus, Track

SLO = {"itl": {"quantile": 0.99, "maxMs": 50}, "ttft": {"quantile": 0.95, "maxMs": 2000}}


def isvc(**spec: Any) -> InferenceService:
    body = {
        "apiVersion": "chunkpilot.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "chat", "namespace": "llm"},
        "spec": {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, **spec},
    }
    return InferenceService.from_manifest(body)


def test_stable_deployment_labels_and_selector() -> None:
    service = isvc(replicas=3)
    deployment = build_deployment(service, Track.STABLE)
    assert deployment["metadata"]["name"] == "chat-stable"
    assert deployment["metadata"]["namespace"] == "llm"
    assert deployment["spec"]["replicas"] == 3
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector == {"chunkpilot.io/service": "chat", "chunkpilot.io/track": "stable"}
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels["chunkpilot.io/config-hash"] == EngineConfig.from_engine(service.spec.engine).config_hash()
    assert selector.items() <= labels.items()


def test_canary_deployment_with_a_trial_config() -> None:
    service = isvc(replicas=3, autotune={"canaryReplicas": 2})
    config = EngineConfig.from_engine(service.spec.engine).model_copy(update={"max_num_batched_tokens": 3072})
    canary = build_deployment(service, "canary", config)
    assert canary["metadata"]["name"] == "chat-canary"
    assert canary["spec"]["replicas"] == 2
    pod = canary["spec"]["template"]
    assert pod["metadata"]["labels"]["chunkpilot.io/track"] == "canary"
    assert pod["metadata"]["labels"]["chunkpilot.io/config-hash"] == config.config_hash()
    args = pod["spec"]["containers"][0]["args"]
    assert args[args.index("--max-num-batched-tokens") + 1] == "3072"
    assert build_deployment(service, Track.CANARY, config, replicas=5)["spec"]["replicas"] == 5


def test_config_change_changes_only_the_template_hash_not_the_selector() -> None:
    service = isvc()
    before = build_deployment(service, Track.STABLE)
    config = EngineConfig.from_engine(service.spec.engine).model_copy(update={"max_num_seqs": 128})
    after = build_deployment(service, Track.STABLE, config)
    assert before["spec"]["selector"] == after["spec"]["selector"]
    hashes = {
        d["spec"]["template"]["metadata"]["labels"]["chunkpilot.io/config-hash"] for d in (before, after)
    }
    assert len(hashes) == 2


def test_pod_details() -> None:
    deployment = build_deployment(isvc(engine={"tensorParallelSize": 2}), Track.STABLE)
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert container["startupProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    args = container["args"]
    assert pod["terminationGracePeriodSeconds"] > int(args[args.index("--shutdown-timeout") + 1])
    assert pod["enableServiceLinks"] is False


def test_engine_pods_are_restricted_by_default_and_root_only_when_asked() -> None:
    pod = build_deployment(isvc(), Track.STABLE)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"] == {
        "seccompProfile": {"type": "RuntimeDefault"},
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "fsGroup": 65532,
    }
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    assert pod["automountServiceAccountToken"] is False
    # HOME, and every cache under it, is a writable emptyDir.
    home = {e["name"]: e["value"] for e in container["env"] if e["name"] in ("HOME", "USER")}
    assert home == {"HOME": "/home/chunkpilot", "USER": "chunkpilot"}
    assert {"name": "home", "mountPath": "/home/chunkpilot"} in container["volumeMounts"]
    assert {"name": "home", "emptyDir": {}} in pod["volumes"]

    rooted = build_deployment(isvc(engine={"runAsUser": 0}), Track.STABLE)["spec"]["template"]["spec"]
    assert rooted["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    assert rooted["containers"][0]["securityContext"] == {"allowPrivilegeEscalation": False}
    other = build_deployment(isvc(engine={"runAsUser": 1001}), Track.STABLE)["spec"]["template"]["spec"]
    assert other["securityContext"]["runAsUser"] == 1001


def test_placement_is_copied() -> None:
    service = isvc(
        resources={
            "nodeSelector": {"pool": "gpu"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        }
    )
    pod = build_deployment(service, Track.STABLE)["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "gpu"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def test_service_selects_both_tracks() -> None:
    service = build_service(isvc())
    assert service["metadata"]["name"] == "chat"
    assert service["spec"]["selector"] == {"chunkpilot.io/service": "chat"}
    assert service["spec"]["ports"][0]["targetPort"] == "http"


def test_pod_monitor_carries_selector_labels_and_track_target_labels() -> None:
    monitor = build_pod_monitor(isvc(), {"release": "kube-prometheus-stack"})
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    endpoint = monitor["spec"]["podMetricsEndpoints"][0]
    assert endpoint["port"] == "http"
    assert "podTargetLabels" not in monitor["spec"]  # would yield chunkpilot_io_track, not track
    rules = endpoint["relabelings"]
    copied = {rule["targetLabel"]: rule["sourceLabels"] for rule in rules if rule["action"] == "replace"}
    assert copied == {
        "namespace": ["__meta_kubernetes_namespace"],
        "service": ["__meta_kubernetes_pod_label_chunkpilot_io_service"],
        "track": ["__meta_kubernetes_pod_label_chunkpilot_io_track"],
        "config_hash": ["__meta_kubernetes_pod_label_chunkpilot_io_config_hash"],
        "pod": ["__meta_kubernetes_pod_name"],
    }
    assert endpoint["relabelings"][-1] == {"action": "labeldrop", "regex": "container|endpoint"}


def with_best(service: InferenceService, **knobs: Any) -> tuple[InferenceService, EngineConfig]:
    best = EngineConfig.from_engine(service.spec.engine).model_copy(update=knobs)
    return service.model_copy(update={"status": InferenceServiceStatus(best_config=best)}), best


def test_promoted_best_config_drives_the_stable_deployment_while_autotuning() -> None:
    service, best = with_best(
        isvc(slo=SLO, autotune={"enabled": True}), max_num_batched_tokens=3072, max_num_seqs=96
    )
    assert promoted_config(service) == best == incumbent(service)
    deployment = build_children(service, pod_monitor=False).deployment
    assert deployment == build_deployment(service, Track.STABLE, config=best)
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels["chunkpilot.io/config-hash"] == best.config_hash()
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--max-num-batched-tokens") + 1] == "3072"
    assert args[args.index("--max-num-seqs") + 1] == "96"


def test_best_config_is_ignored_when_autotune_is_off_or_the_engine_cannot_run_it() -> None:
    off, _ = with_best(isvc(slo=SLO), max_num_batched_tokens=3072)
    assert promoted_config(off) is None
    assert incumbent(off) == EngineConfig.from_engine(off.spec.engine)  # the spec's knobs
    assert build_stable_deployment(off) == build_deployment(off, Track.STABLE)
    upstream = isvc(slo=SLO, autotune={"enabled": True}, engine={"image": "vllm/vllm-openai:v0.33.0"})
    unsupported, _ = with_best(upstream, max_num_partial_prefills=2)
    assert promoted_config(unsupported) is None  # upstream vLLM 0.33 has no partial-prefill limits
    assert incumbent(unsupported) == EngineConfig.from_engine(unsupported.spec.engine)
    assert promoted_config(isvc(slo=SLO, autotune={"enabled": True})) is None


def test_status_best_config_is_read_leniently() -> None:
    service = isvc(slo=SLO, autotune={"enabled": True})
    raw = {"bestConfig": {"maxNumBatchedTokens": 4096, "maxNumSeqs": 128}, "phase": "Nonsense"}
    promoted = with_best_config(service, raw)
    assert promoted.status is not None and promoted.status.best_config is not None
    assert promoted.status.best_config.max_num_batched_tokens == 4096
    assert with_best_config(service, {"bestConfig": {"maxNumSeqs": "many"}}) is service
    assert with_best_config(service, None) is service


def test_unsupported_knob_raises_render_error() -> None:
    with pytest.raises(RenderError) as error:
        build_deployment(
            isvc(engine={"image": "vllm/vllm-openai:v0.33.0", "maxNumPartialPrefills": 2}), Track.STABLE
        )
    assert error.value.problem.reason == "UnsupportedKnob"


def test_children_without_pod_monitor() -> None:
    children = build_children(isvc(), pod_monitor=False)
    assert [m["kind"] for m in children.manifests()] == ["Deployment", "Service"]
