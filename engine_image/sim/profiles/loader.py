"""Model and accelerator profiles: loaded from the bundled JSON files, by alias, or from a path.

The model profiles are this package's ``models/*.json``; the accelerator profiles are the API's
(``chunkpilot.api.accelerators``), the one table of accelerator names, product labels and device
patterns, whose datasheet figures this module reads.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from chunkpilot.api.accelerators import profiles as accelerator_profiles

_DTYPE_BYTES = {
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "bf16": 2,
    "fp16": 2,
    "float32": 4,
    "float": 4,
    "fp8": 1,
    "float8": 1,
}


class ProfileError(ValueError):
    """A profile name or file could not be resolved or is malformed."""


@dataclass(frozen=True, slots=True)
class ModelProfile:
    """Dense decoder-only transformer architecture (the fields of a Hugging Face ``config.json``)."""

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    dtype_bytes: int = 2
    tie_word_embeddings: bool = False
    aliases: tuple[str, ...] = field(default=(), compare=False)

    @property
    def num_parameters(self) -> int:
        """Parameter count of the dense model (embeddings, attention, gated MLP, LM head)."""
        h, hd = self.hidden_size, self.head_dim
        attention = h * (self.num_heads + 2 * self.num_kv_heads) * hd + self.num_heads * hd * h
        mlp = 3 * h * self.intermediate_size
        per_layer = attention + mlp + 2 * h
        embeddings = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + embeddings + h

    @property
    def weight_bytes(self) -> int:
        """Bytes of all weights at the profile's dtype."""
        return self.num_parameters * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one token occupies across all layers (all tensor-parallel ranks together)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @classmethod
    def from_config(cls, config: dict[str, Any], name: str | None = None) -> ModelProfile:
        """Build a profile from a Hugging Face ``config.json`` dictionary."""
        try:
            hidden = int(config["hidden_size"])
            heads = int(config["num_attention_heads"])
            dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
            if dtype not in _DTYPE_BYTES:
                raise ProfileError(f"unsupported torch_dtype {dtype!r}; use one of {sorted(_DTYPE_BYTES)}")
            return cls(
                name=name or str(config.get("name") or config.get("_name_or_path") or "custom"),
                hidden_size=hidden,
                num_layers=int(config["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(config.get("num_key_value_heads") or heads),
                head_dim=int(config.get("head_dim") or hidden // heads),
                intermediate_size=int(config["intermediate_size"]),
                vocab_size=int(config["vocab_size"]),
                max_position_embeddings=int(config.get("max_position_embeddings") or 4096),
                dtype_bytes=_DTYPE_BYTES[dtype],
                tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
                aliases=tuple(str(a) for a in config.get("aliases", ())),
            )
        except KeyError as exc:
            raise ProfileError(
                f"model config lacks field {exc.args[0]!r}; a Hugging Face config.json of a dense "
                "decoder-only model is expected"
            ) from exc


@dataclass(frozen=True, slots=True)
class Accelerator:
    """Datasheet figures of one accelerator (dense BF16, no sparsity)."""

    name: str
    peak_flops: float
    hbm_bytes_per_s: float
    memory_bytes: int
    interconnect_bytes_per_s: float
    allreduce_latency_s: float
    description: str = ""
    aliases: tuple[str, ...] = field(default=(), compare=False)

    @property
    def ridge_point(self) -> float:
        """Arithmetic intensity (FLOP/byte) where the roofline turns compute-bound."""
        return self.peak_flops / self.hbm_bytes_per_s

    @classmethod
    def from_dict(cls, data: dict[str, Any], name: str | None = None) -> Accelerator:
        """Build an accelerator from the JSON shape of the bundled profiles."""
        try:
            return cls(
                name=name or str(data["name"]),
                peak_flops=float(data["peak_tflops"]) * 1e12,
                hbm_bytes_per_s=float(data["hbm_tb_s"]) * 1e12,
                memory_bytes=int(float(data["memory_gib"]) * 2**30),
                interconnect_bytes_per_s=float(data.get("interconnect_gb_s", 300.0)) * 1e9,
                allreduce_latency_s=float(data.get("allreduce_latency_us", 8.0)) * 1e-6,
                description=str(data.get("description", "")),
                aliases=tuple(str(a) for a in data.get("aliases", ())),
            )
        except KeyError as exc:
            raise ProfileError(
                f"accelerator profile lacks field {exc.args[0]!r} (needs peak_tflops, hbm_tb_s, memory_gib)"
            ) from exc


def _bundled(package: str) -> dict[str, dict[str, Any]]:
    result: dict[str, dict[str, Any]] = {}
    for entry in resources.files(package).iterdir():
        if entry.name.endswith(".json"):
            data = json.loads(entry.read_text(encoding="utf-8"))
            result[str(data["name"])] = data
    return result


@cache
def _models() -> dict[str, dict[str, Any]]:
    return _bundled("chunkpilot.engine.sim.profiles.models")


@cache
def _accelerators() -> dict[str, dict[str, Any]]:
    return {name: dict(profile.document) for name, profile in accelerator_profiles().items()}


def model_names() -> list[str]:
    """Names of the built-in model profiles."""
    return sorted(_models())


def accelerator_names() -> list[str]:
    """Names of the built-in accelerator profiles."""
    return sorted(_accelerators())


def normalise(name: str) -> str:
    """The lookup key of a profile name or alias: lower case, runs of other characters as one ``-``.

    ``meta-llama/Llama-3.1-8B``, ``Meta-Llama Llama 3.1 8B`` and ``meta_llama/llama-3.1-8b`` are one key.
    """
    return re.sub(r"[^a-z0-9.]+", "-", name.lower()).strip("-")


def _resolve(key: str, table: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    wanted = normalise(key)
    for name, data in table.items():
        if wanted == normalise(name) or wanted in (normalise(str(a)) for a in data.get("aliases", ())):
            return data
    return None


def _read_json(path: Path) -> Any:
    """The JSON document in the profile file ``path`` (:class:`ProfileError` when it is not JSON)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{path}: not valid JSON ({exc})") from exc


def load_model(name_or_path: str) -> ModelProfile:
    """Resolve a built-in profile name, a Hugging Face id alias, or a path to a ``config.json``."""
    data = _resolve(name_or_path, _models())
    if data is not None:
        return ModelProfile.from_config(data)
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        config = _read_json(path)
        return ModelProfile.from_config(config, name=str(config.get("name") or path.parent.name or path.stem))
    raise ProfileError(
        f"unknown model {name_or_path!r}: use one of {', '.join(model_names())}, a Hugging Face id "
        "they alias, or a path to a config.json"
    )


def load_accelerator(name_or_path: str) -> Accelerator:
    """Resolve a built-in accelerator name or a path to an accelerator JSON file."""
    data = _resolve(name_or_path, _accelerators())
    if data is not None:
        return Accelerator.from_dict(data)
    path = Path(name_or_path)
    if path.is_file():
        return Accelerator.from_dict(_read_json(path), name=path.stem)
    raise ProfileError(
        f"unknown accelerator {name_or_path!r}: use one of {', '.join(accelerator_names())} "
        "or a path to an accelerator JSON file"
    )
