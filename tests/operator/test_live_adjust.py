"""autotune.liveAdjust: the engine's live-adjustment route, its token Secret and where it is rendered."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

import pytest
from chunkpilot.engine.live_adjust import LIVE_ADJUST_TOKEN_ENV
from chunkpilot.engine.vllm_plugin.config import load_plugin_config
from chunkpilot.engine.vllm_plugin.render import DEFAULT_CONTROL_FILE
from chunkpilot.operator.builders import (
    ANNOTATION_ROTATE_TOKENS,
    LIVE_ADJUST_SECRET,
    build_deployment,
    build_live_adjust_secret,
    live_adjust_token_key,
    live_adjust_tokens,
    new_live_adjust_token,
    wants_live_adjust_secret,
)
from chunkpilot.operator.config import OperatorConfig
from chunkpilot.operator.kube import KubeError
from chunkpilot.operator.objects import NameConflictError
from chunkpilot.operator.reconcile import Reconciler

from chunkpilot.api import InferenceService, Track
from chunkpilot.testing.argv import flag
from chunkpilot.testing.services import LLAMA_8B, a_manifest

UPSTREAM = "vllm/vllm-openai:v0.33.0"
OWNER_BODY = {
    "apiVersion": "chunkpilot.io/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "chat", "namespace": "llm", "uid": "uid-1"},
}


def isvc(live_adjust: bool = True, **engine: Any) -> InferenceService:
    spec = {
        "model": {"name": LLAMA_8B["name"]},
        "engine": {"version": "0.33.0", **engine},
        "autotune": {"liveAdjust": live_adjust},
    }
    body = a_manifest("chat", "llm", spec)
    return InferenceService.from_manifest(body)


def container(service: InferenceService, track: Track = Track.STABLE) -> dict[str, Any]:
    pod = build_deployment(service, track)["spec"]["template"]["spec"]
    found: dict[str, Any] = pod["containers"][0]
    return found


def test_engine_image_renders_the_route_with_the_token_from_the_secret() -> None:
    service = isvc()
    engine = container(service)
    env = {item["name"]: item for item in engine["env"]}
    assert env["VLLM_PLUGINS"]["value"] == "chunkpilot,chunkpilot_live_adjust"
    assert env[LIVE_ADJUST_TOKEN_ENV]["valueFrom"] == {
        "secretKeyRef": {"name": "chunkpilot-live-adjust", "key": "chat.stable"}
    }
    # One token per track: the canary's pods get the canary's, which adjusts no stable pod.
    canary = {item["name"]: item for item in container(service, Track.CANARY)["env"]}
    assert canary[LIVE_ADJUST_TOKEN_ENV]["valueFrom"]["secretKeyRef"]["key"] == "chat.canary"
    assert "value" not in env[LIVE_ADJUST_TOKEN_ENV]  # never the token itself in the pod spec
    config = load_plugin_config(json.loads(flag(engine["args"], "--additional-config")), {})
    assert config.control_file == DEFAULT_CONTROL_FILE
    assert flag(engine["args"], "--scheduler-cls").endswith("ChunkpilotScheduler")
    mounts = {mount["mountPath"] for mount in engine["volumeMounts"]}
    assert "/run/chunkpilot" in mounts
    assert wants_live_adjust_secret(service)


def test_live_adjust_and_partial_prefills_share_one_additional_config() -> None:
    engine = container(isvc(maxNumPartialPrefills=4, maxLongPartialPrefills=1))
    assert engine["args"].count("--additional-config") == 1
    section = json.loads(flag(engine["args"], "--additional-config"))["chunkpilot"]
    assert section == {
        "control_file": DEFAULT_CONTROL_FILE,
        "max_long_partial_prefills": 1,
        "max_num_partial_prefills": 4,
    }


@pytest.mark.parametrize(
    "service",
    [
        pytest.param(isvc(live_adjust=False), id="off"),
        pytest.param(isvc(image=UPSTREAM), id="upstream-image"),
        pytest.param(isvc(version="0.32.0"), id="release-without-engine-image"),
    ],
)
def test_nothing_extra_where_live_adjust_is_off_or_unavailable(service: InferenceService) -> None:
    engine = container(service)
    names = {item["name"] for item in engine.get("env", [])}
    assert not {"VLLM_PLUGINS", LIVE_ADJUST_TOKEN_ENV} & names
    assert "--scheduler-cls" not in engine["args"]
    assert all(mount["mountPath"] != "/run/chunkpilot" for mount in engine["volumeMounts"])
    assert not wants_live_adjust_secret(service)


def test_simulator_gets_only_the_token_and_keeps_its_argv() -> None:
    # The simulator serves the route in-process: same token env, no plugin flags nor control file.
    on, off = isvc(kind="sim"), isvc(live_adjust=False, kind="sim")
    engine, plain = container(on), container(off)
    assert engine["args"] == plain["args"]
    assert engine["volumeMounts"] == plain["volumeMounts"]
    added = [item for item in engine.get("env", []) if item not in plain.get("env", [])]
    assert added == [
        {
            "name": LIVE_ADJUST_TOKEN_ENV,
            "valueFrom": {"secretKeyRef": {"name": "chunkpilot-live-adjust", "key": "chat.stable"}},
        }
    ]
    assert wants_live_adjust_secret(on) and not wants_live_adjust_secret(off)


def test_secret_manifest_and_tokens() -> None:
    tokens = live_adjust_tokens(isvc())
    assert (
        set(tokens)
        == {live_adjust_token_key("chat", track) for track in Track}
        == {"chat.stable", "chat.canary"}
    )
    secret = build_live_adjust_secret("llm", tokens)
    assert secret["metadata"]["name"] == LIVE_ADJUST_SECRET == "chunkpilot-live-adjust"
    assert secret["metadata"]["namespace"] == "llm"
    assert secret["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "chunkpilot"}
    assert secret["stringData"] == tokens
    token = new_live_adjust_token()
    assert len(token) >= 43 and token != new_live_adjust_token()
    assert tokens["chat.stable"] != tokens["chat.canary"]


SECRET_PATH = "/api/v1/namespaces/llm/secrets/chunkpilot-live-adjust"
MANAGED = {"app.kubernetes.io/managed-by": "chunkpilot"}


class SecretKube:
    """Just the verbs the Secret logic uses, on an in-memory store (status codes as the API's)."""

    def __init__(self, existing: dict[str, Any] | None = None, *, race: bool = False) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.calls: list[str] = []
        self.race = race
        self.version = 1
        if existing is not None:
            existing["metadata"].setdefault("resourceVersion", "1")
            self.objects[SECRET_PATH] = existing

    async def get(self, path: str) -> dict[str, Any] | None:
        self.calls.append(f"GET {path}")
        return json.loads(json.dumps(self.objects[path])) if path in self.objects else None

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self.calls.append(f"POST {path}")
        if self.race:
            raise KubeError(409, "POST", path, '{"message": "already exists"}')
        stored = json.loads(json.dumps({**body, "data": dict(body["stringData"])}))
        stored["metadata"]["resourceVersion"] = "1"
        self.objects[f"{path}/{body['metadata']['name']}"] = stored
        return stored

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        self.calls.append(f"PATCH {path}")
        stored = self.objects[path]
        if patch["metadata"].get("resourceVersion") != stored["metadata"]["resourceVersion"]:
            raise KubeError(409, "PATCH", path, '{"message": "the object has been modified"}')
        if "ownerReferences" in patch["metadata"]:
            stored["metadata"]["ownerReferences"] = patch["metadata"]["ownerReferences"]
        if "annotations" in patch["metadata"]:
            stored["metadata"].setdefault("annotations", {}).update(patch["metadata"]["annotations"])
        stored.setdefault("data", {}).update(patch.get("stringData") or {})
        self.version += 1
        stored["metadata"]["resourceVersion"] = str(self.version)
        return stored


def ensure(kube: SecretKube, name: str = "chat", uid: str = "uid-1", rotation: str = "") -> bool:
    reconciler = Reconciler(kube=kube, config=OperatorConfig())  # type: ignore[arg-type]
    owner = {**OWNER_BODY, "metadata": {**OWNER_BODY["metadata"], "name": name, "uid": uid, "labels": {}}}
    manifest = a_manifest(
        name, "llm", {"model": {"name": LLAMA_8B["name"]}, "autotune": {"liveAdjust": True}}
    )
    if rotation:
        manifest["metadata"]["annotations"] = {ANNOTATION_ROTATE_TOKENS: rotation}
    service = InferenceService.from_manifest(manifest)
    created: bool = asyncio.run(reconciler.children.ensure_live_adjust_secret(service, owner))
    return created


def test_the_secret_is_created_once_owned_by_the_service() -> None:
    kube = SecretKube()
    assert ensure(kube) is True
    secret = kube.objects[SECRET_PATH]
    (owner,) = secret["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("InferenceService", "chat", "uid-1")
    tokens = dict(secret["data"])
    assert set(tokens) == {"chat.stable", "chat.canary"}
    assert ensure(kube) is False  # a later reconcile: read, nothing written
    assert kube.objects[SECRET_PATH]["data"] == tokens
    assert kube.calls[-1] == f"GET {SECRET_PATH}"


def test_another_service_of_the_namespace_joins_the_secret_and_keeps_the_others_tokens() -> None:
    kube = SecretKube()
    ensure(kube)
    first = dict(kube.objects[SECRET_PATH]["data"])
    assert ensure(kube, "code", "uid-2") is True
    secret = kube.objects[SECRET_PATH]
    assert [ref["uid"] for ref in secret["metadata"]["ownerReferences"]] == ["uid-1", "uid-2"]
    assert [ref.get("controller") for ref in secret["metadata"]["ownerReferences"]] == [True, False]
    assert {k: v for k, v in secret["data"].items() if k.startswith("chat.")} == first
    assert {"code.stable", "code.canary"} <= set(secret["data"])


def test_an_existing_token_is_kept_and_a_missing_one_added() -> None:
    ours = {"name": LIVE_ADJUST_SECRET, "labels": MANAGED, "ownerReferences": [{"uid": "uid-1"}]}
    held = {"chat.stable": "c3RhYmxl", "chat.canary": "Y2FuYXJ5"}
    kept = SecretKube({"metadata": dict(ours), "data": dict(held)})
    assert ensure(kept) is False
    assert kept.objects[SECRET_PATH]["data"] == held
    assert not any(call.startswith(("POST", "PATCH")) for call in kept.calls)

    half = SecretKube({"metadata": dict(ours), "data": {"chat.stable": "c3RhYmxl"}})
    assert ensure(half) is True
    assert half.objects[SECRET_PATH]["data"]["chat.stable"] == "c3RhYmxl"
    assert half.objects[SECRET_PATH]["data"]["chat.canary"]


def test_a_secret_of_that_name_the_installation_did_not_create_is_left_untouched() -> None:
    foreign = {"metadata": {"name": LIVE_ADJUST_SECRET, "namespace": "llm"}, "kind": "Secret", "data": {}}
    kube = SecretKube(foreign)
    with pytest.raises(NameConflictError, match="Secret llm/chunkpilot-live-adjust already exists"):
        ensure(kube)
    assert kube.objects[SECRET_PATH]["data"] == {}
    assert not any(call.startswith(("POST", "PATCH")) for call in kube.calls)


def test_a_concurrent_write_is_left_to_the_next_pass() -> None:
    assert ensure(SecretKube(race=True)) is False


def test_a_rotation_request_replaces_the_services_tokens_once_per_value() -> None:
    kube = SecretKube()
    ensure(kube)
    ensure(kube, "code", "uid-2")
    before = dict(kube.objects[SECRET_PATH]["data"])
    assert ensure(kube, rotation="2026-12-05") is True
    after = kube.objects[SECRET_PATH]
    assert after["data"]["chat.stable"] != before["chat.stable"]
    assert after["data"]["chat.canary"] != before["chat.canary"]
    assert after["data"]["code.stable"] == before["code.stable"]  # another service's are kept
    assert after["metadata"]["annotations"] == {"rotated.chunkpilot.io/chat": "2026-12-05"}
    rotated = dict(after["data"])
    assert ensure(kube, rotation="2026-12-05") is False  # the same request: done already
    assert kube.objects[SECRET_PATH]["data"] == rotated
    assert ensure(kube, rotation="2027-01-05") is True
    assert kube.objects[SECRET_PATH]["data"]["chat.stable"] != rotated["chat.stable"]


def test_a_rotation_restarts_the_engines_with_the_new_tokens() -> None:
    plain = build_deployment(isvc(), Track.STABLE)["spec"]["template"]["metadata"]["annotations"]
    assert ANNOTATION_ROTATE_TOKENS not in plain
    manifest = a_manifest(
        "chat",
        "llm",
        {
            "model": {"name": LLAMA_8B["name"]},
            "engine": {"version": "0.33.0"},
            "autotune": {"liveAdjust": True},
        },
    )
    manifest["metadata"]["annotations"] = {ANNOTATION_ROTATE_TOKENS: "2026-12-05"}
    rotated = InferenceService.from_manifest(manifest)
    template = build_deployment(rotated, Track.STABLE)["spec"]["template"]["metadata"]["annotations"]
    assert template[ANNOTATION_ROTATE_TOKENS] == "2026-12-05"  # a changed template: the pods restart
    off = build_deployment(isvc(live_adjust=False), Track.STABLE)["spec"]["template"]["metadata"]
    assert ANNOTATION_ROTATE_TOKENS not in off["annotations"]
