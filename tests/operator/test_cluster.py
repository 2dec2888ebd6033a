"""The operator as a real process against the local control plane (etcd, kube-apiserver,
kube-controller-manager, KWOK).

One operator process serves the tests of this module in order (each step builds on the
previous one, like a user's session); the HA test runs two more with peering in their own
namespace.
"""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from chunkpilot.operator.builders import build_pod_monitor
from chunkpilot.operator.testing import OperatorProcess, operator_env, wait_for

from chunkpilot.bench.operator_load import run_bench
from chunkpilot.testing.kube import condition_of, get_object
from chunkpilot.testing.services import LLAMA_8B, a_manifest

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
NS = "chunkpilot-operator-tests"
NS_HA = "chunkpilot-operator-ha"
EXAMPLE = REPO / "examples" / "chat-llama-8b-sim.yaml"
LEGACY = REPO / "examples" / "legacy-vllm-partial-prefill.yaml"
SERVICE_LABEL = "chunkpilot.io/service"
PSS_ENFORCE = "pod-security.kubernetes.io/enforce"
READY_TIMEOUT = 90.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def apply(cluster: Any, manifest: dict[str, Any] | str, namespace: str = NS) -> None:
    text = manifest if isinstance(manifest, str) else json.dumps(manifest)
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=text)


def get(cluster: Any, kind: str, name: str, namespace: str = NS) -> dict[str, Any] | None:
    return get_object(cluster, kind, name, namespace)


def items(cluster: Any, kind: str, selector: str, namespace: str = NS) -> list[dict[str, Any]]:
    out = cluster.kubectl("get", kind, "-n", namespace, "-l", selector, "-o", "json").stdout
    listed: list[dict[str, Any]] = json.loads(out)["items"]
    return listed


condition = condition_of


def engine_args(deployment: dict[str, Any]) -> list[str]:
    args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def event_reasons(cluster: Any, name: str, namespace: str = NS) -> list[str]:
    out = cluster.kubectl(
        "get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}", "-o", "json"
    ).stdout
    return [event["reason"] for event in json.loads(out)["items"]]


def table_row(header: str, line: str) -> dict[str, str]:
    """One row of ``kubectl get`` output by column (cells may be empty)."""
    starts = [match.start() for match in re.finditer(r"\S+", header)]
    names = header.split()
    bounds = [*starts[1:], None]
    return {name: line[start:end].strip() for name, start, end in zip(names, starts, bounds, strict=True)}


def event_messages(cluster: Any, name: str, reason: str, namespace: str = NS) -> list[str]:
    out = cluster.kubectl(
        "get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={name},reason={reason}",
        "-o", "json",
    ).stdout  # fmt: skip
    return [event["message"] for event in json.loads(out)["items"]]


def wait_ready(cluster: Any, name: str, namespace: str = NS) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        isvc = get(cluster, "inferenceservices", name, namespace)
        ready = condition(isvc, "Ready")
        generation = (isvc or {}).get("metadata", {}).get("generation")
        if ready and ready["status"] == "True" and ready.get("observedGeneration") == generation:
            return isvc
        return None

    return wait_for(ready, timeout=READY_TIMEOUT, what=f"InferenceService {name} Ready=True")


def wait_ready_reason(cluster: Any, name: str, reason: str) -> dict[str, Any]:
    """The Ready condition of ``name`` once its reason is ``reason``."""

    def found() -> dict[str, Any] | None:
        ready = condition(get(cluster, "inferenceservices", name), "Ready")
        return ready if ready and ready["reason"] == reason else None

    return wait_for(found, timeout=60, what=f"{name} Ready reason {reason}")


def small_service(name: str, replicas: int = 0, **spec: Any) -> dict[str, Any]:
    """A vLLM 0.33 service of Llama-3.1-8B on one H100 (no pods unless ``replicas``), ``spec`` on top."""
    engine = {"kind": "vllm", "version": "0.33.0", "maxNumBatchedTokens": 2048, "maxNumSeqs": 64}
    body = {
        "model": {"name": LLAMA_8B["name"]},
        "engine": {**engine, **spec.pop("engine", {})},
        "resources": {"accelerator": "h100"},
        "replicas": replicas,
        **spec,
    }
    return a_manifest(name, None, body)


def wait_rolled_out(cluster: Any, name: str, namespace: str = NS) -> dict[str, Any]:
    """Ready, and every stable pod runs the latest template (no rollout in flight)."""

    def done() -> dict[str, Any] | None:
        isvc = wait_ready(cluster, name, namespace)
        progressing = condition(isvc, "Progressing")
        return isvc if progressing and progressing["reason"] == "RolloutComplete" else None

    return wait_for(done, timeout=READY_TIMEOUT, what=f"InferenceService {name} rollout complete")


def wait_deployment(
    cluster: Any, name: str, predicate: Any = None, namespace: str = NS, what: str = ""
) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        deployment = get(cluster, "deployments", name, namespace)
        if deployment is not None and (predicate is None or predicate(deployment)):
            return deployment
        return None

    return wait_for(found, timeout=60, what=what or f"Deployment {name}")


