"""Fit the step-time model's efficiency constants to the A100 reference measurements.

The reference (``a100_reference.csv``, reduced from the Vidur operator profiles, MIT licence,
(c) Microsoft Corporation) holds the median time of each operator of one layer per token count and
tensor-parallel degree for Llama-3-8B, Llama-2-7B and Llama-2-70B on an A100-80GB. The GEMM constants
(compute and memory efficiency, blending exponent, per-kernel floor) and the element-wise constants are
fitted by minimising the squared log error; the result lives in ``efficiency.json`` beside this file.
Attention and per-step overheads are not in the reference and keep their documented defaults.

Refit and print the error table::

    python -m chunkpilot.engine.sim.calibration.fit --write engine_image/sim/calibration/efficiency.json
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
from dataclasses import asdict, dataclass, replace
from importlib import resources
from pathlib import Path

import numpy as np
import numpy.typing as npt
from chunkpilot.engine.sim.profiles.loader import Accelerator, load_accelerator
from chunkpilot.engine.sim.steptime import Efficiency

GEMM_OPERATORS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
ELEMENTWISE_OPERATORS = ("input_layernorm", "attn_rope", "mlp_act", "add", "emb")
OPERATORS = GEMM_OPERATORS + ELEMENTWISE_OPERATORS
#: The Efficiency field holding each element-wise operator's fraction of the memory bandwidth.
ELEMENTWISE_FIELDS = {
    "input_layernorm": "norm_memory",
    "attn_rope": "rope_memory",
    "mlp_act": "activation_memory",
    "add": "residual_add_memory",
    "emb": "embedding_memory",
}
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class ReferenceRow:
    """One measured operator time."""

    model: str
    tp: int
    num_tokens: int
    operator: str
    d_in: int
    d_out: int
    moved_bytes_per_token: float
    measured_s: float


def load_reference() -> list[ReferenceRow]:
    """Rows of the bundled reduced reference table, one per (model, tp, tokens, operator)."""
    text = resources.files(__package__).joinpath("a100_reference.csv").read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    rows: list[ReferenceRow] = []
    dtype = 2
    for record in csv.DictReader(lines):
        tp, tokens = int(record["tp"]), int(record["num_tokens"])
        h, heads, kv = int(record["n_embd"]), int(record["n_head"]), int(record["n_kv_head"])
        inter, hd = int(record["n_expanded_embd"]), int(record["n_embd"]) // int(record["n_head"])
        dims = {
            "attn_pre_proj": (h, (heads + 2 * kv) * hd // tp),
            "attn_post_proj": (heads * hd // tp, h),
            "mlp_up_proj": (h, 2 * inter // tp),
            "mlp_down_proj": (inter // tp, h),
        }
        per_token = {
            "input_layernorm": 2 * h * dtype,
            "attn_rope": 2 * (heads + kv) * hd / tp * dtype,
            "mlp_act": 3 * inter / tp * dtype,
            "add": 3 * h * dtype,
            "emb": 2 * h * dtype,
        }
        for op in OPERATORS:
            d_in, d_out = dims.get(op, (0, 0))
            rows.append(
                ReferenceRow(
                    model=record["model"],
                    tp=tp,
                    num_tokens=tokens,
                    operator=op,
                    d_in=d_in,
                    d_out=d_out,
                    moved_bytes_per_token=float(per_token.get(op, 0.0)),
                    measured_s=float(record[op]) / 1e3,
                )
            )
    return rows


def _arrays(rows: list[ReferenceRow]) -> dict[str, FloatArray]:
    return {
        "t": np.array([r.num_tokens for r in rows], dtype=np.float64),
        "din": np.array([r.d_in for r in rows], dtype=np.float64),
        "dout": np.array([r.d_out for r in rows], dtype=np.float64),
        "bpt": np.array([r.moved_bytes_per_token for r in rows], dtype=np.float64),
        "op": np.array([OPERATORS.index(r.operator) for r in rows], dtype=np.float64),
        "y": np.array([r.measured_s for r in rows], dtype=np.float64),
    }


def predict(rows: list[ReferenceRow], eff: Efficiency, gpu: Accelerator) -> FloatArray:
    """Model time of each reference row (same formulas as the step-time model)."""
    return _predict(_arrays(rows), eff, gpu)


def _predict(a: dict[str, FloatArray], eff: Efficiency, gpu: Accelerator) -> FloatArray:
    gemm = a["din"] > 0
    t_compute = 2.0 * a["t"] * a["din"] * a["dout"] / (gpu.peak_flops * eff.gemm_compute)
    t_memory = (
        2.0
        * (a["din"] * a["dout"] + a["t"] * (a["din"] + a["dout"]))
        / (gpu.hbm_bytes_per_s * eff.gemm_memory)
    )
    p = eff.gemm_smoothing
    gemm_s = (t_compute**p + t_memory**p) ** (1.0 / p) + eff.gemm_floor_s
    memory = np.ones_like(a["t"])
    for op, name in ELEMENTWISE_FIELDS.items():
        memory[a["op"] == OPERATORS.index(op)] = getattr(eff, name)
    elem_s = a["t"] * a["bpt"] / (gpu.hbm_bytes_per_s * memory) + eff.elementwise_floor_s
    result: FloatArray = np.where(gemm, gemm_s, elem_s)
    return result


def _loss(a: dict[str, FloatArray], eff: Efficiency, gpu: Accelerator) -> float:
    return float(np.mean(np.log(_predict(a, eff, gpu) / a["y"]) ** 2))


def fit(rows: list[ReferenceRow] | None = None) -> Efficiency:
    """Least-squares (log error) fit of the GEMM and element-wise constants by grid refinement."""
    rows = rows if rows is not None else load_reference()
    gpu = load_accelerator("a100-80gb")
    gemm_rows = [r for r in rows if r.operator in GEMM_OPERATORS]
    elem_rows = [r for r in rows if r.operator in ELEMENTWISE_OPERATORS]
    best = Efficiency()
    grids = {
        "gemm_compute": np.linspace(0.55, 0.9, 15),
        "gemm_memory": np.linspace(0.5, 0.9, 17),
        "gemm_smoothing": np.array([1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0]),
        "gemm_floor_s": np.array([0.0, 1e-6, 2e-6, 3e-6, 4e-6, 6e-6, 8e-6]),
    }
    best = _grid(best, grids, gemm_rows, gpu)
    floors = np.array([0.0, 1e-6, 2e-6, 3e-6, 4e-6, 5e-6])
    shared = np.linspace(0.15, 0.9, 31)
    shared_best, best_loss = best, float("inf")
    elem_arrays = _arrays(elem_rows)
    for floor, memory in itertools.product(floors, shared):  # one factor for all: fixes the floor
        candidate = replace(
            best,
            elementwise_floor_s=float(floor),
            **dict.fromkeys(ELEMENTWISE_FIELDS.values(), float(memory)),
        )
        loss = _loss(elem_arrays, candidate, gpu)
        if loss < best_loss:
            shared_best, best_loss = candidate, loss
    best = shared_best
    for op, name in ELEMENTWISE_FIELDS.items():  # then each kernel its own bandwidth fraction
        best = _grid(
            best, {name: np.linspace(0.05, 1.0, 96)}, [r for r in elem_rows if r.operator == op], gpu
        )
    return best


def _grid(
    start: Efficiency, grids: dict[str, FloatArray], rows: list[ReferenceRow], gpu: Accelerator
) -> Efficiency:
    arrays = _arrays(rows)
    best, best_loss = start, _loss(arrays, start, gpu)
    names = list(grids)
    for values in itertools.product(*(grids[n] for n in names)):
        candidate = replace(start, **{n: float(v) for n, v in zip(names, values, strict=True)})
        loss = _loss(arrays, candidate, gpu)
        if loss < best_loss:
            best, best_loss = candidate, loss
    return best


@dataclass(frozen=True, slots=True)
class ErrorRow:
    """Calibration error of one operator at one token count (aggregated over models and TP)."""

    operator: str
    num_tokens: int
    samples: int
    mean_abs_pct: float
    max_abs_pct: float


def error_table(eff: Efficiency | None = None, tp: int | None = None) -> list[ErrorRow]:
    """Absolute percentage error of the model per operator and token count."""
    rows = [r for r in load_reference() if tp is None or r.tp == tp]
    eff = eff or Efficiency.calibrated()
    pred = predict(rows, eff, load_accelerator("a100-80gb"))
    groups: dict[tuple[str, int], list[float]] = {}
    for row, p in zip(rows, pred, strict=True):
        groups.setdefault((row.operator, row.num_tokens), []).append(abs(p / row.measured_s - 1.0) * 100)
    order = {op: i for i, op in enumerate(OPERATORS)}
    return [
        ErrorRow(op, tokens, len(errs), float(np.mean(errs)), float(np.max(errs)))
        for (op, tokens), errs in sorted(groups.items(), key=lambda kv: (order[kv[0][0]], kv[0][1]))
    ]


def format_error_table(table: list[ErrorRow]) -> str:
    """Render the table as operator rows by token-count columns (mean absolute % error)."""
    tokens = sorted({row.num_tokens for row in table})
    cells = {(row.operator, row.num_tokens): row.mean_abs_pct for row in table}
    header = "operator".ljust(16) + "".join(f"{t:>7}" for t in tokens) + "    all"
    lines = [header]
    for op in OPERATORS:
        values = [cells.get((op, t)) for t in tokens]
        present = [v for v in values if v is not None]
        if not present:
            continue
        line = op.ljust(16) + "".join(f"{v:7.1f}" if v is not None else "      -" for v in values)
        lines.append(line + f"{sum(present) / len(present):7.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Refit (``--write`` stores the result) and print the calibration error table."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--write",
        metavar="PATH",
        help="store the fitted constants there (engine_image/sim/calibration/efficiency.json in a checkout)",
    )
    args = parser.parse_args(argv)
    eff = fit()
    print(json.dumps(asdict(eff), indent=2))
    if args.write:
        target = Path(args.write)
        current = json.loads(target.read_text()) if target.exists() else {}
        fitted_names = ("gemm_", "elementwise_", *ELEMENTWISE_FIELDS.values())
        fitted = {k: v for k, v in asdict(eff).items() if k.startswith(fitted_names)}
        defaults = asdict(Efficiency())
        kept = {k: v for k, v in current.get("efficiency", {}).items() if k in defaults}
        merged = {**defaults, **kept, **fitted}
        document = {
            "source": "fitted by chunkpilot.engine.sim.calibration.fit against a100_reference.csv",
            "efficiency": merged,
        }
        target.write_text(json.dumps(document, indent=2) + "\n")
    print(format_error_table(error_table(eff)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
