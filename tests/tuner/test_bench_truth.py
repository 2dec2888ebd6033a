"""Hidden-truth tuner benchmark: the truth stays on the engine side, the JSON shape, the CLI."""

from __future__ import annotations

import ast
import inspect
import json
import math
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from chunkpilot.engine.sim.engine import EngineCore, SimConfig
from chunkpilot.engine.sim.steptime import ForwardPass, StepProfile
from chunkpilot.engine.sim.workload import load_trace
from chunkpilot.tuner.space import build_space
from chunkpilot.tuner.twin.predict import ARRIVAL_SAMPLES, arrival_seeds

from chunkpilot.bench import online as bench_online
from chunkpilot.bench.cli import settings_from
from chunkpilot.bench.exhaustive import (
    FULL,
    SLO_PAIRS,
    BenchError,
    BenchSettings,
    default_config,
    engine_defaults,
    scenario_facts,
)
from chunkpilot.bench.grid import Grid
from chunkpilot.bench.online import OnlineContext, TwinSettings
from chunkpilot.bench.structural_truths import STRUCTURAL_FAMILY, structural_family
from chunkpilot.bench.truth import (
    MARKS,
    METHODS,
    TRUTH_QUICK,
    GroundTruth,
    Truth,
    TruthEngine,
    TruthSettings,
    _falls,
    _sim_slo,
    family_truths,
    format_truth_markdown,
    format_truth_table,
    run_truth_benchmark,
)
from chunkpilot.bench.twin_truth import FAMILY, perturbed_accelerator, truth_engine
from chunkpilot.cli import build_parser, main


class _Opens:
    """Files opened outside the engine's ``serve`` (an audit hook, active only while recording)."""

    def __init__(self) -> None:
        self.recording = False
        self.paths: list[str] = []
        sys.addaudithook(self._hook)

    def _hook(self, event: str, args: tuple[object, ...]) -> None:
        if self.recording and event == "open" and args and isinstance(args[0], str | Path):
            self.paths.append(str(args[0]))


OPENS = _Opens()


class GuardedEngine:
    """The truth engine, with file opens recorded only while the tuner side runs."""

    def __init__(self, inner: TruthEngine) -> None:
        self.inner = inner
        self.calls = 0

    def serve(self, config, rate_req_s):  # type: ignore[no-untyped-def]
        self.calls += 1
        OPENS.recording = False
        try:
            return self.inner.serve(config, rate_req_s)
        finally:
            OPENS.recording = True


@pytest.fixture
def small_grid(tiny_bench: Callable[..., BenchSettings]) -> BenchSettings:
    """The tiny benchmark at 80 requests, a 10% tolerance, three budgets and the first shipped SLO pair."""
    return tiny_bench(requests=80, tolerance=0.1, budget_points=3, slo_pairs=(SLO_PAIRS[0],))


@pytest.fixture
def guarded(tmp_path: Path, small_grid: BenchSettings) -> Iterator[tuple[OnlineContext, GuardedEngine, Path]]:
    truth_dir = tmp_path / "truth"
    source = tmp_path / "truth-source.json"
    source.write_text(json.dumps(perturbed_accelerator(FAMILY["h100-c060-m070-o3"])), encoding="utf-8")
    sim = truth_engine(source, truth_dir)
    slo_pair = SLO_PAIRS[0]
    slo = _sim_slo(slo_pair)
    facts = scenario_facts(small_grid, slo_pair, "azure_code")
    space = build_space(facts)
    lengths = load_trace("azure_code_2023", rate=1.0, limit=80)
    engine = GuardedEngine(TruthEngine(sim, lengths, slo, small_grid.max_model_len))
    context = OnlineContext(facts, space, Grid.over(space, small_grid), slo, 4.0, 2, 0)
    OPENS.paths.clear()
    OPENS.recording = True
    try:
        yield context, engine, tmp_path
    finally:
        OPENS.recording = False


