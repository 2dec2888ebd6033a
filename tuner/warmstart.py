"""The warm start: configurations to try before the sampler, sized by the step-time model.

The guess (:func:`model_guess`) is the largest budget whose full step at load (a
prefill chunk plus the running decode batch, :class:`LoadedStep`) meets the ITL
target; its upper end (:func:`unloaded_guess`) is the largest budget a prefill-only
step allows, tried when the guess's trial shows another SLO binding instead.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

from chunkpilot.tuner.hardware import StepTime
from chunkpilot.tuner.space import (
    BUDGET_ABSOLUTE_MAX,
    DEFAULT_OUTPUT_TOKENS,
    DEFAULT_PROMPT_TOKENS,
    Knob,
    SearchSpace,
    ServiceFacts,
    SpaceError,
    TunedConfig,
    default_step_model,
    largest_tokens_within,
)


@dataclass(frozen=True)
class LoadedStep:
    """The step an engine runs at load: a prefill chunk plus the running decode batch.

    At the capacity every step is full and, by Little's law, the decoding sequences
    take the output share ``O / (P + O)`` of the budget (each request brings P prompt
    tokens and decodes for O steps).  A quantile-q ITL target is decided by the slow
    steps, so the step is sized for the q-quantile of the batch (Poisson counts:
    ``mean + z_q sqrt(mean)``) and for a chunk late in a long prompt (prompt lengths
    taken as exponential with mean P, the least-informed shape for a known mean:
    length ``-P ln(1 - q)``, at most ``max_model_len``).  Below p50 no headroom is added.
    """

    prompt_tokens: float
    output_tokens: float
    quantile: float
    max_num_seqs: int
    max_model_len: int

    @classmethod
    def of(cls, facts: ServiceFacts, max_num_seqs: int) -> LoadedStep:
        """The loaded step of ``facts``'s token mix and ITL quantile at ``max_num_seqs``."""
        if not 0 < facts.itl_quantile < 1:
            raise SpaceError(f"spec.slo.itl.quantile: must be in (0, 1), got {facts.itl_quantile}")
        prompt = facts.mean_prompt_tokens or DEFAULT_PROMPT_TOKENS
        output = facts.mean_output_tokens or DEFAULT_OUTPUT_TOKENS
        return cls(
            float(prompt), float(output), facts.itl_quantile, max(1, max_num_seqs), facts.max_model_len
        )

    @property
    def _z(self) -> float:
        return max(0.0, NormalDist().inv_cdf(self.quantile))

    def decode_seqs(self, budget: int) -> int:
        """Decoding sequences in a full step of ``budget`` tokens at the quantile."""
        share = self.output_tokens / (self.prompt_tokens + self.output_tokens)
        mean = min(float(self.max_num_seqs), share * budget)
        return min(self.max_num_seqs, budget, math.ceil(mean + self._z * math.sqrt(mean)))

    def context_tokens(self, prefill_tokens: int) -> int:
        """Tokens cached before a chunk of ``prefill_tokens`` at the end of a quantile-length prompt."""
        length = min(float(self.max_model_len), -self.prompt_tokens * math.log(1.0 - max(0.5, self.quantile)))
        return max(0, int(length) - prefill_tokens)

    def time_s(self, step_model: StepTime, budget: int) -> float:
        """Predicted duration of a full step of ``budget`` tokens."""
        decodes = self.decode_seqs(budget)
        prefill = max(0, budget - decodes)
        return step_model.step_time_s(prefill, decodes, self.context_tokens(prefill))

    def largest_budget_within(self, step_model: StepTime, limit_s: float, high: int) -> int:
        """Largest budget (at most ``high``) whose full step stays within ``limit_s`` (0 when none)."""
        if high < 1 or self.time_s(step_model, 1) > limit_s:
            return 0
        if self.time_s(step_model, high) <= limit_s:
            return high
        lo, hi = 1, high
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.time_s(step_model, mid) <= limit_s:
                lo = mid
            else:
                hi = mid
        return lo


def _with_budget(space: SearchSpace, budget: int) -> TunedConfig:
    """The incumbent's other knobs with ``budget`` (clipped), repaired into the space."""
    params: dict[str, Any] = {Knob.MAX_NUM_BATCHED_TOKENS.value: space.budget.clip(budget)}
    for knob, r in space.ranges.items():
        if knob is Knob.MAX_NUM_BATCHED_TOKENS:
            continue
        value = getattr(space.fixed, knob.value)
        if knob is Knob.LONG_PREFILL_TOKEN_THRESHOLD and not value:
            value = r.high if space.long_prefill_off_allowed else r.low
        params[knob.value] = r.clip(int(value if value is not None else r.low))
    return space.to_config(params)


