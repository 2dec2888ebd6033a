"""The tuning loop's state machine with a fake clock, a fake API server and a fake Prometheus.

The fakes model only what the loop relies on: objects by path with resourceVersion
conflicts and label-selected lists; Deployments that become Ready when the test
says so; Prometheus answers computed from the config hash in the query. The
operator's own reconciler (the real one) follows a new ``status.bestConfig`` onto the
stable Deployment, as its ``follow_promotion`` handler does.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import itertools
import json
import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from chunkpilot.operator.config import OperatorConfig, PodMonitorMode
from chunkpilot.operator.events import EventSpec
from chunkpilot.operator.kube import KubeError, object_path, resource_path
from chunkpilot.operator.reconcile import Reconciler
from chunkpilot.operator.status import get_condition
from chunkpilot.tuner import records as rec
from chunkpilot.tuner.act.live_adjust import LiveAdjustError
from chunkpilot.tuner.controller import TunerSettings, TuningController, crash_message
from chunkpilot.tuner.decide.canary import live_adjust_refusal, target_limits
from chunkpilot.tuner.measure import MetricsUnavailableError
from chunkpilot.tuner.observe.canary import started_config
from chunkpilot.tuner.space import build_space
from chunkpilot.tuner.warmstart import model_guess

from chunkpilot.api import (
    API_VERSION,
    ISVC_PLURAL,
    LABEL_CONFIG_HASH,
    TRIAL_PLURAL,
    EngineConfig,
    InferenceService,
    InferenceServiceStatus,
    TuningTrial,
)
from chunkpilot.testing.kube import merge_into
from chunkpilot.testing.services import example_body

NS, NAME = "default", "chat"
T0 = datetime(2026, 1, 1, tzinfo=UTC)
TICK = timedelta(seconds=5)


class FakeKube:
    """Objects by path; resourceVersion conflicts on conditional patches; label-equality lists."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self._rv = itertools.count(1)
        self.fail: Callable[[str, str], bool] | None = None

    def _check(self, verb: str, path: str) -> None:
        if self.fail is not None and self.fail(verb, path):
            self.fail = None
            raise RuntimeError(f"injected failure of {verb} {path}")

    def _stamp(self, obj: dict[str, Any]) -> None:
        obj["metadata"]["resourceVersion"] = str(next(self._rv))

    def put(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", f"uid-{meta['name']}")
        meta.setdefault("generation", 1)
        meta.setdefault("labels", {})
        self._stamp(obj)
        self.objects[path] = obj
        return obj

    async def get(self, path: str) -> dict[str, Any] | None:
        self._check("get", path)
        obj = self.objects.get(path)
        return copy.deepcopy(obj) if obj is not None else None

    async def apply(self, manifest: Mapping[str, Any], *, force: bool = True) -> dict[str, Any]:
        self._check("apply", object_path(manifest))
        path = object_path(manifest)
        current = self.objects.get(path)
        obj = copy.deepcopy(dict(manifest))
        if current is not None:
            obj["status"] = current.get("status", {})
            obj["metadata"]["uid"] = current["metadata"]["uid"]
            changed = current.get("spec") != obj.get("spec")
            obj["metadata"]["generation"] = current["metadata"]["generation"] + (1 if changed else 0)
        return copy.deepcopy(self.put(path, obj))

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        self._check("merge_patch", path)
        key = path.removesuffix("/status")
        obj = self.objects.get(key)
        if obj is None:
            raise KubeError(404, "PATCH", path, "{}")
        patch = copy.deepcopy(dict(patch))
        wanted = (patch.get("metadata") or {}).pop("resourceVersion", None)
        if wanted is not None and wanted != obj["metadata"]["resourceVersion"]:
            raise KubeError(409, "PATCH", path, '{"message": "conflict"}')
        if path.endswith("/status"):
            patch = {"status": patch.get("status", {})}
        merge_into(obj, patch)
        self._stamp(obj)
        return copy.deepcopy(obj)

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self._check("create", path)
        key = f"{path}/{body['metadata']['name']}"
        if key in self.objects:
            raise KubeError(409, "POST", path, '{"message": "already exists"}')
        return copy.deepcopy(self.put(key, dict(body)))

    async def delete(self, path: str) -> None:
        self._check("delete", path)
        self.objects.pop(path, None)

    async def list(self, path: str, *, label_selector: str | None = None) -> list[dict[str, Any]]:
        wanted = dict(item.split("=", 1) for item in (label_selector or "").split(",") if item)
        found = []
        for key, obj in self.objects.items():
            if not key.startswith(path + "/") or "/" in key[len(path) + 1 :]:
                continue
            labels = obj["metadata"].get("labels") or {}
            if all(labels.get(k) == v for k, v in wanted.items()):
                found.append(copy.deepcopy(obj))
        return found


def budget_of(config_hash: str, configs: Mapping[str, EngineConfig]) -> int:
    return configs[config_hash].max_num_batched_tokens


class FakePrometheus:
    """Answers the tuner's queries from a latency model of the budget (per config hash)."""

    def __init__(self, itl_ms: Callable[[int], float], ttft_ms: Callable[[int], float]) -> None:
        self.itl_ms = itl_ms
        self.ttft_ms = ttft_ms
        self.configs: dict[str, EngineConfig] = {}
        self.down = False
        self.samples = 500.0
        self.samples_per_s: float | None = None  # when set, samples grow with the window
        self.prompt_tok_s: float | None = 2000.0
        self.generation_rates = True  # False: no generated-token series (NaN/no data)
        self.queries = 0

    def know(self, config: EngineConfig) -> None:
        self.configs[config.config_hash()] = config

    def query(self, promql: str, at: datetime) -> float | None:
        self.queries += 1
        if self.down:
            raise MetricsUnavailableError(
                "Prometheus at http://prometheus did not answer: connection refused"
            )
        match = re.search(r'config_hash="([0-9a-f]+)"', promql)
        if match is None or match.group(1) not in self.configs:
            return None
        budget = self.configs[match.group(1)].max_num_batched_tokens
        if "histogram_quantile" in promql:
            latency = self.itl_ms(budget) if "inter_token" in promql else self.ttft_ms(budget)
            return latency / 1000.0
        if "increase(" in promql:
            samples = self.samples
            if self.samples_per_s is not None:
                window = re.search(r"\[(\d+)s\]", promql)
                samples = self.samples_per_s * int(window.group(1)) if window else 0.0
            return samples * (50 if "inter_token" in promql else 1)
        if "generation_tokens" in promql:
            return 1000.0 + budget / 10 if self.generation_rates else None
        if "prompt_tokens" in promql:
            return self.prompt_tok_s
        if "request_success" in promql:
            return 5.0
        if promql.startswith("count(up"):
            return 1.0
        return None


class Harness:
    """A service, the fakes and a clock; :meth:`tick` steps the loop and lets the world move on."""

    def __init__(
        self,
        itl_ms: Callable[[int], float] = lambda b: 10 + b / 100,
        ttft_ms: Callable[[int], float] = lambda b: 300_000 / b,
        **spec: Any,
    ) -> None:
        manifest = example_body()
        manifest["metadata"]["namespace"] = NS
        manifest["spec"]["engine"]["maxNumBatchedTokens"] = 8192
        manifest["spec"]["autotune"].update(
            {"trialWindow": "60s", "warmup": "10s", "maxTrials": 6, **spec.pop("autotune", {})}
        )
        merge_into(manifest["spec"], spec)
        self.kube = FakeKube()
        self.kube.put(self.isvc_path, manifest)
        self.prom = FakePrometheus(itl_ms, ttft_ms)
        self.now = T0
        self.events: list[EventSpec] = []
        self.ready_tracks = {"stable", "canary"}
        self.settings = TunerSettings(rollout_timeout_s=120)
        self.mirrored: list[tuple[list[int], dict[int, Any]]] = []
        self.mirror_fails = False
        self.controller = self.new_controller()
        self.stable_from_spec()
        self.operator = Reconciler(kube=self.kube, config=OperatorConfig(pod_monitor=PodMonitorMode.DISABLED))  # type: ignore[arg-type]
        self.operator_follows = True
        self.followed: Any = None

    @property
    def isvc_path(self) -> str:
        return resource_path(API_VERSION, ISVC_PLURAL, NS, NAME)

    def deployment_path(self, track: str) -> str:
        return resource_path("apps/v1", "deployments", NS, f"{NAME}-{track}")

    def new_controller(self) -> TuningController:
        """A fresh controller: nothing survives from the previous one but the cluster."""
        return TuningController(
            self.kube,
            self.prom.query,
            post_event=lambda _body, spec: self.events.append(spec),
            clock=lambda: self.now,
            settings=self.settings,
            inline=True,
            mirror=self.mirror,
        )

    async def mirror(
        self, namespace: str, name: str, space: Any, records: list[Any], attrs: Mapping[int, Any]
    ) -> None:
        assert (namespace, name) == (NS, NAME)
        if self.mirror_fails:
            raise ConnectionError("database down")
        self.mirrored.append(([r.number for r in records], dict(attrs)))

    def stable_from_spec(self) -> None:
        from chunkpilot.operator.builders import build_deployment

        from chunkpilot.api import InferenceService, Track

        isvc = InferenceService.from_manifest(
            {k: v for k, v in self.kube.objects[self.isvc_path].items() if k != "status"}
        )
        manifest = build_deployment(isvc, Track.STABLE)
        manifest["metadata"]["namespace"] = NS
        self.kube.put(object_path(manifest), manifest)
        self.prom.know(EngineConfig.from_engine(isvc.spec.engine))

    def ready_deployments(self) -> None:
        for key, obj in self.kube.objects.items():
            if (
                "/deployments/" not in key
                or obj["metadata"]["labels"].get("chunkpilot.io/track") not in self.ready_tracks
            ):
                continue
            replicas = obj["spec"]["replicas"]
            obj["status"] = {
                "replicas": replicas,
                "readyReplicas": replicas,
                "updatedReplicas": replicas,
                "availableReplicas": replicas,
                "observedGeneration": obj["metadata"]["generation"],
            }

    def know_trials(self) -> None:
        for trial in self.trials():
            self.prom.know(trial.spec.params)

    def follow_promotion(self) -> None:
        """The operator's ``follow_promotion``: a new ``status.bestConfig`` rolls the stable Deployment."""
        body = self.kube.objects[self.isvc_path]
        best = (body.get("status") or {}).get("bestConfig")
        if self.operator_follows and best != self.followed:
            asyncio.run(self.operator.reconcile(copy.deepcopy(body)))
            self.followed = copy.deepcopy(best)

    def tick(self, count: int = 1) -> None:
        for _ in range(count):
            self.know_trials()
            self.ready_deployments()
            try:
                asyncio.run(self.controller.step(NS, NAME))
            finally:
                self.follow_promotion()
            self.now += TICK

    def run_until(self, predicate: Callable[[], bool], limit: int = 400) -> None:
        for _ in range(limit):
            if predicate():
                return
            self.tick()
        raise AssertionError(f"not reached after {limit} ticks; trials: {self.describe()}")

    def trials(self) -> list[TuningTrial]:
        prefix = resource_path(API_VERSION, TRIAL_PLURAL, NS) + "/"
        found = [TuningTrial.from_manifest(o) for k, o in self.kube.objects.items() if k.startswith(prefix)]
        return sorted(found, key=lambda t: t.spec.number)

    def status(self) -> InferenceServiceStatus:
        return InferenceServiceStatus.model_validate(self.kube.objects[self.isvc_path].get("status") or {})

    def condition(self, type_: str) -> tuple[str, str] | None:
        found = get_condition(self.status().conditions, type_)
        return (found.status.value, found.reason) if found else None

    def canary(self) -> dict[str, Any] | None:
        return self.kube.objects.get(self.deployment_path("canary"))

    def stable_args(self) -> list[str]:
        args: list[str] = self.kube.objects[self.deployment_path("stable")]["spec"]["template"]["spec"][
            "containers"
        ][0]["args"]
        return args

    def describe(self) -> list[tuple[int, str | None, str | None]]:
        return [
            (t.spec.number, t.status.phase if t.status else None, t.status.reason if t.status else None)
            for t in self.trials()
        ]

    def finished(self) -> list[TuningTrial]:
        return [t for t in self.trials() if not rec.is_active(t)]

    def reasons(self) -> list[str]:
        return [e.reason for e in self.events]


def flag(args: list[str], name: str) -> int:
    return int(args[args.index(name) + 1])


# --------------------------------------------------------------------------- the happy path


def test_tunes_a_violating_service_into_its_slo_and_promotes_through_the_stable_deployment() -> None:
    h = Harness()
    h.run_until(lambda: h.status().best_config is not None)
    best = h.status().best_config
    assert best is not None and 10 + best.max_num_batched_tokens / 100 <= 50
    assert flag(h.stable_args(), "--max-num-batched-tokens") == best.max_num_batched_tokens
    promoted = [t for t in h.trials() if t.status and t.status.verdict == "Promoted"]
    assert [t.metadata.name for t in promoted] == [h.status().best_trial]
    trial = promoted[0]
    assert trial.status is not None and trial.status.canary is not None and trial.status.stable is not None
    assert trial.status.canary.itl_ms is not None and trial.status.canary.itl_ms <= 50
    assert trial.status.stable.itl_ms is not None and trial.status.stable.itl_ms > 50  # same window
    assert trial.status.constraints is not None and trial.status.constraints.itl is not None
    assert trial.status.constraints.itl < 0
    assert h.canary() is None
    assert "TrialStarted" in h.reasons() and "Promoted" in h.reasons()
    # Marked applied once the operator reports the promoted config's hash (one step later).
    assert rec.trial_progress(trial).promotion_applied is None
    assert h.status().applied_config_hash == best.config_hash()
    h.tick()
    trial = next(t for t in h.trials() if t.metadata.name == trial.metadata.name)
    assert rec.trial_progress(trial).promotion_applied is True
    # The next trial compares against the promoted config, not the spec.
    h.run_until(lambda: len(h.trials()) > len(promoted) + 0 and rec.is_active(h.trials()[-1]))
    assert h.trials()[-1].spec.baseline_config_hash == best.config_hash()


def test_runs_max_trials_then_stops_with_every_trial_recorded_and_no_canary() -> None:
    h = Harness(autotune={"maxTrials": 3})
    h.run_until(lambda: h.condition("Tuning") == ("False", "MaxTrialsReached"))
    assert len(h.trials()) == 3 and all(not rec.is_active(t) for t in h.trials())
    assert [t.spec.number for t in h.trials()] == [1, 2, 3]
    assert h.canary() is None
    assert h.status().trials_completed == 3 and h.status().current_trial is None
    h.tick(10)
    assert len(h.trials()) == 3  # stays stopped


def test_first_trial_is_the_model_based_guess_within_the_bounds() -> None:
    h = Harness()
    h.tick(2)
    trial = h.trials()[0]
    assert trial.metadata.labels[rec.LABEL_ROUND] == "0"
    assert 295 <= trial.spec.params.max_num_batched_tokens <= 3433
    assert h.canary() is not None
    assert h.canary()["metadata"]["annotations"][rec.ANNOTATION_TRIAL] == trial.metadata.name  # type: ignore[index]
    assert h.condition("Tuning") == ("True", "TrialRunning")


def first_budget_and_mix(h: Harness) -> tuple[int, str]:
    h.tick(2)
    trial = h.trials()[0]
    assert trial.spec.token_mix is not None
    return trial.spec.params.max_num_batched_tokens, trial.spec.token_mix.note


def expected_guess(h: Harness, prompt: float | None, output: float | None) -> int:
    isvc = InferenceService.from_manifest(
        {k: v for k, v in h.kube.objects[h.isvc_path].items() if k != "status"}
    )
    facts = rec.service_facts(isvc)
    space = build_space(facts, rec.space_bounds(isvc))
    facts = dataclasses.replace(facts, mean_prompt_tokens=prompt, mean_output_tokens=output)
    return model_guess(space, facts).max_num_batched_tokens


def test_the_first_guess_is_sized_for_the_token_mix_measured_on_stable() -> None:
    heavy = Harness()
    heavy.prom.prompt_tok_s = 40_000.0  # 8000 prompt tokens per request at 5 req/s
    budget, mix = first_budget_and_mix(heavy)
    output = (1000.0 + 8192 / 10) / 5.0  # the fake's generation rate of the stable budget
    assert budget == expected_guess(heavy, 8000.0, output)
    assert mix == "8000 prompt + 364 output tokens per request (measured on stable over 2m)"
    assert "WarmStart" in heavy.reasons()
    assert any("sized for 8000 prompt + 364 output" in e.message for e in heavy.events)

    unknown = Harness()
    unknown.prom.prompt_tok_s = None
    unknown.prom.generation_rates = False
    default_budget, default_mix = first_budget_and_mix(unknown)
    assert default_budget == expected_guess(unknown, None, None)
    assert default_mix == (
        "1024 prompt + 256 output tokens per request (defaults: Prometheus has no stable traffic over 2m)"
    )
    # Fewer decodes per step, but chunks late in much longer prompts: the mix moves the guess.
    assert budget != default_budget


def test_a_drifting_token_mix_keeps_the_rounds_first_warm_start() -> None:
    """Within a round the mix of its first trial is reused: a drifting measurement must not turn every
    trial into a fresh warm start (the sampler would never be asked)."""
    h = Harness(autotune={"maxTrials": 3})
    h.prom.prompt_tok_s = 40_000.0
    h.tick(2)
    first_mix = h.trials()[0].spec.token_mix
    h.prom.prompt_tok_s = 1_000.0  # the load changes while the first trial runs
    h.run_until(lambda: len(h.trials()) >= 3)
    mixes = [t.spec.token_mix for t in h.trials()]
    assert mixes == [first_mix] * 3
    warm_starts = [e for e in h.events if e.reason == "WarmStart"]
    assert len(warm_starts) <= 2, [e.message for e in warm_starts]  # the guess and its conditional follow-up


def test_a_mean_without_data_falls_back_to_its_default_alone() -> None:
    h = Harness()
    h.prom.generation_rates = False
    budget, mix = first_budget_and_mix(h)
    assert budget == expected_guess(h, 400.0, None) != expected_guess(h, None, None)
    assert mix == "400 prompt + 256 output tokens per request (output default: no data over 2m)"


def test_an_invalid_warm_start_reports_an_invalid_search_space_instead_of_crashing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    facts_of = rec.service_facts
    monkeypatch.setattr(
        rec, "service_facts", lambda isvc: dataclasses.replace(facts_of(isvc), itl_quantile=1.0)
    )
    h = Harness()
    h.tick(3)
    assert h.trials() == []
    assert h.condition("Tuning") == ("False", "InvalidSearchSpace")
    tuning = get_condition(h.status().conditions, "Tuning")
    assert tuning is not None and "spec.slo.itl.quantile" in tuning.message


# --------------------------------------------------------------------------- safety


def test_prunes_a_canary_that_breaches_the_slo_by_the_abort_factor() -> None:
    h = Harness(itl_ms=lambda b: 500.0)
    h.run_until(lambda: bool(h.finished()))
    trial = h.finished()[0]
    assert trial.status is not None and trial.status.verdict == "Pruned"
    assert trial.status.canary is not None and trial.status.canary.itl_ms == 500.0
    assert h.canary() is None
    assert h.status().best_config is None


def test_a_crashing_canary_aborts_the_trial_and_is_removed() -> None:
    h = Harness()
    h.ready_tracks = {"stable"}
    h.tick(2)  # trial created, canary applied
    trial = h.trials()[0]
    pod = {
        "metadata": {
            "name": "chat-canary-abc",
            "namespace": NS,
            "labels": {
                "chunkpilot.io/service": NAME,
                "chunkpilot.io/track": "canary",
                "app.kubernetes.io/component": "engine",  # as every engine pod (a router's says router)
                LABEL_CONFIG_HASH: trial.spec.params.config_hash(),
            },
        },
        "status": {
            "containerStatuses": [
                {
                    "name": "engine",
                    "restartCount": 1,
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                    "lastState": {"terminated": {"exitCode": 137}},
                }
            ]
        },
    }
    h.kube.put(resource_path("v1", "pods", NS, "chat-canary-abc"), pod)
    h.tick()
    trial = h.trials()[0]
    assert trial.status is not None and trial.status.verdict == "Aborted"
    assert "crashed" in (trial.status.reason or "") and "CrashLoopBackOff, exit code 137" in (
        trial.status.reason or ""
    )
    assert h.canary() is None
    assert "TrialAborted" in h.reasons()


def test_a_canary_that_never_becomes_ready_is_aborted_after_the_rollout_timeout() -> None:
    h = Harness()
    h.ready_tracks = {"stable"}
    h.tick(2)
    h.tick(int(120 / TICK.total_seconds()) + 2)
    first = h.trials()[0]
    assert first.status is not None and first.status.verdict == "Aborted"
    assert "did not become Ready" in (first.status.reason or "")


def test_prometheus_outage_pauses_without_promoting_and_aborts_a_long_gap() -> None:
    h = Harness()
    h.prom.down = True
    h.tick(3)
    assert h.trials() == []  # no trial starts without metrics
    assert h.condition("MetricsUnavailable") == ("True", "PrometheusUnreachable")
    h.prom.down = False
    h.run_until(lambda: bool(h.trials()) and rec.trial_phase(h.trials()[0]) == "Measuring")
    assert h.condition("MetricsUnavailable") == ("False", "MetricsAvailable")
    h.prom.down = True
    h.tick(int(60 / TICK.total_seconds()) + 4)  # longer than the trial window
    trial = h.trials()[0]
    assert trial.status is not None and trial.status.verdict == "Aborted"
    assert "Prometheus unreachable" in (trial.status.reason or "")
    assert h.status().best_config is None and h.canary() is None


def test_a_short_metrics_gap_restarts_the_measurement_window() -> None:
    h = Harness()
    h.run_until(lambda: bool(h.trials()) and rec.trial_phase(h.trials()[0]) == "Measuring")
    h.tick(4)
    h.prom.down = True
    h.tick(2)
    assert rec.trial_progress(h.trials()[0]).metrics_gap_since is not None
    h.prom.down = False
    h.tick()
    trial = h.trials()[0]
    assert rec.trial_progress(trial).metrics_gap_since is None
    restarted = rec.trial_progress(trial).measure_from
    assert restarted is not None and restarted >= h.now - 2 * TICK
    assert "MetricsRestored" in h.reasons()


def test_too_few_samples_is_inconclusive_never_promoted() -> None:
    h = Harness()
    h.prom.samples = 3
    h.run_until(lambda: bool(h.finished()))
    trial = h.finished()[0]
    assert trial.status is not None and trial.status.verdict == "Aborted"
    assert "needed to judge" in (trial.status.reason or "")
    assert h.status().best_config is None


def test_too_few_samples_at_the_end_of_the_window_widens_it_before_giving_up() -> None:
    h = Harness(autotune={"abort": {"minSamples": 150}})
    h.prom.samples_per_s = 2.0  # 120 requests in the 60 s window; 150 after 75 s
    h.run_until(lambda: bool(h.finished()))
    trial = h.finished()[0]
    assert trial.status is not None and trial.status.verdict != "Aborted", trial.status
    assert trial.status.canary is not None and (trial.status.canary.samples or 0) >= 150
    assert trial.status.canary.window is not None and int(trial.status.canary.window[:-1]) > 60


def test_paused_starts_nothing_and_aborts_a_running_trial() -> None:
    h = Harness()
    h.tick(2)
    assert h.canary() is not None
    h.kube.objects[h.isvc_path]["spec"]["autotune"]["paused"] = True
    h.tick(3)
    assert h.canary() is None
    assert [t.status.verdict for t in h.trials() if t.status] == ["Aborted"]
    assert h.condition("Tuning") == ("False", "Paused")
    assert len(h.trials()) == 1


def test_disabling_autotuning_removes_the_canary() -> None:
    h = Harness()
    h.tick(2)
    h.kube.objects[h.isvc_path]["spec"]["autotune"]["enabled"] = False
    h.tick()
    assert h.canary() is None and h.status().current_trial is None
    assert h.condition("Tuning") == ("False", "Disabled")


# --------------------------------------------------------------------------- durability


def test_restart_mid_trial_resumes_the_same_trial_without_duplicates() -> None:
    h = Harness()
    h.run_until(lambda: bool(h.trials()) and rec.trial_phase(h.trials()[0]) == "Measuring")
    before = h.trials()[0]
    h.controller = h.new_controller()  # the operator restarted: no memory
    h.run_until(lambda: bool(h.finished()))
    assert h.finished()[0].metadata.name == before.metadata.name
    measure_from = rec.trial_progress(before).measure_from
    assert measure_from is not None
    assert rec.trial_progress(h.finished()[0]).measure_from == measure_from


def test_a_trial_written_by_the_previous_release_resumes_from_its_annotations() -> None:
    """The previous release kept progress and study inputs in annotations; an upgrade resumes its trial."""
    h = Harness()
    h.run_until(lambda: bool(h.trials()) and rec.trial_phase(h.trials()[0]) == "Measuring")
    h.tick(2)
    before = h.trials()[0]
    key = next(k for k, o in h.kube.objects.items() if o["metadata"]["name"] == before.metadata.name)
    obj = h.kube.objects[key]
    progress = obj["status"].pop("progress")
    params, mix = obj["spec"].pop("studyParams"), obj["spec"].pop("tokenMix")
    obj["metadata"]["annotations"] = {
        "chunkpilot.io/canary-ready-at": progress["readyAt"],
        "chunkpilot.io/measure-from": progress["measureFrom"],
        "chunkpilot.io/study-params": json.dumps(params),
        "chunkpilot.io/token-mix": mix["note"],
        "chunkpilot.io/token-mix-means": json.dumps(
            {"prompt": mix.get("prompt"), "output": mix.get("output")}
        ),
    }
    legacy = h.trials()[0]
    assert legacy.status is not None and legacy.status.progress is None and legacy.spec.study_params is None
    measure_from = rec.trial_progress(before).measure_from
    assert measure_from is not None and rec.trial_progress(legacy).measure_from == measure_from
    h.controller = h.new_controller()  # the upgraded release
    h.run_until(lambda: bool(h.finished()))
    finished = h.finished()[0]
    assert finished.metadata.name == before.metadata.name and len(h.trials()) == 1
    assert finished.status is not None and finished.status.verdict != "Aborted", finished.status
    assert rec.trial_progress(finished).measure_from == measure_from  # the window it had started
    assert rec.token_mix(finished) == before.spec.token_mix
    space = build_space(
        rec.service_facts(
            InferenceService.from_manifest(
                {k: v for k, v in h.kube.objects[h.isvc_path].items() if k != "status"}
            )
        )
    )
    assert rec.study_params(finished, space) == before.spec.study_params


def test_a_crash_between_creating_a_trial_and_recording_it_creates_no_duplicate() -> None:
    h = Harness()
    h.kube.fail = lambda verb, path: verb == "merge_patch" and "/tuningtrials/" in path
    with pytest.raises(RuntimeError, match="injected failure"):
        h.tick()
    assert len(h.trials()) == 1 and h.trials()[0].status is None
    h.controller = h.new_controller()
    h.tick(2)
    assert len(h.trials()) == 1
    assert rec.trial_phase(h.trials()[0]) in ("RollingOut", "Measuring")
    assert h.canary() is not None


def refused_with(status_body: str) -> Callable[..., Any]:
    async def create(path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        raise KubeError(403, "POST", path, status_body)

    return create


NAMESPACE_TERMINATING = json.dumps(
    {
        "kind": "Status",
        "message": f"unable to create new content in namespace {NS} because it is being terminated",
        "reason": "Forbidden",
        "details": {"causes": [{"reason": "NamespaceTerminating", "field": "metadata.namespace"}]},
        "code": 403,
    }
)


def test_a_namespace_being_deleted_ends_the_step_quietly_but_an_rbac_denial_does_not() -> None:
    h = Harness()
    h.kube.create = refused_with(NAMESPACE_TERMINATING)  # type: ignore[method-assign]
    h.tick()
    assert h.trials() == []
    h.kube.create = refused_with('{"message": "tuningtrials is forbidden: User cannot create", "code": 403}')  # type: ignore[method-assign]
    with pytest.raises(KubeError, match="forbidden"):
        h.tick()


def test_an_orphaned_canary_is_removed() -> None:
    h = Harness()
    from chunkpilot.operator.builders import build_deployment

    from chunkpilot.api import InferenceService, Track

    isvc = InferenceService.from_manifest(h.kube.objects[h.isvc_path])
    orphan = build_deployment(isvc, Track.CANARY)
    orphan["metadata"]["namespace"] = NS
    h.kube.put(object_path(orphan), orphan)
    h.prom.down = True  # no trial may start: only the cleanup runs
    h.tick()
    assert h.canary() is None
    assert "OrphanRemoved" in h.reasons()


def promoted_trial(h: Harness) -> TuningTrial | None:
    return next((t for t in h.trials() if t.status and t.status.verdict == "Promoted"), None)


def test_an_interrupted_promotion_is_completed_on_the_next_step() -> None:
    """The step that recorded the verdict stopped before writing bestConfig (the operator process died)."""
    h = Harness()
    status_path = h.isvc_path + "/status"
    h.kube.fail = lambda verb, path: (
        verb == "merge_patch" and path == status_path and promoted_trial(h) is not None
    )
    with pytest.raises(RuntimeError, match="injected failure"):
        h.run_until(lambda: h.status().best_config is not None)
    promoted = promoted_trial(h)
    assert promoted is not None and h.status().best_config is None
    assert rec.trial_progress(promoted).promotion_applied is None
    h.controller = h.new_controller()
    h.tick()
    assert h.status().best_trial == promoted.metadata.name
    assert flag(h.stable_args(), "--max-num-batched-tokens") == promoted.spec.params.max_num_batched_tokens
    h.tick()
    promoted = next(t for t in h.trials() if t.metadata.name == promoted.metadata.name)
    assert rec.trial_progress(promoted).promotion_applied is True


def test_a_promotion_is_marked_applied_only_once_the_operator_runs_it_and_blocks_the_next_trial() -> None:
    h = Harness()
    h.operator_follows = False  # the operator is slow to roll the stable Deployment
    h.run_until(lambda: h.status().best_config is not None)
    promoted = promoted_trial(h)
    assert promoted is not None
    count = len(h.trials())
    h.tick(5)
    assert (
        rec.trial_progress(
            next(t for t in h.trials() if t.metadata.name == promoted.metadata.name)
        ).promotion_applied
        is None
    )
    assert (
        len(h.trials()) == count
    )  # no trial is measured against a stable that does not run the incumbent yet
    assert h.condition("Tuning") == ("True", "WaitingForStable")
    assert flag(h.stable_args(), "--max-num-batched-tokens") != promoted.spec.params.max_num_batched_tokens
    h.operator_follows = True
    h.run_until(lambda: len(h.trials()) > count)
    promoted = next(t for t in h.trials() if t.metadata.name == promoted.metadata.name)
    assert rec.trial_progress(promoted).promotion_applied is True
    assert flag(h.stable_args(), "--max-num-batched-tokens") == promoted.spec.params.max_num_batched_tokens
    assert h.trials()[-1].spec.baseline_config_hash == promoted.spec.params.config_hash()


# --------------------------------------------------------------------------- study-level outcomes


def test_infeasible_slos_are_reported_with_the_best_quantiles_and_a_remedy() -> None:
    h = Harness(itl_ms=lambda b: 80.0, autotune={"maxTrials": 10, "abort": {"itlFactor": 4}})
    h.run_until(lambda: h.condition("SLOInfeasible") == ("True", "SLOInfeasible"))
    condition = get_condition(h.status().conditions, "SLOInfeasible")
    assert condition is not None
    assert "best achieved ITL p99 80ms" in condition.message
    assert "tensorParallelSize" in condition.message and "DifferentParallelism" in condition.message
    assert h.condition("Tuning") == ("False", "SLOInfeasible")
    count = len(h.trials())
    h.tick(20)
    assert len(h.trials()) == count and h.canary() is None


def test_sustained_violation_after_tuning_stopped_starts_a_new_round() -> None:
    h = Harness(autotune={"maxTrials": 2})
    h.settings = TunerSettings(rollout_timeout_s=120, retune_after_s=30)
    h.controller = h.new_controller()
    h.run_until(lambda: h.condition("Tuning") == ("False", "MaxTrialsReached"))
    h.tick(3)
    assert h.condition("SLOMet") == ("True", "SLOMet")
    h.prom.itl_ms = lambda b: 90.0  # the load mix changed: every config now violates ITL
    h.run_until(lambda: len(h.trials()) > 2)
    assert h.trials()[-1].metadata.labels[rec.LABEL_ROUND] == "1"
    assert "Retuning" in h.reasons()


def test_every_finished_trial_is_handed_to_the_mirror_and_a_failing_mirror_changes_nothing() -> None:
    h = Harness(autotune={"maxTrials": 2})
    h.mirror_fails = True
    h.run_until(lambda: len(h.finished()) == 1)
    assert h.mirrored == []
    h.mirror_fails = False
    h.run_until(lambda: len(h.finished()) == 2)
    numbers, attrs = h.mirrored[-1]
    assert numbers == [1, 2]  # the whole history: the mirror catches up after an outage
    assert attrs[1]["verdict"] == h.finished()[0].status.verdict  # type: ignore[union-attr]


def test_crash_message_ignores_terminating_pods_and_other_configs() -> None:
    crashed = {
        "metadata": {"name": "p", "labels": {LABEL_CONFIG_HASH: "aa"}},
        "status": {"containerStatuses": [{"restartCount": 2, "state": {"running": {}}}]},
    }
    assert crash_message([crashed], 1, "aa") is not None
    assert crash_message([crashed], 1, "bb") is None
    assert crash_message([crashed], 3, "aa") is None
    terminating = copy.deepcopy(crashed)
    terminating["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert crash_message([terminating], 1, "aa") is None


# --------------------------------------------------------------------------- live adjustment

LIVE_BOUNDS = {"bounds": {"longPrefillTokenThreshold": {"min": 0, "max": 0}}}  # only the live limits vary


class FakeLiveAdjuster:
    """Stands in for the engines' route: records each call; the adjusted pods then report the new limits."""

    def __init__(self, harness: LiveHarness) -> None:
        self.harness = harness
        self.calls: list[tuple[list[str], str, dict[str, int]]] = []
        self.fail: str | None = None

    async def adjust(self, pods: Any, token: str, limits: Any) -> None:
        self.calls.append(([p["metadata"]["name"] for p in pods], token, dict(limits)))
        if self.fail is not None:
            raise LiveAdjustError(self.fail)
        for pod in pods:
            started = self.harness.prom.configs[pod["metadata"]["labels"][LABEL_CONFIG_HASH]]
            self.harness.served[pod["metadata"]["labels"][LABEL_CONFIG_HASH]] = started.model_copy(
                update={
                    "max_num_batched_tokens": limits["max_num_batched_tokens"],
                    "max_num_seqs": limits["max_num_seqs"],
                }
            )


class LiveHarness(Harness):
    """``autotune.liveAdjust`` on, the token Secret, Ready canary pods and a fake route."""

    def __init__(self, secret: bool = True, impostor: bool = False, **spec: Any) -> None:
        self.impostor = impostor
        autotune = {"liveAdjust": True, **LIVE_BOUNDS, **spec.pop("autotune", {})}
        super().__init__(autotune=autotune, **spec)
        self.served: dict[str, EngineConfig] = {}  # config hash -> limits the pods run now
        self.adjuster = FakeLiveAdjuster(self)
        self.controller.live_adjuster = self.adjuster
        if secret:
            path = resource_path("v1", "secrets", NS, "chunkpilot-live-adjust")
            labels = {"app.kubernetes.io/managed-by": "chunkpilot"}
            metadata = {"name": "chunkpilot-live-adjust", "labels": labels}  # as the operator creates it
            # base64 of "tok" (the canary's) and "stb" (the stable track's, never sent by the tuner)
            self.kube.put(
                path, {"metadata": metadata, "data": {"chat.canary": "dG9r", "chat.stable": "c3Ri"}}
            )
        self.canary_applies: list[dict[str, Any]] = []
        apply = self.kube.apply

        async def counting(manifest: Mapping[str, Any], *, force: bool = True) -> dict[str, Any]:
            if object_path(manifest) == self.deployment_path("canary"):
                self.canary_applies.append(copy.deepcopy(dict(manifest)))
            return await apply(manifest, force=force)

        self.kube.apply = counting  # type: ignore[method-assign]

    def ready_deployments(self) -> None:
        super().ready_deployments()
        canary = self.canary()
        pods = resource_path("v1", "pods", NS)
        wanted = None
        if canary is not None:
            labels = canary["spec"]["template"]["metadata"]["labels"]
            wanted = labels[LABEL_CONFIG_HASH]
            started = started_config(canary)
            assert started is not None and started.config_hash() == wanted
            if wanted not in self.served:
                self.prom.know(started)  # a fresh pod runs its start-up limits
            name = f"chat-canary-{wanted}"
            # The owner chain the controllers give it: Deployment -> ReplicaSet -> pod (by uid).
            replica_set = f"{resource_path('apps/v1', 'replicasets', NS)}/{name}"
            owner = {"kind": "Deployment", "uid": canary["metadata"]["uid"], "controller": True}
            self.kube.objects.setdefault(
                replica_set,
                {
                    "metadata": {
                        "name": name,
                        "uid": f"rs-{wanted}",
                        "labels": dict(labels),
                        "ownerReferences": [owner],
                    }
                },
            )
            pod_owner = {"kind": "ReplicaSet", "uid": f"rs-{wanted}", "controller": True}
            self.kube.objects.setdefault(
                f"{pods}/{name}",
                {
                    "metadata": {
                        "name": name,
                        "namespace": NS,
                        "labels": dict(labels),
                        "ownerReferences": [pod_owner],
                    },
                    "status": {"podIP": "10.0.0.7", "conditions": [{"type": "Ready", "status": "True"}]},
                },
            )
            if self.impostor:  # someone else's pod with the canary's labels: never sent the token
                impostor = {"metadata": {"name": "impostor", "namespace": NS, "labels": dict(labels)}}
                self.kube.objects.setdefault(
                    f"{pods}/impostor",
                    {
                        **impostor,
                        "status": {"podIP": "10.9.9.9", "conditions": [{"type": "Ready", "status": "True"}]},
                    },
                )
        for key in [k for k in self.kube.objects if k.startswith(pods + "/")]:
            if self.kube.objects[key]["metadata"]["labels"].get(LABEL_CONFIG_HASH) != wanted:
                hash_ = self.kube.objects.pop(key)["metadata"]["labels"][LABEL_CONFIG_HASH]
                self.served.pop(hash_, None)
        for hash_, config in self.served.items():
            self.prom.configs[hash_] = config  # Prometheus sees what the adjusted pods run

    def live_marks(self) -> list[bool | None]:
        return [rec.trial_progress(t).live_adjusted for t in self.trials()]

    def live_errors(self) -> list[str | None]:
        return [rec.trial_progress(t).live_adjust_error for t in self.trials()]


def stopped(h: Harness) -> bool:
    return h.condition("Tuning") is not None and h.condition("Tuning")[0] == "False" and bool(h.finished())


def test_live_adjust_starts_one_canary_at_the_top_of_the_space_and_adjusts_it_for_every_trial() -> None:
    h = LiveHarness()
    h.run_until(lambda: stopped(h))
    trials = h.finished()
    assert len(trials) >= 3
    assert len(h.canary_applies) == 1  # one rollout for the whole study
    started = started_config(h.canary_applies[0])
    assert started is not None
    assert all(live_adjust_refusal(started, t.spec.params) is None for t in trials)
    assert started.max_num_batched_tokens > trials[0].spec.params.max_num_batched_tokens
    assert h.live_marks() == [True] * len(trials)
    assert [call[2] for call in h.adjuster.calls] == [target_limits(t.spec.params) for t in trials]
    assert all(
        call[0] == [f"chat-canary-{started.config_hash()}"] and call[1] == "tok" for call in h.adjuster.calls
    )
    # Measured on the adjusted pods (the fake Prometheus answers per hash with the adjusted limits).
    assert all(t.status is not None and t.status.canary is not None for t in trials)
    assert all(rec.trial_progress(t).canary_config_hash == started.config_hash() for t in trials)
    assert h.canary() is None  # released once tuning stopped
    assert "LiveAdjustFailed" not in h.reasons()


def test_the_token_goes_only_to_pods_whose_owner_chain_ends_at_the_canary() -> None:
    h = LiveHarness(impostor=True)
    h.run_until(lambda: len(h.finished()) >= 1)
    assert h.adjuster.calls, "the canary's own pod was adjusted"
    assert all("impostor" not in call[0] for call in h.adjuster.calls)


def test_a_failing_route_falls_back_to_a_rollout_and_live_adjustment_is_not_tried_again() -> None:
    h = LiveHarness()
    h.adjuster.fail = "PUT http://10.0.0.7:8000/chunkpilot/v1/scheduler/limits answered 409: above start-up"
    h.run_until(lambda: stopped(h))
    trials = h.finished()
    assert len(h.adjuster.calls) == 1
    marks, errors = h.live_marks(), h.live_errors()
    assert marks[0] is False and errors[0] is not None and "409" in errors[0]
    assert marks[1:] == [None] * (len(trials) - 1)
    assert "LiveAdjustFailed" in h.reasons()
    # The fallback and every later canary run the trial's own config; nothing is left broken.
    first = trials[0]
    assert started_config(h.canary_applies[1]) == first.spec.params
    assert all(t.status is not None and t.status.verdict != "Aborted" for t in trials)
    assert len(h.canary_applies) == len(trials) + 1
    assert h.canary() is None


def test_without_the_token_secret_the_trial_falls_back_to_a_normal_rollout() -> None:
    h = LiveHarness(secret=False)
    h.run_until(lambda: len(h.finished()) >= 1)
    assert h.adjuster.calls == []
    assert h.live_marks()[0] is False
    assert (h.live_errors()[0] or "").startswith("no token chat.canary")
    assert h.finished()[0].status.verdict != "Aborted"  # type: ignore[union-attr]


def test_liveadjust_off_rolls_out_each_trial_with_its_own_config() -> None:
    h = LiveHarness(autotune={"liveAdjust": False})
    h.run_until(lambda: stopped(h))
    trials = h.finished()
    assert h.adjuster.calls == []
    assert all(rec.trial_progress(t).live_adjusted is None for t in trials)
    assert [started_config(m) for m in h.canary_applies] == [t.spec.params for t in trials]


def test_a_crashing_live_canary_is_found_by_its_start_up_hash_and_not_parked() -> None:
    h = LiveHarness()
    h.ready_tracks = {"stable"}
    h.tick(2)  # trial created, canary applied at the top of the space
    canary = h.canary()
    assert canary is not None
    started = started_config(canary)
    assert started is not None and started != h.trials()[0].spec.params
    pod = {
        "metadata": {
            "name": "chat-canary-crash",
            "namespace": NS,
            "labels": {
                "chunkpilot.io/service": NAME,
                "chunkpilot.io/track": "canary",
                "app.kubernetes.io/component": "engine",  # as every engine pod (a router's says router)
                LABEL_CONFIG_HASH: started.config_hash(),
            },
        },
        "status": {"containerStatuses": [{"name": "engine", "restartCount": 1, "state": {}}]},
    }
    h.kube.put(resource_path("v1", "pods", NS, "chat-canary-crash"), pod)
    asyncio.run(h.controller.step(NS, NAME))
    trial = h.trials()[0]
    assert trial.status is not None and trial.status.verdict == "Aborted"
    assert h.canary() is None
