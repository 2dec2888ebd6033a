"""The topology part of the API: defaults, inheritance of the pools' knobs, one knob vocabulary."""

from __future__ import annotations

from typing import Any

import pytest

from chunkpilot.api import (
    EngineConfig,
    InferenceService,
    KVConnector,
    ManifestError,
    PoolRole,
    PoolSpec,
    RouterPolicy,
    TopologyMode,
)


def service(**spec: Any) -> InferenceService:
    body = {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, "engine": {"kind": "sim"}, **spec}
    return InferenceService.from_manifest({"metadata": {"name": "chat"}, "spec": body})


DISAGGREGATED = {
    "mode": "disaggregated",
    "prefill": {"replicas": 1, "maxNumBatchedTokens": 8192, "maxNumSeqs": 16},
    "decode": {"replicas": 3, "maxNumBatchedTokens": 512},
}


def test_no_topology_is_colocated_and_has_no_pools() -> None:
    spec = service().spec
    assert spec.topology is None and not spec.disaggregated
    with pytest.raises(ValueError, match="no prefill pool"):
        spec.pool(PoolRole.PREFILL)
    assert not service(topology={"mode": "colocated"}).spec.disaggregated
    assert service().spec.autotune.allow_topology_change is False


def test_pool_knobs_override_the_engine_and_inherit_the_rest() -> None:
    spec = service(
        engine={"kind": "sim", "maxNumSeqs": 128, "longPrefillTokenThreshold": 256}, topology=DISAGGREGATED
    ).spec
    assert spec.disaggregated
    prefill, decode = spec.pool_config(PoolRole.PREFILL), spec.pool_config("decode")
    assert (prefill.max_num_batched_tokens, prefill.max_num_seqs) == (8192, 16)
    assert (decode.max_num_batched_tokens, decode.max_num_seqs) == (512, 128)  # seqs from spec.engine
    assert prefill.long_prefill_token_threshold == decode.long_prefill_token_threshold == 256
    assert spec.pool(PoolRole.DECODE).replicas == 3


def test_kv_transfer_and_router_defaults() -> None:
    spec = service(topology=DISAGGREGATED).spec
    assert spec.kv_transfer.connector == KVConnector.NIXL
    assert (spec.kv_transfer.bandwidth_gbps, spec.kv_transfer.latency_ms) == (25.0, 1.0)
    assert (
        spec.router.policy == RouterPolicy.CACHE_AWARE
        and spec.router.replicas == 1
        and spec.router.image is None
    )
    hinted = service(topology={**DISAGGREGATED, "kvTransfer": {"bandwidthGBps": 12.5, "latencyMs": 0.2}}).spec
    assert hinted.kv_transfer.bandwidth_gbps == 12.5
    assert hinted.topology is not None and hinted.topology.mode == TopologyMode.DISAGGREGATED
    assert hinted.to_k8s()["topology"]["kvTransfer"] == {
        "connector": "NixlConnector",
        "bandwidthGBps": 12.5,
        "latencyMs": 0.2,
    }


def test_pools_speak_the_tuned_knob_vocabulary() -> None:
    knobs = [name for name in PoolSpec.model_fields if name != "replicas"]
    assert tuple(knobs) == EngineConfig.KNOBS


def test_router_policies_are_vllm_routers_choices() -> None:
    # vllm-router 0.1.17 --policy choices (vllm_router/router_args.py).
    assert [p.value for p in RouterPolicy] == [
        "random", "round_robin", "cache_aware", "kv_aware", "power_of_two", "consistent_hash",
        "sticky_least_loaded",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("version", "accepted"),
    [("0.8.5", False), ("v0.8", False), ("0.9.0", True), ("0.10.1", True), ("0.33.0", True)],
)
def test_the_kv_connector_arrives_in_vllm_0_9(version: str, accepted: bool) -> None:
    def build() -> InferenceService:
        return service(engine={"kind": "vllm", "version": version}, topology=DISAGGREGATED)

    if accepted:
        assert build().spec.disaggregated
    else:
        with pytest.raises(ManifestError, match=r"needs vLLM 0\.9\.0 or later"):
            build()


def test_colocated_services_dump_without_topology() -> None:
    assert "topology" not in service().to_manifest()["spec"]
