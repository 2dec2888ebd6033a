"""A hidden truth for the twin: the simulator on hardware that differs from its datasheet.

The accelerator profile's peaks are scaled (``peak_tflops``, ``hbm_tb_s``) and the per-step
overheads multiplied through a step profile, so a truth engine is an ordinary :class:`SimConfig`
(``accelerator`` and ``step_profile`` paths) that the tuner is never shown.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

from chunkpilot.engine.sim.engine import SimConfig
from chunkpilot.engine.sim.profiles.loader import load_accelerator, load_model, normalise
from chunkpilot.engine.sim.scheduler import SchedulerConfig
from chunkpilot.engine.sim.steptime import STEP_PROFILE_SCHEMA, Efficiency, StepTimeModel
from chunkpilot.tuner.twin.fit import PROFILE_TOKENS

__all__ = ["Perturbation", "write_truth"]


@dataclass(frozen=True, slots=True)
class Perturbation:
    """How the truth engine differs from the datasheet (1.0 = as the datasheet says)."""

    compute: float = 1.0
    memory: float = 1.0
    overhead: float = 1.0

    @property
    def label(self) -> str:
        return f"compute x{self.compute:g}, HBM x{self.memory:g}, overhead x{self.overhead:g}"


def _accelerator_json(name: str) -> dict[str, object]:
    key = normalise(name)
    for entry in resources.files("chunkpilot.engine.sim.profiles.accelerators").iterdir():
        if entry.name.endswith(".json"):
            data: dict[str, object] = json.loads(entry.read_text(encoding="utf-8"))
            aliases = [normalise(str(a)) for a in data.get("aliases", ())]  # type: ignore[attr-defined]
            if normalise(str(data["name"])) == key or key in aliases:
                return data
    raise ValueError(f"unknown accelerator {name!r}")


def write_truth(
    directory: Path,
    perturbation: Perturbation,
    *,
    model: str = "llama-3.1-8b",
    accelerator: str = "h100",
    tensor_parallel_size: int = 1,
    scheduler: SchedulerConfig | None = None,
) -> SimConfig:
    """Write the truth's accelerator and step profile under ``directory``; the engine config using them."""
    directory.mkdir(parents=True, exist_ok=True)
    data = dict(_accelerator_json(accelerator))
    data["peak_tflops"] = float(data["peak_tflops"]) * perturbation.compute  # type: ignore[arg-type]
    data["hbm_tb_s"] = float(data["hbm_tb_s"]) * perturbation.memory  # type: ignore[arg-type]
    data["aliases"] = []
    data["name"] = f"{data['name']}-truth"
    accel_path = directory / "truth-accelerator.json"
    accel_path.write_text(json.dumps(data) + "\n", encoding="utf-8")
    base = Efficiency.calibrated()
    eff = replace(
        base,
        step_overhead_s=base.step_overhead_s * perturbation.overhead,
        per_sequence_overhead_s=base.per_sequence_overhead_s * perturbation.overhead,
    )
    step_model = StepTimeModel(
        load_model(model), load_accelerator(str(accel_path)), tensor_parallel_size, efficiency=eff
    )
    profile = {
        "schema": STEP_PROFILE_SCHEMA,
        "model": model,
        "accelerator": str(accel_path),
        "tensor_parallel_size": tensor_parallel_size,
        "linear_ms": {str(t): step_model.linear_time(t) * 1e3 for t in PROFILE_TOKENS},
        "efficiency": {
            "step_overhead_s": eff.step_overhead_s,
            "per_sequence_overhead_s": eff.per_sequence_overhead_s,
        },
    }
    profile_path = directory / "truth-step-profile.json"
    profile_path.write_text(json.dumps(profile, indent=1) + "\n", encoding="utf-8")
    return SimConfig(
        model=model,
        accelerator=str(accel_path),
        tensor_parallel_size=tensor_parallel_size,
        scheduler=scheduler or SchedulerConfig(),
        step_profile=str(profile_path),
    )