@pytest.fixture(scope="module")
def cluster(control_plane: Any) -> Any:
    """The session control plane with the CRDs (ours and Kopf's peering) and two namespaces."""
    control_plane.apply_manifests(
        [REPO / "crds", REPO / "charts" / "chunkpilot" / "crds" / "kopf-peering.yaml"]
    )
    for namespace in (NS, NS_HA):
        apply(control_plane, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    # Every engine pod of this module must pass the "restricted" Pod Security profile: the API
    # server refuses to create one that does not.
    control_plane.kubectl("label", "--overwrite", "namespace", NS, f"{PSS_ENFORCE}=restricted")
    return control_plane


@pytest.fixture(scope="module")
def operator(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    """``chunkpilot operator -n NS --standalone`` for every test of this module."""
    port = free_port()
    process = OperatorProcess(
        ["-n", NS, "--standalone", "--verbose", "--metrics-port", str(port)],
        env=operator_env(cluster.env),
        log_path=tmp_path_factory.mktemp("operator") / "operator.log",
    )
    process.metrics_port = port  # type: ignore[attr-defined]
    process.start()
    yield process
    # Remove what is left while the operator still runs (it owns the finalizers).
    cluster.kubectl(
        "delete", "inferenceservices", "--all", "-n", NS, "--wait=true", "--timeout=60s", check=False
    )
    process.stop()


def test_example_becomes_ready_with_its_children(cluster: Any, operator: OperatorProcess) -> None:
    apply(cluster, EXAMPLE.read_text())
    isvc = get(cluster, "inferenceservices", "chat")
    assert isvc is not None
    deployment = wait_deployment(cluster, "chat-stable")
    args = engine_args(deployment)
    assert flag(args, "--max-num-batched-tokens") == "2048"
    assert flag(args, "--max-num-seqs") == "128"
    assert flag(args, "--served-model-name") == "llama-8b"
    assert deployment["spec"]["replicas"] == 2
    owner = deployment["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"], owner["controller"]) == (
        "InferenceService",
        isvc["metadata"]["uid"],
        True,
    )
    service = get(cluster, "services", "chat")
    assert service is not None and service["spec"]["selector"] == {SERVICE_LABEL: "chat"}

    ready = wait_ready(cluster, "chat")  # KWOK runs the pods and marks them Ready
    assert ready["status"]["appliedConfig"]["maxNumBatchedTokens"] == 2048
    assert ready["status"]["readyReplicas"] == 2
    table = cluster.kubectl("get", "cpis", "chat", "-n", NS).stdout.splitlines()
    row = table_row(table[0], table[1])
    assert (row["READY"], row["BUDGET"], row["PHASE"]) == ("True", "2048", "Ready")
    described = cluster.kubectl("describe", "cpis", "chat", "-n", NS).stdout
    assert "Conditions:" in described and "Events:" in described
    assert {"Created", "Ready"} <= set(event_reasons(cluster, "chat"))

    url = f"http://127.0.0.1:{operator.metrics_port}/metrics"  # type: ignore[attr-defined]
    metrics = urllib.request.urlopen(url, timeout=10).read().decode()
    assert (
        f'chunkpilot_token_budget_tokens{{namespace="{NS}",service="chat",track="stable"}} 2048.0' in metrics
    )
    assert (
        f'chunkpilot_slo_target_seconds{{metric="itl",namespace="{NS}",quantile="0.99",service="chat"}} 0.05'
        in (metrics)
    )


#: What the Prometheus Operator puts in front of a PodMonitor endpoint's own relabelings.
PROMETHEUS_OPERATOR_PRELUDE: list[dict[str, Any]] = [
    {"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": "http"},
    {"action": "replace", "source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
    {
        "action": "replace",
        "source_labels": ["__meta_kubernetes_pod_container_name"],
        "target_label": "container",
    },
    {"action": "replace", "source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
    {"action": "replace", "target_label": "endpoint", "replacement": "http"},
]


def test_pod_monitor_relabelings_give_the_contract_target_labels(
    cluster: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Real Prometheus relabels the engine pods' targets as the PodMonitor says."""
    from chunkpilot.api import InferenceService
    from chunkpilot.devcluster.processes import ManagedProcess, http_ok
    from chunkpilot.devcluster.prometheus import locate_prometheus

    binary = locate_prometheus()
    if binary is None:
        pytest.fail("Prometheus is not installed; run `chunkpilot cluster fetch`", pytrace=False)
    monitor = build_pod_monitor(InferenceService.from_manifest({**yaml.safe_load(EXAMPLE.read_text())}))
    endpoint = monitor["spec"]["podMetricsEndpoints"][0]
    rules = [
        {
            {"sourceLabels": "source_labels", "targetLabel": "target_label"}.get(k, k): v
            for k, v in rule.items()
        }
        for rule in endpoint["relabelings"]
    ]
    folder = tmp_path_factory.mktemp("prometheus-sd")
    # Debian's Prometheus is built without Kubernetes discovery, so the test hands it the targets
    # that discovery would produce for the live pods: the same __meta_kubernetes_* labels, through
    # file_sd. Relabeling is then Prometheus's own.
    pods = {item["metadata"]["name"]: item for item in items(cluster, "pods", f"{SERVICE_LABEL}=chat")}
    assert pods
    groups = []
    for index, (name, pod) in enumerate(sorted(pods.items())):
        meta = {
            "__meta_kubernetes_namespace": NS,
            "__meta_kubernetes_pod_name": name,
            "__meta_kubernetes_pod_container_name": "engine",
            "__meta_kubernetes_pod_container_port_name": "http",
            **{
                "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", key): value
                for key, value in pod["metadata"]["labels"].items()
            },
        }
        groups.append({"targets": [f"127.0.0.{index + 2}:8000"], "labels": meta})
    (folder / "targets.json").write_text(json.dumps(groups))
    config = {
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": f"podMonitor/{NS}/chat/0",
                "file_sd_configs": [{"files": [str(folder / "targets.json")]}],
                "relabel_configs": [
                    {
                        "action": "keep",
                        "source_labels": ["__meta_kubernetes_pod_label_chunkpilot_io_service"],
                        "regex": "chat",
                    },
                    *PROMETHEUS_OPERATOR_PRELUDE,
                    *rules,
                ],
            }
        ],
    }
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    prometheus = ManagedProcess(
        name="prometheus-sd",
        argv=[
            str(binary),
            f"--config.file={folder / 'prometheus.yml'}",
            f"--storage.tsdb.path={folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        log_path=folder / "prometheus.log",
        cwd=folder,
    ).start()
    try:
        prometheus.wait_until(lambda: http_ok(f"http://127.0.0.1:{port}/-/ready"), 60, "Prometheus ready")

        def targets() -> list[dict[str, str]] | None:
            url = f"http://127.0.0.1:{port}/api/v1/targets?state=active"
            active = json.loads(urllib.request.urlopen(url, timeout=5).read())["data"]["activeTargets"]
            return [target["labels"] for target in active] or None

        found = wait_for(targets, timeout=60, what="engine pods discovered by Prometheus")
        assert sorted(labels["pod"] for labels in found) == sorted(pods)
        for labels in found:
            pod_labels = pods[labels["pod"]]["metadata"]["labels"]
            assert {k: v for k, v in labels.items() if k not in ("job", "instance")} == {
                "namespace": NS,
                "service": "chat",
                "track": "stable",
                "config_hash": pod_labels["chunkpilot.io/config-hash"],
                "pod": labels["pod"],
            }
    finally:
        prometheus.stop()


def test_spec_change_rolls_the_deployment_with_new_arguments(cluster: Any, operator: OperatorProcess) -> None:
    before = get(cluster, "deployments", "chat-stable")
    assert before is not None
    cluster.kubectl(
        "patch",
        "cpis",
        "chat",
        "-n",
        NS,
        "--type=merge",
        "-p",
        '{"spec":{"engine":{"maxNumBatchedTokens":4096}}}',
    )
    after = wait_deployment(
        cluster,
        "chat-stable",
        lambda d: flag(engine_args(d), "--max-num-batched-tokens") == "4096",
        what="chat-stable rolled to a budget of 4096",
    )
    label = "chunkpilot.io/config-hash"
    assert after["metadata"]["labels"][label] != before["metadata"]["labels"][label]
    assert after["metadata"]["uid"] == before["metadata"]["uid"]  # rolled in place, not recreated
    ready = wait_ready(cluster, "chat")
    assert ready["status"]["appliedConfig"]["maxNumBatchedTokens"] == 4096
    assert "Rolled" in event_reasons(cluster, "chat")


def scale_of(cluster: Any, name: str) -> dict[str, Any]:
    """The service's ``scale`` subresource, as an HPA reads it."""
    path = f"/apis/chunkpilot.io/v1alpha1/namespaces/{NS}/inferenceservices/{name}/scale"
    return dict(json.loads(cluster.kubectl("get", "--raw", path).stdout))


def test_kubectl_scale_on_the_service_sets_its_replicas_and_its_scale_subresource_reports_them(
    cluster: Any, operator: OperatorProcess
) -> None:
    apply(cluster, small_service("scaled", replicas=1))
    wait_deployment(cluster, "scaled-stable", lambda d: d["spec"]["replicas"] == 1)
    cluster.kubectl("scale", "cpis", "scaled", "-n", NS, "--replicas=3")
    wait_deployment(cluster, "scaled-stable", lambda d: d["spec"]["replicas"] == 3, what="3 stable replicas")

    def reported() -> dict[str, Any] | None:
        scale = scale_of(cluster, "scaled")
        return scale if scale.get("status", {}).get("replicas") == 3 else None

    scale = wait_for(reported, timeout=60, what="the scale subresource at 3 replicas")
    assert scale["spec"]["replicas"] == 3
    selector = scale["status"]["selector"]
    assert selector == "chunkpilot.io/service=scaled,chunkpilot.io/track=stable", selector
    assert len(items(cluster, "pods", selector)) == 3  # what an HPA averages its pod metrics over
    # Off (the default): the replicas set through the service stick; nothing scales them back.
    time.sleep(2)
    assert get(cluster, "deployments", "scaled-stable")["spec"]["replicas"] == 3  # type: ignore[index]
    line = cluster.kubectl("get", "cpis", "scaled", "-n", NS).stdout.splitlines()
    assert table_row(line[0], line[1])["REPLICAS"] == "3"
    cluster.kubectl("delete", "cpis", "scaled", "-n", NS)


def test_a_horizontal_pod_autoscaler_scales_the_service_through_its_scale_subresource(
    cluster: Any, operator: OperatorProcess
) -> None:
    apply(cluster, small_service("hpa", replicas=1))
    wait_deployment(cluster, "hpa-stable", lambda d: d["spec"]["replicas"] == 1)
    target = {"apiVersion": "chunkpilot.io/v1alpha1", "kind": "InferenceService", "name": "hpa"}
    cpu = {
        "type": "Resource",
        "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}},
    }
    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "hpa", "namespace": NS},
        "spec": {"scaleTargetRef": target, "minReplicas": 2, "maxReplicas": 3, "metrics": [cpu]},
    }
    apply(cluster, hpa)
    # kube-controller-manager's HPA controller raises a target below its minReplicas without metrics:
    # it reads and writes the InferenceService's scale subresource, and the operator follows.
    wait_deployment(cluster, "hpa-stable", lambda d: d["spec"]["replicas"] == 2, what="the HPA's minReplicas")
    isvc = get(cluster, "inferenceservices", "hpa")
    assert isvc is not None and isvc["spec"]["replicas"] == 2
    cluster.kubectl("delete", "hpa", "hpa", "-n", NS)
    cluster.kubectl("delete", "cpis", "hpa", "-n", NS)


