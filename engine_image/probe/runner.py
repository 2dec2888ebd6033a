"""Run the probe: resolve the model and device, time every token count, fit, and assemble the profile.

Only :func:`run_probe` needs torch (imported when it is called); resolving the
request and assembling the profile from measurements are pure and tested
without it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from chunkpilot.engine.probe.fit import CostPoint, RooflineFit, fit_roofline
from chunkpilot.engine.probe.profile import (
    CurvePoint,
    EfficiencyFit,
    Peaks,
    PeakSource,
    ProbeSettings,
    StepProfile,
)
from chunkpilot.engine.probe.roofline import (
    ModelShape,
    ShardShapes,
    decode_attention_cost,
    linear_cost,
    prefill_attention_cost,
    shard_shapes,
)
from chunkpilot.engine.sim.profiles.loader import ProfileError as SimProfileError
from chunkpilot.engine.sim.profiles.loader import load_accelerator, load_model

from chunkpilot.api.accelerators import matching_device

if TYPE_CHECKING:
    import torch
    from chunkpilot.engine.probe.bench import Timer

__all__ = [
    "DEFAULT_TOKENS",
    "DTYPE_BYTES",
    "LayerMeasurement",
    "ProbeRequest",
    "ProbeRequestError",
    "accelerator_for_device_name",
    "assemble_profile",
    "resolve_dtype",
    "resolve_model_shape",
    "run_probe",
    "simulator_efficiency",
]

DEFAULT_TOKENS: tuple[int, ...] = tuple(2**i for i in range(15))  # 1 … 16384
DTYPE_BYTES: dict[str, int] = {"bfloat16": 2, "float16": 2, "float32": 4}

Device = Literal["cpu", "cuda"]
Progress = Callable[[str], None]


class ProbeRequestError(ValueError):
    """A probe request that cannot run (the message names the option and the fix)."""


@dataclass(frozen=True)
class ProbeRequest:
    """Everything ``chunkpilot probe`` was asked to do."""

    model: str
    tensor_parallel_size: int = 1
    device: Device = "cpu"
    dtype: str = "auto"
    tokens: tuple[int, ...] = DEFAULT_TOKENS
    itl_target_ms: float | None = None
    context_tokens: int = 2048
    max_decode_sequences: int = 512
    warmup: int = 3
    repeats: int = 7
    min_repeat_ms: float = 2.0
    accelerator: str | None = None
    peak_tflops: float | None = None
    peak_bandwidth_gbs: float | None = None
    measure_peaks: bool = False
    peak_matmul_size: int | None = None  # default: 8192 on cuda, 1024 on cpu
    peak_copy_mib: int | None = None  # default: 1024 on cuda, 128 on cpu
    threads: int | None = None  # CPU threads for torch (default: torch's choice)

    def validate(self) -> None:
        """Raise :class:`ProbeRequestError` naming the first bad option."""
        if self.tensor_parallel_size < 1:
            raise ProbeRequestError("--tensor-parallel-size must be at least 1")
        if len(set(self.tokens)) < 3 or min(self.tokens) < 1:
            raise ProbeRequestError(
                "--tokens needs at least 3 distinct positive token counts to fit 3 parameters, "
                "e.g. --tokens 1,16,256,4096"
            )
        if self.itl_target_ms is not None and self.itl_target_ms <= 0:
            raise ProbeRequestError("--itl-target-ms must be positive")
        if self.context_tokens < 0 or self.max_decode_sequences < 0:
            raise ProbeRequestError("--context-tokens and --max-decode-sequences must be non-negative")
        if self.threads is not None and self.threads < 1:
            raise ProbeRequestError("--threads must be at least 1")
        if self.repeats < 1 or self.warmup < 0:
            raise ProbeRequestError("--repeats must be at least 1 and --warmup non-negative")
        if (self.peak_tflops is None) != (self.peak_bandwidth_gbs is None):
            raise ProbeRequestError("give both --peak-tflops and --peak-bandwidth-gbs, or neither")
        for value, flag in (
            (self.peak_tflops, "--peak-tflops"),
            (self.peak_bandwidth_gbs, "--peak-bandwidth-gbs"),
        ):
            if value is not None and value <= 0:
                raise ProbeRequestError(f"{flag} must be positive")
        resolve_dtype(self.device, self.dtype)


@dataclass(frozen=True)
class LayerMeasurement:
    """Median timings at one token count (one layer, one shard)."""

    tokens: int
    linear_ms: float
    prefill_attention_ms: float
    decode_attention_ms: float | None


def resolve_dtype(device: Device, dtype: str) -> str:
    """``auto`` means bfloat16 on a GPU and float32 on the CPU (where bf16 GEMMs are often emulated)."""
    if dtype == "auto":
        return "bfloat16" if device == "cuda" else "float32"
    if dtype not in DTYPE_BYTES:
        raise ProbeRequestError(f"--dtype {dtype!r} is not supported; use auto, {', '.join(DTYPE_BYTES)}")
    return dtype


def resolve_model_shape(model: str) -> ModelShape:
    """A built-in simulator model profile (``llama-3.1-8b``, a HF id alias) or a ``config.json`` path."""
    return ModelShape.from_model_profile(load_model(model))


def accelerator_for_device_name(name: str, memory_bytes: int) -> str | None:
    """The accelerator profile a CUDA device (``NVIDIA H200``) is: the profile whose ``device_patterns``
    its name matches, of several (the A100's 40 and 80 GB) the one nearest its memory
    (:func:`chunkpilot.api.accelerators.matching_device`)."""
    profile = matching_device(name, memory_bytes)
    return None if profile is None else profile.name


def _linear_points(
    shapes: ShardShapes, measured: Sequence[LayerMeasurement], dtype_bytes: int
) -> list[CostPoint]:
    return [CostPoint(*linear_cost(shapes.linears, m.tokens, dtype_bytes), m.linear_ms) for m in measured]


def assemble_profile(
    *,
    request: ProbeRequest,
    shape: ModelShape,
    accelerator: str,
    device_name: str,
    peaks: Peaks,
    measured: Sequence[LayerMeasurement],
    torch_version: str | None = None,
) -> StepProfile:
    """Fit the measurements and build the profile (pure)."""
    dtype = resolve_dtype(request.device, request.dtype)
    dtype_bytes = DTYPE_BYTES[dtype]
    shapes = shard_shapes(shape, request.tensor_parallel_size)
    ctx = request.context_tokens
    points: list[CurvePoint] = []
    attention_points: list[CostPoint] = []
    for m in sorted(measured, key=lambda item: item.tokens):
        lin_flops, lin_bytes = linear_cost(shapes.linears, m.tokens, dtype_bytes)
        pre_flops, pre_bytes = prefill_attention_cost(shapes.attention, m.tokens, ctx, dtype_bytes)
        attention_points.append(CostPoint(pre_flops, pre_bytes, m.prefill_attention_ms))
        dec_flops: float | None = None
        dec_bytes: float | None = None
        if m.decode_attention_ms is not None and ctx > 0:
            dec_flops, dec_bytes = decode_attention_cost(shapes.attention, m.tokens, ctx, dtype_bytes)
            attention_points.append(CostPoint(dec_flops, dec_bytes, m.decode_attention_ms))
        points.append(
            CurvePoint(
                tokens=m.tokens,
                linear_ms=m.linear_ms,
                linear_flops=lin_flops,
                linear_bytes=lin_bytes,
                prefill_attention_ms=m.prefill_attention_ms,
                prefill_attention_flops=pre_flops,
                prefill_attention_bytes=pre_bytes,
                decode_attention_ms=m.decode_attention_ms if dec_flops is not None else None,
                decode_attention_flops=dec_flops,
                decode_attention_bytes=dec_bytes,
            )
        )
    linear_fit = fit_roofline(
        _linear_points(shapes, measured, dtype_bytes), peaks.flops_per_s, peaks.bandwidth_bytes_per_s
    )
    attention_fit = fit_roofline(attention_points, peaks.flops_per_s, peaks.bandwidth_bytes_per_s)
    draft = StepProfile(
        accelerator=accelerator,
        linear_ms={p.tokens: p.linear_ms * shape.num_layers for p in points},
        efficiency=simulator_efficiency(accelerator, peaks, linear_fit, attention_fit),
        device=request.device,
        device_name=device_name,
        model=request.model,
        model_shape=shape,
        tensor_parallel_size=request.tensor_parallel_size,
        dtype=dtype,
        dtype_bytes=dtype_bytes,
        peaks=peaks,
        settings=ProbeSettings(
            warmup=request.warmup,
            repeats=request.repeats,
            context_tokens=ctx,
            max_decode_sequences=request.max_decode_sequences,
            min_repeat_ms=request.min_repeat_ms,
            threads=request.threads,
        ),
        points=points,
        linear_fit=EfficiencyFit.from_fit(linear_fit),
        attention_fit=EfficiencyFit.from_fit(attention_fit),
        knee_tokens=None,
        itl_target_ms=request.itl_target_ms,
        torch_version=torch_version,
    )
    budget = draft.itl_feasible_budget(request.itl_target_ms) if request.itl_target_ms is not None else None
    return draft.model_copy(
        update={"knee_tokens": draft.compute_knee_tokens(), "itl_feasible_budget_tokens": budget}
    )


def simulator_efficiency(
    accelerator: str, peaks: Peaks, linear_fit: RooflineFit, attention_fit: RooflineFit
) -> dict[str, float]:
    """The fitted efficiencies as overrides of the simulator's constants, relative to its datasheet.

    The simulator multiplies its efficiencies with the accelerator's datasheet peaks,
    so efficiencies fitted against other peaks (measured, given) are rescaled onto
    the datasheet of ``accelerator``; with no datasheet (``cpu``) there is nothing to
    override and the mapping is empty.
    """
    try:
        sheet = load_accelerator(accelerator)
    except SimProfileError:
        return {}
    flops_scale = peaks.flops_per_s / sheet.peak_flops
    bandwidth_scale = peaks.bandwidth_bytes_per_s / sheet.hbm_bytes_per_s
    return {
        "gemm_compute": linear_fit.compute_efficiency * flops_scale,
        "gemm_memory": linear_fit.bandwidth_efficiency * bandwidth_scale,
        "attention_compute": attention_fit.compute_efficiency * flops_scale,
        "attention_memory": attention_fit.bandwidth_efficiency * bandwidth_scale,
    }


def _format_ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g} ms"


def run_probe(request: ProbeRequest, progress: Progress) -> StepProfile:
    """Measure the curve on the requested device and return the fitted profile (needs torch)."""
    request.validate()
    shape = resolve_model_shape(request.model)
    shapes = shard_shapes(shape, request.tensor_parallel_size)
    dtype_name = resolve_dtype(request.device, request.dtype)

    try:
        import torch
        from chunkpilot.engine.probe import bench
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise ProbeRequestError(
            f"the probe needs torch ({exc}); install the extra (pip install 'chunkpilot[probe]'), or for a "
            "CPU run use a cached torch: PYTHONPATH=$(chunkpilot probe torch-env) chunkpilot probe ..."
        ) from exc

    if request.device == "cuda" and not torch.cuda.is_available():
        raise ProbeRequestError(
            "--device cuda: torch sees no CUDA device; run on a GPU node or use --device cpu"
        )
    device = torch.device(request.device)
    if request.threads is not None:
        torch.set_num_threads(request.threads)
    dtype = bench.DTYPES[dtype_name]
    timer = bench.Timer(
        device=device, warmup=request.warmup, repeats=request.repeats, min_repeat_ms=request.min_repeat_ms
    )
    name = bench.device_name(device)

    accelerator = request.accelerator
    if accelerator is None:
        if request.device == "cuda":
            memory = torch.cuda.get_device_properties(device).total_memory
            accelerator = accelerator_for_device_name(name, memory) or re.sub(
                r"[^a-z0-9]+", "-", name.lower()
            )
        else:
            accelerator = "cpu"
    peaks = _resolve_peaks(request, accelerator, timer, dtype, progress)
    progress(
        f"probing {shape.name} (tp={request.tensor_parallel_size}, shard hidden={shape.hidden_size}, "
        f"heads={shapes.attention.num_heads}/{shapes.attention.num_kv_heads} kv, "
        f"intermediate={shape.intermediate_size // request.tensor_parallel_size}) on {name} "
        f"[{accelerator}], {dtype_name}; peaks {peaks.flops_per_s / 1e12:.3g} TFLOP/s, "
        f"{peaks.bandwidth_bytes_per_s / 1e9:.4g} GB/s ({peaks.source.value})"
    )

    layer = bench.LayerBench(shapes, timer, dtype)
    tokens = sorted(set(request.tokens))
    measured: list[LayerMeasurement] = []
    for index, count in enumerate(tokens, start=1):
        try:
            linear_ms = layer.linear_ms(count)
            prefill_ms = layer.prefill_attention_ms(count, request.context_tokens)
            decode_ms = (
                layer.decode_attention_ms(count, request.context_tokens)
                if count <= request.max_decode_sequences and request.context_tokens > 0
                else None
            )
        except torch.OutOfMemoryError as exc:
            raise ProbeRequestError(
                f"out of device memory at {count} tokens; drop the largest values from --tokens "
                "or lower --context-tokens / --max-decode-sequences"
            ) from exc
        measured.append(LayerMeasurement(count, linear_ms, prefill_ms, decode_ms))
        progress(
            f"[{index}/{len(tokens)}] tokens={count}: linear {_format_ms(linear_ms)}/layer, "
            f"prefill attention {_format_ms(prefill_ms)}, decode attention {_format_ms(decode_ms)}"
        )
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if layer.attention_fallback:
        progress("note: grouped-query attention ran with repeated KV heads (no native GQA kernel here)")

    profile = assemble_profile(
        request=request,
        shape=shape,
        accelerator=accelerator,
        device_name=name,
        peaks=peaks,
        measured=measured,
        torch_version=str(torch.__version__),
    )
    fit = profile.linear_fit
    progress(
        f"linear fit: compute efficiency {fit.compute_efficiency:.3f}, bandwidth efficiency "
        f"{fit.bandwidth_efficiency:.3f}, overhead {fit.overhead_ms:.4g} ms, "
        f"rms error {fit.rms_relative_error:.1%}; knee at {profile.knee_tokens} tokens"
    )
    if profile.itl_target_ms is not None:
        progress(
            f"ITL target {profile.itl_target_ms:g} ms: feasible token budget "
            f"{profile.itl_feasible_budget_tokens} (measured parts only)"
        )
    return profile


def _resolve_peaks(
    request: ProbeRequest, accelerator: str, timer: Timer, dtype: torch.dtype, progress: Progress
) -> Peaks:
    if request.peak_tflops is not None and request.peak_bandwidth_gbs is not None:
        return Peaks(
            flops_per_s=request.peak_tflops * 1e12,
            bandwidth_bytes_per_s=request.peak_bandwidth_gbs * 1e9,
            source=PeakSource.GIVEN,
        )
    if request.device == "cuda" and not request.measure_peaks:
        try:
            datasheet = load_accelerator(accelerator)
        except SimProfileError:
            progress(f"no datasheet profile for accelerator {accelerator!r}; measuring peaks instead")
        else:
            return Peaks(
                flops_per_s=datasheet.peak_flops,
                bandwidth_bytes_per_s=datasheet.hbm_bytes_per_s,
                source=PeakSource.DATASHEET,
            )
    from chunkpilot.engine.probe import bench

    cuda = request.device == "cuda"
    size = request.peak_matmul_size or (8192 if cuda else 1024)
    copy_mib = request.peak_copy_mib or (1024 if cuda else 128)
    progress(f"measuring peaks: {size}x{size} GEMM and a {copy_mib} MiB copy")
    flops, bandwidth = bench.measure_peaks(timer, dtype, size, copy_mib * 2**20)
    return Peaks(flops_per_s=flops, bandwidth_bytes_per_s=bandwidth, source=PeakSource.MICROBENCHMARK)
