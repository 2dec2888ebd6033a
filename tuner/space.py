"""The search space of the scheduler knobs for one InferenceService.

The token budget (``--max-num-batched-tokens``) is the main dial: an integer on a
log scale between a floor and a ceiling derived from the hardware, the model and
the SLO:

- **floor**: the accelerator's compute knee (a pass over M tokens has arithmetic
  intensity of about M FLOP/byte, so below the ridge point ``peak FLOP/s / HBM
  bytes/s`` the GEMMs are bandwidth-bound and every token costs more), and never
  below ``max-num-seqs x (1 + speculative tokens)`` (vLLM rejects smaller budgets);
  without chunked prefill also never below ``max-model-len``;
- **ceiling**: activation memory (a share of what the weights leave free) and the
  ITL target: the largest budget whose predicted step time stays within
  ``ITL_CEILING_HEADROOM x`` the ITL target.  The headroom is deliberate: a
  quantile target lets a small fraction of steps exceed it, so at low load a
  budget whose full-budget step is slower than the target can still meet it.

The space is per engine, from the knob table: a tuned knob is searched only where the
service's engine kind and version have a setting for it (:func:`honours`, the check the
renderers refuse by).  ``max-num-seqs`` (SGLang ``--max-running-requests``, TensorRT-LLM
``--max_batch_size``) and, on vLLM, the long-prefill threshold are tuned too; the
partial-prefill limits and ``max-num-active-seqs`` only when the engine honours them and
the service opted in (set them in the spec or gave bounds).  On SGLang with
``maxPrefillTokens`` set the budget (``--chunked-prefill-size``) never exceeds it, the
rule the API enforces.  A step profile
measured by ``chunkpilot probe`` (``ServiceFacts.step_profile``) replaces the
datasheet: its knee is the floor, its ITL-feasible budget sets the ceiling and
the warm start.  Bounds in the
custom resource override every derived limit, and :meth:`SearchSpace.to_config`
never returns a value outside the final bounds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from typing import Any, Protocol

from chunkpilot.engine.probe.fit import largest_tokens_within as search_largest_within
from chunkpilot.engine.sim.profiles.loader import Accelerator, ModelProfile, ProfileError
from chunkpilot.tuner import hardware
from chunkpilot.tuner.hardware import StepTime
from optuna.distributions import BaseDistribution, IntDistribution

from chunkpilot.api import knobs
from chunkpilot.api.knobs import TUNABLE, EngineVersion

#: The step time the budget ceiling may reach, as a multiple of the ITL target.
ITL_CEILING_HEADROOM = 2.0
#: Share of the memory left after the weights that activations of one pass may use.
ACTIVATION_MEMORY_SHARE = 0.10
#: Absolute limits no derived bound goes beyond.
BUDGET_ABSOLUTE_MIN = 64
BUDGET_ABSOLUTE_MAX = 131072
LONG_PREFILL_MIN = 64
#: Mean prompt and output lengths assumed when the service's token mix is unknown (a chat-like mix).
DEFAULT_PROMPT_TOKENS = 1024
DEFAULT_OUTPUT_TOKENS = 256


class Knob(StrEnum):
    """The tuned knobs of the knob table (:data:`chunkpilot.api.knobs.TUNABLE`), in its order.

    The values are the table's field names and double as Optuna parameter names; a test
    proves the members and the table agree.
    """

    MAX_NUM_BATCHED_TOKENS = "max_num_batched_tokens"
    MAX_NUM_SEQS = "max_num_seqs"
    MAX_NUM_ACTIVE_SEQS = "max_num_active_seqs"
    LONG_PREFILL_TOKEN_THRESHOLD = "long_prefill_token_threshold"
    MAX_NUM_PARTIAL_PREFILLS = "max_num_partial_prefills"
    MAX_LONG_PARTIAL_PREFILLS = "max_long_partial_prefills"


#: camelCase spelling used by the API (bounds, EngineConfig aliases), from the knob table.
KNOB_ALIASES: dict[Knob, str] = {Knob(row.name): row.camel for row in TUNABLE}


class SpaceError(ValueError):
    """The service's facts or bounds leave no valid configuration; the message names the fix."""


