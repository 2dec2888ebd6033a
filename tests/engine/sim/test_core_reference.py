"""The simulator core gives the same answers as the recorded reference, to the last bit.

Every summary the offline simulator prints (and every per-request record, and the step telemetry the
server would export) is compared with ``core_reference.json``, recorded from the core before its
hot paths were rewritten for speed. The cases span the three engines' scheduling semantics, budgets
from 256 to 8192 tokens, the bundled traces and the features that change the scheduler's path
(prefix caching, preemption, speculative decoding, partial-prefill limits, step-time spread, the
step-by-step path, disaggregated pools, a run stopped once its SLO has missed). The two stopped runs
were recorded later than the rest, on the Python core, and the compiled core answers the same.

Regenerate only after an intended change of the simulator's *answers*, never to make a speed-up pass:
``CHUNKPILOT_UPDATE_GOLDEN=1 .venv/bin/pytest tests/engine/sim/test_core_reference.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import astuple, replace
from pathlib import Path
from typing import Any

import pytest
from chunkpilot.engine.sim import compiled
from chunkpilot.engine.sim.disagg import PoolConfig, Topology, simulate_disaggregated
from chunkpilot.engine.sim.engine import SimConfig
from chunkpilot.engine.sim.metrics import StepTelemetry
from chunkpilot.engine.sim.offline import SLO, Summary, simulate
from chunkpilot.engine.sim.steptime import STEP_PROFILE_SCHEMA
from chunkpilot.engine.sim.workload import Workload, load_trace, parse_workload_spec

REFERENCE = Path(__file__).parent / "core_reference.json"
UPDATE = os.environ.get("CHUNKPILOT_UPDATE_GOLDEN") == "1"
SLO_PAIR = SLO(itl_ms=40.0, itl_quantile=0.99, ttft_ms=1500.0, ttft_quantile=0.95)


def _config(engine: str = "vllm", **fields: Any) -> SimConfig:
    fields.setdefault("max_model_len", 32768)
    return SimConfig.for_engine(engine, **fields)


def _conv(limit: int = 2500, rate: float | None = None) -> Workload:
    return load_trace("azure_conv_2023", rate=rate, limit=limit)


def _code(limit: int = 1500, rate: float | None = None) -> Workload:
    return load_trace("azure_code_2023", rate=rate, limit=limit)


def _arxiv(limit: int = 500, rate: float = 2.0) -> Workload:
    return load_trace("arxiv_summarization_lengths", rate=rate, limit=limit)


def _shared_prefixes() -> Workload:
    return parse_workload_spec("n=800,rate=10,prompt=512-4096,output=16-256,prefix=1536,groups=4,seed=3")


def _spread_profile(directory: Path) -> str:
    """The datasheet H100's linear layers as a step profile, single steps spread log-normally."""
    model = SimConfig().build().step_model
    document = {
        "schema": STEP_PROFILE_SCHEMA,
        "model": "llama-3.1-8b",
        "accelerator": "h100",
        "linear_ms": {str(t): model.linear_time(t) * 1e3 for t in (1, 16, 256, 1024, 4096, 16384)},
        "efficiency": {"step_overhead_s": 2e-3, "attention_memory": 0.5},
        "step_log_sigma": {"1": 0.05, "512": 0.2, "8192": 0.1},
    }
    path = directory / "spread.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    return str(path)


Case = Callable[[Path], dict[str, Any]]


def _offline(config: SimConfig, workload: Workload, **options: Any) -> Callable[[Path], dict[str, Any]]:
    def run(_directory: Path) -> dict[str, Any]:
        return _fingerprint(simulate(config, workload, SLO_PAIR, keep_records=True, **options))

    return run


def _with_telemetry(config: SimConfig, workload: Workload) -> Case:
    def run(_directory: Path) -> dict[str, Any]:
        telemetry = StepTelemetry()
        result = _fingerprint(simulate(config, workload, SLO_PAIR, keep_records=True, telemetry=telemetry))
        result["telemetry_sha256"] = _sha256("\n".join(telemetry.render('engine="ref"')))
        return result

    return run


def _spread(config: SimConfig, workload: Workload) -> Case:
    def run(directory: Path) -> dict[str, Any]:
        spread = replace(config, step_profile=_spread_profile(directory), seed=7)
        return _fingerprint(simulate(spread, workload, SLO_PAIR, keep_records=True))

    return run


def _disaggregated(prefill: SimConfig, decode: SimConfig, workload: Workload) -> Case:
    def run(_directory: Path) -> dict[str, Any]:
        topology = Topology(PoolConfig(prefill, replicas=1), PoolConfig(decode, replicas=2))
        return _fingerprint(simulate_disaggregated(topology, workload, SLO_PAIR, keep_records=True))

    return run


