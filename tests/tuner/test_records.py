"""Service facts the search space is built from, read off an InferenceService."""

from __future__ import annotations

from typing import Any

import pytest
from chunkpilot.tuner.records import service_facts
from chunkpilot.tuner.space import Knob, build_space

from chunkpilot.api import InferenceService


def service(**engine: Any) -> InferenceService:
    return InferenceService.from_manifest(
        {
            "apiVersion": "chunkpilot.io/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": "chat", "namespace": "default"},
            "spec": {
                "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "maxModelLen": 8192},
                "engine": {"kind": "vllm", "maxNumBatchedTokens": 4096, "maxNumSeqs": 128, **engine},
                "slo": {"itl": {"quantile": 0.99, "maxMs": 50}, "ttft": {"quantile": 0.95, "maxMs": 1000}},
                "autotune": {"enabled": True},
            },
        }
    )


@pytest.mark.parametrize(
    ("engine", "honoured"),
    [
        ({"version": "0.33.0"}, True),  # the default engine image carries the scheduler plugin
        ({"version": "0.33.0", "image": "vllm/vllm-openai:v0.33.0"}, False),  # upstream V1: removed
        ({"version": "0.8.5"}, True),  # V0 still had the flags
        ({"kind": "sim", "version": "0.33.0"}, True),
    ],
)
def test_partial_prefill_knobs_follow_what_the_operator_can_render(
    engine: dict[str, Any], honoured: bool
) -> None:
    facts = service_facts(service(**engine))
    assert facts.partial_prefills is honoured
    space = build_space(facts, bounds={Knob.MAX_NUM_PARTIAL_PREFILLS.value: (1, 4)})
    assert (Knob.MAX_NUM_PARTIAL_PREFILLS in space.ranges) is honoured
