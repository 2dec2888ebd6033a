"""``chunkpilot bench autoscale``: rate profiles, the fleet on a truth, the baselines, the command."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import pytest
from chunkpilot.engine.sim.engine import SimConfig
from chunkpilot.engine.sim.offline import SLO
from chunkpilot.engine.sim.scheduler import SchedulerConfig
from chunkpilot.engine.sim.steptime import StepProfile
from chunkpilot.tuner.decide.lifecycle import MAX_RESCALE_RESTARTS_WINDOWS
from chunkpilot.tuner.space import TunedConfig

from chunkpilot.api import ScalingMode, ScalingSpec
from chunkpilot.bench.autoscale import (
    AUTOSCALE_QUICK,
    MODEL,
    RETUNE_WINDOW_S,
    _hpa_queue,
    _Round,
    _settle_oracle,
    _TwinSizing,
    average_capacity,
    format_autoscale_markdown,
    held_counts,
    register,
    settings_from,
)
from chunkpilot.bench.fleet import Fleet, FleetRun, View
from chunkpilot.bench.rate_profile import RateProfileError, read_rate_profile, shipped_profiles
from chunkpilot.bench.structural_truths import STRUCTURAL_FAMILY, structural_family
from chunkpilot.cli import main

CONFIG = TunedConfig(max_num_batched_tokens=512, max_num_seqs=64)
SIM = SimConfig(scheduler=SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=64))


def profile_file(tmp_path: Path, text: str, name: str = "p.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_shipped_profiles_have_the_shapes_they_are_named_for() -> None:
    profiles = {name: read_rate_profile(path) for name, path in shipped_profiles().items()}
    assert set(profiles) == {"diurnal", "flash-crowd", "mix-shift", "drain"}
    diurnal = profiles["diurnal"]
    assert diurnal.peak >= 5 * min(p.load for p in diurnal.points)
    crowd = profiles["flash-crowd"]
    (step,) = crowd.steps()
    assert crowd.load_at(step + 60) == pytest.approx(3.5 * crowd.load_at(step))
    shift = profiles["mix-shift"]
    assert len(shift.workloads) == 2 and len({p.load for p in shift.points}) == 1
    drain = profiles["drain"]
    assert drain.load_at(drain.duration_s) <= 0.05 * drain.load_at(0)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("t,load\n0,1,azure_conv\n60,1\n", "write t_s,load or t_s,load,workload"),
        ("t_s,load,workload\n0,1,azure_conv\n60,1\n30,2\n", "row 4: t_s 30 is not after"),
        ("t_s,load,workload\n0,1,chat\n60,1\n", "unknown workload 'chat'; use one of azure_conv"),
        ("t_s,load,workload\n0,1\n60,1\n", "row 2: the first row must name its workload"),
        ("t_s,load,workload\n0,-1,azure_conv\n60,1\n", "must be a finite number >= 0"),
        ("t_s,load,workload\n5,1,azure_conv\n60,1\n", "the first row must be at t_s 0"),
        ("t_s,load,workload\n0,1,azure_conv\n", "at least two rows"),
        ("t_s,load,workload\n0,x,azure_conv\n60,1\n", "must be numbers"),
    ],
)
def test_a_bad_profile_is_refused_naming_the_row_and_the_fix(tmp_path: Path, text: str, says: str) -> None:
    with pytest.raises(RateProfileError, match=None) as caught:
        read_rate_profile(profile_file(tmp_path, text))
    assert says in str(caught.value)


def test_arrivals_follow_the_load_and_carry_the_workload_in_force(tmp_path: Path) -> None:
    path = profile_file(
        tmp_path, "# a comment\nt_s,load,workload\n0,1,azure_conv\n600,3,azure_code\n1200,3\n"
    )
    profile = read_rate_profile(path)
    arrivals = profile.arrivals(unit_req_s=2.0, seed=1)
    first = [a for a in arrivals if a[0] < 600]
    second = [a for a in arrivals if a[0] >= 600]
    # 2 -> 6 req/s over the first ten minutes (2400 expected), 6 req/s over the next (3600).
    assert abs(len(first) - 2400) < 5 * math.sqrt(2400) and abs(len(second) - 3600) < 5 * math.sqrt(3600)
    assert {w for _, w in first} == {"azure_conv"} and {w for _, w in second} == {"azure_code"}
    assert arrivals == profile.arrivals(unit_req_s=2.0, seed=1)  # seeded


def test_direction_changes_count_turns_between_scale_events() -> None:
    run = FleetRun([], 0.0, [(0, 2), (60, 4), (120, 5), (180, 3), (240, 4), (300, 4)])
    assert run.direction_changes() == 2 and run.max_replicas == 5


def test_more_replicas_of_the_fleet_serve_the_same_load_faster_and_new_ones_start_late(
    tmp_path: Path,
) -> None:
    profile = read_rate_profile(profile_file(tmp_path, "t_s,load,workload\n0,1,azure_conv\n300,1\n"))
    slo = SLO()
    results = {}
    for replicas in (1, 3):
        fleet = Fleet(SIM, 8192, startup_s=0.0, slo=slo)
        results[replicas] = fleet.run(profile, 12.0, lambda _v, n=replicas: n, CONFIG, replicas, seed=0)
    one, three = results[1], results[3]
    assert sum(m.arrivals for m in one.minutes) == sum(m.arrivals for m in three.minutes) > 3000
    assert three.gpu_seconds == pytest.approx(3 * one.gpu_seconds) == pytest.approx(900.0)
    assert three.minutes[2].ttft_ms(0.95) < one.minutes[2].ttft_ms(0.95)
    assert three.minutes[2].itl_ms(0.99) <= one.minutes[2].itl_ms(0.99)
    # Asked for a second replica after the first tick (15 s), it serves from 135 s on.
    late = Fleet(SIM, 8192, startup_s=120.0, slo=slo)
    run = late.run(profile, 1.0, lambda _v: 2, CONFIG, 1, seed=0)
    assert [(m.replicas, m.ready) for m in run.minutes[:3]] == [(2, 1), (2, 1), (2, 2)]
    assert run.events == [(0.0, 1), (15.0, 2)]


def test_the_methods_see_the_rate_as_the_operator_reads_it_arrivals_in_a_burst_completions_in_a_drain(
    tmp_path: Path,
) -> None:
    """Completions plus the growth of the requests in the engines, a fall not subtracted: a burst
    one replica cannot serve reads at its arrivals, the backlog it drains afterwards at its
    completions (the load itself near zero by then)."""
    profile = read_rate_profile(
        profile_file(tmp_path, "t_s,load,workload\n0,1,azure_conv\n90,1\n91,0.01\n240,0.01\n")
    )
    views: list[View] = []

    def watch(view: View) -> int:
        views.append(view)
        return 1

    Fleet(SIM, 8192, startup_s=0.0, slo=SLO()).run(profile, 30.0, watch, CONFIG, 1, seed=0)
    burst = [v for v in views if v.now_s == 90.0]
    assert burst[0].rate_req_s == pytest.approx(30.0, rel=0.15) and burst[0].waiting_per_replica > 100
    # A minute after the burst under 1 req/s has arrived over the last minute; the backlog completes.
    draining = [v.rate_req_s for v in views if 150.0 <= v.now_s <= 165.0]
    assert len(draining) == 2 and min(draining) > 5.0


def test_a_new_configuration_rolls_out_with_the_old_replicas_serving_until_the_new_ones_are_ready(
    tmp_path: Path,
) -> None:
    profile = read_rate_profile(profile_file(tmp_path, "t_s,load,workload\n0,1,azure_conv\n300,1\n"))
    other = TunedConfig(max_num_batched_tokens=1024, max_num_seqs=64)
    fleet = Fleet(SIM, 8192, startup_s=60.0, slo=SLO())
    run = fleet.run(
        profile, 2.0, lambda _v: 2, CONFIG, 2, seed=0, knobs=lambda v: other if v.now_s >= 60 else CONFIG
    )
    assert run.events == [(0.0, 2), (60.0, 2)]
    # The old pair served until the new pair was Ready (120 s): four replicas' GPU time overlapped.
    assert run.gpu_seconds == pytest.approx(2 * 120.0 + 2 * (300.0 - 60.0))
    assert [m.ready for m in run.minutes] == [2, 2, 2, 2, 2] and all(m.replicas == 2 for m in run.minutes)
    assert sum(m.arrivals for m in run.minutes) > 400 and all(r.config == other for r in fleet.active)


def test_the_twin_method_retunes_on_a_drifted_workload_and_sizes_with_the_promoted_knobs() -> None:
    tuned = TunedConfig(max_num_batched_tokens=1024, max_num_seqs=64)
    capacities = {CONFIG: (1.0, 0.9), tuned: (2.0, 1.8)}
    rounds: list[tuple[str, TunedConfig]] = []

    def refit(_workload: str, _per_replica: float, knobs: TunedConfig) -> tuple[float, float]:
        return capacities[knobs]

    def retune(workload: str, _per_replica: float, knobs: TunedConfig) -> tuple[TunedConfig, int]:
        rounds.append((workload, knobs))
        return tuned, 1

    spec = ScalingSpec(mode=ScalingMode.AUTO, min_replicas=1, max_replicas=20)
    sizing = _TwinSizing(spec, 60.0, refit, "chat", capacities[CONFIG], (100.0, 2000.0), CONFIG, retune)
    seen: dict[float, tuple[int, TunedConfig]] = {}
    replicas = 5
    for tick in range(1, 80):
        now = 15.0 * tick
        view = View(
            now, replicas, replicas, 4.0, 50.0, 500.0, 0.0, "chat" if now < 300 else "code", sizing.config
        )
        replicas = sizing(view)
        seen[now] = (replicas, sizing.knobs(view))
    # The workload changed at 300 s; two minutes later the twin refits and the round starts from the
    # running knobs; its one trial (start-up, warm-up, window) lands 420 s on, and the replicas
    # follow the doubled capacity.
    assert rounds == [("code", CONFIG)]
    assert sizing.retunes[0]["t_s"] == 420.0 and sizing.retunes[0]["promoted_at_s"] == 840.0
    assert sizing.retunes[0]["window_restarts"] == 0
    assert seen[825.0][1] == CONFIG and seen[840.0][1] == tuned
    # (down once the scale-down window has passed since the promotion)
    assert seen[825.0][0] >= 5 and seen[1185.0][0] < seen[825.0][0]


def test_the_planners_change_of_replicas_in_a_rounds_window_delays_its_promotion() -> None:
    """The load doubles while the round's one trial is measured: the planner adds replicas, the
    window restarts once they have started, and the promotion lands that much later."""
    tuned = TunedConfig(max_num_batched_tokens=1024, max_num_seqs=64)
    capacities = {CONFIG: (1.0, 0.9), tuned: (2.0, 1.8)}
    spec = ScalingSpec(mode=ScalingMode.AUTO, min_replicas=1, max_replicas=40)
    sizing = _TwinSizing(
        spec,
        60.0,
        lambda _w, _r, knobs: capacities[knobs],
        "chat",
        capacities[CONFIG],
        (100.0, 2000.0),
        CONFIG,
        lambda _w, _r, _k: (tuned, 1),
    )
    replicas = 5
    for tick in range(1, 100):
        now = 15.0 * tick
        rate = 8.0 if now >= 600 else 4.0  # inside the window (measured from 540 s)
        view = View(
            now, replicas, replicas, rate, 50.0, 500.0, 0.0, "chat" if now < 300 else "code", sizing.config
        )
        replicas = sizing(view)
    record = sizing.retunes[0]
    assert record["t_s"] == 420.0 and record["window_restarts"] == 1
    # Restarted at the first tick after the change (600 s): 60 s start-up and 60 s warm-up on, one
    # window of 300 s.
    assert record["promoted_at_s"] == 615.0 + 120.0 + RETUNE_WINDOW_S
    assert sizing.config == tuned


def test_a_round_restarts_its_window_when_the_replicas_change_in_it_as_the_operator_does() -> None:
    """Two trials, start-up 100 s: each is measured 160 s after it starts, for 300 s. A change of
    the replicas after the canary was Ready restarts the window once the new replicas have started;
    one before it, or once the trial has run its longest, does not."""
    tuned = TunedConfig(max_num_batched_tokens=1024, max_num_seqs=64)
    record: dict[str, Any] = {"promoted_at_s": None, "window_restarts": 0}
    trial = _Round.starting(tuned, 2, 0.0, 100.0, record)
    assert (trial.ready_s, trial.measure_from_s) == (100.0, 160.0)
    assert not trial.lands(150.0, 50.0, 100.0)  # warming up; the change came before Ready
    assert not trial.lands(200.0, 50.0, 100.0) and trial.measure_from_s == 160.0
    warming = _Round.starting(tuned, 1, 0.0, 100.0, {"window_restarts": 0})
    assert not warming.lands(160.0, 130.0, 100.0)  # changed after Ready, in the warm-up: restart
    assert warming.measure_from_s == 320.0
    assert not trial.lands(300.0, 250.0, 100.0)  # changed inside the window: restart
    assert trial.measure_from_s == 460.0 and record["window_restarts"] == 1
    assert not trial.lands(760.0, 250.0, 100.0)  # the first trial's restarted window is over
    assert trial.trials_left == 1 and trial.measure_from_s == 920.0
    assert not trial.lands(1219.0, 250.0, 100.0) and trial.lands(1220.0, 250.0, 100.0)
    late = _Round.starting(tuned, 1, 0.0, 100.0, {"window_restarts": 0})
    longest = MAX_RESCALE_RESTARTS_WINDOWS * RETUNE_WINDOW_S
    assert late.lands(100.0 + longest + 15.0, 400.0, 100.0)  # judged on the window it has
    assert late.measure_from_s == 160.0


def _view(waiting: float, replicas: int, now: float) -> View:
    return View(now, replicas, replicas, 1.0, 10.0, 100.0, waiting, "azure_conv", CONFIG)


def test_the_hpa_baseline_scales_up_at_most_by_its_policies_and_down_after_five_minutes() -> None:
    decide = _hpa_queue(max_replicas=50)
    assert decide(_view(5.0, 2, 15)) == 2  # at target
    assert decide(_view(5.4, 2, 30)) == 2  # within the 10% tolerance
    assert decide(_view(100.0, 2, 45)) == 6  # 40 wanted; max(4 pods, 100%) per period
    assert decide(_view(0.0, 6, 60)) == 6  # held by the scale-down window
    assert decide(_view(0.0, 6, 400)) == 1  # five minutes later


class _Minute:
    def __init__(self, met: bool) -> None:
        self._met = met

    def met(self, _slo: SLO) -> bool:
        return self._met


def test_the_oracle_gives_each_minute_the_fleet_missed_one_replica_more_until_all_are_met() -> None:
    needs = [1, 3, 2, 5]  # what each minute takes in the fleet; minute 3 is not judged
    flown: list[list[int]] = []

    def fly(decide: Any, _initial: int) -> FleetRun:
        counts = [decide(_view(0.0, 1, 60.0 * m + 15)) for m in range(len(needs))]
        flown.append(counts)
        return FleetRun([_Minute(c >= n) for c, n in zip(counts, needs, strict=True)], 0.0, [])

    def judge(_run: FleetRun) -> list[bool]:
        return [True, True, True, False]

    run, runs = _settle_oracle(fly, judge, [1, 1, 1, 1], SLO(), most=8)
    assert flown == [[1, 1, 1, 1], [1, 2, 2, 1], [1, 3, 2, 1]] and runs == 3
    assert all(m.met(SLO()) for m in run.minutes[:3])
    # At most ``rounds`` more runs, and never past ``most``: what is still missed is reported.
    flown.clear()
    run, runs = _settle_oracle(fly, judge, [1, 1, 1, 1], SLO(), most=2, rounds=3)
    assert flown == [[1, 1, 1, 1], [1, 2, 2, 1]] and runs == 2 and not run.minutes[1].met(SLO())
    flown.clear()
    assert _settle_oracle(fly, judge, [1, 1, 1, 1], SLO(), most=8, rounds=1)[1] == 2


def test_the_oracles_counts_held_by_the_rules_cost_the_lead_and_the_window() -> None:
    counts = [1, 1, 3, 1, 1, 1, 1, 1, 1, 1]
    # Asked two minutes ahead (start-up 120 s): minutes 0-2 pay for the 3 of minute 2.
    assert held_counts(counts, 120.0, 0.0) == [3, 3, 3, 1, 1, 1, 1, 1, 1, 1]
    # And held for a 300 s scale-down window: five more minutes at 3.
    assert held_counts(counts, 120.0, 300.0) == [3, 3, 3, 3, 3, 3, 3, 3, 1, 1]
    assert held_counts(counts, 0.0, 0.0) == counts  # a planner with no lead and no window: the oracle
    assert held_counts(counts, 90.0, 60.0)[:4] == [3, 3, 3, 3]  # 90 s is two minutes ahead; 60 s one


def test_the_average_model_capacity_grows_with_a_looser_target() -> None:
    wide = SimConfig(scheduler=SchedulerConfig(max_num_batched_tokens=8192, max_num_seqs=256))
    tight = average_capacity(wide, 1000.0, 200.0, SLO(itl_ms=30.0, ttft_ms=2000.0))
    loose = average_capacity(wide, 1000.0, 200.0, SLO(itl_ms=80.0, ttft_ms=2000.0))
    assert 0 < tight < loose
    # With a 512-token budget the prefill tokens arriving per step bind first, whatever the target.
    assert average_capacity(SIM, 1000.0, 200.0, SLO(itl_ms=80.0, ttft_ms=2000.0)) < loose


@pytest.mark.slow
def test_the_command_runs_every_method_on_a_short_profile_and_prints_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = profile_file(tmp_path, "t_s,load,workload\n0,1,azure_conv\n120,1\n121,3\n360,3\n", "step.csv")
    code = main(["bench", "autoscale", "--quick", "--rate-profile", str(path), "--minutes", "6", "--json"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    (scenario,) = data["scenarios"]
    methods = scenario["methods"]
    assert list(methods) == list(AUTOSCALE_QUICK.methods)
    for m in methods.values():
        assert m["gpu_hours"] > 0 and len(m["minutes"]) == 6 and m["judged_minutes"] <= 6
    assert methods["static-peak"]["scale_events"] == 0
    assert methods["oracle"]["gpu_hours"] < methods["static-peak"]["gpu_hours"]
    # The step to 3 at minute 2 is more than the replicas running can absorb: the minutes of the
    # start-up plus two windows after it are reported, not judged (the oracle starts at once).
    assert methods["twin"]["excluded_minutes"] >= 3 and methods["oracle"]["excluded_minutes"] <= 2
    assert set(scenario["goal"]["checks"]) == {
        "slo_minutes",
        "vs_oracle",
        "vs_static_peak",
        "beats_hpa-queue",
        "beats_average-model",
    }
    assert scenario["twin"]["canaries"] and scenario["unit_req_s"] > 0
    held = scenario["goal"]["held_oracle_x_oracle"]
    assert held >= scenario["goal"]["held_oracle_no_window_x_oracle"] >= 1.0
    rows = format_autoscale_markdown(data).splitlines()
    assert len(rows) == 2 + len(methods) and rows[2].startswith(f"| {scenario['truth']} | step | twin |")


def test_the_command_refuses_a_bad_option_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "autoscale", "--rate-profile", "nowhere"]) == 2
    assert "--rate-profile nowhere: no such file, nor a shipped profile" in capsys.readouterr().err
    assert main(["bench", "autoscale", "--headroom", "2"]) == 2
    assert "--headroom must be within 0 and 1" in capsys.readouterr().err
    # A step profile of another model is refused before any scenario runs, naming the option.
    other = structural_family()["h100-vidur-a035-o3ms"]  # the tuner benchmark's 8B model
    assert main(["bench", "autoscale", "--truth-step-profile", str(other)]) == 2
    err = capsys.readouterr().err
    assert "--truth-step-profile:" in err and "the benchmark runs qwen2.5-32b" in err


def test_the_structural_family_runs_on_the_benchmarks_own_model() -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["autoscale", "--truth-family", "structural"])
    settings = settings_from(args)
    assert [t.name for t in settings.truths] == list(STRUCTURAL_FAMILY)
    for truth in settings.truths:
        assert truth.step_profile is not None
        assert StepProfile.load(Path(truth.step_profile)).model == MODEL == settings.grid.model
