"""The Helm chart: ``helm lint``, ``helm template`` in every mode, and an install on the local
control plane whose service account then runs the operator (proving the RBAC is sufficient).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from chunkpilot.engine.probe.kube import PUBLISHER_ROLE_NAME
from chunkpilot.operator.testing import OperatorProcess, operator_env, wait_for

from chunkpilot.devcluster.components import Binary
from chunkpilot.localrun import chart
from chunkpilot.localrun.chart import grants_by_name

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "chunkpilot"
RELEASE_NS = "chunkpilot-system"
WATCHED_NS = "chunkpilot-chart-tests"


@pytest.fixture(scope="module")
def helm(control_plane_binaries: Any) -> Path:
    path: Path = control_plane_binaries[Binary.HELM]
    return path


def run_helm(helm: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return chart.run_helm(helm, *args, env=env)


def render(helm: Path, *sets: str) -> list[dict[str, Any]]:
    return chart.render(helm, CHART, sets, release="cp", namespace=RELEASE_NS)


by_kind = chart.by_kind
rules_of = chart.rules_of


def aggregated(role: dict[str, Any]) -> bool:
    """A ClusterRole added to Kubernetes' default user roles (not one the operator holds)."""
    labels = role["metadata"].get("labels") or {}
    return any(key.startswith("rbac.authorization.k8s.io/aggregate-to-") for key in labels)


