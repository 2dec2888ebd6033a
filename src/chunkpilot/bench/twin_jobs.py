"""``chunkpilot bench twin-jobs``: the twin's rankings as Kubernetes Jobs at a fleet's scale.

What an operator whose twin work does not fit its CPU budget pays and waits for when every service's
ranking runs as a Job (``CHUNKPILOT_TWIN_JOBS=always``): N InferenceServices, each with a ranking
due, ticked as the tuner ticks them (every ``--interval`` seconds, :class:`TwinJobs` on the
operator's own API client: the first tick creates the Job and its Role, later ticks read it until
its result is there). Figures, printed (never asserted):

* per ranking: Job created -> its pod created (the Job controller), pod -> worker started (the
  queue), the worker's run and CPU, result written -> collected by a tick, and the whole way;
* the operator's side: its CPU seconds and API requests per ranking, by verb and resource.

The local control plane's KWOK nodes run no containers, so the benchmark plays the kubelet of the
Jobs' pods: ``--workers`` at a time, each pod's own command (``chunkpilot twin work``) with the
request its downward-API volume would mount and a token of the workers' ServiceAccount (the result
goes into the Job through the Job's own Role), then the pod marked Succeeded. The queue is
therefore this machine's ``--workers``; on a cluster it is the free CPU the scheduler finds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from chunkpilot import telemetry
from chunkpilot.api import GROUP, ISVC_PLURAL, VERSION, Objective
from chunkpilot.bench.operator_load import local_cluster, service_manifest
from chunkpilot.bench.twin_validate import observe_window
from chunkpilot.engine.sim.capacity import retime
from chunkpilot.engine.sim.engine import SimConfig
from chunkpilot.engine.sim.metrics import StepTelemetry
from chunkpilot.engine.sim.offline import SLO, simulate
from chunkpilot.engine.sim.scheduler import SchedulerConfig
from chunkpilot.engine.sim.workload import load_trace
from chunkpilot.operator.kube import KubeClient
from chunkpilot.operator.testing import token_kubeconfig
from chunkpilot.tuner.observe.twinjobs import JobsApi, TwinJobs
from chunkpilot.tuner.observe.watched import WatchedKube, index_object
from chunkpilot.tuner.space import Knob, KnobRange, SearchSpace, TunedConfig
from chunkpilot.tuner.twin import jobs, online
from chunkpilot.tuner.twin.jobs import JobPhase, Offload, OffloadMode

__all__ = ["JobTimes", "JobsResult", "ranking_request", "run_twin_jobs", "terminated_status"]

NAMESPACE_PREFIX: Final = "chunkpilot-twin-jobs"
#: The worker's image as the Jobs name it (the benchmark runs the command itself).
IMAGE: Final = "chunkpilot:bench"
#: The tuner's tick (``CHUNKPILOT_TUNER_INTERVAL``'s default).
TICK_S: Final = 10.0
#: Rankings a tick asks about at once (the operator's API client pools 32 connections).
CONCURRENT: Final = 32
#: How often the played kubelet lists the Jobs' pods.
POLL_S: Final = 0.5
RANKING_SLO: Final = SLO(itl_ms=50.0, ttft_ms=2000.0)
RANKING_INCUMBENT: Final = TunedConfig(512, 128)


def ranking_request(key: str, *, max_evaluations: int = 4, seed: int = 7) -> online.Request:
    """A ranking as the tuner asks for one: the step telemetry and workload of a simulated engine
    (Llama-3.1-8B on an H100, budget 512, 128 sequences, azure_conv at 3 req/s), the budget's range
    searched, ended after ``max_evaluations`` evaluations."""
    workload = load_trace("azure_conv_2023", rate=1.0, limit=200)
    engine = SimConfig(scheduler=SchedulerConfig(**RANKING_INCUMBENT.as_dict(), max_model_len=8192))  # type: ignore[arg-type]
    steps = StepTelemetry()
    observed = simulate(engine, retime(workload, 3.0, 1), RANKING_SLO, keep_records=True, telemetry=steps)
    return online.Request(
        key=key,
        model="llama-3.1-8b",
        accelerator="h100",
        tensor_parallel_size=1,
        max_model_len=8192,
        gpu_memory_utilization=0.92,
        steps=steps.totals(),
        workload=observe_window(observed, 8192),
        slo=RANKING_SLO,
        space=SearchSpace(
            ranges={Knob.MAX_NUM_BATCHED_TOKENS: KnobRange(256, 4096, log=True)}, fixed=RANKING_INCUMBENT
        ),
        incumbent=RANKING_INCUMBENT,
        stable_rate_req_s=3.0,
        measured_ms=(observed.itl_at_slo_quantile_ms, observed.ttft_at_slo_quantile_ms),
        objective=Objective.GOODPUT,
        seed=seed,
        rank=True,
        cpu_budget_s=600.0,
        max_evaluations=max_evaluations,
    )


@dataclass
class JobTimes:
    """One service's ranking Job, in seconds of the benchmark's monotonic clock (None: not yet)."""

    created: float | None = None
    pod_seen: float | None = None
    started: float | None = None
    finished: float | None = None
    collected: float | None = None
    worker_cpu_s: float = 0.0
    exit_code: int | None = None
    failed: str = ""


def _spread(values: list[float]) -> dict[str, float] | None:
    """p50, p99 and max of ``values`` (None without any)."""
    if not values:
        return None
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"p50_s": statistics.median(ordered), "p99_s": p99, "max_s": ordered[-1]}


def _quantiles(values: list[float]) -> str:
    found = _spread(values)
    if found is None:
        return "none"
    return f"p50 {found['p50_s']:.1f} s, p99 {found['p99_s']:.1f} s, max {found['max_s']:.1f} s"


@dataclass(frozen=True)
class JobsResult:
    """What one run measured."""

    services: int
    workers: int
    interval_s: float
    wall_s: float
    times: dict[str, JobTimes]
    #: The operator side's CPU seconds (its event loop's thread) and API requests by verb and resource.
    operator_cpu_s: float
    api_requests: dict[str, float] = field(default_factory=dict)
    watch_reads: bool = True
    #: What went wrong playing the kubelet (the first few).
    errors: tuple[str, ...] = ()

    def spans(self) -> dict[str, list[float]]:
        """Each stage's durations over the rankings that reached its end."""
        out: dict[str, list[float]] = {
            "job_to_pod": [],
            "queue": [],
            "worker": [],
            "result_to_collected": [],
            "total": [],
        }
        for t in self.times.values():
            if t.created is not None and t.pod_seen is not None:
                out["job_to_pod"].append(t.pod_seen - t.created)
            if t.pod_seen is not None and t.started is not None:
                out["queue"].append(t.started - t.pod_seen)
            if t.started is not None and t.finished is not None:
                out["worker"].append(t.finished - t.started)
            if t.finished is not None and t.collected is not None:
                out["result_to_collected"].append(max(0.0, t.collected - t.finished))
            if t.created is not None and t.collected is not None:
                out["total"].append(t.collected - t.created)
        return out

    @property
    def collected(self) -> int:
        return sum(1 for t in self.times.values() if t.collected is not None)

    @property
    def requests_per_ranking(self) -> float:
        return sum(self.api_requests.values()) / self.services if self.services else 0.0

    def report(self) -> str:
        spans = self.spans()
        cpu = [t.worker_cpu_s for t in self.times.values() if t.finished is not None]
        top = ", ".join(
            f"{k} {v / max(1, self.services):.2f}" for k, v in list(self.api_requests.items())[:6]
        )
        failed = [f"{name}: {t.failed}" for name, t in self.times.items() if t.failed][:3]
        return "\n".join(
            [
                f"{self.services} rankings as Jobs, {self.workers} worker(s), a tick every"
                f" {self.interval_s:g} s, Jobs read from {'a watch' if self.watch_reads else 'the API'}:"
                f" {self.collected} collected in {self.wall_s:.1f} s",
                f"  Job -> pod (the Job controller): {_quantiles(spans['job_to_pod'])}",
                f"  pod -> worker started (the queue): {_quantiles(spans['queue'])}",
                f"  worker run: {_quantiles(spans['worker'])};"
                f" CPU {statistics.fmean(cpu) if cpu else 0.0:.2f} s per ranking",
                f"  result -> collected by a tick: {_quantiles(spans['result_to_collected'])}",
                f"  Job created -> result collected: {_quantiles(spans['total'])}",
                f"  operator: {self.operator_cpu_s / max(1, self.services) * 1000:.1f} ms CPU and"
                f" {self.requests_per_ranking:.1f} API requests per ranking ({top})",
                *([f"  failed: {'; '.join(failed)}"] if failed else []),
                *([f"  kubelet errors: {'; '.join(self.errors[:3])}"] if self.errors else []),
            ]
        )

    def figures(self) -> dict[str, Any]:
        """The JSON the command prints with ``--json``."""
        cpu = [t.worker_cpu_s for t in self.times.values() if t.finished is not None]
        return {
            "services": self.services,
            "workers": self.workers,
            "interval_s": self.interval_s,
            "watch_reads": self.watch_reads,
            "wall_s": self.wall_s,
            "collected": self.collected,
            "failed": sum(1 for t in self.times.values() if t.failed),
            "spans": {name: _spread(values) for name, values in self.spans().items()},
            "worker_cpu_s_mean": statistics.fmean(cpu) if cpu else None,
            "operator_cpu_ms_per_ranking": self.operator_cpu_s / max(1, self.services) * 1000,
            "api_requests_per_ranking": self.requests_per_ranking,
            "api_requests": self.api_requests,
        }


