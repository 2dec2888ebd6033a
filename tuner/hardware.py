"""The tuner's view of the hardware: the simulator's profiles and step-time model, nothing else.

The search space needs three things of the hardware: an accelerator's datasheet figures (its
ridge point is the budget floor, its memory the activation ceiling), a model's dimensions (its
weights), and the duration of one forward pass.  All three come from
:mod:`chunkpilot.engine.sim.profiles` and :mod:`chunkpilot.engine.sim.steptime`, the model the
simulated engines run on, through this adapter.
"""

from __future__ import annotations

from chunkpilot.engine.sim.profiles.loader import (
    Accelerator,
    ModelProfile,
    ProfileError,
    accelerator_names,
    load_accelerator,
    load_model,
)
from chunkpilot.engine.sim.steptime import ForwardPass, StepTimeModel

#: Context each decoding sequence is assumed to read per step when only counts are known.
DECODE_CONTEXT_TOKENS = 1024


def accelerator(name: str) -> Accelerator:
    """Accelerator profile by name or alias; :class:`ProfileError` naming the known ones otherwise."""
    return load_accelerator(name)


def known_accelerators() -> list[str]:
    """Names of the built-in accelerator profiles."""
    return accelerator_names()


def model_profile(name: str) -> ModelProfile | None:
    """Model dimensions by Hugging Face id, profile name or URI; None when the model has no profile."""
    try:
        return load_model(name.split("://", 1)[-1])
    except ProfileError:
        return None


class StepTime:
    """Predicted duration of one engine step, in the terms the search space reasons in.

    A pass over ``prefill_tokens`` prompt tokens (one chunk after ``context_tokens`` of
    context) plus ``decode_seqs`` decoding sequences, each reading
    :data:`DECODE_CONTEXT_TOKENS` of KV cache, as the simulator's model times it.
    """

    def __init__(self, model: StepTimeModel) -> None:
        self.model = model

    def step_time_s(self, prefill_tokens: int, decode_seqs: int, context_tokens: int) -> float:
        """Seconds for the pass (see the class docstring)."""
        sequences = decode_seqs + (1 if prefill_tokens else 0)
        forward = ForwardPass(
            num_tokens=prefill_tokens + decode_seqs,
            num_sequences=sequences,
            num_sampled=sequences,
            prefill_attention_pairs=ForwardPass.prefill_pairs(prefill_tokens, context_tokens)
            if prefill_tokens
            else 0.0,
            prefill_context_tokens=context_tokens if prefill_tokens else 0,
            decode_context_tokens=decode_seqs * DECODE_CONTEXT_TOKENS,
        )
        return float(self.model.step_time(forward))


def step_time(model: str, accelerator_name: str, tensor_parallel_size: int = 1) -> StepTime | None:
    """The simulator's step-time model for ``model`` on ``accelerator_name``, or None when it has none.

    None when the model has no profile, the accelerator is unknown, or the tensor-parallel
    degree does not divide the model's attention heads (no engine can run that layout).
    """
    profile = model_profile(model)
    if profile is None:
        return None
    try:
        return StepTime(StepTimeModel(profile, load_accelerator(accelerator_name), tensor_parallel_size))
    except ValueError:  # ProfileError included
        return None
