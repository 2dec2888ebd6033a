"""The benchmark's discretisation of a search space, and vLLM auto_tune's sweep order over it."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import product
from typing import Any, Protocol

from chunkpilot.tuner.space import Knob, KnobRange, SearchSpace, TunedConfig

__all__ = ["Grid", "GridSizes", "autotune_order", "nearest_log"]


class GridSizes(Protocol):
    """How finely the grid covers each knob (the benchmark settings provide these)."""

    @property
    def budget_points(self) -> int: ...
    @property
    def seq_values(self) -> tuple[int, ...]: ...
    @property
    def long_prefill_values(self) -> tuple[int, ...]: ...
    @property
    def autotune_seqs(self) -> tuple[int, ...]: ...


def _geometric(low: int, high: int, points: int) -> list[int]:
    if high <= low:
        return [low]
    values = {round(low * (high / low) ** (i / (points - 1))) for i in range(points)}
    return sorted(values)


def nearest_log(values: Sequence[int], raw: float) -> int:
    return min(values, key=lambda v: (abs(math.log(v) - math.log(max(raw, 1.0))), v))


@dataclass(frozen=True)
class Grid:
    """A discretisation of a search space: per-knob values and the distinct configurations."""

    space: SearchSpace
    values: Mapping[Knob, tuple[int, ...]]
    configs: tuple[TunedConfig, ...]

    @classmethod
    def over(cls, space: SearchSpace, settings: GridSizes) -> Grid:
        values: dict[Knob, tuple[int, ...]] = {}
        for knob, r in space.ranges.items():
            if knob is Knob.MAX_NUM_BATCHED_TOKENS:
                values[knob] = tuple(_geometric(r.low, r.high, settings.budget_points))
            elif knob is Knob.MAX_NUM_SEQS:
                values[knob] = tuple(sorted({r.clip(v) for v in settings.seq_values}))
            elif knob is Knob.LONG_PREFILL_TOKEN_THRESHOLD:
                inside = {r.clip(v) for v in settings.long_prefill_values if v < r.high}
                off = {r.high} if space.long_prefill_off_allowed else set()
                values[knob] = tuple(sorted(inside | off))
            else:
                values[knob] = (r.low, r.high) if r.low != r.high else (r.low,)
        knobs = list(values)
        configs: dict[TunedConfig, None] = {}
        for combo in product(*(values[k] for k in knobs)):
            configs[space.to_config({k.value: v for k, v in zip(knobs, combo, strict=True)})] = None
        return cls(space, values, tuple(configs))

    def snap(self, params: Mapping[str, Any]) -> TunedConfig:
        """The grid configuration nearest (per knob, on a log scale) to sampled parameters.

        A long-prefill threshold that would be switched off (at or above the budget or the
        top of its range) snaps to "off".
        """
        snapped: dict[str, int] = {}
        for knob, choices in self.values.items():
            r: KnobRange = self.space.ranges[knob]
            raw = params.get(knob.value)
            value = r.clip(int(raw)) if raw is not None else choices[-1]
            if knob is Knob.LONG_PREFILL_TOKEN_THRESHOLD and self.space.long_prefill_off_allowed:
                budget = params.get(Knob.MAX_NUM_BATCHED_TOKENS.value)
                if value >= r.high or (budget is not None and value >= int(budget)):
                    snapped[knob.value] = r.high
                    continue
            snapped[knob.value] = nearest_log(choices, value)
        return self.space.to_config(snapped)


def autotune_order(grid: Grid, settings: GridSizes) -> list[TunedConfig]:
    """vLLM auto_tune's sweep: for each max-num-seqs, every power-of-two budget, on the grid."""
    space = grid.space
    budgets = grid.values[Knob.MAX_NUM_BATCHED_TOKENS]
    seq_choices = grid.values[Knob.MAX_NUM_SEQS]
    powers = [2**i for i in range(9, 18) if budgets[0] <= 2**i <= budgets[-1] * 1.5]
    coarse = list(dict.fromkeys(nearest_log(budgets, p) for p in powers)) or list(budgets)
    order: dict[TunedConfig, None] = {}
    for seqs in dict.fromkeys(nearest_log(seq_choices, s) for s in settings.autotune_seqs):
        for budget in coarse:
            params: dict[str, int] = {
                Knob.MAX_NUM_BATCHED_TOKENS.value: budget,
                Knob.MAX_NUM_SEQS.value: seqs,
            }
            lpt = space.ranges.get(Knob.LONG_PREFILL_TOKEN_THRESHOLD)
            if lpt is not None:
                params[Knob.LONG_PREFILL_TOKEN_THRESHOLD.value] = lpt.high
            order[grid.snap(params)] = None
    return list(order)
