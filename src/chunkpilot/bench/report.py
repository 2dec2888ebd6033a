"""Text tables of the exhaustive tuner benchmark (:mod:`chunkpilot.bench.exhaustive`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from chunkpilot.bench.exhaustive import DIAGNOSTICS, GOAL_SHARE, GOAL_TRIALS, METHODS, BenchResult
from chunkpilot.tuner.space import TunedConfig


def format_config(config: TunedConfig) -> str:
    """One configuration as its knob summary."""
    return config.summary()


def format_table(result: BenchResult, trial_marks: Sequence[int] | None = None) -> str:
    """A text table per scenario: optimum, default, and per method the best after k trials (% of optimum)."""
    st = result.settings
    marks = list(trial_marks) if trial_marks is not None else list(range(1, st.trials + 1))
    lines = [
        f"Tuner benchmark: {st.model} on {st.accelerator}, {st.requests} requests per trace slice, "
        "capacity = highest Poisson rate meeting the SLO (simulated); "
        f"mean of {st.repeats} seeds for tpe/random",
        "",
    ]
    goal = result.goal_met()
    for s in result.scenarios:
        lines.append(f"== {s.name}: {s.slo.describe()}  (grid {s.grid_size} configs; space {s.space})")
        lines.append(f"   optimum  {s.optimum:7.2f} req/s  {format_config(s.optimum_config)}")
        share = f"{s.default / s.optimum:6.1%}" if s.optimum > 0 else "   n/a"
        lines.append(f"   default  {s.default:7.2f} req/s  {share}  {format_config(s.default_config)}")
        guess_rate = dict(s.landscape).get(s.guess_config, math.nan)
        lines.append(f"   warm start {guess_rate:7.2f} req/s  (model guess) {format_config(s.guess_config)}")
        columns = [m for m in (*METHODS, *DIAGNOSTICS) if m in s.best_after]
        lines.append("   trials " + "".join(f"{m:>17}" for m in columns))
        for k in marks:
            cells = "".join(
                f"{s.best_after[m][k - 1]:8.2f} ({s.share(m, k):6.1%})"
                if s.optimum > 0
                else f"{s.best_after[m][k - 1]:17.2f}"
                for m in columns
            )
            lines.append(f"   {k:>6} {cells}")
        lines.append(
            f"   goal (tpe >= {GOAL_SHARE:.0%} within {GOAL_TRIALS} trials, ahead of both baselines): "
            f"{'met' if goal[s.name] else 'NOT met'}"
        )
        lines.append("")
    lines.append(f"{result.simulations} simulations, {result.wall_s:.0f} s wall")
    return "\n".join(lines)
