"""KV transfer between prefill and decode engines: the link model, ``--kv-transfer-config``, and the
``kv_transfer_params`` a request carries (vLLM's NIXL connector protocol).

Both engines of a disaggregated pair run the same connector with ``kv_role`` ``kv_both``; each
request's ``kv_transfer_params`` decide its role, as in vLLM:

* ``{"do_remote_decode": true, ...}``: prefill only. The engine computes the prompt, emits one token,
  finishes, keeps the KV blocks (until the decode side has read them, at most
  ``VLLM_NIXL_ABORT_REQUEST_TIMEOUT`` seconds) and answers with the parameters for the decode side:
  ``do_remote_prefill``, ``remote_engine_id``, ``remote_block_ids``, ``remote_request_id``,
  ``remote_host``, ``remote_port``, ``tp_size``.
* ``{"do_remote_prefill": true, ...}`` (those parameters): decode. The engine allocates blocks for the
  prompt, receives its KV and decodes without computing the prompt.
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DEFAULT_ABORT_TIMEOUT_S",
    "DEFAULT_KV_BANDWIDTH_GBPS",
    "DEFAULT_KV_LATENCY_MS",
    "KVConnectorConfig",
    "KVTransfer",
    "KVTransferParamsError",
    "RemotePrefill",
    "parse_kv_transfer_config",
    "parse_kv_transfer_params",
]

#: vLLM's ``VLLM_NIXL_ABORT_REQUEST_TIMEOUT`` default: a prefill engine frees KV blocks no decode
#: engine has read after this many seconds.
DEFAULT_ABORT_TIMEOUT_S = 480.0
DEFAULT_KV_BANDWIDTH_GBPS = 25.0
DEFAULT_KV_LATENCY_MS = 1.0
#: Connectors vLLM registers (``KVConnectorFactory``); only these are simulated.
SIMULATED_CONNECTORS = ("NixlConnector",)
KNOWN_CONNECTORS = (
    "NixlConnector",
    "P2pNcclConnector",
    "LMCacheConnectorV1",
    "LMCacheMPConnector",
    "SharedStorageConnector",
    "ExampleConnector",
    "MultiConnector",
    "OffloadingConnector",
    "MooncakeConnector",
    "MoRIIOConnector",
    "DecodeBenchConnector",
)
KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")
#: The fields of vLLM's ``KVTransferConfig`` (an unknown one is an error there too).
_CONFIG_FIELDS: dict[str, tuple[type, ...]] = {
    "kv_connector": (str, type(None)),
    "engine_id": (str, type(None)),
    "kv_buffer_device": (str, type(None)),
    "kv_buffer_size": (int, float),
    "kv_role": (str, type(None)),
    "kv_rank": (int, type(None)),
    "kv_parallel_size": (int,),
    "kv_ip": (str,),
    "kv_port": (int,),
    "kv_connector_extra_config": (dict,),
    "kv_connector_module_path": (str, type(None)),
    "enable_permute_local_kv": (bool,),
    "kv_load_failure_policy": (str,),
}


@dataclass(frozen=True, slots=True)
class KVTransfer:
    """The KV-cache link between the pools: one request's KV takes ``bytes / bandwidth + latency``.

    ``bandwidth_gbps`` is in gigabytes (1e9 bytes) per second, ``latency_ms`` is paid once per
    request. Transfers do not share the bandwidth (each request sees the whole link).
    """

    bandwidth_gbps: float = DEFAULT_KV_BANDWIDTH_GBPS
    latency_ms: float = DEFAULT_KV_LATENCY_MS
    abort_timeout_s: float = DEFAULT_ABORT_TIMEOUT_S

    def __post_init__(self) -> None:
        if not (self.bandwidth_gbps > 0 and math.isfinite(self.bandwidth_gbps)):
            raise ValueError(f"--kv-bandwidth-gbps must be a positive number, not {self.bandwidth_gbps}")
        if not (self.latency_ms >= 0 and math.isfinite(self.latency_ms)):
            raise ValueError(f"--kv-latency-ms must be >= 0, not {self.latency_ms}")
        if not self.abort_timeout_s > 0:
            raise ValueError(f"the KV abort timeout must be positive, not {self.abort_timeout_s}")

    def seconds(self, num_bytes: int) -> float:
        """Time to move ``num_bytes`` of KV cache from a prefill to a decode engine."""
        return num_bytes / (self.bandwidth_gbps * 1e9) + self.latency_ms / 1e3


@dataclass(frozen=True, slots=True)
class KVConnectorConfig:
    """A validated ``--kv-transfer-config`` (vLLM's ``KVTransferConfig``)."""

    kv_connector: str
    kv_role: str
    engine_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def parse_kv_transfer_config(text: str | dict[str, Any]) -> KVConnectorConfig:
    """Parse and check ``--kv-transfer-config`` JSON (raises ValueError naming what is wrong)."""
    flag = "--kv-transfer-config"
    if isinstance(text, str):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{flag} is not valid JSON ({exc.msg})") from exc
    else:
        data = text
    if not isinstance(data, dict):
        raise ValueError(
            f'{flag} must be a JSON object such as {{"kv_connector":"NixlConnector","kv_role":"kv_both"}}'
        )
    unknown = sorted(set(data) - set(_CONFIG_FIELDS))
    if unknown:
        raise ValueError(f"{flag}: unknown field(s) {', '.join(unknown)}")
    for key, kinds in _CONFIG_FIELDS.items():
        value = data.get(key)
        if key in data and (not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds)):
            raise ValueError(f"{flag}: {key} has the wrong type ({type(value).__name__})")
    connector = data.get("kv_connector")
    if connector is None:
        raise ValueError(f"{flag}: kv_connector is required, e.g. NixlConnector")
    if connector not in KNOWN_CONNECTORS:
        raise ValueError(
            f"{flag}: unknown kv_connector {connector!r}; vLLM's are {', '.join(KNOWN_CONNECTORS)}"
        )
    if connector not in SIMULATED_CONNECTORS:
        raise ValueError(
            f"{flag}: kv_connector {connector} is not simulated; use {', '.join(SIMULATED_CONNECTORS)}"
        )
    role = data.get("kv_role")
    if role not in KV_ROLES:
        raise ValueError(f"{flag}: kv_role must be one of {', '.join(KV_ROLES)} (got {role!r})")
    policy = data.get("kv_load_failure_policy", "recompute")
    if policy not in ("recompute", "fail"):
        raise ValueError(f"{flag}: kv_load_failure_policy must be recompute or fail (got {policy!r})")
    return KVConnectorConfig(
        connector, role, data.get("engine_id"), dict(data.get("kv_connector_extra_config") or {})
    )


