"""A hidden truth for the twin: the simulator on hardware that differs from its datasheet.

The accelerator profile's peaks are scaled (``peak_tflops``, ``hbm_tb_s``) and the per-step
overheads multiplied through a step profile, so a truth engine is an ordinary :class:`SimConfig`
(``accelerator`` and ``step_profile`` paths) that the tuner is never shown.

A truth can also be an accelerator profile JSON file (``chunkpilot bench tuner --truth-gpu``): the
simulator's own format, optionally with a ``"truth"`` object whose ``overhead`` multiplies the
per-step and per-sequence overheads. The package ships a family of perturbed H100 profiles
(:func:`family`) in that format.

A truth of another structure brings its own step profile (``--truth-step-profile``, the simulator's
``chunkpilot.io/step-profile/v1``; the shipped ones are in :mod:`chunkpilot.bench.structural_truths`):
it replaces the roofline's linear layers and sets its efficiencies and overheads, on the accelerator
profile given or on the datasheet accelerator (:func:`read_truth_step_profile`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

from chunkpilot.api.accelerators import profiles as accelerator_profiles
from chunkpilot.engine.sim.engine import SimConfig
from chunkpilot.engine.sim.profiles.loader import load_accelerator, load_model, normalise
from chunkpilot.engine.sim.scheduler import SchedulerConfig
from chunkpilot.engine.sim.steptime import STEP_PROFILE_SCHEMA, Efficiency, StepProfile, StepTimeModel
from chunkpilot.tuner.twin.fit import PROFILE_TOKENS

__all__ = [
    "FAMILY",
    "Perturbation",
    "family",
    "perturbed_accelerator",
    "read_perturbation",
    "read_truth_step_profile",
    "step_profile_label",
    "truth_engine",
    "write_truth",
]


@dataclass(frozen=True, slots=True)
class Perturbation:
    """How the truth engine differs from the datasheet (1.0 = as the datasheet says)."""

    compute: float = 1.0
    memory: float = 1.0
    overhead: float = 1.0

    @property
    def label(self) -> str:
        return f"compute x{self.compute:g}, HBM x{self.memory:g}, overhead x{self.overhead:g}"


#: The fields of an accelerator profile that name real hardware (its node label, its device names):
#: a truth is hardware no node and no probe names, so its profile has neither.
_HARDWARE_IDENTITY = ("gpu_product", "device_patterns")


def _accelerator_json(name: str) -> dict[str, object]:
    key = normalise(name)
    for profile in accelerator_profiles().values():
        if normalise(profile.name) == key or key in (normalise(a) for a in profile.aliases):
            return dict(profile.document)
    raise ValueError(f"unknown accelerator {name!r}")


def perturbed_accelerator(perturbation: Perturbation, accelerator: str = "h100") -> dict[str, Any]:
    """The accelerator profile JSON of ``accelerator`` with its peaks scaled and the overhead recorded."""
    data: dict[str, Any] = {
        k: v for k, v in _accelerator_json(accelerator).items() if k not in _HARDWARE_IDENTITY
    }
    data["peak_tflops"] = round(float(data["peak_tflops"]) * perturbation.compute, 6)
    data["hbm_tb_s"] = round(float(data["hbm_tb_s"]) * perturbation.memory, 6)
    data["aliases"] = []
    data["name"] = f"{data['name']}-truth"
    data["description"] = f"{data.get('description', data['name'])}, {perturbation.label}"
    data["truth"] = {
        "based_on": accelerator,
        "compute": perturbation.compute,
        "memory": perturbation.memory,
        "overhead": perturbation.overhead,
    }
    return data


def _json_object(path: Path, what: str, hint: str = "") -> dict[str, Any]:
    """The JSON object in ``path``; ValueError naming the file, ``what`` it should be and ``hint``."""
    suffix = f"; {hint}" if hint else ""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read {what} ({exc}){suffix}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: {what} is a JSON object{suffix}")
    return data


def read_perturbation(path: Path) -> tuple[dict[str, Any], float]:
    """An accelerator profile file and its overhead factor (1 without a ``"truth"`` object).

    Raises :class:`ValueError` naming the file when it is not a usable profile.
    """
    data = _json_object(path, "an accelerator profile")
    missing = [k for k in ("peak_tflops", "hbm_tb_s", "memory_gib") if k not in data]
    if missing:
        raise ValueError(f"{path}: accelerator profile lacks {', '.join(missing)}")
    truth = data.get("truth", {})
    overhead = float(truth.get("overhead", 1.0)) if isinstance(truth, dict) else 1.0
    if not overhead > 0:
        raise ValueError(f"{path}: truth.overhead must be positive")
    return data, overhead


_OVERHEAD_FIELDS = ("step_overhead_s", "per_sequence_overhead_s")
_STEP_PROFILE_HINT = (
    f"give a {STEP_PROFILE_SCHEMA} JSON (docs/probe.md; the shipped ones: --truth-family structural)"
)


def read_truth_step_profile(
    path: Path, *, model: str, tensor_parallel_size: int = 1, overhead: float = 1.0
) -> dict[str, Any]:
    """A step-profile file as the truth's: its document, the accelerator's overhead factor applied.

    Raises :class:`ValueError` naming the file when it is no step profile, when it was made for
    another model or tensor-parallel size, or when it sets an overhead that the accelerator profile's
    ``truth.overhead`` (``overhead`` here, other than 1) would scale too.
    """
    data = _json_object(path, "a step profile", _STEP_PROFILE_HINT)
    try:
        profile = StepProfile.from_dict(data, source=str(path))
    except (TypeError, ValueError) as exc:
        reason = str(exc) if str(exc).startswith(str(path)) else f"{path}: {exc}"
        raise ValueError(f"{reason}; {_STEP_PROFILE_HINT}") from exc
    wanted = load_model(model)
    if profile.model:
        try:
            named = load_model(profile.model).name
        except ValueError:
            named = profile.model
        if named != wanted.name:
            raise ValueError(
                f"{path}: made for model {profile.model!r}, the benchmark runs {wanted.name}; "
                "give a step profile of the benchmark's model"
            )
    if profile.tensor_parallel_size != tensor_parallel_size:
        raise ValueError(
            f"{path}: made for tensor_parallel_size {profile.tensor_parallel_size}, the benchmark runs "
            f"{tensor_parallel_size}"
        )
    document = dict(data)
    if overhead != 1.0:
        clash = [name for name in _OVERHEAD_FIELDS if name in profile.efficiency]
        if clash:
            raise ValueError(
                f"{path} sets {', '.join(clash)} and the accelerator profile's truth.overhead "
                f"({overhead:g}) scales the overheads too: drop one of the two"
            )
        base = Efficiency.calibrated()
        document["efficiency"] = {
            **profile.efficiency,
            **{name: getattr(base, name) * overhead for name in _OVERHEAD_FIELDS},
        }
    return document


def step_profile_label(path: Path) -> str:
    """The step profile's ``description`` (its file name without one)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return path.stem
    return str(data.get("description", path.stem)) if isinstance(data, dict) else path.stem