def test_the_tuner_side_never_opens_the_truth_profile(
    guarded: tuple[OnlineContext, GuardedEngine, Path], small_grid: BenchSettings
) -> None:
    context, engine, root = guarded
    trace = bench_online.run_twin(
        context, engine, TwinSettings(evaluations=6, rerank=1, requests=80, tolerance=0.1)
    )
    bench_online.run_slack(context, engine)
    bench_online.run_random_online(context, engine)
    bench_online.run_grid_online(context, engine, small_grid)
    OPENS.recording = False
    assert engine.calls > 0 and trace.evaluations > 0
    # The twin writes and reads its own fitted profile; nothing under the truth's files is touched.
    assert any("twin-step-profile" in p for p in OPENS.paths)
    leaked = [p for p in OPENS.paths if p.startswith(str(root))]
    assert leaked == []


def test_the_tuner_module_cannot_name_the_truth() -> None:
    source = Path(bench_online.__file__).read_text(encoding="utf-8")
    imported = {
        node.module
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and node.module is not None
    }
    assert not any("truth" in module for module in imported), imported
    # Every tuner-side method takes the context (datasheet facts) and the engine, nothing else.
    for method in (
        bench_online.run_twin,
        bench_online.run_slack,
        bench_online.run_random_online,
        bench_online.run_grid_online,
    ):
        params = list(inspect.signature(method).parameters)
        assert params[:2] == ["context", "engine"] and set(params[2:]) <= {"settings", "sizes"}


