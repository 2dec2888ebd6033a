"""Rankings on the twin as Jobs, on the real control plane: created, a failed pod retried by the Job
controller, the operator restarted in the middle, the result collected.

KWOK runs no containers, so the test plays the kubelet of the Job's pods: it fails the first pod,
and for the retry runs the container's own command (``chunkpilot twin work``) with the request its
downward-API volume would mount and the token of the ServiceAccount the operator created, so the
result is written into the Job through the worker's own Role; then it marks the pod Succeeded.
"The operator" is :class:`TwinJobs` on its own API client; its restart is a new client and a new
instance, with nothing carried over but the cluster.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from chunkpilot.operator.kube import KubeClient
from chunkpilot.operator.testing import token_kubeconfig, wait_for
from chunkpilot.tuner.observe.twinjobs import JobRanking, TwinJobs
from chunkpilot.tuner.twin import jobs, online, wire
from chunkpilot.tuner.twin.jobs import JobPhase, Offload, OffloadMode

from chunkpilot.bench.twin_jobs import terminated_status
from chunkpilot.testing.kube import get_object

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
NS = "chunkpilot-twinjob-tests"
SERVICE = "chat"
IMAGE = "registry.example/chunkpilot:test"


@pytest.fixture(scope="module")
def cluster(control_plane: Any) -> Iterator[Any]:
    control_plane.apply_manifests([REPO / "crds"])
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}
    control_plane.kubectl("apply", "-f", "-", input=json.dumps(namespace))
    yield control_plane
    control_plane.kubectl("delete", "namespace", NS, "--wait=false", check=False)


def rank_once(cluster: Any, request: online.Request) -> JobRanking:
    """One tick of an operator process: its own client, its own TwinJobs, then gone."""

    async def tick() -> JobRanking:
        kube = KubeClient.from_environment(field_manager="twinjob-test", kubeconfig=str(cluster.kubeconfig))
        try:
            return await TwinJobs(kube, IMAGE, Offload(OffloadMode.ALWAYS)).ranking(
                NS, SERVICE, service_uid(cluster), request
            )
        finally:
            await kube.close()

    return asyncio.run(tick())


def service_uid(cluster: Any) -> str:
    body = get_object(cluster, "inferenceservices", SERVICE, NS)
    assert body is not None
    return str(body["metadata"]["uid"])


def pods(cluster: Any, job: str) -> list[dict[str, Any]]:
    out = cluster.kubectl("get", "pods", "-n", NS, "-l", f"{jobs.JOB_NAME_LABEL}={job}", "-o", "json").stdout
    return sorted(json.loads(out)["items"], key=lambda p: p["metadata"]["creationTimestamp"])


def finish_pod(cluster: Any, pod: dict[str, Any], exit_code: int, message: str) -> None:
    """The kubelet's last word on a pod: its container terminated with ``exit_code``."""
    status = terminated_status(exit_code, message, IMAGE)
    cluster.kubectl(
        "patch",
        "pod",
        pod["metadata"]["name"],
        "-n",
        NS,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": status}),
    )