CASES: dict[str, Case] = {
    "vllm-conv-b256": _offline(_config(max_num_batched_tokens=256, max_num_seqs=64), _conv(1500)),
    "vllm-conv-b2048": _offline(_config(max_num_batched_tokens=2048, max_num_seqs=256), _conv()),
    "vllm-conv-b8192": _offline(_config(max_num_batched_tokens=8192, max_num_seqs=1024), _conv(rate=12.0)),
    "vllm-code-b512-threshold": _offline(
        _config(max_num_batched_tokens=512, max_num_seqs=128, long_prefill_token_threshold=256), _code()
    ),
    "vllm-code-adaptive-partials": _offline(
        _config(
            max_num_batched_tokens=1024,
            max_num_seqs=96,
            long_prefill_token_threshold=128,
            long_prefill_token_threshold_adaptive=True,
            max_num_partial_prefills=2,
            max_long_partial_prefills=1,
        ),
        _code(rate=6.0),
    ),
    "vllm-arxiv-b2048": _offline(_config(max_num_batched_tokens=2048, max_num_seqs=128), _arxiv()),
    "vllm-prefix-cache": _offline(_config(max_num_batched_tokens=2048, max_num_seqs=128), _shared_prefixes()),
    "vllm-prefix-cache-off": _offline(
        _config(max_num_batched_tokens=2048, max_num_seqs=128, enable_prefix_caching=False),
        _shared_prefixes(),
    ),
    "vllm-preemption": _offline(
        _config(max_num_batched_tokens=2048, max_num_seqs=256, max_model_len=16384, num_kv_blocks=1100),
        _conv(1200, rate=20.0),
    ),
    "vllm-speculative": _offline(
        _config(max_num_batched_tokens=1024, max_num_seqs=128, num_speculative_tokens=3, seed=5), _conv(1200)
    ),
    "vllm-no-chunking": _offline(
        _config(
            max_num_batched_tokens=16384, max_num_seqs=128, max_model_len=16384, enable_chunked_prefill=False
        ),
        _conv(1200),
    ),
    "vllm-70b-tp4-a100": _offline(
        _config(
            model="llama-3.1-70b",
            accelerator="a100",
            tensor_parallel_size=4,
            max_num_batched_tokens=4096,
            max_num_seqs=256,
        ),
        _conv(1200),
    ),
    "vllm-step-by-step": _offline(
        _config(max_num_batched_tokens=1024, max_num_seqs=128), _conv(800), fast_forward=False
    ),
    # The twin's probes stop once the SLO has missed: at a rate the TTFT quantile misses, and at
    # one only the ITL quantile misses (a budget of 8192 tokens).
    "vllm-stop-on-ttft-miss": _offline(
        _config(max_num_batched_tokens=2048, max_num_seqs=256), _conv(1500, rate=40.0), stop_on_miss=True
    ),
    "vllm-stop-on-itl-miss": _offline(
        _config(max_num_batched_tokens=8192, max_num_seqs=1024), _conv(rate=12.0), stop_on_miss=True
    ),
    "vllm-telemetry": _with_telemetry(_config(max_num_batched_tokens=768, max_num_seqs=96), _code(800)),
    "vllm-spread": _spread(_config(max_num_batched_tokens=1024, max_num_seqs=128), _conv(800)),
    "sglang-conv-b2048": _offline(_config("sglang", max_num_batched_tokens=2048, max_num_seqs=256), _conv()),
    "sglang-code-mixed": _offline(
        _config("sglang", max_num_batched_tokens=1024, max_num_seqs=128, enable_mixed_chunk=True), _code()
    ),
    "sglang-prefix-cache": _offline(
        _config("sglang", max_num_batched_tokens=2048, max_num_seqs=128, max_prefill_tokens=4096),
        _shared_prefixes(),
    ),
    "trtllm-conv-b2048": _offline(_config("trtllm", max_num_batched_tokens=2048, max_num_seqs=256), _conv()),
    "trtllm-code-b512": _offline(_config("trtllm", max_num_batched_tokens=512, max_num_seqs=64), _code()),
    "trtllm-arxiv-b4096": _offline(
        _config("trtllm", max_num_batched_tokens=4096, max_num_seqs=128), _arxiv()
    ),
    "disaggregated-1p2d": _disaggregated(
        _config(max_num_batched_tokens=4096, max_num_seqs=64),
        _config(max_num_batched_tokens=512, max_num_seqs=256),
        _conv(1000, rate=8.0),
    ),
}


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _fingerprint(summary: Summary) -> dict[str, Any]:
    """Everything a run answers, wall time left out; floats are compared bit for bit via ``repr``."""
    data = summary.to_dict()
    data.pop("wall_s")
    records = json.dumps([astuple(record) for record in summary.records])
    assert summary.records, "keep_records gave no records, so the per-request comparison would prove nothing"
    return {"summary": json.loads(json.dumps(data)), "records_sha256": _sha256(records)}


def _recorded() -> dict[str, Any]:
    if not REFERENCE.exists():
        return {}
    recorded: dict[str, Any] = json.loads(REFERENCE.read_text(encoding="utf-8"))
    return recorded


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_core_answers_exactly_as_recorded(name: str, tmp_path: Path) -> None:
    result = CASES[name](tmp_path)
    if UPDATE:
        recorded = _recorded()
        recorded[name] = result
        REFERENCE.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    expected = _recorded().get(name)
    assert expected is not None, f"no reference for {name}: run with CHUNKPILOT_UPDATE_GOLDEN=1"
    assert result["summary"] == expected["summary"]
    assert result == expected, (
        f"{name}: the summaries agree but a per-request record or the telemetry differs"
    )


def test_every_recorded_case_still_exists() -> None:
    assert sorted(_recorded()) == sorted(CASES)


def test_the_core_in_use_is_the_one_asked_for() -> None:
    asked = compiled.mode()
    if asked == "auto":
        pytest.skip("CHUNKPILOT_SIM_CORE is auto: either core may be in use")
    assert compiled.core_in_use() == asked
