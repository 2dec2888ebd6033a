"""What one ``chunkpilot bench disagg`` run compares: the model, GPUs, workload, SLOs and search sizes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from chunkpilot.bench.exhaustive import BenchError
from chunkpilot.bench.twin_truth import family, read_perturbation
from chunkpilot.engine.sim.offline import SLO


@dataclass(frozen=True)
class DisaggSettings:
    """Sizes of one run (``requests`` per replica of every capacity probe, truth and twin alike)."""

    truth: str = "h100-c075-m085-o2"
    gpus: int = 4
    low_gpus: tuple[int, ...] = (2,)
    long_share: float = 0.3
    itl_ms: float = 20.0
    ttft_ms: float = 400.0
    itl_quantile: float = 0.99
    ttft_quantile: float = 0.95
    #: Requests per replica of a disaggregated probe, and of a colocated one (whose queue settles
    #: more slowly: :data:`chunkpilot.tuner.topology.simulate.COLOCATED_REQUESTS`).
    requests: int = 300
    colocated_requests: int = 1000
    tolerance: float = 0.04
    budgets: tuple[int, ...] = (192, 256, 320, 384, 448, 512, 768, 1024, 2048)
    #: Search each pool's knobs on the truth after the splits (else the splits only).
    truth_knobs: bool = True
    max_num_seqs: int = 128
    bandwidth_gbps: float = 25.0
    latency_ms: float = 1.0
    sweep_gbps: tuple[float, ...] = (100.0, 25.0, 10.0, 5.0, 2.0, 1.0, 0.5)
    #: CPU seconds the twin's recommendation may spend (the tuner's default: 60).
    twin_cpu_s: float = 60.0
    stable_budget: int = 2048
    jobs: int = 2
    seed: int = 0

    def __post_init__(self) -> None:
        if self.gpus < 2:
            raise BenchError("--gpus: disaggregation needs at least 2 GPUs (one per pool)")
        if not 0 < self.long_share < 1:
            raise BenchError("--long-share must be in (0, 1)")
        if self.requests < 20:
            raise BenchError("--requests: at least 20 requests per replica")
        if not self.sweep_gbps or any(not b > 0 for b in self.sweep_gbps):
            raise BenchError("--bandwidth: each KV bandwidth must be a positive number of GB/s")
        if self.truth not in family():
            try:
                read_perturbation(Path(self.truth))
            except ValueError as exc:
                raise BenchError(f"--truth-gpu: {exc}") from exc

    @property
    def slo(self) -> SLO:
        return SLO(self.itl_ms, self.itl_quantile, self.ttft_ms, self.ttft_quantile)


DISAGG_FULL = DisaggSettings()

DISAGG_QUICK = DisaggSettings(
    low_gpus=(),
    requests=60,
    colocated_requests=400,
    tolerance=0.1,
    budgets=(256, 320, 384),
    truth_knobs=False,
    sweep_gbps=(25.0, 0.5),
    # The tuner's CPU budget (60 s) for the twin: its 9 layouts take ~5 CPU s here, so a 5 s budget
    # ended the search after as many layouts as the machine's load allowed.
)