def test_in_auto_the_planners_decision_runs_and_a_reapplied_spec_replicas_does_not_fight_it(
    cluster: Any, operator: OperatorProcess
) -> None:
    slo = {"itl": {"quantile": 0.99, "maxMs": 50}, "ttft": {"quantile": 0.95, "maxMs": 600}}
    scaling = {"mode": "Auto", "maxReplicas": 4}
    manifest = small_service("planned", replicas=1, slo=slo, autotune={"enabled": True}, scaling=scaling)
    apply(cluster, manifest)
    wait_deployment(cluster, "planned-stable", lambda d: d["spec"]["replicas"] == 1)

    def decide(replicas: int) -> None:
        """The tuner's decision: status.scaling, written through the status subresource as it does."""
        decision = {"status": {"scaling": {"mode": "Auto", "desiredReplicas": replicas, "reason": "test"}}}
        patch = ("--subresource=status", "--type=merge", "-p", json.dumps(decision))
        cluster.kubectl("patch", "cpis", "planned", "-n", NS, *patch)

    decide(3)
    wait_deployment(cluster, "planned-stable", lambda d: d["spec"]["replicas"] == 3, what="the decision run")
    # A GitOps tool re-applies the manifest with a spec.replicas of its own: the decision still runs.
    apply(cluster, small_service("planned", replicas=2, slo=slo, autotune={"enabled": True}, scaling=scaling))
    time.sleep(2)
    assert get(cluster, "deployments", "planned-stable")["spec"]["replicas"] == 3  # type: ignore[index]
    # A decision beyond maxReplicas runs at maxReplicas; back to Off, spec.replicas runs again.
    decide(9)
    wait_deployment(cluster, "planned-stable", lambda d: d["spec"]["replicas"] == 4, what="maxReplicas")
    cluster.kubectl(
        "patch", "cpis", "planned", "-n", NS, "--type=merge", "-p", '{"spec":{"scaling":{"mode":"Off"}}}'
    )
    wait_deployment(cluster, "planned-stable", lambda d: d["spec"]["replicas"] == 2, what="spec.replicas")
    cluster.kubectl("delete", "cpis", "planned", "-n", NS)


