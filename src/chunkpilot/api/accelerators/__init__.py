"""The accelerator profiles: one JSON file per accelerator, the one table of accelerator facts.

Each ``<name>.json`` next to this module holds:

- ``name`` (the file's stem) and ``aliases``: how the simulator's ``--gpu``, the tuner and the API
  name it (aliases match whatever their case and separators);
- ``description``: the card, in words;
- ``gpu_product``: the ``nvidia.com/gpu.product`` label NVIDIA's GPU feature discovery puts on a node
  with this GPU (the local control plane's fake nodes carry it). A profile without one is no GPU a
  node offers (``generic-cpu``, the twin's prior for vLLM's CPU backend). The API's accelerators,
  ``spec.resources.accelerator``, are exactly the profiles with a ``gpu_product``:
  ``tests/api/test_accelerators.py`` proves the ``Accelerator`` enum (declared member by member so
  that ``Accelerator.H100`` type-checks) and this table agree;
- ``device_patterns``: regular expressions searched for in the lower-cased CUDA device name
  (``NVIDIA A100-SXM4-80GB``) by which the probe recognises the GPU; where several profiles match
  (the A100's 40 and 80 GB), the one whose ``memory_gib`` is nearest the device's memory wins;
- the datasheet figures the simulator reads (``peak_tflops``, ``hbm_tb_s``, ``memory_gib``,
  ``interconnect_gb_s``, ``allreduce_latency_us``; see ``chunkpilot.engine.sim.profiles.loader``).

This module only reads the files: the layers above (simulator, probe, local control plane) take
their accelerator names, product labels and device patterns from here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from types import MappingProxyType
from typing import Any

__all__ = ["AcceleratorProfile", "gpu_products", "matching_device", "profiles"]


@dataclass(frozen=True, slots=True)
class AcceleratorProfile:
    """One accelerator profile file: its identity and, in ``document``, every field as read."""

    name: str
    description: str
    memory_gib: float
    gpu_product: str | None = None
    device_patterns: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    document: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def matches_device(self, device_name: str) -> bool:
        """Whether one of ``device_patterns`` is found in the lower-cased ``device_name``."""
        lowered = device_name.lower()
        return any(re.search(pattern, lowered) for pattern in self.device_patterns)

    @classmethod
    def from_document(cls, data: Mapping[str, Any], source: str) -> AcceleratorProfile:
        """The profile of one file's JSON object; :class:`ValueError` naming ``source`` if malformed."""
        try:
            name = str(data["name"])
            memory_gib = float(data["memory_gib"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{source}: an accelerator profile needs a name and memory_gib ({exc})") from exc
        product = data.get("gpu_product")
        if product is not None and (not isinstance(product, str) or not product):
            raise ValueError(f"{source}: gpu_product must be a non-empty string")
        patterns = tuple(str(p) for p in data.get("device_patterns", ()))
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(
                    f"{source}: device pattern {pattern!r} is no regular expression ({exc})"
                ) from exc
        return cls(
            name=name,
            description=str(data.get("description", "")),
            memory_gib=memory_gib,
            gpu_product=product,
            device_patterns=patterns,
            aliases=tuple(str(a) for a in data.get("aliases", ())),
            document=MappingProxyType(dict(data)),
        )


@cache
def _profiles() -> dict[str, AcceleratorProfile]:
    found: dict[str, AcceleratorProfile] = {}
    for entry in sorted(resources.files(__name__).iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".json"):
            continue
        profile = AcceleratorProfile.from_document(json.loads(entry.read_text(encoding="utf-8")), entry.name)
        if profile.name in found:
            raise ValueError(f"{entry.name}: accelerator {profile.name!r} is defined twice")
        found[profile.name] = profile
    return found


def profiles() -> dict[str, AcceleratorProfile]:
    """Every bundled accelerator profile by name, in name order."""
    return dict(_profiles())


def gpu_products() -> dict[str, str]:
    """The GPU accelerators (those an InferenceService may name) and their ``nvidia.com/gpu.product``."""
    return {p.name: p.gpu_product for p in _profiles().values() if p.gpu_product is not None}


def matching_device(device_name: str, memory_bytes: int) -> AcceleratorProfile | None:
    """The profile a CUDA device is: its name matches the profile's ``device_patterns``; of several
    matches (the A100's 40 and 80 GB), the one whose memory is nearest ``memory_bytes``."""
    matches = [p for p in _profiles().values() if p.matches_device(device_name)]
    if not matches:
        return None
    return min(matches, key=lambda p: (abs(p.memory_gib * 2**30 - memory_bytes), p.name))
