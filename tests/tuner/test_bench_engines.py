"""``bench tuner --engine``: each engine's semantics, defaults and search space reach the benchmark."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from chunkpilot.engine.sim.capacity import retime
from chunkpilot.engine.sim.flags import SGLANG_PINNED_VERSION, TRTLLM_PINNED_VERSION
from chunkpilot.engine.sim.metrics import StepTelemetry
from chunkpilot.engine.sim.offline import SLO, simulate
from chunkpilot.engine.sim.scheduler import CapacitySchedulerPolicy, Engine
from chunkpilot.engine.sim.workload import load_trace
from chunkpilot.tuner.space import TunedConfig
from chunkpilot.tuner.twin.fit import fit_steps
from chunkpilot.tuner.twin.predict import LatencyQuantiles, Twin
from chunkpilot.tuner.twin.search import scheduler_of

from chunkpilot.bench.exhaustive import (
    FULL,
    SLO_PAIRS,
    BenchError,
    default_config,
    engine_defaults,
    scenario_facts,
    sim_config,
    tuned_scheduler,
)
from chunkpilot.bench.truth import METHODS, TRUTH_QUICK
from chunkpilot.cli import main

#: The knobs each engine's space searches (the knob table: vLLM alone has a long-prefill threshold).
SEARCHED = {
    "vllm": {"maxNumBatchedTokens", "maxNumSeqs", "longPrefillTokenThreshold"},
    "sglang": {"maxNumBatchedTokens", "maxNumSeqs"},
    "trtllm": {"maxNumBatchedTokens", "maxNumSeqs"},
}
#: The engine's own scheduler settings every trial runs with (SGLang and TensorRT-LLM defaults).
OWN_SETTINGS: dict[str, dict[str, object]] = {
    "vllm": {"policy": "fcfs"},
    "sglang": {"policy": "fcfs", "enable_mixed_chunk": False, "max_prefill_tokens": 16384},
    "trtllm": {
        "capacity_scheduler_policy": "GUARANTEED_NO_EVICT",
        "context_chunking_policy": "FIRST_COME_FIRST_SERVED",
    },
}
VERSIONS = {"vllm": "0.33.0", "sglang": SGLANG_PINNED_VERSION, "trtllm": TRTLLM_PINNED_VERSION}


def _knobs(space: str) -> set[str]:
    return {part.split("=", 1)[0] for part in space.split()}


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_quick_run_per_engine_searches_that_engines_space(
    engine: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "tuner", "--quick", "--engine", engine, "--load", "0.5", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["engine"], data["engine_version"]) == (engine, VERSIONS[engine])
    assert data["methods"] == list(METHODS)
    assert OWN_SETTINGS[engine].items() <= data["engine_settings"].items()
    grid = TRUTH_QUICK.grid
    assert len(data["scenarios"]) == len(grid.workloads) * len(grid.slo_pairs)
    for scenario in data["scenarios"]:
        assert scenario["engine"] == engine and scenario["load"] == 0.5
        assert _knobs(scenario["space"]) == SEARCHED[engine]
        for curve in scenario["share_after_trials"].values():
            assert len(curve) == TRUTH_QUICK.trials
            assert all(0 <= v <= 1 + 1e-9 for v in curve)
        assert scenario["optimum_req_s"] >= scenario["grid_optimum_req_s"] > 0
        promoted = [*scenario["final_config"].values(), scenario["optimum_config"]]
        if engine != "vllm":
            # Nothing outside the engine's space was tried: no vLLM-only knob in any configuration.
            assert all(c["long_prefill_token_threshold"] == 0 for c in promoted)
            assert all(
                c[k] is None for c in promoted for k in ("max_num_active_seqs", "max_num_partial_prefills")
            )
            assert not any("lpt=" in c for c in scenario["twin"]["canaries"])


def test_each_engine_starts_from_its_own_server_defaults() -> None:
    slo = SLO_PAIRS[0]
    for engine, seqs in (("vllm", 1024), ("sglang", 2048), ("trtllm", 2048)):
        settings = replace(FULL, engine=engine)
        assert default_config(settings) == TunedConfig(8192, seqs)
        facts = scenario_facts(settings, slo, "azure_code")
        assert (facts.engine_kind, facts.engine_version) == (engine, VERSIONS[engine])
        config = TunedConfig(2048, 64)
        scheduler = sim_config(config, settings).scheduler
        assert scheduler.engine is Engine(engine)
        assert (scheduler.max_num_batched_tokens, scheduler.max_num_seqs) == (2048, 64)
        assert scheduler.enable_chunked_prefill
    trtllm = engine_defaults(replace(FULL, engine="trtllm"))
    assert trtllm.scheduler.capacity_scheduler_policy is CapacitySchedulerPolicy.GUARANTEED_NO_EVICT
    assert engine_defaults(replace(FULL, engine="sglang")).gpu_memory_utilization == pytest.approx(0.88)
    with pytest.raises(BenchError, match="--engine"):
        replace(FULL, engine="tgi")


def test_the_twin_simulates_in_the_engines_semantics(tmp_path: Path) -> None:
    """The bench's twin on SGLang is the simulator in SGLang's semantics (chunk-only prefill passes)."""
    settings = replace(FULL, engine="sglang")
    base = engine_defaults(settings).scheduler
    lengths = load_trace("azure_code_2023", rate=1.0, limit=120)
    slo = SLO(itl_ms=50.0, itl_quantile=0.99, ttft_ms=2000.0, ttft_quantile=0.95)
    telemetry = StepTelemetry()
    simulate(sim_config(TunedConfig(8192, 2048), settings), lengths, slo, telemetry=telemetry)
    fit = fit_steps(telemetry.totals(), settings.model, settings.accelerator)
    on_sglang = Twin.build(fit, lengths, tmp_path / "sglang", engine=base)
    on_vllm = Twin.build(fit, lengths, tmp_path / "vllm")
    config = TunedConfig(1024, 64)
    assert on_sglang.config(scheduler_of(config)).scheduler == tuned_scheduler(base, config)
    assert on_vllm.config(scheduler_of(config)).scheduler.engine is Engine.VLLM
    sglang = on_sglang.latency(scheduler_of(config), 1.0, slo)
    direct = replace(on_vllm.config(scheduler_of(config)), scheduler=tuned_scheduler(base, config))
    assert sglang == LatencyQuantiles.of(simulate(direct, retime(lengths, 1.0, 0), slo))
    # Decodes wait for whole chunk-only passes on SGLang, ride along each step on vLLM: other tails.
    assert abs(math.log(sglang.itl_p99_ms / on_vllm.latency(scheduler_of(config), 1.0, slo).itl_p99_ms)) > 0.5


def test_cli_refuses_an_unknown_engine(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", "tuner", "--quick", "--engine", "tgi"])
    assert exc.value.code == 2
    assert "--engine" in capsys.readouterr().err
