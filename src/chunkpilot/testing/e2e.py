"""Scenario and reads shared by the end-to-end tests of the local stack.

One simulated service that violates its ITL SLO at the default budget, a reader for the objects the
operator and the tuner write about it, and a wait that explains itself when it times out.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from chunkpilot.api import GROUP, ISVC_PLURAL, TRIAL_PLURAL, VERSION, Track
from chunkpilot.devcluster.controlplane import ControlPlane
from chunkpilot.localrun.loadgen import BackgroundLoad, word_prompt
from chunkpilot.localrun.podrunner import PodRunner
from chunkpilot.localrun.stack import LocalStack
from chunkpilot.testing.services import LLAMA_8B, a_manifest

#: Long prompts, outputs capped low to keep the CPU cost of replay small.
TRACE = "arxiv_summarization_lengths"
#: Requests per second over the whole service (stable and canary share it round-robin).
RATE = 8.0


def sim_service_manifest(
    name: str, namespace: str, *, max_trials: int, window: str, warmup: str, **autotune: Any
) -> dict[str, Any]:
    """Llama-3.1-8B on a simulated H100 at budget 8192 with ITL p99 <= 50 ms and TTFT p95 <= 2 s.

    ``window`` is both the SLO window and the trial window; ``autotune`` adds fields to
    ``spec.autotune`` (for example ``abort`` or ``liveAdjust``).
    """
    spec = {
        "model": dict(LLAMA_8B),
        "engine": {"kind": "sim", "maxNumBatchedTokens": 8192, "maxNumSeqs": 128},
        "resources": {"accelerator": "h100"},
        "replicas": 1,
        "slo": {
            "itl": {"quantile": 0.99, "maxMs": 50},
            "ttft": {"quantile": 0.95, "maxMs": 2000},
            "window": window,
        },
        "autotune": {
            "enabled": True,
            "trialWindow": window,
            "warmup": warmup,
            "maxTrials": max_trials,
            **autotune,
        },
    }
    return a_manifest(name, namespace, spec)


def disaggregated_service_manifest(
    name: str, namespace: str, served_name: str = "llama-8b"
) -> dict[str, Any]:
    """Llama-3.1-8B on simulated H100s: 1 prefill + 1 decode replica, vllm-router in front, ITL p99
    <= 50 ms and TTFT p95 <= 2 s (served as ``served_name``)."""
    spec = {
        "model": {**LLAMA_8B, "servedName": served_name},
        "engine": {"kind": "sim", "maxNumBatchedTokens": 2048, "maxNumSeqs": 64},
        "resources": {"accelerator": "h100"},
        "topology": {
            "mode": "disaggregated",
            "prefill": {"replicas": 1, "maxNumBatchedTokens": 4096, "maxNumSeqs": 16},
            "decode": {"replicas": 1, "maxNumBatchedTokens": 512, "maxNumSeqs": 64},
            "kvTransfer": {"connector": "NixlConnector", "bandwidthGBps": 25, "latencyMs": 1},
            "router": {"policy": "round_robin"},
        },
        "slo": {"itl": {"quantile": 0.99, "maxMs": 50}, "ttft": {"quantile": 0.95, "maxMs": 2000}},
    }
    return a_manifest(name, namespace, spec)


def start_scenario_load(stack: LocalStack, name: str, namespace: str, duration_s: float) -> BackgroundLoad:
    """Replay the scenario's trace against ``name`` at :data:`RATE` for up to ``duration_s``."""
    return stack.start_load(
        name,
        TRACE,
        namespace=namespace,
        rate=RATE,
        duration_s=duration_s,
        max_prompt_tokens=7000,
        max_output_tokens=64,
    )


def start_poisson_load(
    stack: LocalStack,
    name: str,
    namespace: str,
    *,
    rate: float,
    max_prompt_tokens: int,
    max_output_tokens: int,
    duration_s: float,
) -> BackgroundLoad:
    """Poisson arrivals of :data:`TRACE`'s lengths at ``rate``, split at random over the Ready engines
    (the local stack's default routing: each engine then sees the Poisson arrivals the twin assumes)."""
    return stack.start_load(
        name,
        TRACE,
        namespace=namespace,
        rate=rate,
        duration_s=duration_s,
        max_prompt_tokens=max_prompt_tokens,
        max_output_tokens=max_output_tokens,
    )


#: The infeasible scenario's targets on an L40S: ITL p99 and TTFT p95, in milliseconds.
INFEASIBLE_ITL_MS, INFEASIBLE_TTFT_MS = 35, 600
#: The infeasible scenario's caps on the trace's lengths: prompt tokens, output tokens.
INFEASIBLE_MAX_PROMPT, INFEASIBLE_MAX_OUTPUT = 4000, 64


