"""Search space: floors, ceilings, bounds overrides, repairs and warm start."""

from __future__ import annotations

import pytest
from chunkpilot.tuner.hardware import StepTime, step_time
from chunkpilot.tuner.space import (
    KNOB_ALIASES,
    Knob,
    ServiceFacts,
    SpaceError,
    TunedConfig,
    build_space,
    compute_knee_tokens,
    default_step_model,
    honours_max_num_active_seqs,
    honours_partial_prefills,
    largest_tokens_within,
    load_accelerator,
)
from chunkpilot.tuner.warmstart import LoadedStep, model_guess, unloaded_guess, warm_start

from chunkpilot.api.knobs import TUNABLE


def sim_step(accelerator: str = "h100") -> StepTime:
    """The simulator's roofline step-time model of Llama 3.1 8B (the one hardware model)."""
    model = step_time("llama-3.1-8b", accelerator)
    assert model is not None
    return model


def facts(**overrides: object) -> ServiceFacts:
    base: dict[str, object] = {
        "accelerator": "h100",
        "model": "llama-3.1-8b",
        "incumbent": TunedConfig(8192, 256),
        "itl_target_ms": 50.0,
    }
    base.update(overrides)
    return ServiceFacts(**base)  # type: ignore[arg-type]


def test_budget_floor_is_the_compute_knee() -> None:
    space = build_space(facts(), step_model=sim_step())
    knee = compute_knee_tokens(load_accelerator("h100"))
    assert 280 <= knee <= 310  # 989 TFLOP/s / 3.35 TB/s
    assert space.budget.low == knee
    assert space.budget.log


def test_budget_floor_respects_speculative_tokens() -> None:
    space = build_space(facts(speculative_tokens=4), step_model=sim_step())
    seqs_low = space.ranges[Knob.MAX_NUM_SEQS].low
    assert space.budget.low >= seqs_low * 5


