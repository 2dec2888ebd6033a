"""The results of ``chunkpilot bench disagg`` and the tables it prints (docs/benchmarks.md shows them)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from chunkpilot.bench.disagg_settings import DisaggSettings

__all__ = ["TARGET_SHARE", "Comparison", "DisaggResult", "format_disagg_markdown", "format_disagg_table"]

#: The target load as a share of the best disaggregated capacity.
TARGET_SHARE = 0.8


@dataclass(frozen=True)
class Comparison:
    """Colocated against disaggregated on ``gpus`` GPUs at one KV bandwidth (true capacities, req/s)."""

    gpus: int
    bandwidth_gbps: float
    colocated_req_s: float
    colocated_budget: int
    disaggregated_req_s: float
    layout: str
    knobs: str
    kv_transfer_ms: float

    @property
    def gain(self) -> float:
        return self.disaggregated_req_s / self.colocated_req_s - 1 if self.colocated_req_s > 0 else math.inf

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpus": self.gpus,
            "bandwidth_gbps": self.bandwidth_gbps,
            "colocated_req_s": self.colocated_req_s,
            "colocated_budget": self.colocated_budget,
            "disaggregated_req_s": self.disaggregated_req_s,
            "topology": self.layout,
            "knobs": self.knobs,
            "kv_transfer_ms_p50": finite_or_none(self.kv_transfer_ms),
            "gain": finite_or_none(self.gain),
        }


def finite_or_none(value: float) -> float | None:
    """``value``, or ``None`` when it is not finite (JSON has no infinity)."""
    return value if math.isfinite(value) else None


@dataclass(frozen=True)
class DisaggResult:
    """One run: the headline comparison, the twin's recommendation, the sweeps."""

    settings: DisaggSettings
    mean_prompt_tokens: float
    kv_mb_per_request: float
    headline: Comparison
    target_req_s: float
    #: Per colocated budget: its ITL and TTFT quantiles at the target load.
    colocated_at_target: dict[str, dict[str, float]]
    disaggregated_at_target: dict[str, float]
    recommendation: dict[str, Any]
    sweep: tuple[Comparison, ...]
    low_volume: tuple[Comparison, ...]
    cpu_s: float
    wall_s: float
    notes: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        s = self.settings
        return {
            "settings": {
                "truth": s.truth,
                "gpus": s.gpus,
                "workload": f"bimodal: azure_conv_2023 chat + {s.long_share:.0%} arxiv summarisation",
                "slo": {
                    "itl_ms": s.itl_ms,
                    "itl_quantile": s.itl_quantile,
                    "ttft_ms": s.ttft_ms,
                    "ttft_quantile": s.ttft_quantile,
                },
                "requests_per_replica": s.requests,
                "colocated_requests": s.colocated_requests,
                "tolerance": s.tolerance,
                "budgets": list(s.budgets),
                "kv_bandwidth_gbps": s.bandwidth_gbps,
                "kv_latency_ms": s.latency_ms,
            },
            "mean_prompt_tokens": self.mean_prompt_tokens,
            "kv_mb_per_request": self.kv_mb_per_request,
            "headline": self.headline.to_dict(),
            "target_req_s": self.target_req_s,
            "colocated_at_target": self.colocated_at_target,
            "disaggregated_at_target": self.disaggregated_at_target,
            "recommendation": self.recommendation,
            "bandwidth_sweep": [c.to_dict() for c in self.sweep],
            "low_volume": [c.to_dict() for c in self.low_volume],
            "cpu_s": self.cpu_s,
            "wall_s": self.wall_s,
        }


def _gain(c: Comparison) -> str:
    return f"{c.gain:+.0%}" if math.isfinite(c.gain) else "inf"


def _rows(comparisons: Sequence[Comparison]) -> list[str]:
    return [
        f"| {c.gpus} | {c.bandwidth_gbps:g} | {c.colocated_req_s:.2f} (budget {c.colocated_budget}) | "
        f"{c.disaggregated_req_s:.2f} ({c.layout}) | {_gain(c)} | "
        f"{c.kv_transfer_ms:.0f} |"
        for c in comparisons
    ]


HEADER = (
    "| GPUs | KV GB/s | colocated req/s (best budget) | disaggregated req/s (best split) | gain "
    "| KV hop p50 ms |",
    "|---:|---:|---:|---:|---:|---:|",
)


def format_disagg_markdown(result: DisaggResult) -> str:
    """The tables docs/benchmarks.md shows."""
    s, h, r = result.settings, result.headline, result.recommendation
    co, dis = result.colocated_at_target, result.disaggregated_at_target
    slo = (
        f"ITL p{s.itl_quantile * 100:g} ≤ {s.itl_ms:g} ms, TTFT p{s.ttft_quantile * 100:g} ≤ {s.ttft_ms:g} ms"
    )
    lines = [
        f"Truth {s.truth}, {s.gpus} GPUs, {slo}; bimodal workload (chat + {s.long_share:.0%} summarisation, "
        f"mean prompt {result.mean_prompt_tokens:.0f} tokens = {result.kv_mb_per_request:.0f} MB of KV), "
        f"{s.requests} requests per replica per disaggregated probe, "
        f"{s.colocated_requests} per colocated one.",
        "",
        *HEADER,
        *_rows([h]),
        "",
        f"At the target load, {result.target_req_s:.1f} req/s ({TARGET_SHARE:.0%} of the disaggregated "
        f"capacity), {h.layout}: ITL {dis['itl_ms']:g} ms, TTFT {dis['ttft_ms']:g} ms; "
        "colocated, per budget:",
        "",
        "| budget | " + " | ".join(co) + " |",
        "|---|" + "---:|" * len(co),
        "| ITL ms | " + " | ".join(f"{v['itl_ms']:g}" for v in co.values()) + " |",
        "| TTFT ms | " + " | ".join(f"{v['ttft_ms']:g}" for v in co.values()) + " |",
        "",
        "| twin recommends | predicted req/s | true req/s | error | share of the true best | "
        "predicted / true colocated req/s | evaluations | CPU s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        f"| {r['topology']} ({r['knobs']}) | {_num(r['predicted_req_s'])} | {_num(r['true_req_s'])} | "
        f"{_pct(r['error'])} | {_pct(r['share_of_true_best'], signed=False)} | "
        f"{_num(r['predicted_colocated_req_s'])} / {_num(r['true_colocated_req_s'])} | {r['evaluations']} | "
        f"{r['cpu_s']} |",
        "",
        "KV-transfer bandwidth (every split with the best pool knobs, on the truth):",
        "",
        *HEADER,
        *_rows(result.sweep),
    ]
    if result.low_volume:
        lines += [
            "",
            "Fewer GPUs (lower volume):",
            "",
            *HEADER,
            *_rows(result.low_volume),
        ]
    lines += ["", f"CPU {result.cpu_s:.0f} s (this process), wall {result.wall_s:.0f} s."]
    return "\n".join(lines)


def _num(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, float) and math.isfinite(value) else "-"


def _pct(value: Any, signed: bool = True) -> str:
    if not isinstance(value, float) or not math.isfinite(value):
        return "-"
    return f"{value:+.0%}" if signed else f"{value:.0%}"


def format_disagg_table(result: DisaggResult) -> str:
    """What the command prints (the same tables)."""
    return format_disagg_markdown(result)
