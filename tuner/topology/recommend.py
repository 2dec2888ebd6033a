"""The disaggregation recommendation's job: colocated capacity and the best prefill/decode layouts
of the service's replicas on its twin (pure; picklable, so it runs in the twin's worker process).

When it is computed is observed (:mod:`chunkpilot.tuner.observe.recommendation`); what the status and
the ``SLOInfeasible`` condition say of it is decided (:mod:`chunkpilot.tuner.decide.recommendation`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from chunkpilot.engine.sim.offline import SLO
from chunkpilot.engine.sim.profiles.loader import load_model
from chunkpilot.tuner.space import TunedConfig
from chunkpilot.tuner.topology.layouts import (
    LayoutEvaluator,
    Recommendation,
    kv_bytes_per_request,
    search_topologies,
)
from chunkpilot.tuner.topology.simulate import (
    COLOCATED_REQUESTS,
    LAYOUT_SEED,
    REQUESTS_PER_REPLICA,
    TOLERANCE,
    tiled,
    twin_evaluator,
)
from chunkpilot.tuner.twin.predict import Twin
from chunkpilot.tuner.twin.search import evaluate_on_twin

if TYPE_CHECKING:
    pass


@dataclass(frozen=True)
class RecommendRequest:
    """Everything one recommendation needs (picklable: it runs in the twin's worker process).

    ``slo``: the SLO the simulated steps must meet (the twin's offsets taken off);
    ``colocated_req_s``: one replica's best colocated capacity when known, else the best of the
    ``colocated`` configurations on the twin.
    """

    key: str
    twin: Twin
    slo: SLO
    replicas: int
    max_model_len: int
    decode_seqs: int
    decode_budget: int
    kv_bandwidth_gbps: float
    kv_latency_ms: float
    cpu_budget_s: float
    colocated_req_s: float | None = None
    colocated: tuple[TunedConfig, ...] = ()
    requests_per_replica: int = REQUESTS_PER_REPLICA
    colocated_requests: int = COLOCATED_REQUESTS
    tolerance: float = TOLERANCE


@dataclass(frozen=True)
class RecommendationResult:
    """A recommendation computed this step for twin fit ``key`` (or why there is none)."""

    key: str
    recommendation: Recommendation | None = None
    error: str | None = None


EvaluatorFactory = Callable[[RecommendRequest], LayoutEvaluator]


def _sim_evaluator(job: RecommendRequest) -> LayoutEvaluator:
    return twin_evaluator(
        job.twin,
        job.slo,
        job.kv_bandwidth_gbps,
        job.kv_latency_ms,
        max_model_len=job.max_model_len,
        requests_per_replica=job.requests_per_replica,
        tolerance=job.tolerance,
    )


def recommend(job: RecommendRequest, evaluator: EvaluatorFactory = _sim_evaluator) -> Recommendation:
    """Colocated capacity and the best disaggregated layouts of ``job.replicas`` on the twin."""
    per_replica = job.colocated_req_s
    if per_replica is None:  # over a horizon long enough for a colocated queue to settle
        # On the one arrival sample the layouts are searched on, so the two compare alike.
        colocated = tiled(job.twin.workload, job.colocated_requests)
        twin = replace(job.twin, workload=colocated, arrival_seeds=(LAYOUT_SEED,))
        found = [
            evaluate_on_twin(
                twin,
                config,
                job.slo,
                max_model_len=job.max_model_len,
                requests=job.colocated_requests,
                tolerance=job.tolerance,
            ).capacity_req_s
            for config in dict.fromkeys(job.colocated)
        ]
        per_replica = max(found, default=0.0)
    search = search_topologies(
        evaluator(job),
        job.replicas,
        decode_seqs=job.decode_seqs,
        decode_budget=job.decode_budget,
        cpu_budget_s=job.cpu_budget_s,
    )
    prompts = [r.prompt_tokens for r in job.twin.workload.requests]
    mean_prompt = sum(prompts) / len(prompts) if prompts else 0.0
    kv_bytes = kv_bytes_per_request(load_model(job.twin.fit.model).kv_bytes_per_token, mean_prompt)
    return Recommendation(
        replicas=job.replicas,
        colocated_req_s=per_replica * job.replicas,
        search=search,
        kv_bandwidth_gbps=job.kv_bandwidth_gbps,
        kv_latency_ms=job.kv_latency_ms,
        kv_mb_per_request=kv_bytes / 1e6,
    )