def test_promoted_config_survives_a_deleted_deployment(cluster: Any, operator: OperatorProcess) -> None:
    best = {"maxNumBatchedTokens": 3072, "maxNumSeqs": 96}
    cluster.kubectl(
        "patch", "cpis", "chat", "-n", NS, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"bestConfig": best, "bestTrial": "chat-7"}}),
    )  # fmt: skip
    promoted = wait_deployment(
        cluster,
        "chat-stable",
        lambda d: flag(engine_args(d), "--max-num-batched-tokens") == "3072",
        what="chat-stable following status.bestConfig",
    )
    assert flag(engine_args(promoted), "--max-num-seqs") == "96"

    cluster.kubectl("delete", "deployment", "chat-stable", "-n", NS)
    restored = wait_deployment(
        cluster,
        "chat-stable",
        lambda d: d["metadata"]["uid"] != promoted["metadata"]["uid"],
        what="chat-stable recreated after being deleted by hand",
    )
    assert flag(engine_args(restored), "--max-num-batched-tokens") == "3072"
    wait_for(
        lambda: "DriftCorrected" in event_reasons(cluster, "chat"), timeout=30, what="DriftCorrected Event"
    )
    rolled = event_messages(cluster, "chat", "Rolled")
    assert len(rolled) == 2, rolled  # the spec change and the promotion: no flapping between them


