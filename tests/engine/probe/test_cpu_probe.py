"""``chunkpilot probe`` for real: torch times a tiny model on the CPU and the profile is checked end to end.

The probe runs as a subprocess of the installed ``chunkpilot`` script, with torch
from the ``torch_env`` fixture (the interpreter's own torch, or the cached one).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from chunkpilot.engine.probe import load_profile
from chunkpilot.engine.sim.profiles.loader import load_accelerator, load_model
from chunkpilot.engine.sim.steptime import StepProfile as SimStepProfile
from chunkpilot.engine.sim.steptime import StepTimeModel

pytestmark = pytest.mark.slow

TINY_CONFIG = {
    "name": "tiny-llama",
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "intermediate_size": 256,
    "vocab_size": 1000,
    "torch_dtype": "float32",
}
TOKENS = (1, 4, 16, 64)
DECODE_LIMIT = 16
ITL_TARGET_MS = 2.0


def _chunkpilot() -> str:
    return str(Path(sys.executable).with_name("chunkpilot"))


def _probe(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_chunkpilot(), "probe", *args], env=env, capture_output=True, text=True, timeout=600, check=False
    )


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "config.json"
    path.write_text(json.dumps(TINY_CONFIG), encoding="utf-8")
    return path


def test_probe_runs_on_the_cpu_and_writes_a_valid_profile(
    torch_env: dict[str, str], tiny_model: Path, tmp_path: Path
) -> None:
    out = tmp_path / "profile.json"
    result = _probe(
        torch_env,
        *("--model", str(tiny_model), "--tensor-parallel-size", "2", "--out", str(out)),
        *("--tokens", ",".join(str(t) for t in TOKENS), "--context-tokens", "32"),
        *("--max-decode-sequences", str(DECODE_LIMIT), "--itl-target-ms", f"{ITL_TARGET_MS:g}"),
        *("--warmup", "1", "--repeats", "3", "--min-repeat-ms", "0.5", "--threads", "1"),
    )
    assert result.returncode == 0, result.stderr
    print(result.stdout)

    profile = load_profile(out)  # validates against the schema
    assert (profile.device, profile.accelerator, profile.dtype, profile.dtype_bytes) == (
        "cpu",
        "cpu",
        "float32",
        4,
    )
    assert profile.tensor_parallel_size == 2
    assert profile.torch_version is not None and profile.torch_version.startswith("2.13.0")
    assert profile.model_shape.name == "tiny-llama"
    assert (profile.shard.attention.num_heads, profile.shard.attention.num_kv_heads) == (4, 2)
    assert [p.tokens for p in profile.points] == list(TOKENS)
    for point in profile.points:
        assert point.linear_ms > 0 and point.prefill_attention_ms > 0
        assert (point.decode_attention_ms is not None) == (point.tokens <= DECODE_LIMIT)
        assert profile.linear_ms[point.tokens] == pytest.approx(2 * point.linear_ms)
    assert profile.settings.context_tokens == 32 and profile.settings.threads == 1
    assert profile.peaks.source.value == "microbenchmark"
    assert profile.efficiency == {}  # no datasheet for "cpu": nothing to override in the simulator
    assert profile.knee_tokens == profile.compute_knee_tokens()
    assert profile.itl_target_ms == ITL_TARGET_MS
    assert profile.itl_feasible_budget_tokens == profile.itl_feasible_budget(ITL_TARGET_MS)

    # The simulator reads the same file as a step profile and uses its measured linear times.
    sim_profile = SimStepProfile.load(out)
    model = StepTimeModel(load_model(str(tiny_model)), load_accelerator("h200"), 2, step_profile=sim_profile)
    assert model.linear_time(16) == pytest.approx(profile.linear_ms[16] / 1000)

    # stdout: the knee and one table row per token count.
    lines = result.stdout.splitlines()
    assert f"knee: {profile.knee_tokens} tokens" in lines
    rows = [line.split() for line in lines if line.split() and line.split()[0].isdigit()]
    assert [int(row[0]) for row in rows] == list(TOKENS)
    assert any(line.startswith(f"ITL target {ITL_TARGET_MS:g} ms: feasible token budget") for line in lines)
    assert "wrote" in result.stderr


def test_cuda_without_a_gpu_is_a_clear_error(torch_env: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    result = _probe(torch_env, "--model", "llama-3.1-8b", "--device", "cuda", "--out", str(out))
    if result.returncode == 0:
        pytest.skip("this host has a CUDA device")
    assert result.returncode == 2
    assert "--device cuda: torch sees no CUDA device" in result.stderr
    assert not out.exists()


@pytest.mark.gpu
def test_llama_8b_profile_on_the_gpu(torch_env: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    result = _probe(
        torch_env, "--model", "llama-3.1-8b", "--device", "cuda", "--itl-target-ms", "50", "--out", str(out)
    )
    assert result.returncode == 0, result.stderr
    print(result.stdout)
    profile = load_profile(out)
    assert profile.device == "cuda"
    assert profile.knee_tokens is not None and profile.itl_feasible_budget_tokens is not None