def run_worker(cluster: Any, pod: dict[str, Any], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """The pod's container: its command, its mounted request and its ServiceAccount's token."""
    spec = pod["spec"]
    (item,) = next(v for v in spec["volumes"] if v["name"] == "request")["downwardAPI"]["items"]
    annotation = item["fieldRef"]["fieldPath"].split("'")[1]
    request_file = tmp_path / item["path"]
    request_file.write_text(pod["metadata"]["annotations"][annotation])
    token = cluster.kubectl("create", "token", spec["serviceAccountName"], "-n", NS).stdout.strip()
    kubeconfig = token_kubeconfig(cluster.kubeconfig, token, tmp_path / "worker-kubeconfig", NS)
    command = [
        str(request_file) if arg == jobs.REQUEST_FILE else arg for arg in spec["containers"][0]["command"]
    ]
    command[0] = str(Path(sys.executable).with_name("chunkpilot"))
    return subprocess.run(
        [*command, "--kubeconfig", str(kubeconfig)], capture_output=True, text=True, timeout=300, check=False
    )


def worker_can(cluster: Any, verb: str, resource: str) -> bool:
    subject = f"system:serviceaccount:{NS}:{jobs.WORKER_ACCOUNT}"
    done = cluster.kubectl("auth", "can-i", verb, resource, "-n", NS, "--as", subject, check=False)
    return done.stdout.strip() == "yes"


def test_a_ranking_job_is_retried_survives_a_restart_and_delivers(
    cluster: Any, ranking_request: online.Request, tmp_path: Path
) -> None:
    service = yaml.safe_load((REPO / "examples" / "chat-llama-8b-sim.yaml").read_text())
    service["metadata"]["namespace"] = NS
    cluster.kubectl("apply", "-f", "-", input=json.dumps(service))

    # 1. The first tick creates the Job, its request and the worker's account, all owned.
    started = rank_once(cluster, ranking_request)
    assert started.created and started.state.phase is JobPhase.RUNNING and started.result is None
    job = get_object(cluster, "jobs", started.job, NS)
    assert job is not None
    assert job["metadata"]["ownerReferences"][0]["uid"] == service_uid(cluster)
    template = job["spec"]["template"]["spec"]
    assert template["serviceAccountName"] == jobs.WORKER_ACCOUNT
    assert template["securityContext"]["runAsNonRoot"] is True
    assert template["containers"][0]["securityContext"]["allowPrivilegeEscalation"] is False
    # The request, less the planner's minutes (the ranking does not use them).
    assert wire.decode_request(
        job["spec"]["template"]["metadata"]["annotations"][jobs.ANNOTATION_REQUEST]
    ) == replace(ranking_request, workload=replace(ranking_request.workload, segments=()))
    role = get_object(cluster, "roles", started.job, NS)
    assert role is not None and role["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    assert worker_can(cluster, "patch", f"jobs/{started.job}")
    assert not worker_can(cluster, "patch", "jobs/someone-elses")
    assert not worker_can(cluster, "create", "configmaps") and not worker_can(cluster, "get", "secrets")

    # 2. Its first pod fails; the Job controller retries it with a second one.
    first = wait_for(
        lambda: (found := pods(cluster, started.job)) and found[0], timeout=60, what="the Job's pod"
    )
    finish_pod(cluster, first, 1, "the twin's worker was killed")
    retried = wait_for(
        lambda: len(found := pods(cluster, started.job)) >= 2 and found[-1], timeout=90, what="the retry pod"
    )
    assert retried["metadata"]["name"] != first["metadata"]["name"]

    # 3. The operator restarts meanwhile: the next one finds the same Job and starts nothing.
    again = rank_once(cluster, ranking_request)
    assert not again.created and again.job == started.job and again.state.phase is JobPhase.RUNNING
    listed = cluster.kubectl("get", "jobs", "-n", NS, "-o", "json").stdout
    assert len(json.loads(listed)["items"]) == 1

    # 4. The retry runs the container's command with the worker's own credentials, and succeeds.
    worked = run_worker(cluster, retried, tmp_path)
    assert worked.returncode == 0, worked.stderr
    assert f"wrote the result into Job {NS}/{started.job}" in worked.stderr
    finish_pod(cluster, retried, 0, "")

    # 5. The operator collects the ranking: the one it would have made itself.
    done = rank_once(cluster, ranking_request)
    assert done.state.phase is JobPhase.SUCCEEDED and done.result is not None
    here = wire.rank(ranking_request)
    assert done.result.key == ranking_request.key and done.result.ranked == here.ranked
    finished = wait_for(
        lambda: (
            (body := get_object(cluster, "jobs", started.job, NS))
            and any(c["type"] == "Complete" for c in body["status"].get("conditions") or [])
            and body
        ),
        timeout=60,
        what="the Job Complete",
    )
    assert finished["status"].get("failed") == 1  # the one retried pod


def test_the_twin_jobs_benchmark_runs_every_ranking_through_a_job(cluster: Any, tmp_path: Path) -> None:
    """``chunkpilot bench twin-jobs`` on the real control plane: each ranking a Job, run by the played
    kubelet with the worker's own credentials, collected by a tick."""
    from chunkpilot.bench.twin_jobs import run_twin_jobs

    result = run_twin_jobs(
        services=3,
        workers=2,
        kubeconfig=cluster.kubeconfig,
        work_dir=tmp_path,
        log=lambda _: None,
        interval_s=1.0,
        max_evaluations=1,
        timeout_s=240.0,
    )
    assert result.collected == 3, result.report()
    assert all(t.exit_code == 0 and not t.failed and t.worker_cpu_s > 0 for t in result.times.values())
    spans = result.spans()
    assert all(len(spans[stage]) == 3 for stage in ("job_to_pod", "queue", "worker", "total"))
    # The whole way holds each stage of it.
    assert min(spans["total"]) >= min(spans["worker"]) > 0
    # Per ranking: the Job and its Role and RoleBinding made once, the Job read on each tick.
    assert result.api_requests["create batch/jobs"] == 3
    assert result.api_requests["create rbac.authorization.k8s.io/roles"] == 3
    assert result.api_requests.get("get rbac.authorization.k8s.io/roles", 0) == 0
    assert result.api_requests["create serviceaccounts"] == 1
    # The ticks read the Jobs from a watch, as the operator does: a Job is read from the API only
    # until the watch has shown it.
    assert result.watch_reads and result.api_requests.get("get batch/jobs", 0) <= 2 * 3
    assert "rankings as Jobs" in result.report() and result.figures()["collected"] == 3