def test_child_service_deleted_or_edited_by_hand_is_restored(cluster: Any, operator: OperatorProcess) -> None:
    old = get(cluster, "services", "chat")
    assert old is not None
    cluster.kubectl("delete", "service", "chat", "-n", NS)
    wait_for(
        lambda: (
            (get(cluster, "services", "chat") or {}).get("metadata", {}).get("uid")
            not in (None, old["metadata"]["uid"])
        ),
        timeout=60,
        what="Service chat recreated",
    )
    cluster.kubectl(
        "patch", "service", "chat", "-n", NS, "--type=merge", "-p", '{"spec":{"selector":{"x":"y"}}}'
    )
    wait_for(
        lambda: (
            (get(cluster, "services", "chat") or {}).get("spec", {}).get("selector")
            == {SERVICE_LABEL: "chat"}
        ),
        timeout=60,
        what="Service chat selector restored",
    )


def test_unsupported_knob_sets_ready_false_instead_of_a_crashing_pod(
    cluster: Any, operator: OperatorProcess
) -> None:
    manifest = yaml.safe_load(LEGACY.read_text())
    manifest["metadata"]["name"] = "upgraded"
    manifest["spec"]["engine"]["version"] = "0.33.0"
    manifest["spec"]["engine"]["image"] = "vllm/vllm-openai:v0.33.0"
    apply(cluster, manifest)
    ready = wait_ready_reason(cluster, "upgraded", "UnsupportedKnob")
    assert ready["status"] == "False"
    assert "maxNumPartialPrefills" in ready["message"] and "0.33" in ready["message"]
    assert get(cluster, "deployments", "upgraded-stable") is None
    assert "UnsupportedKnob" in event_reasons(cluster, "upgraded")


def test_a_name_taken_by_an_object_the_service_does_not_own_is_left_untouched(
    cluster: Any, operator: OperatorProcess
) -> None:
    foreign = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web", "labels": {"app": "web-frontend"}},
        "spec": {"selector": {"app": "web-frontend"}, "ports": [{"name": "http", "port": 80}]},
    }
    apply(cluster, foreign)
    apply(cluster, small_service("web"))
    ready = wait_ready_reason(cluster, "web", "NameConflict")
    assert ready["status"] == "False" and f"Service {NS}/web already exists" in ready["message"], ready
    service = get(cluster, "services", "web")
    assert service is not None
    assert service["spec"]["selector"] == {"app": "web-frontend"}
    assert get(cluster, "deployments", "web-stable") is None  # no engine for a service that cannot serve
    assert not service["metadata"].get("ownerReferences"), service["metadata"]
    assert "NameConflict" in event_reasons(cluster, "web")

    # Once the other Service is gone the service gets its own (the conflict is retried).
    cluster.kubectl("delete", "service", "web", "-n", NS)

    def own_service() -> dict[str, Any] | None:
        found = get(cluster, "services", "web")
        return found if found and found["spec"].get("selector") == {SERVICE_LABEL: "web"} else None

    wait_for(own_service, timeout=90, what="the service's own Service web")
    wait_ready_reason(cluster, "web", "ScaledToZero")  # once the conflict is gone
    cluster.kubectl("delete", "cpis", "web", "-n", NS, "--timeout=60s")


def test_a_live_adjust_secret_name_taken_by_another_secret_is_left_untouched(
    cluster: Any, operator: OperatorProcess
) -> None:
    theirs = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "chunkpilot-live-adjust"}}
    apply(cluster, {**theirs, "stringData": {"token": "someone-elses"}})
    apply(cluster, small_service("keys", autotune={"liveAdjust": True}))
    ready = wait_ready_reason(cluster, "keys", "NameConflict")
    assert f"Secret {NS}/chunkpilot-live-adjust already exists" in ready["message"], ready
    secret = get(cluster, "secrets", "chunkpilot-live-adjust")
    assert secret is not None and not secret["metadata"].get("ownerReferences")
    assert secret["data"] == {"token": "c29tZW9uZS1lbHNlcw=="}  # base64 of "someone-elses": untouched
    assert get(cluster, "deployments", "keys-stable") is None  # nothing rolled out without its token
    cluster.kubectl("delete", "cpis", "keys", "-n", NS, "--timeout=60s")
    cluster.kubectl("delete", "secret", "chunkpilot-live-adjust", "-n", NS)


