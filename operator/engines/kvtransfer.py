"""The KV transfer of a disaggregated service: what a prefill or decode engine adds to its recipe.

Both pools run vLLM's KV-transfer connector in role ``kv_both`` (as vLLM's NIXL examples do):
the router asks the prefill engine for the KV blocks (``do_remote_decode``) and hands their
address to the decode engine, which pulls them. vLLM's NIXL connector advertises its side
channel at ``VLLM_NIXL_SIDE_CHANNEL_HOST:VLLM_NIXL_SIDE_CHANNEL_PORT`` (localhost and 5600 by
default), so a pod advertises its own IP. The simulator takes the same ``--kv-transfer-config``
and side-channel host, and models the transfer from two flags of its own, the bandwidth and
latency hints.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, Final

from chunkpilot.operator.engines.common import EngineRender

from chunkpilot.api import EngineKind, InferenceServiceSpec

#: vLLM's ``kv_role`` for both pools: each engine can send and receive KV blocks.
KV_ROLE: Final = "kv_both"
#: The NIXL side-channel port (vLLM's default) and its container port name.
NIXL_SIDE_CHANNEL_PORT: Final = 5600
NIXL_PORT_NAME: Final = "nixl"
#: The simulator's flags for the transfer time of a request: KV bytes / bandwidth + latency.
SIM_BANDWIDTH_FLAG: Final = "--kv-bandwidth-gbps"
SIM_LATENCY_FLAG: Final = "--kv-latency-ms"


def kv_transfer_config(spec: InferenceServiceSpec) -> str:
    """The ``--kv-transfer-config`` JSON of ``spec``'s connector (compact, sorted keys)."""
    config = {"kv_connector": str(spec.kv_transfer.connector), "kv_role": KV_ROLE}
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


def kv_transfer_args(spec: InferenceServiceSpec) -> list[str]:
    """The engine flags of the KV transfer; the simulator also gets its bandwidth and latency hints."""
    args = ["--kv-transfer-config", kv_transfer_config(spec)]
    if spec.engine.kind == EngineKind.SIM:
        transfer = spec.kv_transfer
        args += [
            SIM_BANDWIDTH_FLAG,
            f"{transfer.bandwidth_gbps:g}",
            SIM_LATENCY_FLAG,
            f"{transfer.latency_ms:g}",
        ]
    return args


def nixl_env() -> list[dict[str, Any]]:
    """vLLM's NIXL side channel on the pod's own address (its default host is localhost)."""
    return [
        {"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": str(NIXL_SIDE_CHANNEL_PORT)},
    ]


def with_kv_transfer(spec: InferenceServiceSpec, render: EngineRender) -> EngineRender:
    """``render`` of one pool's engine with the KV transfer added (flags last, after extraArgs).

    Both engines advertise the pod's address as the side-channel host (the simulator serves
    its side channel on the API port, so only vLLM gets the NIXL port).
    """
    ports = list(render.extra_ports)
    if spec.engine.kind == EngineKind.VLLM:
        ports.append({"name": NIXL_PORT_NAME, "containerPort": NIXL_SIDE_CHANNEL_PORT, "protocol": "TCP"})
    return replace(
        render,
        args=[*render.args, *kv_transfer_args(spec)],
        env=[*render.env, *nixl_env()],
        extra_ports=ports,
    )


__all__ = [
    "KV_ROLE",
    "NIXL_PORT_NAME",
    "NIXL_SIDE_CHANNEL_PORT",
    "SIM_BANDWIDTH_FLAG",
    "SIM_LATENCY_FLAG",
    "kv_transfer_args",
    "kv_transfer_config",
    "nixl_env",
    "with_kv_transfer",
]