@dataclass(frozen=True)
class TunedConfig:
    """Values of the tuned knobs, one field per :class:`Knob` (``None``: not set, the engine's default)."""

    max_num_batched_tokens: int
    max_num_seqs: int
    max_num_active_seqs: int | None = None
    long_prefill_token_threshold: int = 0
    max_num_partial_prefills: int | None = None
    max_long_partial_prefills: int | None = None

    def as_dict(self) -> dict[str, int | None]:
        """Snake-case mapping of every knob."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def summary(self) -> str:
        """Short human-readable form, e.g. ``budget=3072 seqs=256 lpt=512`` (:func:`knobs.summary`)."""
        return knobs.summary(self.as_dict())


# --------------------------------------------------------------------------- hardware facts
#
# One hardware model: the simulator's profiles and step-time model (see chunkpilot.tuner.hardware).


def load_accelerator(name: str) -> Accelerator:
    """Accelerator profile by name or alias (the simulator's profile data)."""
    try:
        return hardware.accelerator(name)
    except ProfileError:
        known = hardware.known_accelerators()
        raise SpaceError(
            f"spec.resources.accelerator: unknown accelerator {name!r}; use one of {known}"
        ) from None


def load_model_shape(name: str) -> ModelProfile | None:
    """Model dimensions by HF id or profile name; None when the model has no profile."""
    return hardware.model_profile(name)


def default_step_model(model: str, accelerator: str, tensor_parallel_size: int = 1) -> StepTime | None:
    """The simulator's step-time model for the service, or None when it has none (no ITL ceiling)."""
    return hardware.step_time(model, accelerator, tensor_parallel_size)


class MeasuredStepProfile(Protocol):
    """What the space needs of a measured profile (``chunkpilot.engine.probe.StepProfile``)."""

    @property
    def knee_tokens(self) -> int | None: ...

    def itl_feasible_budget(self, itl_target_ms: float) -> int | None: ...


# --------------------------------------------------------------------------- service facts


@dataclass(frozen=True)
class ServiceFacts:
    """What the space is derived from: hardware, model, engine and SLO of one service."""

    accelerator: str
    model: str
    incumbent: TunedConfig
    itl_target_ms: float
    max_model_len: int = 8192
    tensor_parallel_size: int = 1
    speculative_tokens: int = 0
    engine_kind: str = "vllm"
    engine_version: str = "0.33.0"
    enable_chunked_prefill: bool = True
    gpu_memory_utilization: float = 0.92
    #: Quantile of the ITL SLO (0-1): a higher one needs more headroom in the warm start's step.
    itl_quantile: float = 0.99
    #: Mean prompt / output tokens of the offered load (None: ``DEFAULT_PROMPT_TOKENS`` /
    #: ``DEFAULT_OUTPUT_TOKENS``); they size the decode batch every step carries at load.
    mean_prompt_tokens: float | None = None
    mean_output_tokens: float | None = None
    #: SGLang's ``--max-prefill-tokens`` (None: unset); with chunked prefill on it caps the budget.
    max_prefill_tokens: int | None = None
    #: Whether the rendered engine enforces the partial-prefill limits (None: judge from the engine
    #: kind and version alone; the operator's renderer knows more, e.g. the scheduler plugin).
    partial_prefills: bool | None = None
    #: Measured on this accelerator, model and TP by ``chunkpilot probe`` (None: datasheet roofline).
    step_profile: MeasuredStepProfile | None = field(default=None, compare=False)


def honours(engine_kind: str, engine_version: str, name: str) -> bool:
    """True when ``engine_version`` of ``engine_kind`` has a setting for knob ``name``.

    The knob table's flag for the kind's dialect and its version range
    (:func:`chunkpilot.api.knobs.engine_honours`, the judgement the renderers refuse by);
    versions are read in the kind's own numbering.  The simulator is judged as the vLLM release
    it mirrors (``render_sim`` refuses what that release would), except that it enforces the
    knobs vLLM V1 leaves to the scheduler plugin itself (whether the operator renders those is
    :attr:`ServiceFacts.partial_prefills`).
    """
    version = EngineVersion.lenient(engine_version)
    if engine_kind == "sim":
        flag = knobs.knob(name).flags.get(knobs.VLLM)
        if flag is not None and flag.plugin:
            return True
    return knobs.engine_honours(engine_kind, name, version)


def honours_partial_prefills(engine_kind: str, engine_version: str) -> bool:
    """True when the engine enforces ``--max-num-partial-prefills`` / ``--max-long-partial-prefills``.

    Judged from kind and version alone: the simulator does (as an option); vLLM natively only
    before 0.9.0 (V1 never enforced the flags); SGLang and TensorRT-LLM have no such setting.
    :attr:`ServiceFacts.partial_prefills` overrides this with the operator's answer, which also
    knows about the Chunkpilot scheduler plugin.
    """
    return honours(engine_kind, engine_version, Knob.MAX_NUM_PARTIAL_PREFILLS)


def honours_max_num_active_seqs(engine_kind: str, engine_version: str) -> bool:
    """True when the engine accepts ``--max-num-active-seqs`` (vLLM 0.33 and the simulator)."""
    return honours(engine_kind, engine_version, Knob.MAX_NUM_ACTIVE_SEQS)


def _has_setting(engine_kind: str, name: str) -> bool:
    """Whether the kind's dialect has a flag for knob ``name`` in any release."""
    return knobs.dialect_of(engine_kind) in knobs.knob(name).flags


# --------------------------------------------------------------------------- the space


@dataclass(frozen=True)
class KnobRange:
    """Inclusive integer range of one knob; ``log`` for a log-scaled search."""

    low: int
    high: int
    log: bool = True

    def clip(self, value: int) -> int:
        return min(self.high, max(self.low, value))

    def distribution(self) -> IntDistribution:
        return IntDistribution(self.low, self.high, log=self.log and self.low >= 1)


@dataclass(frozen=True)
class SearchSpace:
    """Ranges of the tuned knobs plus the fixed values of the others.

    ``long_prefill_off_allowed``: the long-prefill threshold may be switched off; a
    sampled threshold at or above the budget means "off" (it would never bind).
    """

    ranges: Mapping[Knob, KnobRange]
    fixed: TunedConfig
    speculative_tokens: int = 0
    max_model_len: int = 8192
    long_prefill_off_allowed: bool = True
    notes: tuple[str, ...] = field(default=())

    def distributions(self) -> dict[str, BaseDistribution]:
        """Optuna distributions of the tuned knobs."""
        return {knob.value: r.distribution() for knob, r in self.ranges.items()}

    def to_config(self, params: Mapping[str, Any]) -> TunedConfig:
        """Turn sampled parameters into a valid configuration inside the bounds.

        Repairs, in order: every value clipped into its range; max-num-seqs lowered
        until ``budget >= seqs x (1 + k)``; a long-prefill threshold at or above the
        budget (or at the top of its range) switched off; partial-prefill and active-sequence limits kept
        consistent with each other and with max-num-seqs.
        """
        values = self.fixed.as_dict()
        for knob, r in self.ranges.items():
            raw = params.get(knob.value)
            values[knob.value] = r.clip(int(raw)) if raw is not None else values[knob.value]
        budget = int(values[Knob.MAX_NUM_BATCHED_TOKENS] or 0)
        seqs = int(values[Knob.MAX_NUM_SEQS] or 1)
        per_seq = 1 + self.speculative_tokens
        if seqs * per_seq > budget:
            seqs = max(1, budget // per_seq)
            seq_range = self.ranges.get(Knob.MAX_NUM_SEQS)
            if seq_range is not None:
                seqs = max(seq_range.low, seqs)
        values[Knob.MAX_NUM_SEQS] = seqs
        lpt = values[Knob.LONG_PREFILL_TOKEN_THRESHOLD] or 0
        lpt_range = self.ranges.get(Knob.LONG_PREFILL_TOKEN_THRESHOLD)
        if (
            lpt_range is not None
            and self.long_prefill_off_allowed
            and (lpt >= budget or lpt >= lpt_range.high)
        ):
            lpt = 0
        values[Knob.LONG_PREFILL_TOKEN_THRESHOLD] = min(lpt, self.max_model_len)
        active = values[Knob.MAX_NUM_ACTIVE_SEQS]
        if active is not None:
            values[Knob.MAX_NUM_ACTIVE_SEQS] = min(active, seqs)
        partial, long_partial = values[Knob.MAX_NUM_PARTIAL_PREFILLS], values[Knob.MAX_LONG_PARTIAL_PREFILLS]
        if long_partial is not None and partial is not None:
            values[Knob.MAX_LONG_PARTIAL_PREFILLS] = min(long_partial, partial)
        return TunedConfig(**values)  # type: ignore[arg-type]

    def to_params(self, config: TunedConfig) -> dict[str, int] | None:
        """Optuna parameters that map onto ``config``, or None when it lies outside the space."""
        params: dict[str, int] = {}
        for knob, r in self.ranges.items():
            value = getattr(config, knob.value)
            if knob is Knob.LONG_PREFILL_TOKEN_THRESHOLD and value == 0:
                if not self.long_prefill_off_allowed:
                    return None
                value = r.high
            if value is None or not r.low <= value <= r.high:
                return None
            params[knob.value] = int(value)
        if self.to_config(params) != config:
            return None
        return params

    def contains(self, config: TunedConfig) -> bool:
        """True when ``config`` is reachable from this space."""
        return self.to_params(config) is not None

    @property
    def budget(self) -> KnobRange:
        return self.ranges[Knob.MAX_NUM_BATCHED_TOKENS]

    def describe(self) -> str:
        """One line per tuned knob, for events and logs."""
        parts = [f"{KNOB_ALIASES[k]}=[{r.low},{r.high}]" for k, r in self.ranges.items()]
        return " ".join(parts)


def largest_tokens_within(step_model: StepTime, limit_s: float, high: int = BUDGET_ABSOLUTE_MAX) -> int:
    """Largest prompt-token count whose predicted pass stays within ``limit_s`` (0 when none)."""

    largest = search_largest_within(
        lambda tokens: step_model.step_time_s(tokens, 0, tokens // 2), limit_s, max_tokens=high
    )
    return largest or 0


def compute_knee_tokens(accelerator: Accelerator) -> int:
    """Tokens per pass below which linear layers are bandwidth-bound (the ridge point)."""
    return round(accelerator.ridge_point)


def memory_ceiling_tokens(facts: ServiceFacts, accelerator: Accelerator, model: ModelProfile | None) -> int:
    """Largest budget whose activations fit the configured share of the memory left by the weights."""
    if model is None:
        return BUDGET_ABSOLUTE_MAX
    tp = max(1, facts.tensor_parallel_size)
    usable = accelerator.memory_bytes * facts.gpu_memory_utilization - model.weight_bytes / tp
    if usable <= 0:
        raise SpaceError(
            f"spec.model.name: {model.name} weights do not fit {accelerator.name} at "
            f"tensorParallelSize={tp}; raise spec.engine.tensorParallelSize"
        )
    # Peak live activations per token: the gated MLP's two up-projections, the
    # residual stream and attention projections, all in BF16.
    per_token = 2 * (2 * model.intermediate_size / tp + 4 * model.hidden_size)
    return int(usable * ACTIVATION_MEMORY_SHARE / per_token)


def _bound(bounds: Mapping[str, tuple[int, int]], knob: Knob) -> tuple[int, int] | None:
    return bounds.get(knob.value) or bounds.get(KNOB_ALIASES[knob])


def _seqs_range(facts: ServiceFacts, bounds: Mapping[str, tuple[int, int]]) -> KnobRange:
    """max-num-seqs: the bound, else [16, 512] widened to take in the incumbent."""
    seq_bound = _bound(bounds, Knob.MAX_NUM_SEQS)
    if seq_bound is not None:
        return KnobRange(*seq_bound)
    inc = facts.incumbent
    return KnobRange(min(16, inc.max_num_seqs), max(512, inc.max_num_seqs))


def _derived_budget(
    facts: ServiceFacts,
    seqs: KnobRange,
    accelerator: Accelerator,
    shape: ModelProfile | None,
    step_model: StepTime | None,
    notes: list[str],
) -> KnobRange:
    """The budget range from the hardware, the model and the ITL target (see the module docstring)."""
    per_seq = 1 + facts.speculative_tokens
    profile = facts.step_profile
    knee = (profile and profile.knee_tokens) or compute_knee_tokens(accelerator)
    floor = max(knee, seqs.low * per_seq, BUDGET_ABSOLUTE_MIN)
    if not facts.enable_chunked_prefill:
        floor = max(floor, facts.max_model_len)
    ceiling = min(memory_ceiling_tokens(facts, accelerator, shape), BUDGET_ABSOLUTE_MAX)
    if profile is not None or step_model is not None:
        limit_ms = facts.itl_target_ms * ITL_CEILING_HEADROOM
        if profile is not None:
            itl_limit = profile.itl_feasible_budget(limit_ms) or 0
            notes.append(f"measured step profile: knee {knee} tokens, {limit_ms:g} ms budget {itl_limit}")
        else:
            assert step_model is not None
            itl_limit = largest_tokens_within(step_model, limit_ms / 1000)
        if itl_limit < floor:
            notes.append(
                f"predicted step time at the compute knee ({floor} tokens) exceeds "
                f"{ITL_CEILING_HEADROOM:g}x the ITL target; the ITL SLO may be infeasible"
            )
        ceiling = min(ceiling, max(itl_limit, floor))
    return KnobRange(floor, max(ceiling, floor))


def _budget_range(
    facts: ServiceFacts, bounds: Mapping[str, tuple[int, int]], seqs: KnobRange, derived: KnobRange
) -> KnobRange:
    """The budget bound (raised to what vLLM accepts at ``seqs.low``), else the derived range."""
    budget_bound = _bound(bounds, Knob.MAX_NUM_BATCHED_TOKENS)
    if budget_bound is None:
        return derived
    per_seq = 1 + facts.speculative_tokens
    low, high = budget_bound
    low = max(low, seqs.low * per_seq)  # vLLM rejects anything smaller
    if low > high:
        raise SpaceError(
            f"spec.autotune.bounds.maxNumBatchedTokens: max {high} is below maxNumSeqs.min x "
            f"(1 + speculative tokens) = {seqs.low * per_seq}; raise the budget bound or lower "
            "maxNumSeqs.min"
        )
    return KnobRange(low, high)


def _prefill_capped(
    facts: ServiceFacts,
    bounds: Mapping[str, tuple[int, int]],
    seqs: KnobRange,
    budget: KnobRange,
    notes: list[str],
) -> KnobRange:
    """``budget`` capped at SGLang's ``--max-prefill-tokens`` where the engine has it and chunks.

    The API refuses a chunk (``--chunked-prefill-size``) above the prefill batch bound; a derived
    floor above the cap comes down to it, a bound above it is an error naming both fields.
    """
    cap = facts.max_prefill_tokens
    if (
        cap is None
        or not facts.enable_chunked_prefill
        or not honours(facts.engine_kind, facts.engine_version, "max_prefill_tokens")
        or budget.high <= cap
    ):
        return budget
    per_seq = 1 + facts.speculative_tokens
    if seqs.low * per_seq > cap:
        raise SpaceError(
            f"spec.engine.maxPrefillTokens: {cap} is below maxNumSeqs.min x (1 + speculative tokens) = "
            f"{seqs.low * per_seq}, the smallest budget the engine accepts; raise maxPrefillTokens or "
            "lower maxNumSeqs.min"
        )
    if budget.low > cap:
        if _bound(bounds, Knob.MAX_NUM_BATCHED_TOKENS) is not None:
            raise SpaceError(
                f"spec.autotune.bounds.maxNumBatchedTokens: min {budget.low} is above "
                f"spec.engine.maxPrefillTokens {cap} (the budget is SGLang's --chunked-prefill-size, "
                "which may not exceed it); lower the bound or raise maxPrefillTokens"
            )
        notes.append(f"budget floor {budget.low} lowered to maxPrefillTokens {cap}")
    notes.append(f"budget capped at maxPrefillTokens {cap} (--chunked-prefill-size <= --max-prefill-tokens)")
    return KnobRange(max(min(budget.low, cap), seqs.low * per_seq), cap, budget.log)


def _lpt_range(
    facts: ServiceFacts, bounds: Mapping[str, tuple[int, int]], budget: KnobRange
) -> tuple[KnobRange | None, bool]:
    """The long-prefill threshold's range (None when empty) and whether it may be switched off."""
    lpt_bound = _bound(bounds, Knob.LONG_PREFILL_TOKEN_THRESHOLD)
    off_allowed = lpt_bound is None or lpt_bound[0] == 0
    lpt_low = max(LONG_PREFILL_MIN, lpt_bound[0] if lpt_bound else LONG_PREFILL_MIN)
    lpt_high = min(facts.max_model_len, lpt_bound[1] if lpt_bound else facts.max_model_len)
    if lpt_bound is None:
        lpt_high = min(lpt_high, budget.high)
    return (KnobRange(lpt_low, lpt_high) if lpt_low <= lpt_high else None), off_allowed


def _opt_in_ranges(
    facts: ServiceFacts, bounds: Mapping[str, tuple[int, int]], seqs: KnobRange, notes: list[str]
) -> dict[Knob, KnobRange]:
    """The partial-prefill and active-sequence limits: tuned when honoured and opted in (spec or bounds)."""
    inc = facts.incumbent
    ranges: dict[Knob, KnobRange] = {}
    partial_ok = _has_setting(facts.engine_kind, Knob.MAX_NUM_PARTIAL_PREFILLS) and (
        facts.partial_prefills
        if facts.partial_prefills is not None
        else honours_partial_prefills(facts.engine_kind, facts.engine_version)
    )
    partial_bound = _bound(bounds, Knob.MAX_NUM_PARTIAL_PREFILLS)
    if partial_ok and (partial_bound is not None or inc.max_num_partial_prefills is not None):
        ranges[Knob.MAX_NUM_PARTIAL_PREFILLS] = KnobRange(*(partial_bound or (1, 8)), log=False)
        long_bound = _bound(bounds, Knob.MAX_LONG_PARTIAL_PREFILLS)
        if long_bound is not None or inc.max_long_partial_prefills is not None:
            ranges[Knob.MAX_LONG_PARTIAL_PREFILLS] = KnobRange(*(long_bound or (1, 8)), log=False)
    elif inc.max_num_partial_prefills is not None or partial_bound is not None:
        notes.append(
            f"{facts.engine_kind} {facts.engine_version} does not honour the partial-prefill limits; "
            "not tuned"
        )
    active_bound = _bound(bounds, Knob.MAX_NUM_ACTIVE_SEQS)
    if honours_max_num_active_seqs(facts.engine_kind, facts.engine_version) and (
        active_bound is not None or inc.max_num_active_seqs is not None
    ):
        ranges[Knob.MAX_NUM_ACTIVE_SEQS] = KnobRange(*(active_bound or (seqs.low, seqs.high)))
    return ranges


def build_space(
    facts: ServiceFacts,
    bounds: Mapping[str, tuple[int, int]] | None = None,
    step_model: StepTime | None = None,
) -> SearchSpace:
    """Derive the search space for ``facts``; ``bounds`` (knob -> (min, max)) override derived limits.

    ``step_model`` predicts step times; without one the simulator's calibrated model
    is used (:func:`default_step_model`; no ITL ceiling when the model has no profile).
    """
    bounds = bounds or {}
    for required in (Knob.MAX_NUM_BATCHED_TOKENS, Knob.MAX_NUM_SEQS):
        if not honours(facts.engine_kind, facts.engine_version, required):
            raise SpaceError(
                f"spec.engine.kind: {facts.engine_kind} {facts.engine_version} has no setting for "
                f"{KNOB_ALIASES[required]}; the autotuner cannot tune it"
            )
    accelerator = load_accelerator(facts.accelerator)
    shape = load_model_shape(facts.model)
    tp = max(1, facts.tensor_parallel_size)
    if shape is not None and shape.num_heads % tp:
        raise SpaceError(
            f"spec.engine.tensorParallelSize: {tp} does not divide the {shape.num_heads} attention heads of "
            f"{shape.name}; use a divisor of {shape.num_heads}"
        )
    if step_model is None:
        step_model = default_step_model(facts.model, facts.accelerator, facts.tensor_parallel_size)
    notes: list[str] = []
    # max-num-seqs first: its floor feeds the budget floor.
    seqs = _seqs_range(facts, bounds)
    derived = _derived_budget(facts, seqs, accelerator, shape, step_model, notes)
    budget = _budget_range(facts, bounds, seqs, derived)
    budget = _prefill_capped(facts, bounds, seqs, budget, notes)
    ranges: dict[Knob, KnobRange] = {Knob.MAX_NUM_BATCHED_TOKENS: budget, Knob.MAX_NUM_SEQS: seqs}
    off_allowed = True
    if honours(facts.engine_kind, facts.engine_version, Knob.LONG_PREFILL_TOKEN_THRESHOLD):
        lpt, off_allowed = _lpt_range(facts, bounds, budget)
        if lpt is not None:
            ranges[Knob.LONG_PREFILL_TOKEN_THRESHOLD] = lpt
    elif _bound(bounds, Knob.LONG_PREFILL_TOKEN_THRESHOLD) not in (None, (0, 0)):
        notes.append(f"{facts.engine_kind} {facts.engine_version} has no long-prefill threshold; not tuned")
    ranges.update(_opt_in_ranges(facts, bounds, seqs, notes))

    for knob, r in ranges.items():
        if r.low > r.high or r.low < 0:
            raise SpaceError(
                f"spec.autotune.bounds.{KNOB_ALIASES[knob]}: empty range [{r.low}, {r.high}]; "
                "make min <= max and both non-negative"
            )
    inc = facts.incumbent
    fixed = replace(inc, long_prefill_token_threshold=inc.long_prefill_token_threshold or 0)
    return SearchSpace(
        ranges=ranges,
        fixed=fixed,
        speculative_tokens=facts.speculative_tokens,
        max_model_len=facts.max_model_len,
        long_prefill_off_allowed=off_allowed,
        notes=tuple(notes),
    )