def test_engine_pods_pass_the_restricted_pod_security_profile_unless_run_as_root(
    cluster: Any, operator: OperatorProcess
) -> None:
    labels = json.loads(cluster.kubectl("get", "namespace", NS, "-o", "json").stdout)["metadata"]["labels"]
    assert labels[PSS_ENFORCE] == "restricted"
    apply(cluster, small_service("strict", replicas=1))
    pods = wait_for(
        lambda: items(cluster, "pods", f"{SERVICE_LABEL}=strict"), timeout=90, what="the engine pod created"
    )
    (pod,) = pods
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert pod["spec"]["automountServiceAccountToken"] is False

    # The same engine as root (spec.engine.runAsUser 0) is refused by the same API server.
    apply(cluster, small_service("rooted", replicas=1, engine={"runAsUser": 0}))

    def refused() -> str | None:
        out = cluster.kubectl(
            "get", "events", "-n", NS, "--field-selector", "reason=FailedCreate", "-o", "json"
        ).stdout
        messages = [
            e["message"]
            for e in json.loads(out)["items"]
            if e["involvedObject"]["name"].startswith("rooted-stable-")
        ]
        return next((m for m in messages if "violates PodSecurity" in m), None)

    message = wait_for(refused, timeout=90, what="the root pod refused by Pod Security admission")
    assert "runAsNonRoot" in message, message
    assert items(cluster, "pods", f"{SERVICE_LABEL}=rooted") == []
    for name in ("strict", "rooted"):
        cluster.kubectl("delete", "cpis", name, "-n", NS, "--timeout=60s")


def test_extra_args_only_the_model_refuses_are_reported_not_retried(
    cluster: Any, operator: OperatorProcess
) -> None:
    # The CRD's CEL sees only the "=" form of --additional-config and no abbreviation; the
    # operator's check, with the engine's parser rules, sees both.
    refused = {
        "garbled": (["--additional-config", "not json"], "--additional-config must be a JSON object"),
        "abbreviated": (["--max-num-seq=512"], "sets --max-num-seqs"),
    }
    for name, (args, _) in refused.items():
        apply(cluster, small_service(name, engine={"extraArgs": args}))
    for name, (_, said) in refused.items():
        ready = wait_ready_reason(cluster, name, "InvalidExtraArgs")
        assert said in ready["message"], ready
        assert get(cluster, "deployments", f"{name}-stable") is None
    for name in refused:
        cluster.kubectl("delete", "cpis", name, "-n", NS, "--timeout=60s")