def operator_roles(documents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The operator's (Cluster)Roles."""
    return [
        r
        for r in by_kind(documents, "ClusterRole") + by_kind(documents, "Role")
        if not aggregated(r) and r["metadata"]["name"] != PUBLISHER_ROLE_NAME
    ]


def operator_container(documents: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = by_kind(documents, "Deployment")
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


@pytest.mark.parametrize(
    "sets",
    [
        [],
        ["replicaCount=3"],
        [
            "watch.mode=namespaced",
            "watch.namespaces={a,b}",
            "replicaCount=2",
            "grafanaDashboard.enabled=true",
        ],
    ],
    ids=["defaults", "ha-cluster", "ha-namespaced"],
)
def test_helm_lint_is_clean(helm: Path, sets: list[str]) -> None:
    argv = ["lint", "--strict", str(CHART)]
    for item in sets:
        argv += ["--set", item]
    result = run_helm(helm, *argv)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


def test_defaults_render_a_hardened_single_replica(helm: Path) -> None:
    documents = render(helm)
    assert {doc["kind"] for doc in documents} == {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
    }
    (deployment,) = by_kind(documents, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    container = operator_container(documents)
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert {"cpu", "memory"} <= container["resources"]["requests"].keys()
    assert "--standalone" in container["args"] and "--all-namespaces" in container["args"]
    assert "--metrics-port=8080" in container["args"]
    assert {port["name"]: port["containerPort"] for port in container["ports"]} == {
        "healthz": 8081,
        "metrics": 8080,
    }
    assert deployment["spec"]["strategy"]["type"] == "Recreate"


@pytest.mark.parametrize(
    "sets", [[], ["watch.mode=namespaced", "watch.namespaces={a,b}"]], ids=["cluster", "namespaced"]
)
def test_rbac_has_no_wildcards(helm: Path, sets: list[str]) -> None:
    documents = render(helm, *sets)
    roles = by_kind(documents, "ClusterRole") + by_kind(documents, "Role")
    assert roles
    for role in roles:
        for rule in role["rules"]:
            for key in ("verbs", "resources", "apiGroups"):
                assert "*" not in rule[key], (role["metadata"]["name"], rule)
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])
    if sets:
        assert sorted(role["metadata"]["namespace"] for role in roles) == ["a", "b"]
        assert not by_kind(documents, "ClusterRole") and not by_kind(documents, "ClusterRoleBinding")


def test_users_default_roles_gain_inferenceservices_in_cluster_mode(helm: Path) -> None:
    user_roles = {r["metadata"]["name"]: r for r in by_kind(render(helm), "ClusterRole") if aggregated(r)}
    assert set(user_roles) == {"cp-chunkpilot-edit", "cp-chunkpilot-view"}
    edit, view = (rules_of(user_roles[f"cp-chunkpilot-{name}"]) for name in ("edit", "view"))
    assert "create" in edit[("chunkpilot.io", "inferenceservices")]
    assert edit[("chunkpilot.io", "tuningtrials")] == {"get", "list", "watch"}  # the tuner writes them
    assert all(verbs == {"get", "list", "watch"} for verbs in view.values())
    labels = user_roles["cp-chunkpilot-edit"]["metadata"]["labels"]
    assert labels["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert not [
        r for r in by_kind(render(helm, "rbac.aggregateToDefaultRoles=false"), "ClusterRole") if aggregated(r)
    ]
    namespaced = render(helm, "watch.mode=namespaced", "watch.namespaces={a,b}")
    assert not by_kind(namespaced, "ClusterRole")  # a namespaced install creates nothing cluster-wide


#: What operator/probejob.py does in a watched namespace (see docs/probe.md).
PROBE_RULES = {
    ("batch", "jobs"): {"get", "list", "watch", "create", "delete"},
    ("", "configmaps"): {"get", "list", "watch"},  # read only: the publisher role writes them
    ("", "serviceaccounts"): {"get", "create", "patch"},
    ("rbac.authorization.k8s.io", "rolebindings"): {"get", "create", "patch"},
}


def test_the_operator_knows_its_namespace_and_prometheuss_for_network_policies(helm: Path) -> None:
    env = {e["name"]: e for e in operator_container(render(helm))["env"]}
    assert env["CHUNKPILOT_OPERATOR_NAMESPACE"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.namespace"}
    }
    assert env["CHUNKPILOT_PROMETHEUS_NAMESPACE_LABELS"]["value"] == "kubernetes.io/metadata.name=monitoring"
    elsewhere = render(helm, "networkPolicy.prometheusNamespaceLabels.team=obs")
    env = {e["name"]: e for e in operator_container(elsewhere)["env"]}
    assert (
        env["CHUNKPILOT_PROMETHEUS_NAMESPACE_LABELS"]["value"]
        == "kubernetes.io/metadata.name=monitoring,team=obs"
    )


def test_default_image_registry_reaches_the_operator(helm: Path) -> None:
    assert "CHUNKPILOT_IMAGE_REGISTRY" not in {e["name"] for e in operator_container(render(helm))["env"]}
    mirrored = render(helm, "defaultImageRegistry=mirror.internal:5000")
    env = {e["name"]: e.get("value") for e in operator_container(mirrored)["env"]}
    assert env["CHUNKPILOT_IMAGE_REGISTRY"] == "mirror.internal:5000"


@pytest.mark.parametrize(
    "sets", [[], ["watch.mode=namespaced", "watch.namespaces={a,b}"]], ids=["cluster", "namespaced"]
)
def test_probe_jobs_value_sets_the_env_and_the_rbac_it_needs(helm: Path, sets: list[str]) -> None:
    off = render(helm, *sets)
    on = render(helm, *sets, "probeJobs.enabled=true", "probeJobs.image=registry.example/probe:1")
    env_off = {item["name"] for item in operator_container(off)["env"]}
    assert not {"CHUNKPILOT_PROBE_JOBS", "CHUNKPILOT_PROBE_IMAGE"} & env_off
    env_on = {item["name"]: item.get("value") for item in operator_container(on)["env"]}
    assert env_on["CHUNKPILOT_PROBE_JOBS"] == "on"
    assert env_on["CHUNKPILOT_PROBE_IMAGE"] == "registry.example/probe:1"
    assert "CHUNKPILOT_PROBE_IMAGE_ANNOTATION" not in env_on  # the annotation is ignored by default
    allowed = render(helm, *sets, "probeJobs.enabled=true", "probeJobs.allowImageAnnotation=true")
    env_allowed = {item["name"]: item.get("value") for item in operator_container(allowed)["env"]}
    assert env_allowed["CHUNKPILOT_PROBE_IMAGE_ANNOTATION"] == "on"
    for documents, probing in ((off, False), (on, True)):
        roles = operator_roles(documents)
        assert len(roles) == (2 if sets else 1)
        for role in roles:
            granted = rules_of(role)
            for key, verbs in PROBE_RULES.items():
                assert granted.get(key) == (verbs if probing else None), (key, probing)


DISAGGREGATION_RULES = {
    ("", "pods"): {"get", "list", "watch"},
    # delete: a topology trial's canary router (autotune.allowTopologyChange) goes with its verdict.
    ("", "serviceaccounts"): {"get", "create", "patch", "delete"},
    ("rbac.authorization.k8s.io", "roles"): {"get", "create", "patch", "delete"},
    ("rbac.authorization.k8s.io", "rolebindings"): {"get", "create", "patch", "delete"},
}


@pytest.mark.parametrize(
    "sets", [[], ["watch.mode=namespaced", "watch.namespaces={a,b}"]], ids=["cluster", "namespaced"]
)
def test_disaggregation_value_sets_the_env_and_grants_the_router_rbac(helm: Path, sets: list[str]) -> None:
    """Off (the default): the operator refuses disaggregated services and holds no router RBAC."""
    for enabled in (False, True):
        documents = render(helm, *sets, f"disaggregation.enabled={str(enabled).lower()}")
        env = {item["name"]: item.get("value") for item in operator_container(documents)["env"]}
        assert env.get("CHUNKPILOT_DISAGGREGATION") == (None if enabled else "off")
        roles = operator_roles(documents)
        assert len(roles) == (2 if sets else 1)
        for role in roles:
            granted = rules_of(role)
            for key, verbs in DISAGGREGATION_RULES.items():
                expected = verbs if enabled else ({"list"} if key == ("", "pods") else None)
                assert granted.get(key) == expected, (key, enabled)
            assert ("delete" in granted[("monitoring.coreos.com", "podmonitors")]) == enabled


@pytest.mark.parametrize(
    "sets", [[], ["watch.mode=namespaced", "watch.namespaces={a,b}"]], ids=["cluster", "namespaced"]
)
def test_live_adjust_value_grants_the_token_secrets(helm: Path, sets: list[str]) -> None:
    """The live-adjustment token Secrets (autotune.liveAdjust) are granted only when the chart allows it."""
    for enabled in (False, True):
        documents = render(helm, *sets, f"liveAdjust.enabled={str(enabled).lower()}")
        roles = operator_roles(documents)
        assert len(roles) == (2 if sets else 1)
        for role in roles:
            granted = rules_of(role).get(("", "secrets"))
            assert granted == ({"get", "create", "patch"} if enabled else None), (enabled, role)
            if enabled:  # read and patched by name only: the namespace's one live-adjustment Secret
                by_name = grants_by_name(role)[("", "secrets")]
                assert sorted((sorted(n), sorted(v)) for n, v in by_name) == [
                    ([], ["create"]),
                    (["chunkpilot-live-adjust"], ["get", "patch"]),
                ]


def test_live_adjust_off_tells_the_operator(helm: Path) -> None:
    """Without the Secrets grant the operator runs with CHUNKPILOT_LIVE_ADJUST=off (no Forbidden)."""
    for enabled, expected in ((False, "off"), (True, None)):
        documents = render(helm, f"liveAdjust.enabled={str(enabled).lower()}")
        env = {item["name"]: item.get("value") for item in operator_container(documents)["env"]}
        assert env.get("CHUNKPILOT_LIVE_ADJUST") == expected, (enabled, env)
    defaults = {item["name"]: item.get("value") for item in operator_container(render(helm))["env"]}
    assert defaults["CHUNKPILOT_LIVE_ADJUST"] == "off"  # the chart's default grants no Secrets


def test_several_replicas_get_peering(helm: Path) -> None:
    documents = render(helm, "replicaCount=2")
    (peering,) = by_kind(documents, "ClusterKopfPeering")
    assert peering["metadata"]["name"] == "chunkpilot"
    container = operator_container(documents)
    assert "--peering=chunkpilot" in container["args"] and "--standalone" not in container["args"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env["CHUNKPILOT_OPERATOR_REPLICAS"] == "2"

    namespaced = render(helm, "replicaCount=2", "watch.mode=namespaced", "watch.namespaces={a,b}")
    assert sorted(p["metadata"]["namespace"] for p in by_kind(namespaced, "KopfPeering")) == ["a", "b"]
    assert not by_kind(render(helm), "ClusterKopfPeering")


def test_several_replicas_without_peering_are_refused(helm: Path) -> None:
    result = run_helm(
        helm, "template", "cp", str(CHART), "--set", "replicaCount=2", "--set", "peering.enabled=false"
    )
    assert result.returncode != 0
    assert "peering.enabled is false" in result.stderr


def test_grafana_dashboard_config_map(helm: Path) -> None:
    assert not by_kind(render(helm), "ConfigMap")
    (config_map,) = by_kind(render(helm, "grafanaDashboard.enabled=true"), "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["namespace"] == RELEASE_NS
    shipped = json.loads((CHART / "dashboards" / "chunkpilot.json").read_text())
    assert json.loads(config_map["data"]["chunkpilot.json"]) == shipped

    (custom,) = by_kind(
        render(
            helm,
            "grafanaDashboard.enabled=true",
            "grafanaDashboard.namespace=monitoring",
            "grafanaDashboard.labels.grafana_dashboard=null",
            "grafanaDashboard.labels.dashboards=chunkpilot",
        ),
        "ConfigMap",
    )
    assert custom["metadata"]["namespace"] == "monitoring"
    assert custom["metadata"]["labels"]["dashboards"] == "chunkpilot"
    assert "grafana_dashboard" not in custom["metadata"]["labels"]


def test_tuner_timing_values_reach_the_operator(helm: Path) -> None:
    env = {item["name"]: item for item in operator_container(render(helm))["env"]}
    assert env["CHUNKPILOT_TUNER_INTERVAL"]["value"] == "10"
    assert env["CHUNKPILOT_TUNER_ROLLOUT_TIMEOUT"]["value"] == "900"
    custom = operator_container(render(helm, "tuner.interval=5", "tuner.rolloutTimeout=1800"))
    env = {item["name"]: item for item in custom["env"]}
    assert (env["CHUNKPILOT_TUNER_INTERVAL"]["value"], env["CHUNKPILOT_TUNER_ROLLOUT_TIMEOUT"]["value"]) == (
        "5",
        "1800",
    )


def test_optuna_storage_and_metrics_port(helm: Path) -> None:
    container = operator_container(render(helm, "optuna.storage=postgresql://optuna@db:5432/optuna"))
    env = {item["name"]: item for item in container["env"]}
    assert env["CHUNKPILOT_OPTUNA_STORAGE"]["value"] == "postgresql://optuna@db:5432/optuna"

    container = operator_container(render(helm, "optuna.storageSecret.name=optuna-db"))
    env = {item["name"]: item for item in container["env"]}
    assert env["CHUNKPILOT_OPTUNA_STORAGE"]["valueFrom"]["secretKeyRef"] == {
        "name": "optuna-db",
        "key": "url",
    }

    container = operator_container(render(helm, "metrics.port=0"))
    assert "--metrics-port=0" in container["args"]
    assert [port["name"] for port in container["ports"]] == ["healthz"]


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("metrics.port=80", "/metrics/port"),
        ("optuna.storage=not-a-url", "/optuna/storage"),
        ("bogus=1", "bogus"),
        ("probeJobs.enabled=maybe", "/probeJobs/enabled"),
        ("liveAdjust.enabled=maybe", "/liveAdjust/enabled"),
        ("tuner.interval=0", "/tuner/interval"),
        ("defaultImageRegistry=https://mirror", "/defaultImageRegistry"),
    ],
)
def test_values_schema_rejects_bad_values(helm: Path, value: str, fragment: str) -> None:
    result = run_helm(helm, "template", "cp", str(CHART), "--set", value)
    assert result.returncode != 0
    assert fragment in result.stderr


def test_prometheus_credentials_come_from_secrets_as_files(helm: Path) -> None:
    documents = render(
        helm,
        "prometheus.url=https://prometheus.monitoring:9443",
        "prometheus.auth.basicAuthSecret.name=prom-basic",
        "prometheus.auth.caSecret.name=prom-ca",
    )
    container = operator_container(documents)
    env = {item["name"]: item for item in container["env"]}
    assert env["CHUNKPILOT_PROMETHEUS_USERNAME"]["valueFrom"]["secretKeyRef"] == {
        "name": "prom-basic",
        "key": "username",
    }
    password = env["CHUNKPILOT_PROMETHEUS_PASSWORD_FILE"]["value"]
    ca = env["CHUNKPILOT_PROMETHEUS_CA_FILE"]["value"]
    assert "CHUNKPILOT_PROMETHEUS_BEARER_TOKEN_FILE" not in env
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert password.startswith(mounts["prometheus-basic"] + "/") and ca.startswith(
        mounts["prometheus-ca"] + "/"
    )
    (deployment,) = by_kind(documents, "Deployment")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["prometheus-basic"]["secret"]["secretName"] == "prom-basic"
    assert volumes["prometheus-ca"]["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    token = render(helm, "prometheus.auth.bearerTokenSecret.name=prom-token")
    token_env = {item["name"]: item.get("value") for item in operator_container(token)["env"]}
    assert token_env["CHUNKPILOT_PROMETHEUS_BEARER_TOKEN_FILE"] == "/etc/chunkpilot/prometheus/token/token"
    both = ["prometheus.auth.bearerTokenSecret.name=a", "prometheus.auth.basicAuthSecret.name=b"]
    with pytest.raises(Exception, match="not both"):
        render(helm, *both)
    with pytest.raises(Exception, match="prometheus"):
        render(helm, "prometheus.url=http://user:pass@prometheus:9090")  # credentials belong in auth


def test_chart_crds_match_the_generated_crds() -> None:
    for generated in sorted((REPO / "crds").glob("*.yaml")):
        shipped = CHART / "crds" / generated.name
        assert shipped.exists(), f"{shipped} is missing: copy it from crds/"
        assert yaml.safe_load(shipped.read_text()) == yaml.safe_load(generated.read_text()), (
            f"{shipped} differs from {generated}: copy it from crds/"
        )


def _release(
    helm: Path, plane: Any, release: str, release_ns: str, watched: str, *sets: str
) -> Iterator[Any]:
    """``helm install`` in namespaced mode watching ``watched``, with ``sets``; uninstalled afterwards."""
    for namespace in (release_ns, watched):
        plane.kubectl("create", "namespace", namespace, check=False)
    values = ["watch.mode=namespaced", f"watch.namespaces={{{watched}}}", *sets]
    result = run_helm(
        helm,
        "install", release, str(CHART), "--namespace", release_ns,
        *(arg for value in values for arg in ("--set", value)),
        env=plane.env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    yield plane
    plane.kubectl("delete", "cpis", "--all", "-n", watched, "--wait=false", check=False)
    run_helm(helm, "uninstall", release, "--namespace", release_ns, env=plane.env)


@pytest.fixture(scope="module")
def installed(helm: Path, control_plane: Any) -> Iterator[Any]:
    """``helm install`` in namespaced mode watching WATCHED_NS; uninstalled afterwards."""
    yield from _release(
        helm, control_plane, "cp", RELEASE_NS, WATCHED_NS,
        "grafanaDashboard.enabled=true", "probeJobs.enabled=true",
        "liveAdjust.enabled=true", "disaggregation.enabled=true",
    )  # fmt: skip


def _charted_operator(
    plane: Any, release: str, release_ns: str, watched: str, folder: Path, **env: str
) -> OperatorProcess:
    kubeconfig = chart.service_account_kubeconfig(plane, release, release_ns, folder / "kubeconfig")
    return OperatorProcess(
        ["-n", watched, "--standalone", "--verbose", "--metrics-port", "0", "--kubeconfig", str(kubeconfig)],
        env=operator_env(plane.env, KUBECONFIG=str(kubeconfig), **env),
        log_path=folder / "operator.log",
    )


def _disaggregated(name: str) -> dict[str, Any]:
    service: dict[str, Any] = yaml.safe_load((REPO / "examples" / "disaggregated-sim.yaml").read_text())
    service["metadata"]["name"] = name
    service["spec"]["topology"]["decode"]["replicas"] = 1
    return service


def _conditions(plane: Any, name: str, namespace: str) -> dict[str, dict[str, Any]]:
    out = plane.kubectl("get", "cpis", name, "-n", namespace, "-o", "json").stdout
    return {c["type"]: c for c in json.loads(out).get("status", {}).get("conditions", [])}


def _tuned(**annotations: str) -> dict[str, Any]:
    """InferenceService ``tuned``: autotune.liveAdjust on the vLLM engine image, no replicas."""
    metadata: dict[str, Any] = {"name": "tuned"}
    if annotations:
        metadata["annotations"] = annotations
    return {
        "apiVersion": "chunkpilot.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": metadata,
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
            "engine": {"kind": "vllm", "version": "0.33.0"},
            "resources": {"accelerator": "h100"},
            "replicas": 0,
            "autotune": {"liveAdjust": True},
        },
    }


def _assert_nothing_refused(operator: OperatorProcess) -> None:
    log = operator.log()
    assert "Forbidden" not in log and "forbidden" not in log and "undeclared" not in log, log[-2000:]


def test_disaggregated_service_under_the_charts_rbac(
    installed: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """disaggregation.enabled: the operator may create the router's Role (it holds the pod reads)."""
    operator = _charted_operator(
        installed, "cp-chunkpilot", RELEASE_NS, WATCHED_NS, tmp_path_factory.mktemp("chart-operator-pd")
    )
    try:
        operator.start()
        installed.kubectl("apply", "-n", WATCHED_NS, "-f", "-", input=json.dumps(_disaggregated("pd")))
        wait_for(
            lambda: _conditions(installed, "pd", WATCHED_NS).get("Ready", {}).get("status") == "True",
            timeout=90,
            what="pd Ready=True under the chart's RBAC",
        )
        role = json.loads(
            installed.kubectl("get", "role", "pd-router", "-n", WATCHED_NS, "-o", "json").stdout
        )
        assert role["rules"] == [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
        ]
        _assert_nothing_refused(operator)
        installed.kubectl("delete", "cpis", "pd", "-n", WATCHED_NS, "--timeout=60s")
    finally:
        operator.stop()


def test_installed_chart_creates_the_operator_deployment(installed: Any) -> None:
    deployment = json.loads(
        installed.kubectl("get", "deployment", "cp-chunkpilot", "-n", RELEASE_NS, "-o", "json").stdout
    )
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "cp-chunkpilot"
    for kind, namespace in (
        ("serviceaccount", RELEASE_NS),
        ("configmap/cp-chunkpilot-dashboard", RELEASE_NS),
        ("role", WATCHED_NS),
        ("rolebinding", WATCHED_NS),
    ):
        target = kind if "/" in kind else f"{kind}/cp-chunkpilot"
        installed.kubectl("get", target, "-n", namespace)
    assert installed.kubectl("get", "crd", "inferenceservices.chunkpilot.io").returncode == 0


def test_operator_runs_with_the_charts_service_account(
    installed: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """KWOK runs no containers, so the operator runs here as a process with the release's token (and
    the probe settings its Deployment is given: it binds the chart's publisher role)."""
    deployment = json.loads(
        installed.kubectl("get", "deployment", "cp-chunkpilot", "-n", RELEASE_NS, "-o", "json").stdout
    )
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["CHUNKPILOT_PROBE_PUBLISHER_ROLE"] == "Role/chunkpilot-probe-publisher"
    operator = _charted_operator(
        installed, "cp-chunkpilot", RELEASE_NS, WATCHED_NS, tmp_path_factory.mktemp("chart-operator"),
        CHUNKPILOT_PROBE_JOBS="on", CHUNKPILOT_PROBE_PUBLISHER_ROLE=env["CHUNKPILOT_PROBE_PUBLISHER_ROLE"],
    )  # fmt: skip
    service = yaml.safe_load((REPO / "examples" / "chat-llama-8b-sim.yaml").read_text())
    service["spec"]["replicas"] = 1
    try:
        operator.start()
        installed.kubectl("apply", "-n", WATCHED_NS, "-f", "-", input=json.dumps(service))

        wait_for(
            lambda: _conditions(installed, "chat", WATCHED_NS).get("Ready", {}).get("status") == "True",
            timeout=90,
            what="chat Ready=True under the chart's RBAC",
        )

        # autotune.liveAdjust on the vLLM engine image: the token Secret; a probe request: its Job.
        tuned = _tuned(**{"chunkpilot.io/probe": "request"})
        installed.kubectl("apply", "-n", WATCHED_NS, "-f", "-", input=json.dumps(tuned))

        def exists(kind: str, name: str) -> bool:
            got = installed.kubectl("get", kind, name, "-n", WATCHED_NS, check=False)
            return got.returncode == 0

        wait_for(
            lambda: exists("secret", "chunkpilot-live-adjust"),
            timeout=60,
            what="Secret chunkpilot-live-adjust",
        )
        wait_for(
            lambda: "job.batch/chunkpilot-probe-" in installed.kubectl(
                "get", "jobs", "-n", WATCHED_NS, "-o", "name"
            ).stdout,
            timeout=60,
            what="the probe Job",
        )  # fmt: skip
        # The probe's binding names the chart's publisher role: the operator wrote no Role of its own.
        assert not exists("role", "chunkpilot-probe") and exists("rolebinding", "chunkpilot-probe")
        binding = json.loads(
            installed.kubectl("get", "rolebinding", "chunkpilot-probe", "-n", WATCHED_NS, "-o", "json").stdout
        )
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": "chunkpilot-probe-publisher",
        }
        assert "Forbidden" not in operator.log() and "forbidden" not in operator.log()
        installed.kubectl("delete", "cpis", "chat", "tuned", "-n", WATCHED_NS, "--timeout=60s")
    finally:
        operator.stop()


OFF_RELEASE_NS = "chunkpilot-system-off"
OFF_WATCHED_NS = "chunkpilot-chart-off"


@pytest.fixture(scope="module")
def installed_without_live_adjust(helm: Path, control_plane: Any) -> Iterator[Any]:
    """A release with the chart's default ``liveAdjust.enabled=false`` (no Secrets granted)."""
    yield from _release(helm, control_plane, "cpoff", OFF_RELEASE_NS, OFF_WATCHED_NS)


def test_live_adjust_asked_for_but_not_granted_is_a_condition_not_a_forbidden(
    installed_without_live_adjust: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Under the chart's RBAC without Secrets: no Secret call, the LiveAdjustDisabled condition and Event."""
    plane = installed_without_live_adjust
    deployment = json.loads(
        plane.kubectl("get", "deployment", "cpoff-chunkpilot", "-n", OFF_RELEASE_NS, "-o", "json").stdout
    )
    chart_env = {
        e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert chart_env["CHUNKPILOT_LIVE_ADJUST"] == "off"
    operator = _charted_operator(
        plane, "cpoff-chunkpilot", OFF_RELEASE_NS, OFF_WATCHED_NS,
        tmp_path_factory.mktemp("chart-operator-off"),
        CHUNKPILOT_LIVE_ADJUST=chart_env["CHUNKPILOT_LIVE_ADJUST"],
    )  # fmt: skip
    tuned = _tuned()

    def live_condition() -> dict[str, Any] | None:
        return _conditions(plane, "tuned", OFF_WATCHED_NS).get("LiveAdjust")

    def reasons() -> list[str]:
        out = plane.kubectl(
            "get",
            "events",
            "-n",
            OFF_WATCHED_NS,
            "--field-selector",
            "involvedObject.name=tuned",
            "-o",
            "json",
        ).stdout
        return [event["reason"] for event in json.loads(out)["items"]]

    try:
        operator.start()
        plane.kubectl("apply", "-n", OFF_WATCHED_NS, "-f", "-", input=json.dumps(tuned))
        found = wait_for(live_condition, timeout=60, what="the LiveAdjust condition")
        assert (found["status"], found["reason"]) == ("False", "LiveAdjustDisabled")
        assert "liveAdjust.enabled=true" in found["message"]
        wait_for(lambda: "LiveAdjustDisabled" in reasons(), timeout=30, what="the LiveAdjustDisabled Event")
        stable = json.loads(
            plane.kubectl("get", "deployment", "tuned-stable", "-n", OFF_WATCHED_NS, "-o", "json").stdout
        )
        container = stable["spec"]["template"]["spec"]["containers"][0]
        assert not any("live-adjust" in str(e.get("valueFrom", "")) for e in container.get("env", []))
        _assert_nothing_refused(operator)
        plane.kubectl("delete", "cpis", "tuned", "-n", OFF_WATCHED_NS, "--timeout=60s")
    finally:
        operator.stop()


def test_disaggregated_service_without_the_value_is_a_condition_not_a_forbidden(
    installed_without_live_adjust: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The chart's default disaggregation.enabled=false: Ready=False DisaggregationDisabled, no pools."""
    plane = installed_without_live_adjust
    folder = tmp_path_factory.mktemp("chart-operator-pd-off")
    operator = _charted_operator(
        plane, "cpoff-chunkpilot", OFF_RELEASE_NS, OFF_WATCHED_NS, folder,
        CHUNKPILOT_LIVE_ADJUST="off", CHUNKPILOT_DISAGGREGATION="off",
    )  # fmt: skip
    try:
        operator.start()
        plane.kubectl("apply", "-n", OFF_WATCHED_NS, "-f", "-", input=json.dumps(_disaggregated("pd-off")))

        def refused() -> dict[str, Any] | None:
            ready = _conditions(plane, "pd-off", OFF_WATCHED_NS).get("Ready")
            return ready if ready and ready["reason"] == "DisaggregationDisabled" else None

        ready = wait_for(refused, timeout=60, what="Ready=False DisaggregationDisabled")
        assert ready["status"] == "False" and "disaggregation.enabled=true" in ready["message"]
        listed = plane.kubectl("get", "deployments,roles", "-n", OFF_WATCHED_NS, "-o", "name").stdout
        assert "pd-off" not in listed
        _assert_nothing_refused(operator)
        plane.kubectl("delete", "cpis", "pd-off", "-n", OFF_WATCHED_NS, "--timeout=60s")
    finally:
        operator.stop()
