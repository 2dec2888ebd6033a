"""A synthetic step profile: what an ideal roofline device would measure (tests, examples, demos).

No torch: the "measurements" are the fitted roofline form itself, so every
derived figure (efficiencies, knee, ITL budget) is known exactly.
"""

from __future__ import annotations

from chunkpilot.engine.probe.fit import RooflineFit
from chunkpilot.engine.probe.profile import Peaks, PeakSource, StepProfile
from chunkpilot.engine.probe.roofline import linear_cost, prefill_attention_cost, shard_shapes
from chunkpilot.engine.probe.runner import (
    LayerMeasurement,
    ProbeRequest,
    assemble_profile,
    resolve_model_shape,
)
from chunkpilot.engine.sim.profiles.loader import load_accelerator

__all__ = ["SYNTHETIC_TOKENS", "synthetic_profile"]

SYNTHETIC_TOKENS: tuple[int, ...] = tuple(2**i for i in range(15))


def synthetic_profile(
    model: str = "llama-3.1-8b",
    tensor_parallel_size: int = 1,
    accelerator: str = "h200",
    itl_target_ms: float | None = 50.0,
    linear: tuple[float, float, float] = (0.75, 0.70, 0.010),
    attention: tuple[float, float, float] = (0.55, 0.80, 0.005),
    context_tokens: int = 2048,
) -> StepProfile:
    """The profile of ``accelerator`` reaching given shares of its datasheet peaks, plus an overhead.

    ``linear`` and ``attention`` are (compute efficiency, bandwidth efficiency,
    overhead ms) of the projections and of prefill attention.
    """
    sheet = load_accelerator(accelerator)
    linear_fit = RooflineFit(sheet.peak_flops, sheet.hbm_bytes_per_s, *linear, 0.0, 0, 0)
    attention_fit = RooflineFit(sheet.peak_flops, sheet.hbm_bytes_per_s, *attention, 0.0, 0, 0)
    shape = resolve_model_shape(model)
    shapes = shard_shapes(shape, tensor_parallel_size)
    measured = [
        LayerMeasurement(
            tokens,
            linear_fit.predict_ms(*linear_cost(shapes.linears, tokens, 2)),
            attention_fit.predict_ms(*prefill_attention_cost(shapes.attention, tokens, context_tokens, 2)),
            None,
        )
        for tokens in SYNTHETIC_TOKENS
    ]
    request = ProbeRequest(
        model=model,
        tensor_parallel_size=tensor_parallel_size,
        device="cuda",
        tokens=SYNTHETIC_TOKENS,
        itl_target_ms=itl_target_ms,
        context_tokens=context_tokens,
    )
    peaks = Peaks(
        flops_per_s=sheet.peak_flops, bandwidth_bytes_per_s=sheet.hbm_bytes_per_s, source=PeakSource.DATASHEET
    )
    return assemble_profile(
        request=request,
        shape=shape,
        accelerator=accelerator,
        device_name=f"synthetic {accelerator}",
        peaks=peaks,
        measured=measured,
    )
