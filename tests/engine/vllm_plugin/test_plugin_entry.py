"""The general-plugin entry point and the comparison's step-log ITL (pure, no vLLM)."""

from __future__ import annotations

import pytest
from chunkpilot.engine.vllm_plugin.compare import Scenario, sim_rows, step_itls
from chunkpilot.engine.vllm_plugin.config import PluginConfigError
from chunkpilot.engine.vllm_plugin.plugin import register


def test_register_accepts_a_valid_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHUNKPILOT_MAX_NUM_PARTIAL_PREFILLS", "2")
    register()


def test_register_stops_on_a_bad_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHUNKPILOT_MAX_NUM_PARTIAL_PREFILLS", "two")
    with pytest.raises(PluginConfigError, match="CHUNKPILOT_MAX_NUM_PARTIAL_PREFILLS"):
        register()


def test_step_itls_weights_gaps_by_decoding_requests() -> None:
    steps = [
        {"time": 0.00, "decodes": 4},
        {"time": 0.01, "decodes": 4},
        {"time": 0.02, "decodes": 0},  # a prefill-only step: nobody waits on its gap
        {"time": 0.50, "decodes": 4},  # this step carried the long prompt: its gap is the stall
        {"time": 1.50, "decodes": 4},
        {"time": 1.51, "decodes": 0},
    ]
    p50, worst = step_itls(steps)
    assert p50 == pytest.approx(0.01)
    assert worst == pytest.approx(1.0)


def test_simulated_stall_shape() -> None:
    small, large = sim_rows(Scenario(), [512, 16384], "llama-3.1-8b", "h100")
    print(f"\nsimulator max/p50 ITL: budget 512 {small.ratio:.1f}, budget 16384 {large.ratio:.1f}")
    assert large.ratio > 3 * small.ratio
