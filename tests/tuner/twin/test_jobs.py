"""Twin Jobs' pure parts: when a ranking leaves the operator, the objects that carry it, a Job's phase."""

from __future__ import annotations

import re
from typing import Any

import pytest
from chunkpilot.tuner.twin import jobs
from chunkpilot.tuner.twin.jobs import JobPhase, Offload, OffloadMode


def test_off_keeps_every_ranking_and_always_sends_every_one() -> None:
    assert Offload(OffloadMode.OFF).local(0.0, 1e9)
    assert not Offload(OffloadMode.ALWAYS).local(0.0, 0.0)


def test_auto_ranks_here_until_the_window_is_spent_then_frees_up() -> None:
    offload = Offload(OffloadMode.AUTO, cores=0.1, window_s=600.0)  # 60 CPU-s per ten minutes
    assert offload.allowance_s == pytest.approx(60.0)
    assert offload.local(0.0, 30.0)
    offload.spent(10.0, 30.0)
    offload.spent(20.0, 25.0)
    assert offload.used_s(30.0) == pytest.approx(55.0)
    assert not offload.local(30.0, 30.0)  # 55 + 30 > 60: this one goes to a Job
    assert offload.local(30.0, 5.0)
    assert offload.local(615.0, 30.0)  # the first ranking left the window
    assert offload.used_s(700.0) == 0.0


def test_a_negative_budget_is_refused() -> None:
    with pytest.raises(ValueError, match="cores"):
        Offload(OffloadMode.AUTO, cores=-1.0)


def test_job_names_are_stable_distinct_and_valid() -> None:
    long = "Chat_Service.with.a-very-long-name-indeed-and-more"
    name = jobs.job_name("team-a", long, "abc-3")
    assert name == jobs.job_name("team-a", long, "abc-3")
    assert name != jobs.job_name("team-a", long, "abc-4")
    assert name != jobs.job_name("team-b", long, "abc-3")
    assert len(name) <= 63 and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name), name


def test_the_job_is_owned_restricted_bounded_and_carries_its_request() -> None:
    job = jobs.build_job(
        name="chunkpilot-twin-chat-1",
        namespace="ns",
        service="chat",
        service_uid="u-1",
        image="img:1",
        cpu_budget_s=300.0,
        request_json='{"kind": "RankingRequest"}',
    )
    assert job["metadata"]["ownerReferences"][0] == {
        "apiVersion": "chunkpilot.io/v1alpha1",
        "kind": "InferenceService",
        "name": "chat",
        "uid": "u-1",
        "controller": True,
    }
    spec = job["spec"]
    assert spec["backoffLimit"] == jobs.BACKOFF_LIMIT and spec["ttlSecondsAfterFinished"] > 0
    assert spec["activeDeadlineSeconds"] == 1200  # four times the CPU budget
    template = spec["template"]
    assert template["metadata"]["annotations"] == {jobs.ANNOTATION_REQUEST: '{"kind": "RankingRequest"}'}
    assert template["metadata"]["labels"][jobs.LABEL_TWIN_WORKER] == "true"
    pod = template["spec"]
    assert pod["restartPolicy"] == "Never" and pod["securityContext"]["runAsNonRoot"] is True
    container = pod["containers"][0]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    command = container["command"]
    assert command[:3] == ["chunkpilot", "twin", "work"]
    assert command[command.index("--result-job") + 1] == "chunkpilot-twin-chat-1"
    assert command[command.index("--request") + 1] == jobs.REQUEST_FILE
    (item,) = next(v for v in pod["volumes"] if v["name"] == "request")["downwardAPI"]["items"]
    assert item["fieldRef"]["fieldPath"] == f"metadata.annotations['{jobs.ANNOTATION_REQUEST}']"
    short = jobs.build_job(
        name="j", namespace="ns", service="s", service_uid="u", image="i", cpu_budget_s=5.0, request_json="{}"
    )
    assert short["spec"]["activeDeadlineSeconds"] == jobs.MIN_DEADLINE_S


def test_the_worker_may_patch_its_own_job_and_nothing_else() -> None:
    role, binding = jobs.build_job_rbac("chunkpilot-twin-chat-1", "ns", "job-uid")
    assert role["rules"] == [
        {
            "apiGroups": ["batch"],
            "resources": ["jobs"],
            "resourceNames": ["chunkpilot-twin-chat-1"],
            "verbs": ["patch"],
        }
    ]
    for owned in (role, binding):
        assert owned["metadata"]["ownerReferences"][0]["uid"] == "job-uid"  # gone with the Job
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": jobs.WORKER_ACCOUNT, "namespace": "ns"}]
    assert jobs.build_worker_account("ns")["metadata"]["name"] == jobs.WORKER_ACCOUNT


def test_the_result_travels_in_the_jobs_annotation() -> None:
    job: dict[str, Any] = {"metadata": {"name": "j"}}
    assert jobs.result_of(job) is None
    job["metadata"].update(jobs.result_patch('{"kind": "RankingResult"}')["metadata"])
    assert jobs.result_of(job) == '{"kind": "RankingResult"}'


def _job(result: str | None = None, **status: Any) -> dict[str, Any]:
    annotations = {jobs.ANNOTATION_RESULT: result} if result else {}
    return {"metadata": {"name": "j", "annotations": annotations}, "status": status}


@pytest.mark.parametrize(
    ("job", "phase", "says"),
    [
        (_job(active=1), JobPhase.RUNNING, "1 pod(s) active"),
        (_job(active=1, failed=1), JobPhase.RUNNING, "1 failed pod(s) retried"),
        (_job("{}", active=1), JobPhase.SUCCEEDED, ""),
        (
            _job(failed=3, conditions=[{"type": "Failed", "status": "True", "message": "backoff limit"}]),
            JobPhase.FAILED,
            "backoff limit",
        ),
        (_job(conditions=[{"type": "Complete", "status": "True"}]), JobPhase.FAILED, "without"),
        (
            _job(conditions=[{"type": "Failed", "status": "False"}], active=1),
            JobPhase.RUNNING,
            "active",
        ),
    ],
)
def test_a_jobs_phase(job: dict[str, Any], phase: JobPhase, says: str) -> None:
    state = jobs.job_state(job)
    assert state.phase is phase and says in state.message
