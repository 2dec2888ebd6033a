"""Benchmarks of the simulator: offline speed on a whole trace, and step-time calibration error.

Figures are printed, never asserted: wall time depends on the machine.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from chunkpilot.engine.sim.calibration.fit import ErrorRow, error_table, format_error_table
from chunkpilot.engine.sim.engine import SimConfig, default_limits
from chunkpilot.engine.sim.offline import simulate
from chunkpilot.engine.sim.profiles.loader import load_accelerator, load_model
from chunkpilot.engine.sim.scheduler import SchedulerConfig
from chunkpilot.engine.sim.workload import load_trace


@dataclass(frozen=True, slots=True)
class SpeedResult:
    """Wall time to simulate one trace (best of ``repeat`` runs, one process, one thread)."""

    trace: str
    model: str
    accelerator: str
    requests: int
    steps: int
    simulated_s: float
    wall_s: float
    wall_runs_s: tuple[float, ...]
    steps_per_s: float
    step_by_step_wall_s: float | None
    load_s: float


@dataclass(frozen=True, slots=True)
class BenchResult:
    """Everything ``chunkpilot sim bench`` reports."""

    speed: SpeedResult
    calibration: tuple[ErrorRow, ...]
    calibration_mean_abs_pct: float
    calibration_by_operator: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready mapping."""
        return {
            "speed": asdict(self.speed),
            "calibration_mean_abs_pct": self.calibration_mean_abs_pct,
            "calibration_by_operator": self.calibration_by_operator,
            "calibration": [asdict(row) for row in self.calibration],
        }


def default_config(model: str, accelerator: str) -> SimConfig:
    """vLLM's server defaults for ``model`` on ``accelerator`` (budget, max-num-seqs, max-model-len)."""
    budget, seqs = default_limits(load_accelerator(accelerator))
    scheduler = SchedulerConfig(
        max_num_batched_tokens=budget,
        max_num_seqs=seqs,
        max_model_len=load_model(model).max_position_embeddings,
    )
    return SimConfig(model=model, accelerator=accelerator, scheduler=scheduler)


def speed(
    trace: str = "azure_conv_2023",
    model: str = "llama-3.1-8b",
    accelerator: str = "h100",
    repeat: int = 3,
    step_by_step: bool = False,
) -> SpeedResult:
    """Simulate the whole trace ``repeat`` times and keep the fastest run."""
    started = time.perf_counter()
    workload = load_trace(trace)
    load_s = time.perf_counter() - started
    config = default_config(model, accelerator)
    runs = [simulate(config, workload) for _ in range(max(1, repeat))]
    best = min(runs, key=lambda s: s.wall_s)
    slow_wall = simulate(config, workload, fast_forward=False).wall_s if step_by_step else None
    return SpeedResult(
        trace=workload.name,
        model=model,
        accelerator=accelerator,
        requests=best.requests,
        steps=best.steps,
        simulated_s=best.duration_s,
        wall_s=best.wall_s,
        wall_runs_s=tuple(s.wall_s for s in runs),
        steps_per_s=best.steps / best.wall_s,
        step_by_step_wall_s=slow_wall,
        load_s=load_s,
    )


def calibration() -> tuple[tuple[ErrorRow, ...], float, dict[str, float]]:
    """Mean absolute % error per operator and token count against the A100 reference."""
    table = tuple(error_table())
    by_operator: dict[str, list[float]] = {}
    for row in table:
        by_operator.setdefault(row.operator, []).append(row.mean_abs_pct)
    means = {op: sum(v) / len(v) for op, v in by_operator.items()}
    overall = sum(r.mean_abs_pct * r.samples for r in table) / sum(r.samples for r in table)
    return table, overall, means


def run(speed_result: SpeedResult) -> BenchResult:
    """Both benchmarks: ``speed_result`` (of :func:`speed`) with the step-time calibration."""
    table, overall, by_operator = calibration()
    return BenchResult(speed_result, table, overall, by_operator)


def format_result(result: BenchResult) -> str:
    """Human-readable report."""
    s = result.speed
    lines = [
        f"offline speed: {s.trace} ({s.requests} requests, {s.simulated_s:.0f} s simulated) "
        f"on {s.model}/{s.accelerator}",
        f"  wall time {s.wall_s:.2f} s (best of {len(s.wall_runs_s)}: "
        + ", ".join(f"{w:.2f}" for w in s.wall_runs_s)
        + f"), {s.steps} steps, {s.steps_per_s:,.0f} steps/s, trace load {s.load_s:.2f} s",
    ]
    if s.step_by_step_wall_s is not None:
        lines.append(f"  step by step (no bulk decode): {s.step_by_step_wall_s:.2f} s")
    lines += [
        "",
        "step-time calibration vs A100-80GB reference: mean absolute % error per operator and token count",
        format_error_table(list(result.calibration)),
        f"overall (sample-weighted): {result.calibration_mean_abs_pct:.1f} %",
    ]
    return "\n".join(lines)
