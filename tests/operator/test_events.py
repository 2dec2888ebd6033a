"""Events: the "what changed" text is the knob table's, the same in the operator and the tuner."""

from __future__ import annotations

from chunkpilot.operator.events import rolled
from chunkpilot.tuner.records import config_change

from chunkpilot.api import EngineConfig, knobs

OLD = EngineConfig(max_num_batched_tokens=8192, max_num_seqs=256)
NEW = OLD.model_copy(update={"max_num_batched_tokens": 3072, "long_prefill_token_threshold": 512})


def test_change_names_only_the_knobs_that_differ_in_table_order() -> None:
    assert knobs.change(OLD.model_dump(), NEW.model_dump()) == (
        "maxNumBatchedTokens 8192 -> 3072, longPrefillTokenThreshold 0 -> 512"
    )
    assert knobs.change(OLD.model_dump(), OLD.model_dump()) == ""


def test_rolled_event_and_trial_text_describe_a_change_the_same_way() -> None:
    change = knobs.change(OLD.model_dump(), NEW.model_dump())
    event = rolled("chat", OLD, NEW, "abcd1234")
    assert event.reason == "Rolled"
    assert event.message == f"rolling chat to config abcd1234 ({change})"
    assert config_change(OLD, NEW) == change


def test_rolled_without_a_previous_config_gives_the_summary_and_no_change_says_so() -> None:
    assert rolled("chat", None, NEW, "abcd1234").message == (
        "rolling chat to config abcd1234 (budget=3072 seqs=256 lpt=512)"
    )
    assert rolled("chat", OLD, OLD, "abcd1234").message.endswith("(engine settings changed)")
    assert config_change(OLD, OLD) == "no change"
