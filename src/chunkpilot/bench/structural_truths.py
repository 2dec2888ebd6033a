"""Hidden truths of another structure: step profiles built from measured kernel curves.

The perturbed truths (:mod:`chunkpilot.bench.twin_truth`) share the twin's structure: the datasheet
roofline with its compute, memory and overhead terms scaled. A structural truth departs from it in
shape, as real GPUs do, and is a ``chunkpilot.io/step-profile/v1`` document the simulated engine
loads (``chunkpilot bench tuner --truth-step-profile FILE``, or every shipped one with
``--truth-family structural``):

* **linear layers** follow the *measured* A100 curve of the same operators, rescaled to the model's
  GEMM shapes and to the H100's datasheet peaks: for each GEMM and token count ``n`` the measured
  time's ratio to the A100's ideal roofline (100% of its peaks) is kept and multiplied by the H100's
  ideal roofline, so the launch floor at small batches, tile quantisation and the measured knee stay
  (the roofline's smooth curve does not); optionally slowed by a constant factor;
* **attention** (prefill compute, decode memory) and **element-wise kernels** run at efficiencies
  unlike the linear layers' (the twin scales them together with the linear layers);
* **CPU overheads** of milliseconds per step and tens of microseconds per sequence, several prior
  standard deviations of the twin's overhead scales away from the datasheet's 0.6 ms and 5 µs.

The measurements are the medians of the Vidur project's per-operator profiles (microsoft/vidur,
``data/profiling/compute/a100/*/mlp.csv``; MIT licence, (c) Microsoft Corporation), measured on an
NVIDIA A100 80GB and reduced in ``chunkpilot.engine.sim.calibration`` (``a100_reference.csv``); this
module reads only that reduced table. The family is shipped for the models the benchmarks run
(:data:`SHIPPED_MODELS`: the tuner benchmark's Llama-3.1-8B as ``<name>.json``, the autoscaling
benchmark's Qwen2.5-32B as ``<name>.qwen2.5-32b.json``). Rewrite the shipped files with::

    python -m chunkpilot.bench.structural_truths --write src/chunkpilot/bench/truths
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Final

from chunkpilot.engine.sim.calibration.fit import GEMM_OPERATORS, load_reference
from chunkpilot.engine.sim.profiles.loader import Accelerator, ModelProfile, load_accelerator, load_model
from chunkpilot.engine.sim.steptime import STEP_PROFILE_SCHEMA

__all__ = [
    "REFERENCE_ACCELERATOR",
    "REFERENCE_MODEL",
    "SHIPPED_MODELS",
    "STRUCTURAL_FAMILY",
    "StructuralTruth",
    "gemm_shapes",
    "measured_linear_ms",
    "structural_family",
    "structural_profile",
    "write_family",
]

#: The reference rows the curve is taken from: the measured model closest to the benchmark's
#: Llama-3.1-8B (the same shapes), on one GPU, and the accelerator they were measured on.
REFERENCE_MODEL: Final = "llama-3-8b"
REFERENCE_ACCELERATOR: Final = "a100-80gb"
SOURCE: Final = (
    "linear layers: median per-operator GEMM times of the Vidur project's A100-80GB profiles "
    "(microsoft/vidur data/profiling/compute/a100/*/mlp.csv; MIT licence, (c) Microsoft Corporation), "
    "rescaled from the A100's to the target's ideal roofline per GEMM and token count"
)
#: The models the family is shipped for: the tuner benchmark's (its files ``<name>.json``) and the
#: autoscaling benchmark's (``<name>.<model>.json``).
SHIPPED_MODELS: Final = ("llama-3.1-8b", "qwen2.5-32b")
_ELEMENTWISE = ("norm_memory", "rope_memory", "activation_memory", "residual_add_memory", "embedding_memory")


@dataclass(frozen=True, slots=True)
class StructuralTruth:
    """How one structural truth departs from the datasheet roofline."""

    #: Every linear layer's measured-and-rescaled time multiplied by this (1 = the A100's achieved
    #: fraction of its peaks carried to the H100's).
    linear_slowdown: float
    attention_compute: float
    attention_memory: float
    #: The fraction of the HBM bandwidth every element-wise kernel reaches.
    elementwise_memory: float
    step_overhead_s: float
    per_sequence_overhead_s: float

    @property
    def label(self) -> str:
        return (
            f"measured A100 linear curve on H100 peaks x{self.linear_slowdown:g}, attention "
            f"{self.attention_compute:g} compute / {self.attention_memory:g} HBM, element-wise "
            f"{self.elementwise_memory:g} HBM, overheads {self.step_overhead_s * 1e3:g} ms/step + "
            f"{self.per_sequence_overhead_s * 1e6:g} us/sequence"
        )

    def efficiency(self) -> dict[str, float]:
        """The step profile's ``efficiency`` overrides (everything the linear curve does not hold)."""
        return {
            "attention_compute": self.attention_compute,
            "attention_memory": self.attention_memory,
            **dict.fromkeys(_ELEMENTWISE, self.elementwise_memory),
            "step_overhead_s": self.step_overhead_s,
            "per_sequence_overhead_s": self.per_sequence_overhead_s,
        }