def test_quick_cli_json_keeps_the_scenario_shape(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "tuner", "--quick", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["benchmark"] == "tuner" and data["methods"] == list(METHODS)
    settings = TRUTH_QUICK
    grid = settings.grid
    assert len(data["scenarios"]) == len(grid.workloads) * len(grid.slo_pairs) * len(settings.loads)
    assert sorted({s["load"] for s in data["scenarios"]}) == [0.3, 0.6, 0.9]
    for scenario in data["scenarios"]:
        shares = scenario["share_after_trials"]
        assert set(shares) == set(METHODS)
        for curve in shares.values():
            assert len(curve) == settings.trials
            assert all(0 <= v <= 1 + 1e-9 for v in curve)
        assert scenario["twin"]["cpu_s_per_trial"] >= 0
        assert scenario["optimum_req_s"] >= scenario["grid_optimum_req_s"] > 0
    assert set(data["goal"]) >= {"met", "measured_median", "misses", "falls"}


def test_a_tiny_run_prints_the_marks_and_markdown(small_grid: BenchSettings) -> None:
    settings = TruthSettings(
        grid=small_grid,
        loads=(0.5,),
        trials=2,
        repeats=1,
        twin=TwinSettings(evaluations=4, rerank=1, requests=80, tolerance=0.1),
    )
    result = run_truth_benchmark(settings)
    [entry] = result.scenarios
    assert entry["truth"] == "h100-c075-m085-o2" and entry["load"] == 0.5
    table = format_truth_table(result)
    assert "azure_code / itl-tight @ 50%" in table and "CPU s per trial" in table
    assert [k for k in MARKS if k <= 2] == [1, 2]
    markdown = format_truth_markdown(result.to_dict())
    assert "| azure_code / itl-tight | 50% |" in markdown and "twin 2" in markdown


def test_settings_and_cli_reject_bad_truths_and_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(BenchError, match="--load"):
        replace(TRUTH_QUICK, loads=(0.0,))
    bad = tmp_path / "gpu.json"
    bad.write_text(json.dumps({"name": "x"}), encoding="utf-8")
    with pytest.raises(BenchError, match=r"--truth-gpu.*peak_tflops"):
        replace(TRUTH_QUICK, truths=(Truth("x", str(bad)),))
    assert main(["bench", "tuner", "--quick", "--truth-gpu", str(tmp_path / "missing.json")]) == 2
    assert "--truth-gpu" in capsys.readouterr().err
    assert main(["bench", "tuner", "--quick", "--truth-gpu", str(bad), "--truth-family"]) == 2
    assert "choose one" in capsys.readouterr().err
    assert main(["bench", "tuner", "--quick", "--load", "2"]) == 2
    with pytest.raises(BenchError, match="--truth-arrivals"):
        replace(TRUTH_QUICK, truth_arrivals=0)
    assert main(["bench", "tuner", "--quick", "--truth-arrivals", "0"]) == 2
    assert "--truth-arrivals" in capsys.readouterr().err
    assert main(["bench", "tuner", "--quick", "--twin-arrivals", "0"]) == 2
    assert "--twin-arrivals" in capsys.readouterr().err


def test_twin_arrivals_are_the_operators_by_default_and_never_the_truths() -> None:
    parser = build_parser()
    default = settings_from(parser.parse_args(["bench", "tuner", "--quick"]))
    one = settings_from(parser.parse_args(["bench", "tuner", "--quick", "--twin-arrivals", "1"]))
    three = settings_from(parser.parse_args(["bench", "tuner", "--quick", "--twin-arrivals", "3"]))
    assert default.twin.arrival_seeds == arrival_seeds(ARRIVAL_SAMPLES) == (1000, 1001)
    assert one.twin.arrival_seeds == (0,)
    assert three.twin.arrival_seeds == (1000, 1001, 1002)
    assert not set(three.twin.arrival_seeds) & {three.grid.seed + k for k in range(10)}  # the truth's
    assert three.twin.evaluations == one.twin.evaluations  # only the samples change


def test_ground_truth_averages_the_capacity_over_arrival_samples(
    tmp_path: Path, small_grid: BenchSettings
) -> None:
    source = tmp_path / "truth-source.json"
    source.write_text(json.dumps(perturbed_accelerator(FAMILY["h100-c100-m070-o1"])), encoding="utf-8")
    sim = truth_engine(source, tmp_path / "truth")
    engine = engine_defaults(small_grid)
    sim = replace(sim, scheduler=engine.scheduler)
    slo = _sim_slo(SLO_PAIRS[1])
    lengths = load_trace("azure_code_2023", rate=1.0, limit=80)
    config = default_config(small_grid)
    one = GroundTruth(sim, lengths, slo, small_grid)
    three = GroundTruth(sim, lengths, slo, small_grid, arrivals=3)
    samples = three.samples(config)
    assert len(samples) == 3
    assert samples[0] == one.capacity(config)  # the first sample is the single-sample truth
    assert len(set(samples)) > 1  # the arrival sample moves the capacity
    assert three.capacity(config) == pytest.approx(sum(samples) / 3)


def test_shipped_family_is_the_generator_output_and_spans_the_ranges() -> None:
    root = resources.files("chunkpilot.bench.truths")
    for name, perturbation in FAMILY.items():
        assert json.loads(root.joinpath(f"{name}.json").read_text(encoding="utf-8")) == json.loads(
            json.dumps(perturbed_accelerator(perturbation))
        )
    assert {t.name for t in family_truths()} == set(FAMILY)
    values = list(FAMILY.values())
    assert min(p.compute for p in values) == 0.6 and max(p.compute for p in values) == 1.0
    assert min(p.memory for p in values) == 0.7 and max(p.memory for p in values) == 1.0
    assert min(p.overhead for p in values) == 1.0 and max(p.overhead for p in values) == 3.0


def test_truth_engine_applies_the_overhead_factor(tmp_path: Path) -> None:
    data = perturbed_accelerator(FAMILY["h100-c100-m100-o3"])
    source = tmp_path / "gpu.json"
    source.write_text(json.dumps(data), encoding="utf-8")
    sim = truth_engine(source, tmp_path / "out")
    profile = json.loads(Path(str(sim.step_profile)).read_text(encoding="utf-8"))
    from chunkpilot.engine.sim.steptime import Efficiency

    base = Efficiency.calibrated()
    assert math.isclose(profile["efficiency"]["step_overhead_s"], base.step_overhead_s * 3.0)
    assert default_config(FULL).max_num_batched_tokens > 0


# --------------------------------------------------------------------------- truths of another structure

STRUCTURAL = "h100-vidur-a035-o3ms"


def _step(sim: SimConfig) -> float:
    """One decode step of 8 sequences over 8000 context tokens on ``sim``'s engine."""
    fp = ForwardPass(num_tokens=8, num_sequences=8, num_sampled=8, decode_context_tokens=8000)
    return EngineCore(sim).step_model.step_time(fp)


def test_the_step_profile_reaches_the_truth_and_not_the_tuner(tmp_path: Path) -> None:
    path = structural_family()[STRUCTURAL]
    parser = build_parser()
    plain = settings_from(parser.parse_args(["bench", "tuner", "--quick"]))
    given = settings_from(parser.parse_args(["bench", "tuner", "--quick", "--truth-step-profile", str(path)]))
    assert given.truths == (Truth(STRUCTURAL, None, str(path)),)
    # The tuner's side is told exactly what it is told without the flag: the datasheet, its settings.
    assert given.grid == plain.grid and given.twin == plain.twin and given.grid.accelerator == "h100"
    assert str(path) not in repr((given.grid, given.twin))
    # The truth's engine runs the profile: its steps are the profile's, not the datasheet roofline's.
    datasheet = truth_engine(None, tmp_path / "datasheet")
    structural = truth_engine(None, tmp_path / "structural", step_profile=path)
    assert Path(str(structural.step_profile)).parent == tmp_path / "structural"  # a copy, under the truth
    model = EngineCore(structural).step_model
    profile = StepProfile.load(path)
    assert model.linear_time(8) == profile.linear_time(8)
    assert model.efficiency.step_overhead_s == 3e-3 and model.efficiency.attention_compute == 0.35
    # Its overheads alone (3 ms a step, 30 us a sequence, against 0.6 ms and 5 us) add about a quarter.
    assert _step(structural) > 1.2 * _step(datasheet)
    # On another accelerator (--truth-gpu): the profile's linear layers, that accelerator's attention.
    slow_hbm = tmp_path / "slow-hbm.json"
    slow_hbm.write_text(json.dumps(perturbed_accelerator(FAMILY["h100-c100-m070-o1"])), encoding="utf-8")
    on_gpu = truth_engine(slow_hbm, tmp_path / "on-gpu", step_profile=path)
    assert EngineCore(on_gpu).step_model.linear_time(8) == model.linear_time(8)
    assert _step(on_gpu) > _step(structural)


def test_an_overhead_factor_applies_where_the_step_profile_sets_no_overheads(tmp_path: Path) -> None:
    document = json.loads(structural_family()[STRUCTURAL].read_text(encoding="utf-8"))
    for name in ("step_overhead_s", "per_sequence_overhead_s"):
        del document["efficiency"][name]
    profile = tmp_path / "no-overheads.json"
    profile.write_text(json.dumps(document), encoding="utf-8")
    gpu = tmp_path / "o3.json"
    gpu.write_text(json.dumps(perturbed_accelerator(FAMILY["h100-c100-m100-o3"])), encoding="utf-8")
    sim = truth_engine(gpu, tmp_path / "truth", step_profile=profile)
    from chunkpilot.engine.sim.steptime import Efficiency

    eff = EngineCore(sim).step_model.efficiency
    assert eff.step_overhead_s == pytest.approx(3 * Efficiency.calibrated().step_overhead_s)
    assert eff.attention_compute == 0.35  # the profile's own overrides stay


def test_the_tuner_side_never_opens_the_step_profile(tmp_path: Path, small_grid: BenchSettings) -> None:
    path = structural_family()[STRUCTURAL]
    sim = truth_engine(None, tmp_path / "truth", step_profile=path)
    slo_pair = SLO_PAIRS[0]
    facts = scenario_facts(small_grid, slo_pair, "azure_code")
    space = build_space(facts)
    lengths = load_trace("azure_code_2023", rate=1.0, limit=80)
    engine = GuardedEngine(TruthEngine(sim, lengths, _sim_slo(slo_pair), small_grid.max_model_len))
    context = OnlineContext(facts, space, Grid.over(space, small_grid), _sim_slo(slo_pair), 4.0, 2, 0)
    OPENS.paths.clear()
    OPENS.recording = True
    try:
        trace = bench_online.run_twin(
            context, engine, TwinSettings(evaluations=4, rerank=1, requests=80, tolerance=0.1)
        )
    finally:
        OPENS.recording = False
    assert engine.calls > 0 and trace.evaluations > 0
    assert any("twin-step-profile" in p for p in OPENS.paths)
    leaked = [p for p in OPENS.paths if p.startswith(str(tmp_path)) or Path(p).name == path.name]
    assert leaked == []


def test_a_tiny_run_names_the_step_profile_in_the_truth(tmp_path: Path, small_grid: BenchSettings) -> None:
    gpu = tmp_path / "h100-c100-m070-o1.json"
    gpu.write_text(json.dumps(perturbed_accelerator(FAMILY["h100-c100-m070-o1"])), encoding="utf-8")
    truth = Truth.of(str(gpu), str(structural_family()[STRUCTURAL]))
    settings = TruthSettings(
        grid=small_grid,
        truths=(truth,),
        loads=(0.5,),
        trials=1,
        repeats=1,
        twin=TwinSettings(evaluations=3, rerank=1, requests=80, tolerance=0.1),
    )
    data = run_truth_benchmark(settings).to_dict()
    [entry] = data["scenarios"]
    assert entry["truth"] == f"h100-c100-m070-o1+{STRUCTURAL}"
    assert f"step profile {STRUCTURAL}" in entry["truth_profile"] and "HBM x0.7" in entry["truth_profile"]
    assert data["truths"] == [{"name": entry["truth"], "profile": entry["truth_profile"]}]
    assert set(entry) >= {"share_after_trials", "optimum_req_s", "twin", "final_config"}


def test_structural_family_flag_runs_every_shipped_profile() -> None:
    parser = build_parser()
    structural = settings_from(parser.parse_args(["bench", "tuner", "--truth-family", "structural"]))
    assert {t.name for t in structural.truths} == set(STRUCTURAL_FAMILY)
    assert all(t.path is None and t.step_profile for t in structural.truths)
    perturbed = settings_from(parser.parse_args(["bench", "tuner", "--truth-family"]))
    assert {t.name for t in perturbed.truths} == set(FAMILY)
    assert (
        perturbed.truths
        == settings_from(parser.parse_args(["bench", "tuner", "--truth-family", "perturbed"])).truths
    )


def _errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["bench", "tuner", "--quick", *argv]) == 2
    return capsys.readouterr().err


