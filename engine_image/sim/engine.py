"""The simulated engine: scheduler + KV cache + step-time model, advanced one step at a time."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from chunkpilot.engine.sim.compiled import picklable
from chunkpilot.engine.sim.kvcache import KVCapacity, kv_capacity
from chunkpilot.engine.sim.profiles.loader import Accelerator, ModelProfile, load_accelerator, load_model
from chunkpilot.engine.sim.scheduler import (
    Engine,
    RequestOutput,
    Scheduler,
    SchedulerConfig,
    SchedulerOutput,
    SGLangSchedulerConfig,
    TrtllmSchedulerConfig,
    scheduler_config_class,
)
from chunkpilot.engine.sim.sglang_scheduler import SGLangScheduler
from chunkpilot.engine.sim.steptime import ForwardPass, StepProfile, StepTimeModel
from chunkpilot.engine.sim.trtllm_scheduler import TRTLLMScheduler

#: The random stream of the step-time spread (apart from the scheduler's, which shares the seed).
_SPREAD_STREAM = 0x5E7D

H100_CLASS_MIN_FLOPS = 900e12


def default_limits(accelerator: Accelerator) -> tuple[int, int]:
    """vLLM's server defaults ``(max_num_batched_tokens, max_num_seqs)`` for an accelerator class."""
    if accelerator.peak_flops >= H100_CLASS_MIN_FLOPS and accelerator.memory_bytes >= 70 * 2**30:
        return 8192, 1024
    return 2048, 256


def make_scheduler(config: SchedulerConfig, num_kv_blocks: int, seed: int = 0) -> Scheduler:
    """The scheduler of ``config``'s engine: vLLM V1, SGLang or TensorRT-LLM semantics."""
    if isinstance(config, SGLangSchedulerConfig):
        return SGLangScheduler(config, num_kv_blocks, seed)
    if isinstance(config, TrtllmSchedulerConfig):
        return TRTLLMScheduler(config, num_kv_blocks, seed)
    return Scheduler(config, num_kv_blocks, seed)


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Everything that defines one simulated engine (``scheduler.engine`` says whose semantics)."""

    model: str = "llama-3.1-8b"
    accelerator: str = "h100"
    tensor_parallel_size: int = 1
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    gpu_memory_utilization: float = 0.92
    step_profile: str | None = None
    seed: int = 0
    num_kv_blocks: int | None = None

    @property
    def engine(self) -> Engine:
        """Whose scheduling semantics and metric names this engine reproduces."""
        return self.scheduler.engine

    @classmethod
    def for_engine(cls, engine: Engine | str, **fields: object) -> SimConfig:
        """A SimConfig with ``engine``'s semantics; ``fields`` are SimConfig fields and
        fields of ``engine``'s scheduler config class (the latter go into ``scheduler``)."""
        config_class = scheduler_config_class(engine)
        names = set(config_class.__dataclass_fields__)
        sched = {k: v for k, v in fields.items() if k in names}
        rest = {k: v for k, v in fields.items() if k not in names}
        return cls(scheduler=config_class(**sched), **rest)  # type: ignore[arg-type]

    def build(self) -> EngineCore:
        """Instantiate the engine this configuration describes."""
        return EngineCore(self)


@dataclass(frozen=True, slots=True)
class StepResult:
    """One executed step: when it started, how long it took, what it scheduled and produced."""

    start_s: float
    duration_s: float
    output: SchedulerOutput
    results: list[RequestOutput]

    @property
    def end_s(self) -> float:
        """Time at which the step's tokens are emitted."""
        return self.start_s + self.duration_s


class EngineCore:
    """Model, accelerator, KV capacity and scheduler of one simulated engine replica."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.model: ModelProfile = load_model(config.model)
        self.accelerator: Accelerator = load_accelerator(config.accelerator)
        profile = StepProfile.load(config.step_profile) if config.step_profile else None
        self.step_model = StepTimeModel(
            self.model, self.accelerator, config.tensor_parallel_size, step_profile=profile
        )
        sched = config.scheduler
        self.capacity: KVCapacity = kv_capacity(
            self.model,
            self.accelerator,
            config.tensor_parallel_size,
            config.gpu_memory_utilization,
            sched.max_num_batched_tokens,
            sched.block_size,
        )
        blocks = config.num_kv_blocks if config.num_kv_blocks is not None else self.capacity.num_blocks
        if blocks * sched.block_size < sched.max_model_len:
            raise ValueError(
                f"--max-model-len {sched.max_model_len} exceeds the {blocks * sched.block_size} "
                f"tokens the KV cache holds for {self.model.name} on "
                f"{config.tensor_parallel_size} x {self.accelerator.name}; "
                "lower --max-model-len or raise --gpu-memory-utilization / --tensor-parallel-size"
            )
        self.scheduler = make_scheduler(sched, blocks, seed=config.seed)
        self._spread = (
            np.random.default_rng([config.seed, _SPREAD_STREAM]) if self.step_model.has_dispersion else None
        )

    @property
    def steps_spread(self) -> bool:
        """Whether single steps last a random multiple of their modelled time (see :meth:`step_time`)."""
        return self._spread is not None

    def step_time(self, forward_pass: ForwardPass) -> float:
        """Seconds ``forward_pass`` lasts: the step model's time, times a mean-one log-normal draw of
        the profile's spread at its token count when the profile gives one (seeded by ``config.seed``)."""
        duration = self.step_model.step_time(forward_pass)
        if self._spread is None:
            return duration
        sigma = self.step_model.step_log_sigma(forward_pass.num_tokens)
        if sigma <= 0:
            return duration
        return duration * math.exp(sigma * float(self._spread.standard_normal()) - sigma * sigma / 2)

    def step(self, now: float) -> StepResult | None:
        """Schedule and execute one step starting at ``now``; None when nothing can run."""
        output = self.scheduler.schedule(now)
        if output.is_empty:
            return None
        duration = self.step_time(output.forward_pass)
        results = self.scheduler.update(output, now + duration)
        return StepResult(now, duration, output, results)


picklable(SimConfig, StepResult)