def infeasible_service_manifest(
    name: str, namespace: str, *, max_trials: int, **autotune: Any
) -> dict[str, Any]:
    """The scenario's service on an L40S with targets its configurations of one engine cannot meet.

    30 s trials after a 5 s warm-up, 40 s SLO windows; canaries run their whole window (no early abort):
    the twin's calibration rests on whole windows. ``autotune`` adds fields to ``spec.autotune``.
    """
    abort = {"minSamples": 15, "itlFactor": 10, "ttftFactor": 10}
    body = sim_service_manifest(
        name, namespace, max_trials=max_trials, window="30s", warmup="5s", abort=abort, **autotune
    )
    spec = body["spec"]
    spec["resources"]["accelerator"] = "l40s"
    spec["slo"].update(
        itl={"quantile": 0.99, "maxMs": INFEASIBLE_ITL_MS},
        ttft={"quantile": 0.95, "maxMs": INFEASIBLE_TTFT_MS},
    )
    spec["slo"]["window"] = "40s"
    return body


def start_infeasible_load(
    stack: LocalStack, name: str, namespace: str, *, rate: float, duration_s: float
) -> BackgroundLoad:
    """:func:`start_poisson_load` with the infeasible scenario's caps on the lengths."""
    return start_poisson_load(
        stack,
        name,
        namespace,
        rate=rate,
        max_prompt_tokens=INFEASIBLE_MAX_PROMPT,
        max_output_tokens=INFEASIBLE_MAX_OUTPUT,
        duration_s=duration_s,
    )


def fresh_service(
    stack: LocalStack, namespace_prefix: str, name_prefix: str
) -> tuple[ControlPlane, PodRunner, str, str]:
    """The stack's control plane and pod runner (it must have started them), and a namespace and a
    service name no other test uses: each prefix and 6 random hex digits."""
    plane, runner = stack.control_plane, stack.runner
    assert plane is not None and runner is not None
    namespace, name = f"{namespace_prefix}-{uuid.uuid4().hex[:6]}", f"{name_prefix}-{uuid.uuid4().hex[:6]}"
    return plane, runner, namespace, name


def apply_service(stack: LocalStack, manifest: Mapping[str, Any]) -> ServiceObjects:
    """Create the manifest's namespace (if new), apply the InferenceService, and read it back.

    The manifest is kept in the stack's state folder (``<name>.json``), beside the stack's logs.
    """
    plane = stack.control_plane
    assert plane is not None
    namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
    plane.kubectl("create", "namespace", namespace, check=False)
    path = stack.options.state_dir / f"{name}.json"
    path.write_text(json.dumps(manifest))
    plane.kubectl("apply", "-f", str(path))
    return ServiceObjects(plane, namespace, name)


def serve_service(stack: LocalStack, manifest: Mapping[str, Any]) -> ServiceObjects:
    """:func:`apply_service`, then wait (up to 2 minutes) until the pod runner serves the stable engine.

    The API connection is closed if the engine never serves.
    """
    runner = stack.runner
    assert runner is not None
    cluster = apply_service(stack, manifest)
    namespace, name = cluster.namespace, cluster.name
    try:
        wait_until(
            "the stable engine to serve", lambda: runner.ready_endpoints(name, namespace), 120, cluster
        )
    except BaseException:
        cluster.close()
        raise
    return cluster