def _write_step_profile(
    directory: Path, accel_path: Path, overhead: float, model: str, tensor_parallel_size: int
) -> Path:
    base = Efficiency.calibrated()
    eff = replace(
        base,
        step_overhead_s=base.step_overhead_s * overhead,
        per_sequence_overhead_s=base.per_sequence_overhead_s * overhead,
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
    return profile_path


def truth_engine(
    profile: Path | None,
    directory: Path,
    *,
    model: str = "llama-3.1-8b",
    tensor_parallel_size: int = 1,
    scheduler: SchedulerConfig | None = None,
    accelerator: str = "h100",
    step_profile: Path | None = None,
) -> SimConfig:
    """The engine of an accelerator profile file (its overhead factor applied), files under ``directory``.

    Without ``profile`` the truth's hardware is the datasheet ``accelerator``; with ``step_profile``
    the truth's linear layers, efficiencies and overheads are that profile's (a copy under
    ``directory``), not the roofline's.
    """
    if profile is None:
        data, overhead = perturbed_accelerator(Perturbation(), accelerator), 1.0
    else:
        data, overhead = read_perturbation(profile)
    directory.mkdir(parents=True, exist_ok=True)
    accel_path = directory / "truth-accelerator.json"
    accel_path.write_text(json.dumps(data) + "\n", encoding="utf-8")
    if step_profile is None:
        profile_path = _write_step_profile(directory, accel_path, overhead, model, tensor_parallel_size)
    else:
        document = read_truth_step_profile(
            step_profile, model=model, tensor_parallel_size=tensor_parallel_size, overhead=overhead
        )
        profile_path = directory / "truth-step-profile.json"
        profile_path.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    return SimConfig(
        model=model,
        accelerator=str(accel_path),
        tensor_parallel_size=tensor_parallel_size,
        scheduler=scheduler or SchedulerConfig(),
        step_profile=str(profile_path),
    )


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
    source = directory / "truth-source.json"
    source.write_text(json.dumps(perturbed_accelerator(perturbation, accelerator)) + "\n", encoding="utf-8")
    return truth_engine(
        source, directory, model=model, tensor_parallel_size=tensor_parallel_size, scheduler=scheduler
    )


#: The shipped family of perturbed H100 profiles (compute x0.6-1.0, HBM x0.7-1.0, overhead x1-3):
#: the corners that matter most plus a middle point; ``tuner/twin/truths/<name>.json``.
FAMILY: dict[str, Perturbation] = {
    "h100-c060-m070-o3": Perturbation(0.6, 0.7, 3.0),
    "h100-c060-m100-o1": Perturbation(0.6, 1.0, 1.0),
    "h100-c100-m070-o1": Perturbation(1.0, 0.7, 1.0),
    "h100-c100-m100-o3": Perturbation(1.0, 1.0, 3.0),
    "h100-c075-m085-o2": Perturbation(0.75, 0.85, 2.0),
}


def family() -> dict[str, Path]:
    """The shipped perturbed profiles by name (files inside the installed package)."""
    root = resources.files("chunkpilot.bench.truths")
    return {name: Path(str(root.joinpath(f"{name}.json"))) for name in FAMILY}
