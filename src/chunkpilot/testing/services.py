"""InferenceService bodies as the API server returns them, typed services, and status conditions."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from chunkpilot.api import API_VERSION, ISVC_KIND, EngineKind, InferenceService, InferenceServiceSpec
from chunkpilot.tuner.observe.observer import parse_service

#: The examples of the checkout this package runs from (a strict editable install links its files).
EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
#: The checkout's InferenceService manifests: the examples, the operator's golden cases, the API's valid ones.
MANIFEST_FOLDERS = (
    EXAMPLES,
    EXAMPLES.parent / "tests" / "operator" / "golden" / "cases",
    EXAMPLES.parent / "tests" / "api" / "valid",
)
#: The service the builders make unless told: a chat service on the CPU simulator.
CHAT_EXAMPLE = "chat-llama-8b-sim.yaml"
#: The builders' clock: the "now" of the step they feed.
NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)

#: The model of the hand-written services: Llama-3.1-8B served as ``llama-8b`` with an 8k context.
LLAMA_8B: Mapping[str, Any] = {
    "name": "meta-llama/Llama-3.1-8B-Instruct",
    "servedName": "llama-8b",
    "maxModelLen": 8192,
}


def a_manifest(
    name: str, namespace: str | None, spec: Mapping[str, Any], *, kind: str = ISVC_KIND, **fields: Any
) -> dict[str, Any]:
    """An object of the chunkpilot API as a user applies it (an InferenceService unless ``kind``).

    ``namespace`` None leaves it to ``kubectl apply``; ``fields`` are further top-level fields
    (``status``, for one).
    """
    metadata = {"name": name} if namespace is None else {"name": name, "namespace": namespace}
    return {"apiVersion": API_VERSION, "kind": kind, "metadata": metadata, "spec": dict(spec), **fields}


def a_topology_manifest(
    name: str = "chat", namespace: str = "default", *, enabled: bool = True, allow: bool = True, **spec: Any
) -> dict[str, Any]:
    """A simulated Llama-3.1-8B service on 2 replicas (budget 256, 64 sequences) with tight targets
    (ITL p99 35 ms, TTFT p95 600 ms), autotuned (``enabled``) and allowed to change topology (``allow``).

    ``spec`` adds or replaces fields of its spec.
    """
    return a_manifest(
        name,
        namespace,
        {
            "model": {"name": LLAMA_8B["name"]},
            "engine": {"kind": "sim", "maxNumBatchedTokens": 256, "maxNumSeqs": 64},
            "replicas": 2,
            "slo": {"itl": {"quantile": 0.99, "maxMs": 35}, "ttft": {"quantile": 0.95, "maxMs": 600}},
            "autotune": {"enabled": enabled, "allowTopologyChange": allow},
            **spec,
        },
    )


def example_body(name: str = CHAT_EXAMPLE) -> dict[str, Any]:
    """``examples/<name>``, read afresh (callers may edit it)."""
    body: dict[str, Any] = yaml.safe_load((EXAMPLES / name).read_text())
    return body


def specs_of_kind(kind: EngineKind) -> dict[str, InferenceServiceSpec]:
    """The spec of every InferenceService in :data:`MANIFEST_FOLDERS` whose engine is ``kind``, by
    ``<folder>/<file>`` (read afresh)."""
    specs: dict[str, InferenceServiceSpec] = {}
    for path in (path for folder in MANIFEST_FOLDERS for path in sorted(folder.glob("*.yaml"))):
        manifest = yaml.safe_load(path.read_text())
        if manifest.get("kind") != ISVC_KIND:
            continue
        if (manifest["spec"].get("engine") or {}).get("kind") == kind:
            specs[f"{path.parent.name}/{path.name}"] = InferenceService.from_manifest(manifest).spec
    return specs


def a_service_body(
    *,
    replicas: int | None = None,
    spec: Mapping[str, Any] | None = None,
    engine: Mapping[str, Any] | None = None,
    itl_ms: float | None = None,
    ttft_ms: float | None = None,
    trial_window: str | None = "60s",
    warmup: str | None = "10s",
    autotune: Mapping[str, Any] | None = None,
    status: Mapping[str, Any] | None = None,
    resource_version: str | None = "1",
) -> dict[str, Any]:
    """The chat example as the API server returns it: namespace ``default``, uid ``uid-chat``, generation 1.

    What is not None changes the example: ``spec.replicas``, further ``spec`` fields, ``engine`` fields,
    the ITL p99 and TTFT p95 targets (ms), the trial window and warm-up (short unless told), further
    ``autotune`` fields, the whole ``status``, and ``metadata.resourceVersion``.
    """
    body = example_body()
    metadata: dict[str, Any] = {"namespace": "default", "uid": "uid-chat", "generation": 1}
    if resource_version is not None:
        metadata["resourceVersion"] = resource_version
    body["metadata"].update(metadata)
    if replicas is not None:
        body["spec"]["replicas"] = replicas
    body["spec"].update(spec or {})
    body["spec"]["engine"].update(engine or {})
    if itl_ms is not None:
        body["spec"]["slo"]["itl"] = {"quantile": 0.99, "maxMs": itl_ms}
    if ttft_ms is not None:
        body["spec"]["slo"]["ttft"] = {"quantile": 0.95, "maxMs": ttft_ms}
    windows = {"trialWindow": trial_window, "warmup": warmup}
    body["spec"]["autotune"].update({k: v for k, v in windows.items() if v is not None}, **(autotune or {}))
    if status is not None:
        body["status"] = dict(status)
    return body


def a_service(body: Mapping[str, Any] | None = None) -> InferenceService:
    """``body`` (default :func:`a_service_body`) as the tuner reads it; it must be valid."""
    isvc = parse_service(a_service_body() if body is None else body)
    if isvc is None:
        raise ValueError("not a valid InferenceService body")
    return isvc


def a_condition(
    type_: str, status: str, reason: str, message: str, since: datetime = NOW - timedelta(minutes=1)
) -> dict[str, Any]:
    """A condition of the service's status as the API server returns it, set ``since``."""
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since.isoformat(),
    }
