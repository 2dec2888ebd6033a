"""The twin's view of an engine's scheduling: the simulator's scheduler for a service's engine spec.

One hook per engine that schedules differently from vLLM (each kind's module in
``chunkpilot.operator.engines`` names its own as ``SUPPORT.twin_semantics``): the engine's server
defaults on the accelerator, with the engine-only settings the spec pins; a policy the simulator does
not reproduce keeps the engine's default. The tuned knobs are replaced per candidate by the twin.
vLLM and the simulator have none: the twin's default is vLLM's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from chunkpilot.engine.sim.flags import engine_server_defaults
from chunkpilot.engine.sim.scheduler import (
    SIMULATED_CAPACITY_POLICIES,
    CapacitySchedulerPolicy,
    ContextChunkingPolicy,
    Engine,
    SchedulerConfig,
    SchedulingPolicy,
)

from chunkpilot.api import EngineSpec

#: A twin semantics hook: ``(spec, model, accelerator, max_model_len)`` -> the scheduler to simulate.
SemanticsHook = Callable[[EngineSpec, str, str, int], SchedulerConfig]


def sglang_semantics(spec: EngineSpec, model: str, accelerator: str, max_model_len: int) -> SchedulerConfig:
    """SGLang's defaults with the spec's prefill cap, schedule policy and mixed chunks."""
    base = engine_server_defaults(Engine.SGLANG.value, model, accelerator, max_model_len).scheduler
    pinned: dict[str, object] = {
        "enable_prefix_caching": spec.enable_prefix_caching,
        "enable_mixed_chunk": spec.enable_mixed_chunk,
    }
    if spec.max_prefill_tokens is not None:
        pinned["max_prefill_tokens"] = spec.max_prefill_tokens
    if spec.schedule_policy is not None and spec.schedule_policy.value in {p.value for p in SchedulingPolicy}:
        pinned["policy"] = SchedulingPolicy(spec.schedule_policy.value)
    return replace(base, **pinned)  # type: ignore[arg-type]


def trtllm_semantics(spec: EngineSpec, model: str, accelerator: str, max_model_len: int) -> SchedulerConfig:
    """TensorRT-LLM's defaults with the spec's capacity-scheduler and context-chunking policies."""
    base = engine_server_defaults(Engine.TRTLLM.value, model, accelerator, max_model_len).scheduler
    pinned: dict[str, object] = {"enable_prefix_caching": spec.enable_prefix_caching}
    policy = spec.capacity_scheduler_policy
    if policy is not None and CapacitySchedulerPolicy(policy.value) in SIMULATED_CAPACITY_POLICIES:
        pinned["capacity_scheduler_policy"] = CapacitySchedulerPolicy(policy.value)
    if spec.context_chunking_policy is not None:
        pinned["context_chunking_policy"] = ContextChunkingPolicy(spec.context_chunking_policy.value)
    return replace(base, **pinned)  # type: ignore[arg-type]


__all__ = ["SemanticsHook", "sglang_semantics", "trtllm_semantics"]