def model_guess(space: SearchSpace, facts: ServiceFacts, step_model: StepTime | None = None) -> TunedConfig:
    """The largest budget whose full step at load meets the ITL target (the rest as the incumbent).

    The step is :class:`LoadedStep`: the prefill chunk plus the running decode batch and
    their KV reads, with headroom for the ITL quantile.  ``step_model`` defaults to the
    one :func:`~chunkpilot.tuner.space.build_space` uses.  A measured step profile gives
    its ITL-feasible budget instead; without any step-time model the guess is the geometric
    middle of the range.
    """
    if step_model is None:
        step_model = default_step_model(facts.model, facts.accelerator, facts.tensor_parallel_size)
    budget = space.budget
    if facts.step_profile is not None:
        guess = facts.step_profile.itl_feasible_budget(facts.itl_target_ms) or budget.low
    elif step_model is None:
        guess = int(math.sqrt(budget.low * budget.high))
    else:
        seqs = _with_budget(space, budget.high).max_num_seqs
        loaded = LoadedStep.of(facts, seqs)
        guess = loaded.largest_budget_within(step_model, facts.itl_target_ms / 1000, BUDGET_ABSOLUTE_MAX)
        guess = guess or budget.low
    return _with_budget(space, guess)


def unloaded_guess(
    space: SearchSpace, facts: ServiceFacts, step_model: StepTime | None = None
) -> TunedConfig:
    """The largest budget whose prefill-only step meets the ITL target: the guess's upper end.

    No step at load is slower than the loaded one, so this is the most the ITL target
    allows when decodes are few (the budget then mostly serves TTFT).
    """
    if step_model is None:
        step_model = default_step_model(facts.model, facts.accelerator, facts.tensor_parallel_size)
    if facts.step_profile is not None:
        budget = facts.step_profile.itl_feasible_budget(facts.itl_target_ms) or space.budget.low
    elif step_model is None:
        budget = space.budget.high
    else:
        budget = largest_tokens_within(step_model, facts.itl_target_ms / 1000) or space.budget.low
    return _with_budget(space, budget)


@dataclass(frozen=True, eq=False)
class WarmStart(Mapping[str, int]):
    """Parameters to try before the sampler (a read-only mapping of the Optuna parameters).

    ``when_slack``: the name of an SLO constraint; the point is tried only when the
    latest measured trial had slack on it, i.e. another SLO bound there (its relative
    constraint was below the largest one).  None: always tried.
    """

    params: Mapping[str, int]
    when_slack: str | None = None

    def __getitem__(self, key: str) -> int:
        return self.params[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.params)

    def __len__(self) -> int:
        return len(self.params)

    def wanted(self, measured: Iterable[tuple[int, Mapping[str, float]]]) -> bool:
        """Whether to try it, given ``(trial number, constraints)`` of the measured trials."""
        if self.when_slack is None:
            return True
        latest = max(measured, key=lambda item: item[0], default=None)
        if latest is None or self.when_slack not in latest[1] or len(latest[1]) < 2:
            return False
        constraints = latest[1]
        others = [v for k, v in constraints.items() if k != self.when_slack]
        return constraints[self.when_slack] < max(others)


def warm_start(
    space: SearchSpace, facts: ServiceFacts, step_model: StepTime | None = None
) -> list[WarmStart]:
    """Parameters to try first: the model-based guess, then its upper end when ITL had slack.

    The guess (:func:`model_guess`) sizes the full step at load to the ITL target; when
    its trial shows another SLO (TTFT) binding instead, the largest budget a
    prefill-only step allows (:func:`unloaded_guess`) is tried next.  A point equal to
    the incumbent is left out.  The incumbent itself is never re-run as a canary: it is
    the stable track, measured in every trial window, and enters the study as a known
    point (see :func:`chunkpilot.tuner.study.incumbent_record`).
    """
    starts: list[WarmStart] = []
    seen = {facts.incumbent}
    guess = model_guess(space, facts, step_model)
    upper = unloaded_guess(space, facts, step_model)
    for config, when_slack in ((guess, None), (upper, "itl")):
        params = space.to_params(config)
        if params is None or config in seen:
            continue
        seen.add(config)
        starts.append(WarmStart(params, when_slack))
    return starts
