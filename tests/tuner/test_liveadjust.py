"""Live adjustment: which trials reuse a running canary, the request, the client against the simulator."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from chunkpilot.engine.live_adjust import LIVE_ADJUST_ROUTE, LIVE_ADJUST_TOKEN_ENV
from chunkpilot.engine.sim.engine import SimConfig
from chunkpilot.engine.sim.scheduler import SchedulerConfig
from chunkpilot.engine.sim.server import ServerConfig, SimEngineServer
from chunkpilot.operator.builders import ANNOTATION_CONFIG
from chunkpilot.operator.config import ENV_LIVE_ADJUST, OperatorConfig
from chunkpilot.tuner.act.live_adjust import (
    HttpLiveAdjuster,
    LiveAdjustError,
    build_request,
    pod_ip_endpoint,
    targets_file_resolver,
)
from chunkpilot.tuner.decide.canary import (
    canary_manifest,
    ceiling_config,
    live_adjust_refusal,
    live_start,
    live_usable,
    target_limits,
)
from chunkpilot.tuner.decide.plan import Plan
from chunkpilot.tuner.observe.canary import enabled, owned_through, pod_ready, secret_token, started_config
from chunkpilot.tuner.observe.observer import parse_service
from chunkpilot.tuner.observe.snapshot import Snapshot
from chunkpilot.tuner.space import Knob, KnobRange, SearchSpace, TunedConfig

from chunkpilot.api import EngineConfig, ObjectMeta, TuningTrial, TuningTrialSpec
from chunkpilot.devcluster.ports import LOOPBACK, free_port
from chunkpilot.testing.tuner import a_snapshot

START = EngineConfig(max_num_batched_tokens=8192, max_num_seqs=256, long_prefill_token_threshold=512)


def config(**knobs: Any) -> EngineConfig:
    return START.model_copy(update=knobs)


@pytest.mark.parametrize(
    ("target", "refused"),
    [
        pytest.param(config(), None, id="same"),
        pytest.param(config(max_num_batched_tokens=1024, max_num_seqs=32), None, id="lower"),
        pytest.param(config(max_num_active_seqs=8), None, id="active-cap-below-seqs"),
        pytest.param(
            config(max_num_batched_tokens=16384), "max_num_batched_tokens 16384 is above", id="raise"
        ),
        pytest.param(config(max_num_seqs=512), "max_num_seqs 512 is above", id="raise-seqs"),
        pytest.param(
            config(long_prefill_token_threshold=256), "long_prefill_token_threshold changes", id="other"
        ),
        pytest.param(config(max_num_partial_prefills=2), "max_num_partial_prefills changes", id="unset-knob"),
    ],
)
def test_only_lowered_live_limits_with_every_other_knob_equal_can_be_adjusted(
    target: EngineConfig, refused: str | None
) -> None:
    reason = live_adjust_refusal(START, target)
    if refused is None:
        assert reason is None
    else:
        assert reason is not None and refused in reason


def test_an_active_cap_is_compared_as_its_effective_value() -> None:
    capped = config(max_num_active_seqs=16)
    assert live_adjust_refusal(capped, config(max_num_active_seqs=8)) is None
    # Unset means max-num-seqs (256): above the start-up cap of 16.
    assert "max_num_active_seqs 256" in (live_adjust_refusal(capped, config()) or "")


def test_ceiling_raises_only_the_live_limits_to_the_top_of_the_space() -> None:
    trial = config(max_num_batched_tokens=1024, max_num_seqs=32, max_num_active_seqs=8)
    top = ceiling_config(trial, 16384, 512)
    assert (top.max_num_batched_tokens, top.max_num_seqs, top.max_num_active_seqs) == (16384, 512, None)
    assert top.long_prefill_token_threshold == 512
    assert live_adjust_refusal(top, trial) is None
    assert ceiling_config(config(max_num_batched_tokens=20000), 16384, None).max_num_batched_tokens == 20000
    assert target_limits(trial) == {
        "max_num_batched_tokens": 1024,
        "max_num_seqs": 32,
        "max_num_active_seqs": 8,
    }
    assert target_limits(START)["max_num_active_seqs"] == 256


def test_started_config_is_the_config_the_deployment_was_built_with() -> None:
    trial = config(max_num_active_seqs=8)
    deployment = {"metadata": {"annotations": {ANNOTATION_CONFIG: json.dumps(trial.to_k8s())}}}
    assert started_config(deployment) == trial
    assert started_config({"metadata": {}}) is None
    assert started_config({"metadata": {"annotations": {ANNOTATION_CONFIG: "{oops"}}}) is None


def test_request_token_and_endpoints(tmp_path: Path) -> None:
    request = build_request("10.1.2.3:8000", "tok", {"max_num_batched_tokens": 512})
    assert request.url == f"http://10.1.2.3:8000{LIVE_ADJUST_ROUTE}"
    assert request.headers["Authorization"] == "Bearer tok"
    assert request.body == {"max_num_batched_tokens": 512}
    assert secret_token({"data": {"chat.canary": "dG9r"}}, "chat.canary") == "tok"
    assert secret_token({"stringData": {"chat.canary": "tok"}}, "chat.canary") == "tok"
    assert secret_token({"data": {"chat.stable": "dG9r"}}, "chat.canary") is None
    assert secret_token({"data": {}}, "chat.canary") is None and secret_token(None, "chat.canary") is None
    pod = {"metadata": {"name": "p-1", "namespace": "llm"}, "status": {"podIP": "10.1.2.3"}}
    assert pod_ip_endpoint(pod) == "10.1.2.3:8000"
    assert pod_ip_endpoint({"status": {}}) is None
    targets = tmp_path / "targets.json"
    targets.write_text(
        json.dumps([{"targets": ["127.0.0.1:41234"], "labels": {"namespace": "llm", "pod": "p-1"}}])
    )
    resolve = targets_file_resolver(targets)
    assert resolve(pod) == "127.0.0.1:41234"
    assert resolve({"metadata": {"name": "p-2", "namespace": "llm"}}) is None
    assert targets_file_resolver(tmp_path / "missing.json")(pod) is None
    ready = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    assert pod_ready(ready)
    assert not pod_ready({**ready, "metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}})
    assert not pod_ready({"status": {"conditions": [{"type": "Ready", "status": "False"}]}})


# --------------------------------------------------------------------------- against the simulator's route

TOKEN = "tuner-token"


async def serve_sim(token: str | None) -> tuple[web.AppRunner, SimEngineServer, str]:
    port = free_port()
    sim = SimConfig(scheduler=SchedulerConfig(max_num_batched_tokens=4096, max_num_seqs=128))
    server = SimEngineServer(ServerConfig(sim=sim, served_model_names=("m",), live_adjust_token=token))
    runner = web.AppRunner(server.app())
    await runner.setup()
    await web.TCPSite(runner, LOOPBACK, port).start()
    return runner, server, f"{LOOPBACK}:{port}"


def run(coro_fn: Callable[[], Any]) -> Any:
    return asyncio.run(coro_fn())


POD = {"metadata": {"name": "p-1", "namespace": "llm"}}


def test_client_lowers_the_simulator_limits_and_reports_refusals_as_errors() -> None:
    async def scenario() -> None:
        runner, server, address = await serve_sim(TOKEN)
        try:
            adjuster = HttpLiveAdjuster(resolver=lambda _pod: address, timeout_s=5)
            await adjuster.adjust(
                [POD], TOKEN, {"max_num_batched_tokens": 1024, "max_num_seqs": 32, "max_num_active_seqs": 16}
            )
            cfg = server.core.scheduler.config
            assert (cfg.max_num_batched_tokens, cfg.max_num_seqs, cfg.max_running) == (1024, 32, 16)
            with pytest.raises(LiveAdjustError, match="answered 409"):
                await adjuster.adjust([POD], TOKEN, {"max_num_batched_tokens": 8192})
            with pytest.raises(LiveAdjustError, match="answered 401"):
                await adjuster.adjust([POD], "wrong", {"max_num_batched_tokens": 512})
            assert server.core.scheduler.config.max_num_batched_tokens == 1024  # refusals change nothing
            with pytest.raises(LiveAdjustError, match="no Ready canary pod"):
                await adjuster.adjust([], TOKEN, {"max_num_batched_tokens": 512})
            unresolved = HttpLiveAdjuster(resolver=lambda _pod: None)
            with pytest.raises(LiveAdjustError, match="no address for canary pod p-1"):
                await unresolved.adjust([POD], TOKEN, {"max_num_batched_tokens": 512})
        finally:
            await runner.cleanup()

    run(scenario)


def test_client_fails_cleanly_when_the_route_is_off_or_nothing_listens() -> None:
    async def scenario() -> None:
        runner, _server, address = await serve_sim(None)
        try:
            adjuster = HttpLiveAdjuster(resolver=lambda _pod: address, timeout_s=5)
            with pytest.raises(LiveAdjustError, match="answered 503"):
                await adjuster.adjust([POD], TOKEN, {"max_num_batched_tokens": 512})
        finally:
            await runner.cleanup()
        closed = HttpLiveAdjuster(resolver=lambda _pod: f"{LOOPBACK}:{free_port()}", timeout_s=2)
        with pytest.raises(LiveAdjustError, match="failed"):
            await closed.adjust([POD], TOKEN, {"max_num_batched_tokens": 512})

    run(scenario)


# --------------------------------------------------------------------------- disabled by the installation


def _service(live_adjust: bool = True) -> Snapshot:
    body = {
        "apiVersion": "chunkpilot.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "chat", "namespace": "llm", "uid": "uid-1"},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
            "engine": {"version": "0.33.0"},
            "autotune": {"liveAdjust": live_adjust},
        },
    }
    return a_snapshot(body, now=datetime(2026, 1, 1, tzinfo=UTC))


def test_with_live_adjustment_off_in_the_installation_trials_roll_out() -> None:
    """CHUNKPILOT_LIVE_ADJUST=off (chart liveAdjust.enabled=false): no ceiling start, no Secret reference."""
    snap = _service()
    trial = TuningTrial(
        metadata=ObjectMeta(name="chat-trial-1", namespace="llm"),
        spec=TuningTrialSpec(service_name="chat", number=1, params=config(max_num_batched_tokens=2048)),
    )
    space = SearchSpace(
        ranges={
            Knob.MAX_NUM_BATCHED_TOKENS: KnobRange(512, 8192),
            Knob.MAX_NUM_SEQS: KnobRange(16, 256),
        },
        fixed=TunedConfig(8192, 256, long_prefill_token_threshold=512),
    )

    def env_names(manifest: dict[str, Any]) -> set[str]:
        return {item["name"] for item in manifest["spec"]["template"]["spec"]["containers"][0].get("env", [])}

    assert enabled(snap.isvc) and live_usable(Plan(snap))
    assert live_start(Plan(snap), trial, space) is not None  # started at the top to go down live
    assert LIVE_ADJUST_TOKEN_ENV in env_names(canary_manifest(snap.isvc, snap.body, trial))

    # As the observer reads the service with CHUNKPILOT_LIVE_ADJUST=off in the tuner's settings.
    off = parse_service(snap.body, live_adjust=OperatorConfig.from_env({ENV_LIVE_ADJUST: "off"}).live_adjust)
    assert off is not None
    snap = replace(snap, isvc=off)
    assert not enabled(snap.isvc) and not live_usable(Plan(snap))
    assert live_start(Plan(snap), trial, space) is None  # the trial's own config: a rollout
    assert LIVE_ADJUST_TOKEN_ENV not in env_names(canary_manifest(snap.isvc, snap.body, trial))
    assert not enabled(_service(live_adjust=False).isvc)


def test_only_pods_the_deployment_controls_through_a_replica_set_are_owned() -> None:
    def owned(uid: str, controller: str | None) -> dict[str, Any]:
        refs = [{"uid": controller, "controller": True}] if controller else []
        return {"metadata": {"name": uid, "uid": uid, "ownerReferences": refs}}

    sets = [owned("rs-1", "canary-uid"), owned("rs-2", "other-deployment")]
    pods = [owned("mine", "rs-1"), owned("theirs", "rs-2"), owned("bare", None)]
    assert [p["metadata"]["name"] for p in owned_through(pods, sets, "canary-uid")] == ["mine"]
    assert owned_through(pods, sets, "unknown") == ()
