"""``chunkpilot sim run|capacity|serve|bench`` through the real command line (in-process)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from chunkpilot.engine.sim.flags import config_for, sim_config_from_args
from chunkpilot.engine.sim.scheduler import TrtllmSchedulerConfig
from chunkpilot.engine.sim.workload import resolve_trace

from chunkpilot.cli import build_parser, main

REPO = Path(__file__).resolve().parents[3]


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict[str, Any]:
    assert main(argv) == 0
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    return data


@pytest.mark.slow
def test_run_whole_azure_conv_trace_prints_the_summary(capsys: pytest.CaptureFixture[str]) -> None:
    trace = str(resolve_trace("azure_conv_2023"))
    data = _json(
        capsys, ["sim", "run", "--trace", trace, "--model", "llama-3.1-8b", "--gpu", "h100", "--json"]
    )
    assert data["requests"] == data["completed"] == 19_366
    assert 3400 < data["duration_s"] < 3700
    for key in ("ttft_ms", "itl_ms", "e2e_ms"):
        assert set(data[key]) >= {"p50", "p90", "p95", "p99", "max"}
        assert 0 < data[key]["p50"] <= data[key]["p99"] <= data[key]["max"]
    for key in ("throughput_tok_s", "goodput_req_s", "slo_attainment", "preemptions", "steps", "wall_s"):
        assert isinstance(data[key], int | float)
    assert data["config"]["max_num_batched_tokens"] == 8192  # vLLM's default on an H100


def test_run_flags_reach_the_engine_and_slo(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["sim", "run", "--trace", "azure_code_2023", "--limit", "300", "--model", "mistral-7b",
            "--gpu", "a100-80gb", "--max-num-batched-tokens", "1024", "--max-num-seqs", "64",
            "--max-model-len", "16384",
            "--no-enable-prefix-caching", "--slo-itl-ms", "80", "--slo-itl-quantile", "0.9",
            "--slo-ttft-ms", "3000", "--slo-ttft-quantile", "0.5", "--json"]  # fmt: skip
    data = _json(capsys, argv)
    assert data["requests"] == 300
    assert data["slo"] == {"itl_ms": 80.0, "itl_quantile": 0.9, "ttft_ms": 3000.0, "ttft_quantile": 0.5}
    config = data["config"]
    assert (config["model"], config["accelerator"]) == ("mistral-7b", "a100-80gb")
    assert (config["max_num_batched_tokens"], config["max_num_seqs"], config["max_model_len"]) == (
        1024,
        64,
        16384,
    )
    assert config["enable_prefix_caching"] is False


def test_run_human_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "run", "--workload", "n=50,rate=10,prompt=256,output=32"]) == 0
    out = capsys.readouterr().out
    assert "TTFT" in out and "ITL" in out and "50/50 requests" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--trace", "azure_conv_2023", "--model", "gpt-17"], "unknown model 'gpt-17'"),
        (["--trace", "azure_conv_2023", "--gpu", "tpu"], "tpu"),
        (["--workload", "n=5", "--rate", "3"], "--rate applies to --trace"),
        (["--trace", "nope.csv"], "bundled traces"),
        (["--trace", "azure_conv_2023", "--slo-itl-quantile", "99"], "--slo-itl-quantile"),
        (
            ["--trace", "azure_conv_2023", "--max-num-batched-tokens", "16", "--max-num-seqs", "32"],
            "--max-num-seqs",
        ),
    ],
)
def test_run_bad_input_is_a_clear_error(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert main(["sim", "run", *argv]) == 2
    assert message in capsys.readouterr().err


def test_run_needs_exactly_one_workload_source(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        main(["sim", "run"])
    assert raised.value.code == 2
    assert "--trace" in capsys.readouterr().err


def test_capacity_bisects_to_the_tolerance(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["sim", "capacity", "--trace", "azure_conv_2023", "--requests", "200", "--model", "llama-3.1-8b",
            "--gpu", "h100", "--slo-itl-ms", "40", "--slo-ttft-ms", "1000", "--json"]  # fmt: skip
    data = _json(capsys, argv)
    assert data["feasible"] is True
    assert data["capacity_req_s"] > 0
    assert (data["upper_req_s"] - data["lower_req_s"]) / data["lower_req_s"] <= 0.025
    verdicts = {p["rate_req_s"]: p["slo_met"] for p in data["probes"]}
    assert verdicts[data["lower_req_s"]] is True and verdicts[data["upper_req_s"]] is False
    assert data["at_capacity"]["slo_met"] is True
    assert data["at_capacity"]["requests"] == 200


def test_capacity_reports_an_unreachable_slo(capsys: pytest.CaptureFixture[str]) -> None:
    data = _json(
        capsys,
        ["sim", "capacity", "--workload", "n=20,prompt=512,output=16", "--slo-itl-ms", "0.5", "--json"],
    )
    assert data["feasible"] is False and data["capacity_req_s"] == 0.0


def _serve_args(argv: list[str]) -> Any:
    return build_parser().parse_args(["sim", "serve", *argv])


def test_serve_rejects_unknown_and_abbreviated_flags(capsys: pytest.CaptureFixture[str]) -> None:
    for bad in (["--not-a-vllm-flag", "1"], ["--max-num-batched", "512"]):
        with pytest.raises(SystemExit) as raised:
            _serve_args(["llama-3.1-8b", *bad])
        assert raised.value.code == 2
        assert "unrecognized arguments" in capsys.readouterr().err


def test_serve_rejects_a_bad_configuration_before_listening(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["sim", "serve", "llama-3.1-8b", "--max-num-batched-tokens", "8", "--max-num-seqs", "16"]) == 2
    )
    assert "--max-num-seqs" in capsys.readouterr().err
    assert main(["sim", "serve", "llama-3.1-8b", "--time-scale", "0"]) == 2
    assert "--time-scale" in capsys.readouterr().err
    assert main(["sim", "serve", "llama-3.1-70b", "--gpu", "a100-40gb"]) == 2
    assert "does not fit on 1 x a100-40gb" in capsys.readouterr().err
    assert main(["sim", "serve", "llama-3.1-8b", "--tensor-parallel-size", "3"]) == 2
    assert "--tensor-parallel-size 3 must divide" in capsys.readouterr().err


def _example_engine_args() -> list[tuple[str, str, list[str], dict[str, str]]]:
    from chunkpilot.operator.engines import render_engine
    from chunkpilot.operator.engines.common import EngineRender

    from chunkpilot.api import InferenceService

    cases: list[tuple[str, str, list[str], dict[str, str]]] = []
    for path in sorted((REPO / "examples").glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if not document or document.get("kind") != "InferenceService":
                continue
            spec = InferenceService.from_manifest(document).spec
            render = render_engine(spec)
            assert isinstance(render, EngineRender), f"{path.name}: {render}"
            env = {item["name"]: item["value"] for item in render.env if "value" in item}
            cases.append((path.name, str(spec.engine.kind), list(render.args), env))
    return cases


#: The token-budget and running-limit flags of each engine's dialect.
_LIMIT_FLAGS = {
    "sglang": ("--chunked-prefill-size", "--max-running-requests"),
    "trtllm": ("--max_num_tokens", "--max_batch_size"),
}


@pytest.mark.parametrize(("example", "kind", "args", "env"), _example_engine_args())
def test_serve_accepts_every_flag_the_operator_renders(
    example: str, kind: str, args: list[str], env: dict[str, str], tmp_path: Path
) -> None:
    """The operator's argument vectors parse and configure the simulator: vLLM's and the simulator's
    as they are, SGLang's and TensorRT-LLM's in their own dialect (recognised by their spelling)."""
    if kind in _LIMIT_FLAGS:
        options = next((value for name, value in env.items() if name.endswith("LLM_API_OPTIONS")), None)
        if options is not None:  # the options file the container writes from its environment
            (tmp_path / "llm-api.yaml").write_text(options)
            args = [str(tmp_path / "llm-api.yaml") if a.endswith("llm-api.yaml") else a for a in args]
        parsed = _serve_args(args)
        assert parsed.engine == kind
        config = config_for(parsed.model, parsed)
        assert config.engine.value == kind
        budget_flag, seqs_flag = _LIMIT_FLAGS[kind]
        assert config.scheduler.max_num_seqs == int(args[args.index(seqs_flag) + 1])
        budget = int(args[args.index(budget_flag) + 1])
        if budget > 0:
            assert config.scheduler.max_num_batched_tokens == budget
        return
    parsed = _serve_args(args)
    config = sim_config_from_args(parsed.model, parsed)
    assert config.scheduler.max_num_batched_tokens == int(args[args.index("--max-num-batched-tokens") + 1])
    assert config.scheduler.max_num_seqs == int(args[args.index("--max-num-seqs") + 1])
    assert parsed.port == 8000 and parsed.served_model_name == [args[args.index("--served-model-name") + 1]]


def test_bench_prints_speed_and_calibration(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    trace = tmp_path / "small.csv"
    source = resolve_trace("azure_conv_2023").read_text().splitlines()
    trace.write_text("\n".join(source[:301]) + "\n")
    data = _json(capsys, ["sim", "bench", "--trace", str(trace), "--repeat", "1", "--step-by-step", "--json"])
    speed = data["speed"]
    assert speed["requests"] == 300 and speed["wall_s"] > 0 and speed["step_by_step_wall_s"] > 0
    operators = set(data["calibration_by_operator"])
    assert {"attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj"} <= operators
    assert all(row["mean_abs_pct"] >= 0 for row in data["calibration"])
    assert 0 < data["calibration_mean_abs_pct"] < 50
    assert main(["sim", "bench", "--trace", str(trace), "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "wall time" in out and "mlp_up_proj" in out


@pytest.mark.parametrize(
    ("flag", "expected"),
    [
        ([], True),
        (["--enable-chunked-prefill"], True),
        (["--no-enable-chunked-prefill"], False),
        (["--enable-chunked-prefill=false"], False),  # how the operator spells it for vLLM < 0.10
        (["--enable-chunked-prefill=true"], True),
    ],
)
def test_switch_spellings(flag: list[str], expected: bool) -> None:
    args = _serve_args(["llama-3.1-8b", *flag, "--max-num-batched-tokens", "131072"])
    assert args.enable_chunked_prefill is expected
    assert sim_config_from_args(args.model, args).scheduler.enable_chunked_prefill is expected


def test_switch_rejects_a_non_boolean(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _serve_args(["llama-3.1-8b", "--enable-prefix-caching=maybe"])
    assert "expected true or false" in capsys.readouterr().err


STALL_TRACE = "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
    [*["2023-11-16 18:15:46.0000000,128,3000\n"] * 8, "2023-11-16 18:15:48.0000000,16384,1\n"]
)


@pytest.mark.parametrize(("mixed", "stalled"), [([], 16384 // 2048), (["--enable-mixed-chunk"], 0)])
def test_sglang_run_counts_one_stalled_step_per_chunk_without_mixed_chunks(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, mixed: list[str], stalled: int
) -> None:
    """Eight streams decode when a 16k prompt arrives: cut into 2048-token chunks it stalls them for
    one chunk-only pass per chunk, unless the chunks carry the decodes."""
    trace = tmp_path / "stall.csv"
    trace.write_text(STALL_TRACE)
    argv = ["sim", "run", "--engine", "sglang", "--trace", str(trace), "--chunked-prefill-size", "2048"]
    data = _json(capsys, [*argv, "--context-length", "32768", *mixed, "--json"])
    assert data["decode_stall_steps"] == stalled
    assert data["config"]["engine"] == "sglang" and data["completed"] == 9
    assert main([*argv, "--context-length", "32768", *mixed]) == 0
    assert f"{stalled} decode-stalled steps" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--engine", "sglang", "--schedule-policy", "priority"],
            "--schedule-policy priority is not simulated",
        ),
        (["--engine", "sglang", "--max-num-seqs", "4"], "unrecognized arguments: --max-num-seqs"),
        (["--engine", "trtllm", "--max_num_tokens", "16"], "tokens_per_block"),
        (["--engine", "trtllm", "--extra_llm_api_options", "/nonexistent.yaml"], "/nonexistent.yaml"),
    ],
)
def test_engine_flags_are_checked_in_the_engines_own_terms(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    extra = ["--enable_chunked_prefill"] if "--max_num_tokens" in argv else []
    try:
        code = main(["sim", "run", *argv, *extra, "--workload", "n=5"])
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    assert code == 2
    assert message in capsys.readouterr().err


def test_trtllm_options_file_sets_the_capacity_policy_and_chunking(tmp_path: Path) -> None:
    options = tmp_path / "llm-api.yaml"
    options.write_text(
        "enable_chunked_prefill: true\nmax_num_tokens: 1024\n"
        "scheduler_config:\n  capacity_scheduler_policy: MAX_UTILIZATION\n"
        "kv_cache_config:\n  tokens_per_block: 64\n  enable_block_reuse: false\n"
    )
    args = _serve_args(
        ["serve", "llama-3.1-8b", "--max_num_tokens", "4096", "--extra_llm_api_options", str(options)]
    )
    sched = config_for(args.model, args).scheduler
    assert (
        args.engine == "trtllm"
        and isinstance(sched, TrtllmSchedulerConfig)
        and sched.engine.value == "trtllm"
    )
    assert sched.max_num_batched_tokens == 1024  # the options file overrides the flag, as in trtllm-serve
    assert sched.enable_chunked_prefill and not sched.enable_prefix_caching
    assert sched.capacity_scheduler_policy.value == "MAX_UTILIZATION" and sched.chunk_unit_size == 64
    options.write_text("scheduler_config:\n  capacity_scheduler_policy: STATIC_BATCH\n")
    with pytest.raises(ValueError, match="STATIC_BATCH"):
        config_for(args.model, args)
