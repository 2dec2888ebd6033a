"""Deployment reads and trial lists from the watch's indices, and the tuner's own writes read back
from the API."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from typing import Any

import pytest
from chunkpilot.operator.kube import KubeError, object_path
from chunkpilot.tuner.observe.watched import PENDING_S, WatchedKube, index_by_label, index_object

from chunkpilot.api import LABEL_SERVICE

NS, NAME = "team", "chat-canary"
PATH = f"/apis/apps/v1/namespaces/{NS}/deployments/{NAME}"


def deployment(version: str, replicas: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"namespace": NS, "name": NAME, "resourceVersion": version, "managedFields": [{}]},
        "spec": {"replicas": replicas},
    }


class RecordingKube:
    """The API: objects by path, each write a new resourceVersion, every call recorded."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []
        self._version = 100

    def _stamp(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self._version += 1
        obj = copy.deepcopy(dict(body))
        obj["metadata"]["resourceVersion"] = str(self._version)
        self.objects[path] = obj
        return copy.deepcopy(obj)

    async def get(self, path: str) -> dict[str, Any] | None:
        self.calls.append(("get", path))
        obj = self.objects.get(path)
        return copy.deepcopy(obj) if obj is not None else None

    async def apply(self, manifest: Mapping[str, Any], *, force: bool = True) -> dict[str, Any]:
        self.calls.append(("apply", object_path(manifest)))
        return self._stamp(object_path(manifest), manifest)

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        self.calls.append(("patch", path))
        path = path.removesuffix("/status")  # a status write changes the object
        return self._stamp(path, {**self.objects[path], **patch})

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self.calls.append(("create", path))
        return self._stamp(f"{path}/{body['metadata']['name']}", body)

    async def delete(self, path: str) -> None:
        self.calls.append(("delete", path))
        self.objects.pop(path, None)

    async def list(self, path: str, *, label_selector: str | None = None) -> list[dict[str, Any]]:
        self.calls.append(("list", path))
        label, _, value = (label_selector or "").partition("=")
        return [
            copy.deepcopy(obj)
            for key, obj in self.objects.items()
            if key.startswith(f"{path}/") and (not label or obj["metadata"]["labels"].get(label) == value)
        ]


class Watch:
    """What Kopf's index holds: the last body the watch delivered per Deployment."""

    def __init__(self) -> None:
        self.index: dict[tuple[str, str], list[dict[str, Any]]] = {}

    def saw(self, body: Mapping[str, Any]) -> None:
        for key, value in index_object(body).items():
            self.index[key] = [value]

    def deleted(self) -> None:
        self.index.pop((NS, NAME), None)


def watched(kube: RecordingKube, watch: Watch, clock: list[float] | None = None) -> WatchedKube:
    now = clock or [0.0]
    view = WatchedKube(kube, clock=lambda: now[0])
    view.indices = {"deployments": watch.index}
    return view


def gets(kube: RecordingKube) -> int:
    return sum(1 for verb, path in kube.calls if verb == "get" and path == PATH)


def test_the_index_keeps_each_deployment_without_its_managed_fields() -> None:
    entry = index_object(deployment("7"))
    assert list(entry) == [(NS, NAME)]
    assert "managedFields" not in entry[(NS, NAME)]["metadata"]
    assert entry[(NS, NAME)]["metadata"]["resourceVersion"] == "7"


def test_without_an_index_every_read_goes_to_the_api() -> None:
    kube = RecordingKube()
    kube.objects[PATH] = deployment("1")
    view = WatchedKube(kube)
    assert asyncio.run(view.get(PATH)) == deployment("1")
    assert gets(kube) == 1


def test_a_watched_deployment_is_read_from_the_index_as_a_copy() -> None:
    kube, watch = RecordingKube(), Watch()
    watch.saw(deployment("5", replicas=3))
    view = watched(kube, watch)
    body = asyncio.run(view.get(PATH))
    assert body is not None and body["spec"] == {"replicas": 3}
    body["spec"]["replicas"] = 0
    again = asyncio.run(view.get(PATH))
    assert again is not None and again["spec"] == {"replicas": 3}
    # Absent from a complete index: absent, without asking the API.
    assert asyncio.run(view.get(f"/apis/apps/v1/namespaces/{NS}/deployments/other")) is None
    assert kube.calls == []
    # Anything but a Deployment goes to the API.
    asyncio.run(view.get(f"/api/v1/namespaces/{NS}/secrets/token"))
    assert kube.calls == [("get", f"/api/v1/namespaces/{NS}/secrets/token")]


def test_a_written_deployment_is_read_from_the_api_until_the_watch_shows_the_write() -> None:
    kube, watch = RecordingKube(), Watch()
    watch.saw(deployment("5"))
    kube.objects[PATH] = deployment("5")
    view = watched(kube, watch)
    written = asyncio.run(view.apply(deployment("5", replicas=2)))
    body = asyncio.run(view.get(PATH))
    assert body is not None and body["spec"] == {"replicas": 2}, "the index still holds the old one"
    assert gets(kube) == 1
    watch.saw(written)  # the watch delivers the write
    body = asyncio.run(view.get(PATH))
    assert body is not None and body["spec"] == {"replicas": 2}
    assert gets(kube) == 1
    # A patch is a write too.
    asyncio.run(view.merge_patch(PATH, {"spec": {"replicas": 4}}))
    asyncio.run(view.get(PATH))
    assert gets(kube) == 2


def test_a_created_deployment_is_read_from_the_api_until_the_watch_shows_it() -> None:
    kube, watch = RecordingKube(), Watch()
    view = watched(kube, watch)
    created = asyncio.run(view.create(f"/apis/apps/v1/namespaces/{NS}/deployments", deployment("0")))
    assert asyncio.run(view.get(PATH)) is not None
    assert gets(kube) == 1
    watch.saw(created)
    assert asyncio.run(view.get(PATH)) is not None
    assert gets(kube) == 1


def test_a_deleted_deployment_is_read_from_the_api_until_the_watch_drops_it() -> None:
    kube, watch = RecordingKube(), Watch()
    watch.saw(deployment("5"))
    kube.objects[PATH] = deployment("5")
    view = watched(kube, watch)
    asyncio.run(view.delete(PATH))
    assert asyncio.run(view.get(PATH)) is None
    assert gets(kube) == 1
    watch.deleted()
    assert asyncio.run(view.get(PATH)) is None
    assert gets(kube) == 1


def test_a_write_the_watch_never_shows_is_settled_when_the_api_and_the_index_agree() -> None:
    kube, watch = RecordingKube(), Watch()
    kube.objects[PATH] = deployment("5")
    view = watched(kube, watch)
    asyncio.run(view.apply(deployment("5", replicas=2)))
    # Another writer changed it again before the watch delivered the tuner's version.
    later = asyncio.run(kube.apply(deployment("x", replicas=7)))
    watch.saw(later)
    body = asyncio.run(view.get(PATH))
    assert body is not None and body["spec"] == {"replicas": 7}
    assert gets(kube) == 1
    asyncio.run(view.get(PATH))
    assert gets(kube) == 1, "settled: the index serves it again"


def test_a_pending_write_stops_costing_reads_after_its_time() -> None:
    kube, watch = RecordingKube(), Watch()
    watch.saw(deployment("5"))
    clock = [0.0]
    view = watched(kube, watch, clock)
    asyncio.run(view.apply(deployment("5", replicas=2)))
    asyncio.run(view.get(PATH))
    assert gets(kube) == 1
    clock[0] = PENDING_S + 1
    body = asyncio.run(view.get(PATH))
    assert body is not None and body["metadata"]["resourceVersion"] == "5"
    assert gets(kube) == 1
    assert view.reads == {"index": 1, "api": 1}


SERVICE = f"/apis/chunkpilot.io/v1alpha1/namespaces/{NS}/inferenceservices/chat"


def service(version: str, phase: str) -> dict[str, Any]:
    return {
        "apiVersion": "chunkpilot.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"namespace": NS, "name": "chat", "resourceVersion": version},
        "status": {"phase": phase},
    }


class ConflictingKube(RecordingKube):
    """Refuses the next conditional patch: someone else wrote the object first."""

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        self.calls.append(("patch", path))
        raise KubeError(409, "PATCH", path, "the object has been modified")


def test_the_service_is_read_from_its_index_and_its_status_write_read_back_from_the_api() -> None:
    kube, services = RecordingKube(), Watch()
    services.saw(service("5", "Pending"))
    kube.objects[SERVICE] = service("5", "Pending")
    view = WatchedKube(kube)
    view.indices = {"inferenceservices": services.index}
    assert (asyncio.run(view.get(SERVICE)) or {})["status"] == {"phase": "Pending"}
    assert kube.calls == []
    kube.objects[f"{SERVICE}/status"] = service("5", "Pending")
    written = asyncio.run(view.merge_patch(f"{SERVICE}/status", {"status": {"phase": "Running"}}))
    kube.objects[SERVICE] = written
    assert (asyncio.run(view.get(SERVICE)) or {})["status"] == {"phase": "Running"}
    assert ("get", SERVICE) in kube.calls
    services.saw(written)
    kube.calls.clear()
    assert (asyncio.run(view.get(SERVICE)) or {})["status"] == {"phase": "Running"}
    assert kube.calls == []


def test_a_conflict_reads_the_object_from_the_api_until_the_index_agrees() -> None:
    kube, services = ConflictingKube(), Watch()
    services.saw(service("5", "Pending"))
    kube.objects[SERVICE] = service("6", "Running")  # written by someone else; not watched yet
    view = WatchedKube(kube)
    view.indices = {"inferenceservices": services.index}
    with pytest.raises(KubeError):
        asyncio.run(view.merge_patch(f"{SERVICE}/status", {"status": {"phase": "Degraded"}}))
    assert (asyncio.run(view.get(SERVICE)) or {})["metadata"]["resourceVersion"] == "6"
    services.saw(service("6", "Running"))
    asyncio.run(view.get(SERVICE))
    kube.calls.clear()
    assert (asyncio.run(view.get(SERVICE)) or {})["metadata"]["resourceVersion"] == "6"
    assert kube.calls == [], "settled once the API and the index agreed"


TRIALS = f"/apis/chunkpilot.io/v1alpha1/namespaces/{NS}/tuningtrials"
SELECTOR = f"{LABEL_SERVICE}=chat"


def trial(name: str, service: str = "chat", version: str = "1", phase: str = "Pending") -> dict[str, Any]:
    return {
        "apiVersion": "chunkpilot.io/v1alpha1",
        "kind": "TuningTrial",
        "metadata": {
            "namespace": NS,
            "name": name,
            "labels": {LABEL_SERVICE: service},
            "resourceVersion": version,
            "managedFields": [{}],
        },
        "status": {"phase": phase},
    }


class TrialWatch:
    """Kopf's index of TuningTrials by their service's label: the last body of each."""

    def __init__(self) -> None:
        self.index: dict[tuple[str, str], list[dict[str, Any]]] = {}

    def saw(self, body: Mapping[str, Any]) -> None:
        for key, value in index_by_label(body, LABEL_SERVICE).items():
            store = [b for b in self.index.get(key, []) if b["metadata"]["name"] != value["metadata"]["name"]]
            self.index[key] = [*store, value]


def trial_view(kube: RecordingKube, watch: TrialWatch, clock: list[float] | None = None) -> WatchedKube:
    now = clock or [0.0]
    view = WatchedKube(kube, clock=lambda: now[0])
    view.indices = {"tuningtrials": watch.index}
    return view


def lists(kube: RecordingKube) -> int:
    return sum(1 for verb, _ in kube.calls if verb == "list")


def names(bodies: list[dict[str, Any]]) -> list[str]:
    return sorted(b["metadata"]["name"] for b in bodies)


def test_a_service_trials_are_listed_from_the_index_by_its_label_as_copies() -> None:
    kube, watch = RecordingKube(), TrialWatch()
    for body in (trial("chat-trial-1"), trial("chat-trial-2"), trial("code-trial-1", service="code")):
        watch.saw(body)
    assert index_by_label({"metadata": {"namespace": NS, "name": "x"}}, LABEL_SERVICE) == {}
    view = trial_view(kube, watch)
    listed = asyncio.run(view.list(TRIALS, label_selector=SELECTOR))
    assert names(listed) == ["chat-trial-1", "chat-trial-2"]
    assert all("managedFields" not in b["metadata"] for b in listed)
    listed[0]["status"]["phase"] = "Changed"
    assert {b["status"]["phase"] for b in asyncio.run(view.list(TRIALS, label_selector=SELECTOR))} == {
        "Pending"
    }
    assert asyncio.run(view.list(TRIALS, label_selector=f"{LABEL_SERVICE}=none")) == []
    assert lists(kube) == 0
    # Any other selector, or none, is the API's to answer.
    asyncio.run(view.list(TRIALS, label_selector=f"{SELECTOR},track=canary"))
    asyncio.run(view.list(TRIALS))
    assert lists(kube) == 2


def test_a_trial_the_tuner_wrote_is_listed_from_the_api_until_the_watch_shows_the_write() -> None:
    kube, watch = RecordingKube(), TrialWatch()
    view = trial_view(kube, watch)
    created = asyncio.run(view.create(TRIALS, trial("chat-trial-1")))
    listed = asyncio.run(view.list(TRIALS, label_selector=SELECTOR))
    assert names(listed) == ["chat-trial-1"] and lists(kube) == 1
    # Another service's list is not held back by this one's write.
    assert asyncio.run(view.list(TRIALS, label_selector=f"{LABEL_SERVICE}=code")) == []
    assert lists(kube) == 1
    watch.saw(created)
    assert names(asyncio.run(view.list(TRIALS, label_selector=SELECTOR))) == ["chat-trial-1"]
    assert lists(kube) == 1
    # A status write: the list is the API's until the index holds the version the write returned.
    patched = asyncio.run(view.merge_patch(f"{TRIALS}/chat-trial-1/status", {"status": {"phase": "Running"}}))
    listed = asyncio.run(view.list(TRIALS, label_selector=SELECTOR))
    assert listed[0]["status"]["phase"] == "Running" and lists(kube) == 2
    watch.saw(patched)
    assert asyncio.run(view.list(TRIALS, label_selector=SELECTOR))[0]["status"]["phase"] == "Running"
    assert lists(kube) == 2


def test_a_trial_write_the_watch_never_shows_is_settled_by_agreement_or_time() -> None:
    kube, watch = RecordingKube(), TrialWatch()
    clock = [0.0]
    view = trial_view(kube, watch, clock)
    asyncio.run(view.create(TRIALS, trial("chat-trial-1")))
    # Someone else wrote it again and the watch shows that later version: index and API agree.
    kube.objects[f"{TRIALS}/chat-trial-1"]["metadata"]["resourceVersion"] = "500"
    watch.saw(kube.objects[f"{TRIALS}/chat-trial-1"])
    asyncio.run(view.list(TRIALS, label_selector=SELECTOR))
    asyncio.run(view.list(TRIALS, label_selector=SELECTOR))
    assert lists(kube) == 1
    asyncio.run(view.create(TRIALS, trial("chat-trial-2")))
    clock[0] = PENDING_S + 1
    assert names(asyncio.run(view.list(TRIALS, label_selector=SELECTOR))) == ["chat-trial-1"]
    assert lists(kube) == 1


def test_a_trial_write_refused_for_a_conflict_lists_from_the_api_until_the_watch_agrees() -> None:
    kube, watch = RecordingKube(), TrialWatch()
    current = trial("chat-trial-1", version="9", phase="Running")
    kube.objects[f"{TRIALS}/chat-trial-1"] = current
    watch.saw(trial("chat-trial-1", version="8"))

    async def refuse(path: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        raise KubeError(409, "PATCH", path, "the object has been modified")

    kube.merge_patch = refuse  # type: ignore[method-assign]
    view = trial_view(kube, watch)
    with pytest.raises(KubeError):
        asyncio.run(view.merge_patch(f"{TRIALS}/chat-trial-1/status", {"status": {"phase": "Failed"}}))
    assert asyncio.run(view.list(TRIALS, label_selector=SELECTOR))[0]["status"]["phase"] == "Running"
    assert lists(kube) == 1
    watch.saw(current)
    asyncio.run(view.list(TRIALS, label_selector=SELECTOR))  # agrees: settled
    assert asyncio.run(view.list(TRIALS, label_selector=SELECTOR))[0]["metadata"]["resourceVersion"] == "9"
    assert lists(kube) == 2


# --------------------------------------------------------------------------- the twin's ranking Jobs


class ExistingKube(RecordingKube):
    """:class:`RecordingKube` whose creates of an existing object are refused, as the API server's."""

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        if f"{path}/{body['metadata']['name']}" in self.objects:
            self.calls.append(("create", path))
            raise KubeError(409, "POST", path, '{"reason": "AlreadyExists"}')
        return await super().create(path, body)


def test_a_ranking_jobs_progress_is_read_from_the_watch_once_it_shows_the_job(
    ranking_request: Any,
) -> None:
    from chunkpilot.tuner.observe.twinjobs import TwinJobs
    from chunkpilot.tuner.twin import jobs, wire
    from chunkpilot.tuner.twin.jobs import JobPhase, Offload, OffloadMode

    kube, jobs_index = ExistingKube(), Watch()
    view = WatchedKube(kube)
    view.indices = {"jobs": jobs_index.index}
    twin_jobs = TwinJobs(view, "img:1", Offload(OffloadMode.ALWAYS))
    name = jobs.job_name(NS, "chat", ranking_request.key)
    path = f"/apis/batch/v1/namespaces/{NS}/jobs/{name}"

    def rank() -> Any:
        return asyncio.run(twin_jobs.ranking(NS, "chat", "uid-1", ranking_request))

    def job_gets() -> int:
        return sum(1 for verb, p in kube.calls if verb == "get" and p == path)

    assert rank().created and job_gets() == 0  # absent from the index: not there, so made
    assert rank().state.phase is JobPhase.RUNNING and job_gets() == 1  # the watch has not shown it yet
    jobs_index.saw(kube.objects[path])
    rank(), rank()
    assert job_gets() == 1  # the watch shows the Job: its ticks read the index alone
    # The worker writes its result into the Job; the watch delivers it, and a tick collects it.
    done = wire.rank(ranking_request)
    kube.objects[path] = {
        **kube.objects[path],
        "metadata": {**kube.objects[path]["metadata"], "resourceVersion": "900"},
    }
    kube.objects[path]["metadata"]["annotations"] = {jobs.ANNOTATION_RESULT: wire.encode_result(done)}
    jobs_index.saw(kube.objects[path])
    found = rank()
    assert found.result is not None and found.result.ranked == done.ranked and job_gets() == 1


def test_a_create_refused_for_a_job_the_watch_has_not_shown_reads_it_from_the_api() -> None:
    kube, jobs_index = ExistingKube(), Watch()
    view = WatchedKube(kube)
    view.indices = {"jobs": jobs_index.index}
    body = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"namespace": NS, "name": "ranking"}}
    collection, path = f"/apis/batch/v1/namespaces/{NS}/jobs", f"/apis/batch/v1/namespaces/{NS}/jobs/ranking"
    kube.objects[path] = {**body, "metadata": {**body["metadata"], "resourceVersion": "3"}}
    with pytest.raises(KubeError):
        asyncio.run(view.create(collection, body))
    # Not in the index, yet it exists: read from the API until the watch agrees.
    assert asyncio.run(view.get(path)) is not None
    assert ("get", path) in kube.calls