def _kube_requests() -> dict[str, float]:
    """``chunkpilot_kube_requests_total`` of this process, by ``verb resource``."""
    out: dict[str, float] = {}
    for metric in telemetry.KUBE_REQUESTS.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total"):
                key = f"{sample.labels['verb']} {sample.labels['resource']}"
                out[key] = out.get(key, 0.0) + sample.value
    return out


def _increase(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What ``after`` adds to ``before``, by key, most first (none left out that grew)."""
    grown = {key: value - before.get(key, 0.0) for key, value in after.items()}
    return dict(sorted(((k, v) for k, v in grown.items() if v > 0), key=lambda item: -item[1]))


class _Operator:
    """The operator's side: :class:`TwinJobs` ticking every pending service, on its own event loop."""

    def __init__(
        self,
        kubeconfig: Path,
        namespace: str,
        uids: dict[str, str],
        request: online.Request,
        times: dict[str, JobTimes],
        interval_s: float,
        jobs_index: dict[tuple[str, str], list[dict[str, Any]]] | None = None,
    ) -> None:
        self.kubeconfig, self.namespace, self.uids = kubeconfig, namespace, uids
        self.request, self.times, self.interval_s = request, times, interval_s
        #: The Jobs as a watch shows them (the operator's Kopf index); None: every read from the API.
        self.jobs_index = jobs_index
        self.cpu_s = 0.0
        self.error: BaseException | None = None

    def run(self, deadline: float) -> None:
        started = time.thread_time()
        try:
            asyncio.run(self._ticks(deadline))
        except BaseException as error:  # reported by the caller
            self.error = error
        finally:
            self.cpu_s = time.thread_time() - started

    async def _ticks(self, deadline: float) -> None:
        kube = KubeClient.from_environment(field_manager="chunkpilot-bench", kubeconfig=str(self.kubeconfig))
        try:
            reads: JobsApi = kube
            if self.jobs_index is not None:
                watched = WatchedKube(kube)
                watched.indices = {"jobs": self.jobs_index}
                reads = watched
            twin_jobs = TwinJobs(reads, IMAGE, Offload(OffloadMode.ALWAYS))
            pending = set(self.uids)
            gate = asyncio.Semaphore(CONCURRENT)

            async def tick(name: str) -> None:
                async with gate:
                    found = await twin_jobs.ranking(self.namespace, name, self.uids[name], self.request)
                now, entry = time.monotonic(), self.times[name]
                if found.created:
                    entry.created = now
                if found.result is not None:
                    entry.collected = now
                    pending.discard(name)
                elif found.state.phase is JobPhase.FAILED:
                    entry.failed = found.state.message
                    pending.discard(name)

            while pending and time.monotonic() < deadline:
                began = time.monotonic()
                await asyncio.gather(*(tick(name) for name in sorted(pending)))
                await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - began)))
        finally:
            await kube.close()


