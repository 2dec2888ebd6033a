"""Reduce the A100 reference measurements to the medians the calibration needs.

Input: the Vidur per-operator profiles ``a100_*_mlp.csv`` (one row per token count and tensor-parallel
degree, columns ``time_stats.<op>.<stat>`` in milliseconds). Output: ``a100_reference.csv`` in this
folder, one row per (model, tensor-parallel degree, token count) with the median time of each operator,
keeping a log-spaced subset of token counts. Run from the repository root::

    python -m chunkpilot.engine.sim.calibration.reduce_reference ../shared/reference
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

OPERATORS = (
    "attn_pre_proj",
    "attn_post_proj",
    "mlp_up_proj",
    "mlp_down_proj",
    "mlp_act",
    "input_layernorm",
    "post_attention_layernorm",
    "attn_rope",
    "add",
    "emb",
)
ARCH_COLUMNS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size")
TOKEN_COUNTS = frozenset(
    (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048,
     3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768)
)  # fmt: skip
SOURCES = {
    "llama-3-8b": "a100_llama3_8b_mlp.csv",
    "llama-2-7b": "a100_llama2_7b_mlp.csv",
    "llama-2-70b": "a100_llama2_70b_mlp.csv",
}
OUTPUT = Path(__file__).with_name("a100_reference.csv")


def reduce(source_dir: Path, output: Path = OUTPUT) -> int:
    """Write the reduced table and return its number of rows."""
    rows: dict[tuple[str, int, int], dict[str, str]] = {}
    for model, filename in SOURCES.items():
        with (source_dir / filename).open(newline="") as handle:
            for record in csv.DictReader(handle):
                tokens = int(record["num_tokens"])
                tp = int(record["num_tensor_parallel_workers"])
                if tokens not in TOKEN_COUNTS or (model, tp, tokens) in rows:
                    continue
                row = {"model": model, "tp": str(tp), "num_tokens": str(tokens)}
                row.update({column: record[column] for column in ARCH_COLUMNS})
                row.update({op: f"{float(record[f'time_stats.{op}.median']):.5f}" for op in OPERATORS})
                rows[(model, tp, tokens)] = row
    fieldnames = ["model", "tp", "num_tokens", *ARCH_COLUMNS, *OPERATORS]
    with output.open("w", newline="") as handle:
        handle.write(
            "# Medians (ms, one layer) from the Vidur A100-80GB operator profiles "
            "(microsoft/vidur data/profiling/compute/a100/*/mlp.csv; "
            "MIT licence, (c) Microsoft Corporation)\n"
        )
        writer = csv.DictWriter(handle, fieldnames=fieldnames)
        writer.writeheader()
        for key in sorted(rows):
            writer.writerow(rows[key])
    return len(rows)


if __name__ == "__main__":
    print(reduce(Path(sys.argv[1] if len(sys.argv) > 1 else "../shared/reference")))