def test_live_adjust_tokens_are_created_once_per_track_and_kept(
    cluster: Any, operator: OperatorProcess
) -> None:
    secret_name = "chunkpilot-live-adjust"
    apply(cluster, small_service("tokens", autotune={"liveAdjust": True}))
    secret = wait_for(lambda: get(cluster, "secrets", secret_name), timeout=60, what=f"Secret {secret_name}")
    isvc = get(cluster, "inferenceservices", "tokens")
    assert isvc is not None
    (owner,) = secret["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"]) == ("InferenceService", isvc["metadata"]["uid"])
    assert set(secret["data"]) == {"tokens.stable", "tokens.canary"}
    assert secret["data"]["tokens.stable"] != secret["data"]["tokens.canary"]
    deployment = wait_deployment(cluster, "tokens-stable")
    env = {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["CHUNKPILOT_LIVE_ADJUST_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": secret_name,
        "key": "tokens.stable",
    }

    # A second service of the namespace shares the Secret: its own tokens, the first's kept.
    apply(cluster, small_service("tokens-b", autotune={"liveAdjust": True}))

    def joined() -> dict[str, Any] | None:
        found = get(cluster, "secrets", secret_name)
        return found if found and "tokens-b.canary" in found["data"] else None

    shared = wait_for(joined, timeout=60, what="tokens of tokens-b in the namespace's Secret")
    assert len(shared["metadata"]["ownerReferences"]) == 2
    assert {k: v for k, v in shared["data"].items() if k.startswith("tokens.")} == secret["data"]

    # Reconciles of every kind: a spec change, a child deleted by hand, a status update.
    cluster.kubectl(
        "patch", "cpis", "tokens", "-n", NS, "--type=merge", "-p", '{"spec":{"engine":{"maxNumSeqs":32}}}'
    )
    rolled = wait_deployment(
        cluster,
        "tokens-stable",
        lambda d: flag(engine_args(d), "--max-num-seqs") == "32",
        what="tokens-stable rolled to max-num-seqs 32",
    )
    cluster.kubectl("delete", "deployment", "tokens-stable", "-n", NS)
    wait_deployment(
        cluster,
        "tokens-stable",
        lambda d: d["metadata"]["uid"] != rolled["metadata"]["uid"],
        what="tokens-stable recreated",
    )
    after = get(cluster, "secrets", secret_name)
    assert after is not None
    assert after["data"] == shared["data"]  # never rotated
    assert after["metadata"]["resourceVersion"] == shared["metadata"]["resourceVersion"]  # never written

    # Rotation on demand: a new value of the annotation replaces tokens's tokens (tokens-b's stay)
    # and restarts its engines, whose template now carries that value.
    cluster.kubectl(
        "annotate", "cpis", "tokens", "-n", NS, "live-adjust.chunkpilot.io/rotate-tokens=2026-12-05"
    )

    def rotated() -> dict[str, Any] | None:
        found = get(cluster, "secrets", secret_name)
        marked = found and (found["metadata"].get("annotations") or {}).get("rotated.chunkpilot.io/tokens")
        return found if marked == "2026-12-05" else None

    fresh = wait_for(rotated, timeout=60, what="the tokens of tokens rotated")
    assert fresh["data"]["tokens.stable"] != after["data"]["tokens.stable"]
    assert fresh["data"]["tokens.canary"] != after["data"]["tokens.canary"]
    assert fresh["data"]["tokens-b.stable"] == after["data"]["tokens-b.stable"]
    wait_deployment(
        cluster,
        "tokens-stable",
        lambda d: (
            d["spec"]["template"]["metadata"]["annotations"].get("live-adjust.chunkpilot.io/rotate-tokens")
            == "2026-12-05"
        ),
        what="tokens-stable restarted for the new tokens",
    )

    for name in ("tokens", "tokens-b"):
        cluster.kubectl("delete", "cpis", name, "-n", NS, "--timeout=60s")
    wait_for(
        lambda: get(cluster, "secrets", secret_name) is None,
        timeout=90,
        what=f"Secret {secret_name} garbage-collected with the last of its services",
    )


def test_restarting_the_operator_creates_no_duplicates(cluster: Any, operator: OperatorProcess) -> None:
    def snapshot() -> dict[str, tuple[str, int]]:
        objects = items(cluster, "deployments,services,replicasets", SERVICE_LABEL)
        return {
            f"{o['kind']}/{o['metadata']['name']}": (o["metadata"]["uid"], o["metadata"].get("generation", 0))
            for o in objects
            if o["kind"] != "ReplicaSet" or int(o["spec"].get("replicas") or 0) > 0
        }

    wait_rolled_out(cluster, "chat")
    before = snapshot()
    operator.stop()
    operator.start()
    operator.wait_for_log(f"reconciled {NS}/chat", timeout=60)
    operator.wait_for_log(f"reconciled {NS}/upgraded", timeout=60)
    assert snapshot() == before
    assert len(items(cluster, "deployments", f"{SERVICE_LABEL}=chat")) == 1


def test_deleting_the_service_removes_every_child(cluster: Any, operator: OperatorProcess) -> None:
    cluster.kubectl("delete", "cpis", "chat", "-n", NS, "--timeout=60s")

    def gone() -> bool:
        return not items(cluster, "deployments,services,replicasets,pods", f"{SERVICE_LABEL}=chat")

    wait_for(gone, timeout=90, what="every child of chat garbage-collected")


def test_two_peered_replicas_only_one_acts(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> None:
    apply(
        cluster,
        {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": "chunkpilot"}},
        NS_HA,
    )
    logs = tmp_path_factory.mktemp("operator-ha")
    env = operator_env(cluster.env, CHUNKPILOT_OPERATOR_REPLICAS="2")
    args = ["-n", NS_HA, "--peering", "chunkpilot", "--verbose", "--metrics-port", "0"]
    first = OperatorProcess(args, env=env, log_path=logs / "first.log")
    second = OperatorProcess(args, env=env, log_path=logs / "second.log")
    try:
        first.start()
        second.start()
        # Kopf starts every replica paused; only the one without a higher-priority peer resumes.
        first.wait_for_log("Resuming operations", timeout=60)

        def peers() -> int:
            peering = get(cluster, "kopfpeerings.kopf.dev", "chunkpilot", NS_HA) or {}
            return len(peering.get("status") or {})

        wait_for(lambda: peers() == 2, timeout=60, what="both replicas in the peering object")
        service = yaml.safe_load(EXAMPLE.read_text())
        service["metadata"]["name"] = "ha-one"
        service["spec"]["replicas"] = 1
        apply(cluster, service, NS_HA)
        wait_deployment(cluster, "ha-one-stable", namespace=NS_HA)
        first.wait_for_log(f"reconciled {NS_HA}/ha-one", timeout=30)
        assert f"{NS_HA}/ha-one" not in second.log()
        assert "Resuming operations" not in second.log()  # the standby never acted

        first.stop()  # a clean exit leaves the peering object: the standby takes over
        second.wait_for_log("Resuming operations", timeout=60)
        service["metadata"]["name"] = "ha-two"
        apply(cluster, service, NS_HA)
        wait_deployment(cluster, "ha-two-stable", namespace=NS_HA)
        second.wait_for_log(f"reconciled {NS_HA}/ha-two", timeout=30)
        cluster.kubectl("delete", "cpis", "--all", "-n", NS_HA, "--timeout=60s")
    finally:
        first.stop()
        second.stop()


def test_bench_prints_latency_and_memory(cluster: Any, tmp_path: Path) -> None:
    result = run_bench(
        count=3, total=5, replicas=0, kubeconfig=cluster.kubeconfig, work_dir=tmp_path, log=lambda _: None
    )
    assert len(result.latencies_s) == 3 and all(0 < value < 60 for value in result.latencies_s)
    assert result.reconciled == 5 and result.rss_bytes > 0
    report = result.report()
    assert "p50" in report and "p99" in report and "MiB" in report
    assert 0 < result.create_s <= result.reconcile_all_s and result.burst_cpu_s > 0
    # The burst's two services each cost the operator API requests, its Deployments among them.
    assert result.requests_per_service > 1 and any("deployments" in key for key in result.burst_requests)
    # New services that want no NetworkPolicy never had one: none is looked up to be removed.
    assert not any("networkpolicies" in key for key in result.burst_requests), result.burst_requests
    assert "API requests per service of the burst" in report
    # The machine's CPU over the burst, the control plane's processes named.
    machine = result.burst_machine
    assert machine is not None and machine.busy_s > 0 and machine.by_component["API server"] > 0
    assert {"etcd", "operator"} <= set(machine.by_component) and "machine CPU over the burst" in report


def test_bench_observes_an_autotuned_fleet_from_the_operators_own_metrics(
    cluster: Any, tmp_path: Path
) -> None:
    """Tuner ticks and API requests counted by the operator itself, with Prometheus in the loop."""
    result = run_bench(
        count=2,
        total=4,
        replicas=0,
        kubeconfig=cluster.kubeconfig,
        work_dir=tmp_path,
        log=lambda _: None,
        autotune=True,
        observe_s=25.0,
        settle_s=0.0,
    )
    fleet = result.fleet
    assert fleet is not None and fleet.window_s >= 25.0
    # Four services ticking every 10 s: about 0.4 ticks per second. A tick lists its trials from the
    # watch: what reaches the API is the status it writes, and the operator's own calls.
    assert 0.2 <= fleet.ticks_per_s <= 0.8, fleet
    assert 0 < fleet.tick_p50_s <= fleet.tick_p99_s
    assert fleet.api_requests_per_s > 0 and any("inferenceservices" in key for key in fleet.api_requests)
    assert not any("tuningtrials" in key for key in fleet.api_requests), fleet.api_requests
    assert 0 < fleet.cpu_cores < 2 and fleet.rss_bytes > 0
    assert "autotuned services at rest" in result.report()


def test_a_services_network_policy_admits_its_clients_and_its_own_pods(
    cluster: Any, operator: OperatorProcess
) -> None:
    clients = [{"namespaceSelector": {"matchLabels": {"team": "web"}}}, {"ipBlock": {"cidr": "10.8.0.0/16"}}]
    apply(cluster, small_service("fenced", networkPolicy={"enabled": True, "clients": clients}))
    policy = wait_for(
        lambda: get(cluster, "networkpolicies", "fenced"), timeout=60, what="NetworkPolicy fenced"
    )
    isvc = get(cluster, "inferenceservices", "fenced")
    assert isvc is not None
    (owner,) = policy["metadata"]["ownerReferences"]
    assert owner["uid"] == isvc["metadata"]["uid"]
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": {SERVICE_LABEL: "fenced"}}
    assert spec["policyTypes"] == ["Ingress"]
    callers, own = spec["ingress"]
    assert callers["from"] == clients and callers["ports"] == [{"port": 8000, "protocol": "TCP"}]
    assert own == {"from": [{"podSelector": {"matchLabels": {SERVICE_LABEL: "fenced"}}}]}

    # A disaggregated service: clients reach its router; its pools, only its own pods (and the installation).
    split = yaml.safe_load((REPO / "examples" / "disaggregated-sim.yaml").read_text())
    split["metadata"] = {"name": "fenced-pd"}
    split["spec"]["networkPolicy"] = {"enabled": True}
    for pool in ("prefill", "decode"):
        split["spec"]["topology"][pool]["replicas"] = 1  # KWOK's pods: nothing runs
    apply(cluster, split)
    pools = wait_for(
        lambda: get(cluster, "networkpolicies", "fenced-pd-pools"),
        timeout=60,
        what="NetworkPolicy fenced-pd-pools",
    )
    assert pools["spec"]["ingress"] == [
        {"from": [{"podSelector": {"matchLabels": {SERVICE_LABEL: "fenced-pd"}}}]}
    ]
    front = get(cluster, "networkpolicies", "fenced-pd")
    assert (
        front is not None
        and front["spec"]["podSelector"]["matchLabels"]["chunkpilot.io/component"] == "router"
    )
    cluster.kubectl("delete", "cpis", "fenced-pd", "-n", NS, "--timeout=60s")

    # Turned off, the policy goes.
    apply(cluster, small_service("fenced"))
    wait_for(
        lambda: get(cluster, "networkpolicies", "fenced") is None, timeout=60, what="NetworkPolicy removed"
    )

    # A policy of that name the service does not own is left alone, and the service says so.
    foreign = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "walled"},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"]},
    }
    apply(cluster, foreign)
    apply(cluster, small_service("walled", networkPolicy={"enabled": True}))
    ready = wait_ready_reason(cluster, "walled", "NameConflict")
    assert "NetworkPolicy" in ready["message"], ready
    kept = get(cluster, "networkpolicies", "walled")
    assert (
        kept is not None and kept["spec"] == foreign["spec"] and not kept["metadata"].get("ownerReferences")
    )
    for name in ("fenced", "walled"):
        cluster.kubectl("delete", "cpis", name, "-n", NS, "--timeout=60s")
    cluster.kubectl("delete", "networkpolicy", "walled", "-n", NS)