class _JobWatch:
    """The twin Jobs of a namespace as a watch shows them, kept as the operator's Kopf index keeps them
    (filled from a first listing before any tick, then from the watch's events)."""

    def __init__(self, api_client: Any, namespace: str) -> None:
        import kubernetes

        self.batch: Any = kubernetes.client.BatchV1Api(api_client)
        self.namespace = namespace
        self.index: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self.stop = threading.Event()
        self.selector = f"{jobs.LABEL_COMPONENT}={jobs.COMPONENT}"

    def start(self) -> _JobWatch:
        listed = self.batch.list_namespaced_job(self.namespace, label_selector=self.selector)
        for item in self.batch.api_client.sanitize_for_serialization(listed)["items"]:
            self._saw(item)
        version = listed.metadata.resource_version
        threading.Thread(target=self._run, args=(version,), daemon=True).start()
        return self

    def _saw(self, body: dict[str, Any]) -> None:
        self.index.update({key: [value] for key, value in index_object(body).items()})

    def _run(self, version: str) -> None:
        import kubernetes

        while not self.stop.is_set():
            watch: Any = kubernetes.watch.Watch()  # type: ignore[no-untyped-call]
            try:
                for event in watch.stream(
                    self.batch.list_namespaced_job,
                    self.namespace,
                    label_selector=self.selector,
                    resource_version=version,
                    timeout_seconds=60,
                ):
                    body = event["raw_object"]
                    version = body["metadata"]["resourceVersion"]
                    if event["type"] == "DELETED":
                        self.index.pop((self.namespace, body["metadata"]["name"]), None)
                    else:
                        self._saw(body)
                    if self.stop.is_set():
                        break
            except Exception:  # a dropped watch is started again from the last version seen
                time.sleep(POLL_S)