def test_budget_ceiling_follows_the_itl_target() -> None:
    model = sim_step()
    tight = build_space(facts(itl_target_ms=30.0), step_model=model)
    loose = build_space(facts(itl_target_ms=200.0), step_model=model)
    assert tight.budget.high < loose.budget.high
    assert model.step_time_s(tight.budget.high, 0, tight.budget.high // 2) <= 0.030 * 2.0
    assert model.step_time_s(tight.budget.high + 1, 0, (tight.budget.high + 1) // 2) > 0.030 * 2.0


def test_bounds_override_derived_limits() -> None:
    space = build_space(
        facts(),
        bounds={"maxNumBatchedTokens": (512, 16384), "maxNumSeqs": (32, 64)},
        step_model=sim_step(),
    )
    assert (space.budget.low, space.budget.high) == (512, 16384)
    assert (space.ranges[Knob.MAX_NUM_SEQS].low, space.ranges[Knob.MAX_NUM_SEQS].high) == (32, 64)


def test_bounds_below_the_sequence_floor_name_the_field() -> None:
    with pytest.raises(SpaceError, match=r"bounds\.maxNumBatchedTokens"):
        build_space(
            facts(speculative_tokens=4), bounds={"maxNumBatchedTokens": (64, 100), "maxNumSeqs": (32, 64)}
        )


def test_unknown_accelerator_is_a_clear_error() -> None:
    with pytest.raises(SpaceError, match=r"spec\.resources\.accelerator"):
        build_space(facts(accelerator="tpu-v9"))


@pytest.mark.parametrize(
    "params",
    [
        {"max_num_batched_tokens": 1, "max_num_seqs": 100000, "long_prefill_token_threshold": 1},
        {"max_num_batched_tokens": 10**7, "max_num_seqs": 1, "long_prefill_token_threshold": 10**7},
        {"max_num_batched_tokens": 400, "max_num_seqs": 400, "long_prefill_token_threshold": 300},
    ],
)
def test_to_config_never_leaves_the_bounds(params: dict[str, int]) -> None:
    space = build_space(facts(speculative_tokens=2), step_model=sim_step())
    config = space.to_config(params)
    for knob, r in space.ranges.items():
        value = getattr(config, knob.value)
        if knob is Knob.LONG_PREFILL_TOKEN_THRESHOLD and value == 0:
            continue
        assert r.low <= value <= r.high, knob
    assert config.max_num_batched_tokens >= config.max_num_seqs * 3


def test_long_prefill_threshold_at_or_above_budget_means_off() -> None:
    space = build_space(facts(), step_model=sim_step())
    config = space.to_config(
        {"max_num_batched_tokens": 1024, "max_num_seqs": 64, "long_prefill_token_threshold": 2000}
    )
    assert config.long_prefill_token_threshold == 0
    config = space.to_config(
        {"max_num_batched_tokens": 1024, "max_num_seqs": 64, "long_prefill_token_threshold": 300}
    )
    assert config.long_prefill_token_threshold == 300


def test_params_round_trip() -> None:
    space = build_space(facts(), step_model=sim_step())
    config = space.to_config(
        {"max_num_batched_tokens": 1500, "max_num_seqs": 100, "long_prefill_token_threshold": 300}
    )
    params = space.to_params(config)
    assert params is not None
    assert space.to_config(params) == config


def test_partial_prefills_only_where_honoured() -> None:
    incumbent = TunedConfig(2048, 128, max_num_partial_prefills=2)
    assert Knob.MAX_NUM_PARTIAL_PREFILLS not in build_space(facts(incumbent=incumbent)).ranges
    sim = build_space(facts(incumbent=incumbent, engine_kind="sim"))
    assert Knob.MAX_NUM_PARTIAL_PREFILLS in sim.ranges
    assert honours_partial_prefills("vllm", "0.8.5") and not honours_partial_prefills("vllm", "0.33.0")


def test_model_guess_full_step_meets_the_itl_target_and_is_warm_started() -> None:
    model = sim_step()
    f = facts(itl_target_ms=50.0)
    space = build_space(f, step_model=model)
    guess = model_guess(space, f, model)
    budget = guess.max_num_batched_tokens
    loaded = LoadedStep.of(f, guess.max_num_seqs)
    # The whole step at load (prefill chunk + running decodes) fits; one token more does not.
    assert space.budget.low < budget < space.budget.high
    assert loaded.time_s(model, budget) <= 0.050 < loaded.time_s(model, budget + 1)
    assert loaded.decode_seqs(budget) > 0
    # A prefill-only pass of the same budget would leave room: the decode batch is what costs.
    assert budget < largest_tokens_within(model, 0.050)
    starts = warm_start(space, f, model)
    assert starts and space.to_config(starts[0]) == guess and starts[0].when_slack is None


def test_the_second_warm_start_is_the_prefill_only_budget_tried_on_itl_slack() -> None:
    model = sim_step()
    f = facts(itl_target_ms=50.0)
    space = build_space(f, step_model=model)
    first, second = warm_start(space, f, model)
    assert second.when_slack == "itl"
    upper = second[Knob.MAX_NUM_BATCHED_TOKENS.value]
    assert upper == largest_tokens_within(model, 0.050) > first[Knob.MAX_NUM_BATCHED_TOKENS.value]
    assert space.to_config(second) == unloaded_guess(space, f, model)
    # Where both ends coincide (the range's floor) only one point is left.
    tight = facts(itl_target_ms=5.0)
    assert len(warm_start(build_space(tight, step_model=model), tight, model)) == 1


@pytest.mark.parametrize("model", [sim_step("h100"), sim_step("a100-80gb")])
def test_model_guess_shrinks_as_the_running_batch_grows(model: StepTime) -> None:
    budgets = []
    for output_tokens in (16, 128, 512, 1024):
        f = facts(mean_prompt_tokens=1024, mean_output_tokens=output_tokens)
        budgets.append(model_guess(build_space(f, step_model=model), f, model).max_num_batched_tokens)
    assert budgets == sorted(budgets, reverse=True) and budgets[0] > budgets[-1]
    # Fewer seats for decodes (max-num-seqs) caps the batch and frees budget for prefill.
    f = facts(mean_prompt_tokens=1024, mean_output_tokens=1024)
    capped = facts(mean_prompt_tokens=1024, mean_output_tokens=1024, incumbent=TunedConfig(8192, 32))
    assert (
        model_guess(build_space(capped, step_model=model), capped, model).max_num_batched_tokens
        > model_guess(build_space(f, step_model=model), f, model).max_num_batched_tokens
    )


def test_a_higher_itl_quantile_gets_more_headroom() -> None:
    model = sim_step()
    guesses = {}
    for quantile in (0.5, 0.9, 0.99):
        f = facts(itl_quantile=quantile)
        guesses[quantile] = model_guess(build_space(f, step_model=model), f, model).max_num_batched_tokens
    assert guesses[0.5] > guesses[0.9] > guesses[0.99]
    step = LoadedStep.of(facts(itl_quantile=0.99), 1024)
    median = LoadedStep.of(facts(itl_quantile=0.5), 1024)
    assert step.decode_seqs(2000) > median.decode_seqs(2000)
    assert step.context_tokens(500) > median.context_tokens(500)


def test_a_bad_itl_quantile_names_the_field() -> None:
    f = facts(itl_quantile=99.0)
    with pytest.raises(SpaceError, match=r"spec\.slo\.itl\.quantile"):
        model_guess(build_space(f, step_model=sim_step()), f, sim_step())


def test_model_guess_defaults_to_the_spaces_step_model() -> None:
    f = facts()
    space = build_space(f)
    default = default_step_model(f.model, f.accelerator)
    assert isinstance(default, StepTime)
    assert model_guess(space, f) == model_guess(space, f, default)


def test_knob_names_and_tuned_config_fields_are_the_knob_table() -> None:
    names = tuple(row.name for row in TUNABLE)
    assert tuple(knob.value for knob in Knob) == names
    assert tuple(TunedConfig(1, 1).as_dict()) == names
    assert {Knob(row.name): row.camel for row in TUNABLE} == KNOB_ALIASES


def test_tuned_config_summary_is_the_api_summary() -> None:
    config = TunedConfig(3072, 256, max_num_active_seqs=64, long_prefill_token_threshold=512)
    assert config.summary() == "budget=3072 seqs=256 active=64 lpt=512"
    assert TunedConfig(3072, 256).summary() == "budget=3072 seqs=256"


def test_version_judgement_follows_the_knob_tables_columns() -> None:
    assert honours_max_num_active_seqs("vllm", "0.33.0") and not honours_max_num_active_seqs("vllm", "0.32.1")
    assert honours_partial_prefills("vllm", "v0.8.5.post1") and not honours_partial_prefills("vllm", "0.9")
    assert honours_partial_prefills("sim", "0.33.0") and honours_max_num_active_seqs("sim", "0.33.0")
    # The simulator is judged as the vLLM release it mirrors: render_sim refuses the flag before 0.33.
    assert not honours_max_num_active_seqs("sim", "0.8.0")


def test_no_step_model_without_a_profile_or_for_an_impossible_layout() -> None:
    assert default_step_model("acme/unknown-model", "h100") is None
    # 32 attention heads cannot be split over 3 GPUs: no engine runs it, so no prediction.
    assert default_step_model("llama-3.1-8b", "h100", tensor_parallel_size=3) is None
    assert isinstance(default_step_model("hf://meta-llama/Llama-3.1-8B-Instruct", "h100"), StepTime)


def test_a_tensor_parallel_size_that_does_not_divide_the_heads_names_the_field() -> None:
    with pytest.raises(SpaceError, match=r"spec\.engine\.tensorParallelSize: 3 does not divide the 32"):
        build_space(facts(tensor_parallel_size=3))


def test_long_partial_prefill_bounds_from_the_resource_shape_the_space() -> None:
    incumbent = TunedConfig(2048, 128, max_num_partial_prefills=4, max_long_partial_prefills=2)
    f = facts(incumbent=incumbent, engine_kind="sim")
    space = build_space(f, bounds={"maxNumPartialPrefills": (1, 6), "maxLongPartialPrefills": (1, 3)})
    long_range = space.ranges[Knob.MAX_LONG_PARTIAL_PREFILLS]
    assert (long_range.low, long_range.high) == (1, 3)
