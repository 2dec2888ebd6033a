"""The chart's identity for the local operator: watch values from the operator's flags, and the
ServiceAccount token kubeconfig that the API server then authorises by the chart's rules only."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest

from chunkpilot.devcluster.components import Binary
from chunkpilot.devcluster.controlplane import ControlPlane
from chunkpilot.localrun.chart import RELEASE_NAMESPACE, chart_dir, install_operator_identity, watch_values
from chunkpilot.localrun.stack import DEFAULT_OPERATOR_COMMAND


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (DEFAULT_OPERATOR_COMMAND, ["watch.mode=cluster"]),
        (["operator", "-A"], ["watch.mode=cluster"]),
        (["operator", "-n", "a", "--namespace=b"], ["watch.mode=namespaced", "watch.namespaces={a,b}"]),
        (["operator", "--namespace", "a"], ["watch.mode=namespaced", "watch.namespaces={a}"]),
        (["operator"], ["watch.mode=cluster"]),
    ],
)
def test_watch_values_follow_the_operator_flags(args: list[str], expected: list[str]) -> None:
    assert watch_values(args) == expected


def test_the_chart_is_found_from_the_package() -> None:
    found = chart_dir()
    assert found is not None and (found / "templates" / "rbac.yaml").is_file()


def can_i(plane: ControlPlane, kubeconfig: Path, *args: str) -> bool:
    """``kubectl auth can-i ARGS`` as the identity in ``kubeconfig``."""
    result = subprocess.run(
        [str(plane.binaries[Binary.KUBECTL]), f"--kubeconfig={kubeconfig}", "auth", "can-i", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return result.stdout.strip() == "yes"


def answers(
    plane: ControlPlane, kubeconfig: Path, asked: Iterable[tuple[str, ...]]
) -> dict[tuple[str, ...], bool]:
    """``kubectl auth can-i`` as ``kubeconfig``'s identity, for each question (its arguments)."""
    return {question: can_i(plane, kubeconfig, *question) for question in asked}


#: What the operator may do watching namespace id-a, live adjustment off.
PLAIN_RULES = {
    ("list", "pods", "-n", "id-a"): True,
    ("patch", "deployments.apps", "-n", "id-a"): True,
    ("list", "pods", "-n", "id-b"): False,  # outside the watched namespace
    ("get", "secrets", "-n", "id-a"): False,  # liveAdjust.enabled is off
    ("delete", "services", "-n", "id-a"): False,
    ("list", "nodes"): False,
}
#: What it may do with Secrets, watching the whole cluster with live adjustment on: read and patch the
#: one live-adjustment Secret of each namespace by name, create (which reveals nothing), no more.
LIVE_RULES = {
    ("get", "secrets/chunkpilot-live-adjust", "-n", "anywhere"): True,
    ("patch", "secrets/chunkpilot-live-adjust", "-n", "anywhere"): True,
    ("create", "secrets", "-n", "anywhere"): True,
    ("get", "secrets", "-n", "anywhere"): False,
    ("get", "secrets/aws-credentials", "-n", "kube-system"): False,
    ("patch", "secrets/web-tls", "-n", "anywhere"): False,
    ("delete", "secrets/chunkpilot-live-adjust", "-n", "anywhere"): False,
    ("list", "secrets", "-n", "anywhere"): False,
}
#: With probe Jobs: bind the probe's publisher role, by name, instead of writing ConfigMaps itself
#: (on EKS kube-system/aws-auth is one).
PROBE_RULES = {
    ("bind", "clusterroles/chunkpilot-probe-publisher"): True,
    ("bind", "clusterroles/cluster-admin"): False,
    ("create", "rolebindings.rbac.authorization.k8s.io", "-n", "anywhere"): True,
    ("get", "configmaps", "-n", "anywhere"): True,
    ("create", "configmaps", "-n", "anywhere"): False,
    ("patch", "configmaps/aws-auth", "-n", "kube-system"): False,
    ("create", "roles.rbac.authorization.k8s.io", "-n", "anywhere"): False,
}


@pytest.mark.cluster
def test_operator_identity_holds_the_charts_rules_and_no_more(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    plain = install_operator_identity(
        control_plane, tmp_path / "plain.kubeconfig", ["watch.mode=namespaced", "watch.namespaces={id-a}"],
        release="identity-plain",
    )  # fmt: skip
    assert answers(control_plane, plain, PLAIN_RULES) == PLAIN_RULES

    live = install_operator_identity(
        control_plane, tmp_path / "live.kubeconfig", ["watch.mode=cluster", "liveAdjust.enabled=true"],
        release="identity-live",
    )  # fmt: skip
    assert answers(control_plane, live, LIVE_RULES) == LIVE_RULES
    probing = install_operator_identity(
        control_plane, tmp_path / "probe.kubeconfig", ["watch.mode=cluster", "probeJobs.enabled=true"],
        release="identity-probe",
    )  # fmt: skip
    assert answers(control_plane, probing, PROBE_RULES) == PROBE_RULES
    account = f"system:serviceaccount:{RELEASE_NAMESPACE}:identity-live-chunkpilot"
    who = subprocess.run(
        [str(control_plane.binaries[Binary.KUBECTL]), f"--kubeconfig={live}", "auth", "whoami", "-o", "json"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert json.loads(who.stdout)["status"]["userInfo"]["username"] == account


def test_leaving_the_stack_fails_on_refused_calls_in_the_operator_log(tmp_path: Path) -> None:
    from chunkpilot.devcluster.processes import ManagedProcess
    from chunkpilot.localrun.stack import DeniedApiCallsError, LocalStack, StackOptions

    stack = LocalStack(StackOptions(state_dir=tmp_path))
    log = tmp_path / "operator.log"
    stack.operator = ManagedProcess(name="operator", argv=["true"], log_path=log, env={})
    log.write_text("reconciled ns/chat\n")
    assert stack.denied_calls() == []
    refused = [
        "kopf.objects [ns/chat] APIForbiddenError: ('secrets is forbidden: User ...', ...)",
        "GET /api/v1/namespaces/ns/pods: HTTP 403: pods is forbidden",
        "undeclared Kubernetes API call DELETE /api/v1/namespaces/ns/services/s (delete core/services ...)",
    ]
    terminating = (
        "Failed to post an event. Code: 403. Message: events is forbidden: unable to create new content "
        "in namespace ns because it is being terminated"
    )
    log.write_text("\n".join(["reconciled ns/chat", *refused, terminating]) + "\n")
    assert stack.denied_calls() == refused
    with pytest.raises(DeniedApiCallsError, match="3 operator log line"):
        stack.__exit__(None, None, None)