class _Kubelet:
    """The Jobs' pods' kubelet: each pod's command run with its request and the workers' token."""

    def __init__(
        self, api_client: Any, kubeconfig: Path, namespace: str, work_dir: Path, times: dict[str, JobTimes]
    ) -> None:
        import kubernetes

        self.core: Any = kubernetes.client.CoreV1Api(api_client)
        self.kubeconfig, self.namespace, self.work_dir, self.times = kubeconfig, namespace, work_dir, times
        self.queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.stop = threading.Event()
        self.seen: set[str] = set()
        self.token_config: Path | None = None
        self.lock = threading.Lock()
        self.errors: list[str] = []

    def poll(self) -> None:
        selector = f"{jobs.LABEL_TWIN_WORKER}=true"
        while not self.stop.is_set():
            try:
                listed = self.core.list_namespaced_pod(self.namespace, label_selector=selector)
            except Exception as error:  # a refused or dropped list: the next poll tries again
                self.errors.append(f"listing the Jobs' pods: {error}")
                self.stop.wait(POLL_S)
                continue
            now = time.monotonic()
            for pod in listed.to_dict()["items"]:
                name = pod["metadata"]["name"]
                if name in self.seen or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                    continue
                self.seen.add(name)
                entry = self.times.get(pod["metadata"]["labels"].get(jobs.JOB_NAME_LABEL, ""))
                if entry is not None and entry.pod_seen is None:
                    entry.pod_seen = now
                self.queue.put(pod)
            self.stop.wait(POLL_S)

    def _credentials(self) -> Path:
        with self.lock:
            if self.token_config is None:
                body = {"spec": {"expirationSeconds": 7200}}
                token = self.core.create_namespaced_service_account_token(
                    jobs.WORKER_ACCOUNT, self.namespace, body
                ).status.token
                path = self.work_dir / "worker-kubeconfig"
                self.token_config = token_kubeconfig(self.kubeconfig, token, path, self.namespace)
            return self.token_config

    def work(self) -> None:
        while True:
            pod = self.queue.get()
            if pod is None:
                return
            try:
                self._run(pod)
            except Exception as error:  # the pod stays unfinished; its Job's deadline ends it
                self.errors.append(f"running pod {pod['metadata']['name']}: {error}")

    def _run(self, pod: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        entry = self.times.get(meta["labels"].get(jobs.JOB_NAME_LABEL, ""))
        request_file = self.work_dir / f"{meta['name']}.json"
        request_file.write_text(meta["annotations"][jobs.ANNOTATION_REQUEST])
        command = [
            str(request_file) if a == jobs.REQUEST_FILE else a for a in spec["containers"][0]["command"]
        ]
        command[0] = str(Path(sys.executable).with_name("chunkpilot"))
        if entry is not None:
            entry.started = time.monotonic()
        log_file = self.work_dir / f"{meta['name']}.log"  # a file: no pipe to fill while it runs
        with log_file.open("wb") as log:
            process = subprocess.Popen(
                [*command, "--kubeconfig", str(self._credentials())], stdout=log, stderr=log
            )
            _pid, status, usage = os.wait4(process.pid, 0)  # its own CPU, as the kubelet's cgroup
        process.returncode = code = os.waitstatus_to_exitcode(status)
        stderr = log_file.read_text(errors="replace")
        if entry is not None:
            entry.finished = time.monotonic()
            entry.worker_cpu_s = usage.ru_utime + usage.ru_stime
            entry.exit_code = code
            if code != 0:
                entry.failed = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit code {code}"
        self._finish(meta["name"], code)

    def _finish(self, name: str, exit_code: int) -> None:
        self.core.patch_namespaced_pod_status(name, self.namespace, {"status": terminated_status(exit_code)})


def terminated_status(exit_code: int, message: str = "", image: str = IMAGE) -> dict[str, Any]:
    """A twin Job pod's status once the kubelet saw its container end with ``exit_code``."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    terminated = {
        "exitCode": exit_code,
        "reason": "Completed" if exit_code == 0 else "Error",
        "message": message,
        "startedAt": now,
        "finishedAt": now,
    }
    return {
        "phase": "Succeeded" if exit_code == 0 else "Failed",
        "containerStatuses": [
            {
                "name": "twin",
                "image": image,
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {"terminated": terminated},
            }
        ],
    }


def run_twin_jobs(
    *,
    services: int,
    workers: int,
    kubeconfig: Path | None,
    work_dir: Path,
    log: Callable[[str], None] = print,
    interval_s: float = TICK_S,
    max_evaluations: int = 4,
    timeout_s: float | None = None,
    watch_reads: bool = True,
) -> JobsResult:
    """Run the benchmark; ``kubeconfig`` None starts (and stops) a local control plane.

    ``watch_reads``: the ticks read the Jobs from a watch, as the operator does (its Kopf index);
    False: every read from the API (as before the operator watched them).
    """
    import kubernetes

    if services < 1 or workers < 1:
        raise ValueError("need at least one service and one worker")
    with ExitStack() as stack:
        if kubeconfig is None:
            log("starting a local control plane ...")
            kubeconfig, _env = stack.enter_context(local_cluster(work_dir / "control-plane"))
        api_client = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        stack.callback(api_client.close)
        core: Any = kubernetes.client.CoreV1Api(api_client)
        custom: Any = kubernetes.client.CustomObjectsApi(api_client)
        namespace = f"{NAMESPACE_PREFIX}-{int(time.time())}"
        core.create_namespace({"metadata": {"name": namespace}})
        stack.callback(lambda: core.delete_namespace(namespace, propagation_policy="Background"))
        log(f"creating {services} InferenceServices (no operator: only their twin Jobs are exercised) ...")
        uids: dict[str, str] = {}
        for index in range(services):
            name = f"svc-{index:04d}"
            made = custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, ISVC_PLURAL, service_manifest(name, 0, autotune=True)
            )
            uids[name] = made["metadata"]["uid"]
        log("building the ranking request from a simulated engine's telemetry ...")
        request = ranking_request("bench-0", max_evaluations=max_evaluations)
        times = {jobs.job_name(namespace, name, request.key): JobTimes() for name in uids}
        by_service = {name: times[jobs.job_name(namespace, name, request.key)] for name in uids}
        kubelet = _Kubelet(api_client, kubeconfig, namespace, work_dir, times)
        watch = _JobWatch(api_client, namespace).start() if watch_reads else None
        if watch is not None:
            stack.callback(watch.stop.set)
        operator = _Operator(
            kubeconfig, namespace, uids, request, by_service, interval_s, watch.index if watch else None
        )
        deadline_s = timeout_s if timeout_s is not None else max(600.0, 3.0 * services)
        log(f"ticking {services} rankings as Jobs, {workers} worker(s) playing their pods ...")
        counted = _kube_requests()  # the process's counter: what this run adds to it is its own
        started = time.monotonic()
        threads = [threading.Thread(target=kubelet.poll, daemon=True)]
        threads += [threading.Thread(target=kubelet.work, daemon=True) for _ in range(workers)]
        for thread in threads:
            thread.start()
        operator.run(started + deadline_s)
        wall = time.monotonic() - started
        kubelet.stop.set()
        for _ in range(workers):
            kubelet.queue.put(None)
        for thread in threads:
            thread.join(timeout=60)
        if operator.error is not None:
            raise operator.error
        return JobsResult(
            services=services,
            workers=workers,
            interval_s=interval_s,
            wall_s=wall,
            times=by_service,
            operator_cpu_s=operator.cpu_s,
            api_requests=_increase(counted, _kube_requests()),
            errors=tuple(kubelet.errors[:10]),
            watch_reads=watch_reads,
        )
    raise AssertionError("unreachable")  # pragma: no cover


def register(inner: Any) -> None:
    """Add ``twin-jobs`` to ``chunkpilot bench``."""
    parser = inner.add_parser(
        "twin-jobs",
        help="the twin's rankings as Kubernetes Jobs at a fleet's scale (prints figures)",
        description=(__doc__ or "").split("\n\n")[0],
    )
    parser.add_argument("--services", type=int, default=100, help="services with a ranking due (default 100)")
    parser.add_argument(
        "--workers", type=int, default=2, help="pods run at once by the played kubelet (default 2)"
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=TICK_S,
        help=f"seconds between a service's ticks (default {TICK_S:g})",
    )
    parser.add_argument(
        "--max-evaluations", type=int, default=4, help="evaluations each ranking makes (default 4)"
    )
    parser.add_argument(
        "--api-reads",
        action="store_true",
        help="read each Job from the API on every tick instead of from a watch (as before the operator "
        "watched them)",
    )
    parser.add_argument(
        "--kubeconfig", type=Path, help="use this cluster (default: start a throw-away local control plane)"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.set_defaults(func=run_command)


def run_command(args: argparse.Namespace) -> int:
    if args.services < 1 or args.workers < 1 or args.interval <= 0 or args.max_evaluations < 1:
        print(
            "chunkpilot bench twin-jobs: need --services >= 1, --workers >= 1, --interval > 0 and "
            "--max-evaluations >= 1",
            file=sys.stderr,
        )
        return 2
    with tempfile.TemporaryDirectory(prefix="chunkpilot-twin-jobs-") as folder:
        result = run_twin_jobs(
            services=args.services,
            workers=args.workers,
            kubeconfig=args.kubeconfig,
            work_dir=Path(folder),
            log=lambda message: print(message, file=sys.stderr),
            interval_s=args.interval,
            max_evaluations=args.max_evaluations,
            watch_reads=not args.api_reads,
        )
    print(json.dumps(result.figures(), indent=2) if args.json else result.report())
    return 0 if result.collected == result.services else 1