#: The shipped structural family (the twin's datasheet: linear at 0.73 compute / 0.79 HBM, attention
#: 0.6 / 0.75, element-wise 0.15-1.0, 0.6 ms per step and 5 us per sequence, overheads trusted to a
#: factor 2.7): slow prefill attention with vLLM-like overheads; attention faster than the linear
#: layers with a heavy per-sequence cost; linear layers below the A100's achieved fraction with slow
#: decode attention and a long step overhead; very slow attention with the largest per-sequence cost.
STRUCTURAL_FAMILY: Final[dict[str, StructuralTruth]] = {
    "h100-vidur-a035-o3ms": StructuralTruth(1.0, 0.35, 0.55, 0.3, 3e-3, 30e-6),
    "h100-vidur-a085-o2ms": StructuralTruth(1.0, 0.85, 0.9, 0.6, 2e-3, 50e-6),
    "h100-vidur-l125-o5ms": StructuralTruth(1.25, 0.3, 0.4, 0.2, 5e-3, 20e-6),
    "h100-vidur-a025-o1ms": StructuralTruth(1.0, 0.25, 0.6, 0.25, 1e-3, 80e-6),
}


def gemm_shapes(model: ModelProfile, tensor_parallel_size: int = 1) -> dict[str, tuple[int, int]]:
    """``(d_in, d_out)`` of each GEMM of one layer on one rank, by reference operator name."""
    m, tp = model, tensor_parallel_size
    return {
        "attn_pre_proj": (m.hidden_size, (m.num_heads + 2 * m.num_kv_heads) * m.head_dim // tp),
        "attn_post_proj": (m.num_heads * m.head_dim // tp, m.hidden_size),
        "mlp_up_proj": (m.hidden_size, 2 * m.intermediate_size // tp),
        "mlp_down_proj": (m.intermediate_size // tp, m.hidden_size),
    }


def _ideal(tokens: int, d_in: int, d_out: int, dtype_bytes: int, gpu: Accelerator) -> float:
    """Seconds of one GEMM at 100% of the peaks (no blending, no floor)."""
    flops = 2.0 * tokens * d_in * d_out
    moved = dtype_bytes * (d_in * d_out + tokens * (d_in + d_out))
    return max(flops / gpu.peak_flops, moved / gpu.hbm_bytes_per_s)


def measured_linear_ms(
    model: str = "llama-3.1-8b", accelerator: str = "h100", tensor_parallel_size: int = 1
) -> dict[int, float]:
    """All linear layers of one pass (ms) by measured token count, the A100 curve rescaled per GEMM."""
    target, gpu = load_model(model), load_accelerator(accelerator)
    reference_gpu = load_accelerator(REFERENCE_ACCELERATOR)
    shapes = gemm_shapes(target, tensor_parallel_size)
    per_layer: dict[int, float] = defaultdict(float)
    for row in load_reference():
        if row.model != REFERENCE_MODEL or row.tp != 1 or row.operator not in GEMM_OPERATORS:
            continue
        n = row.num_tokens
        measured_over_ideal = row.measured_s / _ideal(n, row.d_in, row.d_out, 2, reference_gpu)
        d_in, d_out = shapes[row.operator]
        per_layer[n] += measured_over_ideal * _ideal(n, d_in, d_out, target.dtype_bytes, gpu)
    return {n: per_layer[n] * target.num_layers * 1e3 for n in sorted(per_layer)}


def structural_profile(
    name: str,
    truth: StructuralTruth,
    *,
    model: str = "llama-3.1-8b",
    accelerator: str = "h100",
    tensor_parallel_size: int = 1,
) -> dict[str, Any]:
    """The step-profile document of one structural truth."""
    linear = measured_linear_ms(model, accelerator, tensor_parallel_size)
    return {
        "schema": STEP_PROFILE_SCHEMA,
        "name": name,
        "description": truth.label,
        "model": model,
        "accelerator": accelerator,
        "tensor_parallel_size": tensor_parallel_size,
        "linear_ms": {str(n): float(f"{ms * truth.linear_slowdown:.6g}") for n, ms in linear.items()},
        "efficiency": truth.efficiency(),
        "truth": {
            "structure": "measured",
            "source": SOURCE,
            "reference_model": REFERENCE_MODEL,
            "reference_accelerator": REFERENCE_ACCELERATOR,
            "linear_slowdown": truth.linear_slowdown,
        },
    }


def _file_name(name: str, model: str) -> str:
    return f"{name}.json" if model == SHIPPED_MODELS[0] else f"{name}.{model}.json"


def write_family(directory: Path, models: tuple[str, ...] = SHIPPED_MODELS) -> list[Path]:
    """Write every member of :data:`STRUCTURAL_FAMILY` for each of ``models`` under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for model in models:
        for name, truth in STRUCTURAL_FAMILY.items():
            path = directory / _file_name(name, model)
            document = structural_profile(name, truth, model=model)
            path.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
            written.append(path)
    return written


def structural_family(model: str = SHIPPED_MODELS[0]) -> dict[str, Path]:
    """The shipped structural truths of ``model`` by name (step-profile files inside the installed
    package); :class:`ValueError` for a model they are not shipped for."""
    if model not in SHIPPED_MODELS:
        raise ValueError(
            f"the structural truths are shipped for {', '.join(SHIPPED_MODELS)}, not {model}; write them "
            "for it with structural_profile(name, truth, model=...)"
        )
    root = resources.files("chunkpilot.bench.truths")
    return {name: Path(str(root.joinpath(_file_name(name, model)))) for name in STRUCTURAL_FAMILY}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m chunkpilot.bench.structural_truths", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--write", metavar="DIR", type=Path, required=True, help="folder for the JSON files")
    args = parser.parse_args(argv)
    for path in write_family(args.write):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
