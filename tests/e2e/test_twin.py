"""End to end: the twin finds the capacity optimum of hardware nobody told the tuner about.

The local stack (real control plane, the operator with the tuner, simulator engines run by the pod
runner, a real Prometheus, trace replay in real time). The engines run on a hidden truth: an H100
whose compute is 0.75x and HBM bandwidth 0.85x its datasheet, with twice the per-step overhead; the
pod runner passes those profiles to every simulator (``CHUNKPILOT_SIM_GPU`` /
``CHUNKPILOT_SIM_STEP_PROFILE``) while the InferenceService says ``h100``. The service starts at a
small budget that meets its SLOs at the live load with much less capacity than the best
configuration, and the offered load is about 40% of the true optimum's capacity, where a canary's
latency slack no longer ranks configurations by capacity.

Afterwards the promoted configuration's capacity at SLO is measured offline on the true profile and
compared with the true optimum (a grid over the service's search space, plus the promoted point).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace
from typing import Any

import pytest
from chunkpilot.engine.sim.capacity import find_capacity
from chunkpilot.engine.sim.engine import SimConfig
from chunkpilot.engine.sim.offline import SLO
from chunkpilot.engine.sim.scheduler import SchedulerConfig
from chunkpilot.engine.sim.workload import Workload, load_trace
from chunkpilot.tuner.policy import AGREEMENT_FLOOR
from chunkpilot.tuner.records import service_facts, tuned_config
from chunkpilot.tuner.space import Knob, SearchSpace, TunedConfig, build_space

from chunkpilot.api import EngineConfig, InferenceService
from chunkpilot.bench.twin_truth import Perturbation, write_truth
from chunkpilot.localrun.podrunner import ENV_SIM_GPU, ENV_SIM_STEP_PROFILE
from chunkpilot.localrun.stack import LocalStack
from chunkpilot.testing.e2e import TRACE, serve_service, sim_service_manifest, wait_until
from chunkpilot.testing.stack import StartStack

# Alone: each canary's measured quantiles must agree with the twin's within 15% before anything is
# promoted on a prediction, and three other end-to-end runs on the same two cores skew the measured
# side (all four canaries of one such run disagreed by 18-34%; the same code passed by itself).
pytestmark = [pytest.mark.e2e, pytest.mark.cluster, pytest.mark.prometheus, pytest.mark.alone]

TWIN_FIGURES = ("scales", "error", "stepFitError", "capacityReqS", "evaluations", "cpuSeconds")
TRUTH = Perturbation(compute=0.75, memory=0.85, overhead=2.0)
SLO_ = SLO(itl_ms=50.0, itl_quantile=0.99, ttft_ms=2000.0, ttft_quantile=0.95)
MAX_PROMPT, MAX_OUTPUT = 7000, 64
START_BUDGET = 320
#: Offered load as a share of the true optimum's capacity (one stable replica).
LOAD_SHARE = 0.4
#: Measured on the truth with this trace: the best configuration serves ~9.7 requests/s per replica.
OPTIMUM_REQ_S = 9.7


def lengths() -> Workload:
    trace = load_trace(TRACE, rate=1.0, limit=400)
    capped = tuple(
        replace(
            r, prompt_tokens=min(r.prompt_tokens, MAX_PROMPT), output_tokens=min(r.output_tokens, MAX_OUTPUT)
        )
        for r in trace.requests
    )
    return replace(trace, requests=capped)


def true_capacity(truth: SimConfig, config: TunedConfig, workload: Workload) -> float:
    engine = replace(truth, scheduler=SchedulerConfig(**config.as_dict(), max_model_len=8192))  # type: ignore[arg-type]
    return find_capacity(engine, workload, SLO_, tolerance=0.03, start_rate=2.0).capacity_req_s


def grid(space: SearchSpace, points: int = 10) -> list[TunedConfig]:
    """Budgets spaced geometrically over the space at four max-num-seqs values, long prefills off."""
    budget = space.ranges[Knob.MAX_NUM_BATCHED_TOKENS]
    low, high = budget.low, budget.high
    budgets = sorted({round(low * (high / low) ** (i / (points - 1))) for i in range(points)})
    configs = []
    for b in budgets:
        for seqs in (32, 64, 128, 256):
            params = {Knob.MAX_NUM_BATCHED_TOKENS.value: b, Knob.MAX_NUM_SEQS.value: seqs}
            if Knob.LONG_PREFILL_TOKEN_THRESHOLD in space.ranges:
                params[Knob.LONG_PREFILL_TOKEN_THRESHOLD.value] = space.ranges[
                    Knob.LONG_PREFILL_TOKEN_THRESHOLD
                ].high
            configs.append(space.to_config(params))
    return list(dict.fromkeys(configs))


@pytest.fixture
def truth(tmp_path_factory: pytest.TempPathFactory) -> SimConfig:
    return write_truth(tmp_path_factory.mktemp("truth"), TRUTH, model="llama-3.1-8b", accelerator="h100")


@pytest.fixture
def stack(start_stack: StartStack, truth: SimConfig, monkeypatch: pytest.MonkeyPatch) -> LocalStack:
    assert truth.step_profile is not None
    monkeypatch.setenv(ENV_SIM_GPU, truth.accelerator)
    monkeypatch.setenv(ENV_SIM_STEP_PROFILE, truth.step_profile)
    # Each ranking ends after 16 evaluations (what 15 CPU seconds buy on a quiet machine), not on CPU
    # time: a busy machine bought fewer with the same seconds, and the promoted config hangs on the
    # ranking. The CPU budget only guards against a runaway search.
    return start_stack("twin", CHUNKPILOT_TWIN_MAX_EVALUATIONS="16", CHUNKPILOT_TWIN_CPU_SECONDS="120")


def manifest(name: str, namespace: str) -> dict[str, Any]:
    body = sim_service_manifest(
        name, namespace, max_trials=4, window="30s", warmup="10s", abort={"minSamples": 30}
    )
    body["spec"]["engine"]["maxNumBatchedTokens"] = START_BUDGET
    return body


def test_the_twin_promotes_a_config_near_the_true_capacity_optimum(
    stack: LocalStack, truth: SimConfig
) -> None:
    started = time.monotonic()
    namespace, name = "twin-e2e", "twin"
    body = manifest(name, namespace)
    cluster = serve_service(stack, body)
    try:
        rate = LOAD_SHARE * OPTIMUM_REQ_S
        load = stack.start_load(
            name,
            TRACE,
            namespace=namespace,
            rate=rate,
            duration_s=900,
            max_prompt_tokens=MAX_PROMPT,
            max_output_tokens=MAX_OUTPUT,
        )
        promoted = wait_until(
            "a promoted trial",
            cluster.promoted_trial,
            600,
            cluster,
        )
        promoted_s = time.monotonic() - started
        status = cluster.status()
        best = EngineConfig.model_validate(status["bestConfig"])
        twin = status["twin"]
        condition = cluster.condition("TwinUnavailable")
        trials = cluster.trials()
        load.stop(timeout_s=60)

        # Every trial carries the twin's predicted capacity; the judged ones its error on the canary.
        for trial in trials:
            block = (trial.get("status") or {}).get("twin") or {}
            assert block.get("capacityReqS") is not None, trial["status"]
        # Promoted on a confirmed prediction: each quantile within the tolerance, or closer to the
        # measurement than the agreement floor's share of its target (the verdict's rule).
        judged = promoted["status"]["twin"]
        targets = {q: float(body["spec"]["slo"][q]["maxMs"]) for q in ("itl", "ttft")}

        def agrees(q: str) -> bool:
            predicted, measured = (
                judged[f"predicted{q.capitalize()}Ms"],
                judged.get(f"measured{q.capitalize()}Ms"),
            )
            if measured is None:
                return True  # not compared
            gap = abs(float(predicted) - float(measured))
            return gap <= float(judged["tolerance"]) * float(measured) or gap <= AGREEMENT_FLOOR * targets[q]

        assert judged["error"] <= judged["tolerance"] or all(agrees(q) for q in targets), judged
        assert condition is not None and condition["status"] == "False", condition
        assert twin["state"] == "Fitted" and twin["capacityReqS"] > 0 and twin["liveRequestRate"] > 0

        workload = lengths()
        isvc_space = build_space(service_facts(_typed(cluster.service())), {})
        reached = true_capacity(truth, tuned_config(best), workload)
        start = true_capacity(truth, TunedConfig(START_BUDGET, 128), workload)
        optimum = max([reached, *(true_capacity(truth, c, workload) for c in grid(isvc_space))])
        share = reached / optimum
        print(
            json.dumps(
                {
                    "true_capacity_share": round(share, 3),
                    "promoted_true_req_s": round(reached, 2),
                    "optimum_true_req_s": round(optimum, 2),
                    "start_true_req_s": round(start, 2),
                    "offered_req_s": round(rate, 2),
                    "offered_share_of_optimum": round(rate / optimum, 2),
                    "promoted": best.summary(),
                    "trial_of_promotion": promoted["spec"]["number"],
                    "trials": [(t["spec"]["number"], (t.get("status") or {}).get("verdict")) for t in trials],
                    "twin": {k: twin.get(k) for k in TWIN_FIGURES},
                    "seconds_to_promotion": round(promoted_s, 1),
                },
                default=str,
            )
        )
        assert math.isfinite(share) and share >= 0.9, (share, best.summary())
        assert 0.3 <= rate / optimum <= 0.5  # the scenario's premise: ~40% of the true capacity
    finally:
        cluster.close()


def _typed(body: dict[str, Any]) -> InferenceService:
    return InferenceService.from_manifest({k: v for k, v in body.items() if k != "status"})