class ServiceObjects:
    """Reads of one InferenceService, its TuningTrials and Deployments through the API."""

    def __init__(self, plane: ControlPlane, namespace: str, name: str) -> None:
        from kubernetes import client

        self.namespace, self.name = namespace, name
        self.api_client = plane.api_client()
        self.custom = client.CustomObjectsApi(self.api_client)
        self.apps = client.AppsV1Api(self.api_client)
        self.core = client.CoreV1Api(self.api_client)

    def close(self) -> None:
        """Close the API connection."""
        self.api_client.close()

    def service(self) -> dict[str, Any]:
        """The InferenceService as stored."""
        found: Any = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, ISVC_PLURAL, self.name
        )
        service: dict[str, Any] = found
        return service

    def status(self) -> dict[str, Any]:
        """Its status (empty before the operator wrote one)."""
        status: dict[str, Any] = self.service().get("status") or {}
        return status

    def condition(self, type_: str) -> dict[str, Any] | None:
        """Condition ``type_``, or None."""
        return next((c for c in self.status().get("conditions", []) if c["type"] == type_), None)

    def condition_is(self, type_: str, status: str) -> bool:
        """Whether condition ``type_`` is there with ``status`` (``"True"`` or ``"False"``)."""
        found = self.condition(type_)
        return found is not None and found["status"] == status

    def trials(self) -> list[dict[str, Any]]:
        """Its TuningTrials in trial-number order."""
        listing: Any = self.custom.list_namespaced_custom_object(
            GROUP, VERSION, self.namespace, TRIAL_PLURAL, label_selector=f"chunkpilot.io/service={self.name}"
        )
        items: list[dict[str, Any]] = listing["items"]
        return sorted(items, key=lambda t: t["spec"]["number"])

    def promoted_trial(self) -> dict[str, Any] | None:
        """The first promoted TuningTrial once the service's status records it, else None.

        The tuner writes the trial's verdict before ``status.bestConfig`` (the history first), so a
        trial may read Promoted a moment before the service names it as ``bestTrial``.
        """
        promoted = next(
            (t for t in self.trials() if (t.get("status") or {}).get("verdict") == "Promoted"), None
        )
        if promoted is None:
            return None
        status = self.status()
        if status.get("bestTrial") != promoted["metadata"]["name"] or "bestConfig" not in status:
            return None
        return promoted

    def verdicts(self) -> list[tuple[int, str | None, str | None]]:
        """``(number, verdict, reason)`` per trial."""
        return [
            (
                t["spec"]["number"],
                (t.get("status") or {}).get("verdict"),
                (t.get("status") or {}).get("reason"),
            )
            for t in self.trials()
        ]

    def deployment(self, track: Track) -> Any:
        """The Deployment of ``track``, or None."""
        from kubernetes import client

        from chunkpilot.operator.builders import deployment_name

        try:
            return self.apps.read_namespaced_deployment(deployment_name(self.name, track), self.namespace)
        except client.ApiException as error:
            if error.status == 404:
                return None
            raise

    def canary(self) -> Any:
        """The canary Deployment, or None."""
        return self.deployment(Track.CANARY)

    def stable_args(self) -> list[str]:
        """The stable engine container's arguments."""
        args: list[str] = self.deployment(Track.STABLE).spec.template.spec.containers[0].args
        return args


def wait_until(
    what: str, probe: Callable[[], Any], timeout_s: float, objects: ServiceObjects, poll_s: float = 1.0
) -> Any:
    """Poll ``probe`` until it returns something truthy; on timeout fail with the trials and conditions."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(
        f"timed out after {timeout_s:.0f}s waiting for {what}; trials: {objects.verdicts()}; "
        f"conditions: {json.dumps(objects.status().get('conditions'), indent=1)}"
    )


@dataclass(frozen=True, slots=True)
class StreamedCompletion:
    """What a client saw of one streaming completion: the tokens it received and the usage it was told."""

    status: int
    text_chunks: int
    prompt_tokens: int
    completion_tokens: int
    ttft_s: float
    error: str = ""


async def _stream_one(
    session: aiohttp.ClientSession, url: str, model: str, prompt: str, max_tokens: int
) -> StreamedCompletion:
    payload = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.monotonic()
    ttft = float("nan")
    chunks = 0
    usage: dict[str, Any] = {}
    async with session.post(f"{url}/v1/completions", json=payload) as response:
        if response.status != 200:
            return StreamedCompletion(response.status, 0, 0, 0, ttft, (await response.text())[:300])
        async for raw in response.content:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            event = json.loads(line[5:])
            if any(choice.get("text") for choice in event.get("choices") or []):
                if chunks == 0:
                    ttft = time.monotonic() - started
                chunks += 1
            usage = event.get("usage") or usage
    return StreamedCompletion(
        200, chunks, int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0)), ttft
    )


def stream_completions(
    url: str,
    model: str,
    requests: Sequence[tuple[int, int]],
    *,
    concurrency: int = 4,
    timeout_s: float = 120.0,
    seed: int = 0,
) -> list[StreamedCompletion]:
    """Send streaming completions of ``(prompt words, max_tokens)`` to ``url``, ``concurrency`` at a time.

    Prompts are random three-letter words (see :func:`~chunkpilot.localrun.loadgen.word_prompt`);
    every request asks for exactly ``max_tokens`` (``ignore_eos``) and for the usage chunk.
    """
    rng = random.Random(seed)
    prompts = [(word_prompt(words, rng), max_tokens) for words, max_tokens in requests]

    async def run() -> list[StreamedCompletion]:
        slots = asyncio.Semaphore(concurrency)
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:

            async def one(prompt: str, max_tokens: int) -> StreamedCompletion:
                async with slots:
                    return await _stream_one(session, url, model, prompt, max_tokens)

            return list(await asyncio.gather(*(one(p, m) for p, m in prompts)))

    return asyncio.run(run())


__all__ = [
    "RATE",
    "TRACE",
    "ServiceObjects",
    "StreamedCompletion",
    "sim_service_manifest",
    "start_scenario_load",
    "stream_completions",
    "wait_until",
]