def test_bad_step_profiles_and_combinations_are_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = str(structural_family()[STRUCTURAL])
    gpu = str(tmp_path / "o3.json")
    Path(gpu).write_text(json.dumps(perturbed_accelerator(FAMILY["h100-c100-m100-o3"])), encoding="utf-8")
    missing = _errors(["--truth-step-profile", str(tmp_path / "missing.json")], capsys)
    assert "--truth-step-profile" in missing and "cannot read" in missing and "step-profile/v1" in missing
    not_a_profile = _errors(["--truth-step-profile", gpu], capsys)
    assert "--truth-step-profile" in not_a_profile and "'schema'" in not_a_profile
    document = json.loads(Path(good).read_text(encoding="utf-8"))
    for field, value, expected in (
        ("model", "llama-3.1-70b", "benchmark runs llama-3.1-8b"),
        ("tensor_parallel_size", 2, "tensor_parallel_size 2"),
        ("efficiency", {"warp_speed": 1.0}, "warp_speed"),
        ("linear_ms", {"0": 1.0}, "linear_ms"),
    ):
        bad = tmp_path / f"bad-{field}.json"
        bad.write_text(json.dumps({**document, field: value}), encoding="utf-8")
        err = _errors(["--truth-step-profile", str(bad)], capsys)
        assert "--truth-step-profile" in err and expected in err, err
    clash = _errors(["--truth-step-profile", good, "--truth-gpu", gpu], capsys)
    assert "truth.overhead" in clash and "drop one" in clash
    for family in ("structural", "perturbed"):
        both = _errors(["--truth-step-profile", good, "--truth-family", family], capsys)
        assert "--truth-step-profile and --truth-family: choose one" in both
    gpu_and_family = _errors(["--truth-gpu", gpu, "--truth-family", "structural"], capsys)
    assert "--truth-gpu and --truth-family" in gpu_and_family
    with pytest.raises(BenchError, match="--truth-step-profile"):
        replace(TRUTH_QUICK, truths=(Truth("x", None, gpu),))


def test_every_fall_of_the_twins_incumbent_is_reported() -> None:
    def entry(curve: list[float]) -> dict[str, Any]:
        return {
            "truth": "t",
            "workload": "w",
            "slo": {"name": "s"},
            "load": 0.6,
            "share_after_trials": {"twin": curve},
        }

    assert _falls(entry([0.5, 1.0, 1.0])) == []
    falls = _falls(entry([0.5, 1.0, 0.979, 0.979, 0.95]))
    assert falls == [
        "t / w / s @ 60%: 100.0% after trial 2 -> 97.9% after trial 3",
        "t / w / s @ 60%: 97.9% after trial 4 -> 95.0% after trial 5",
    ]