class KVTransferParamsError(ValueError):
    """A request's ``kv_transfer_params`` cannot be honoured (answered with 400)."""


@dataclass(frozen=True, slots=True)
class RemotePrefill:
    """Where a decode request's KV is: the prefill engine's answer, forwarded by the router."""

    engine_id: str
    request_id: str
    block_ids: tuple[int, ...]
    host: str
    port: int
    tp_size: int


_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)


def remote_host_problem(host: str) -> str | None:
    """Why ``host`` cannot be a prefill engine's address (None: it can).

    A host name or an IP address, nothing else (no scheme, user, port or path to smuggle into the
    URL the decode engine builds); not a link-local, multicast or unspecified address (a cloud's
    metadata endpoint is link-local), which no engine listens on.
    """
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None if _HOSTNAME.match(host) else "must be a host name or an IP address"
    if address.is_link_local or address.is_multicast or address.is_unspecified:
        return f"{host} is a link-local, multicast or unspecified address, not a prefill engine's"
    return None


def parse_kv_transfer_params(value: Any) -> bool | RemotePrefill | None:
    """The role ``kv_transfer_params`` give a request.

    None: neither (an ordinary request); True: prefill only (``do_remote_decode``); a
    :class:`RemotePrefill`: decode of a remote prefill. Raises :class:`KVTransferParamsError`.
    """
    if value is None:
        return None
    where = "kv_transfer_params"
    if not isinstance(value, dict):
        raise KVTransferParamsError(f"{where} must be a JSON object")
    decode = value.get("do_remote_decode", False)
    prefill = value.get("do_remote_prefill", False)
    for name, flag in (("do_remote_decode", decode), ("do_remote_prefill", prefill)):
        if not isinstance(flag, bool):
            raise KVTransferParamsError(f"{where}.{name} must be true or false")
    if decode and prefill:
        raise KVTransferParamsError(f"{where}: do_remote_decode and do_remote_prefill cannot both be true")
    if decode:
        return True
    if not prefill:
        return None
    missing = [
        k
        for k in ("remote_engine_id", "remote_request_id", "remote_block_ids", "remote_host", "remote_port")
        if value.get(k) is None
    ]
    if missing:
        raise KVTransferParamsError(
            f"{where} with do_remote_prefill needs {', '.join(missing)} (the prefill engine's "
            "kv_transfer_params, as its response returned them)"
        )
    engine_id, request_id, host = value["remote_engine_id"], value["remote_request_id"], value["remote_host"]
    for name, text in (
        ("remote_engine_id", engine_id),
        ("remote_request_id", request_id),
        ("remote_host", host),
    ):
        if not isinstance(text, str) or not text:
            raise KVTransferParamsError(f"{where}.{name} must be a non-empty string")
    host_problem = remote_host_problem(host)
    if host_problem:
        raise KVTransferParamsError(f"{where}.remote_host {host_problem}")
    port = value["remote_port"]
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        raise KVTransferParamsError(f"{where}.remote_port must be an integer in [1, 65535]")
    blocks = value["remote_block_ids"]
    if not isinstance(blocks, list) or not all(
        isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in blocks
    ):
        raise KVTransferParamsError(f"{where}.remote_block_ids must be a list of non-negative integers")
    tp = value.get("tp_size", 1)
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise KVTransferParamsError(f"{where}.tp_size must be a positive integer")
    return RemotePrefill(engine_id, request_id, tuple(blocks), host, port, tp)
