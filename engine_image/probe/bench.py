"""Torch timing of one layer shard's projections and attention (needs the ``probe`` extra).

Every measurement follows the same protocol: warm-up calls, then an inner loop
long enough to dwarf the timer's resolution, bracketed by device
synchronisation, repeated; the reported figure is the median per-call time.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812 (the conventional spelling)
from chunkpilot.engine.probe.roofline import AttentionShape, ShardShapes
from torch.nn.attention.bias import causal_lower_right

__all__ = [
    "DTYPES",
    "LayerBench",
    "Timer",
    "device_name",
    "measure_peaks",
]

DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
}


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_name(device: torch.device) -> str:
    """Human-readable name of the device (the GPU's marketing name, or the CPU model)."""
    if device.type == "cuda":
        return str(torch.cuda.get_device_name(device))
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


@dataclass(frozen=True)
class Timer:
    """Median-of-repeats timing with warm-up and device synchronisation."""

    device: torch.device
    warmup: int = 3
    repeats: int = 7
    min_repeat_ms: float = 2.0  # each repeat runs the call often enough to last at least this long

    def median_ms(self, call: Callable[[], object]) -> float:
        with torch.inference_mode():
            for _ in range(max(1, self.warmup)):
                call()
            _synchronize(self.device)
            start = time.perf_counter()
            call()
            _synchronize(self.device)
            single_ms = (time.perf_counter() - start) * 1000.0
            inner = max(1, min(1000, int(self.min_repeat_ms / max(single_ms, 1e-6))))
            samples: list[float] = []
            for _ in range(self.repeats):
                _synchronize(self.device)
                start = time.perf_counter()
                for _ in range(inner):
                    call()
                _synchronize(self.device)
                samples.append((time.perf_counter() - start) * 1000.0 / inner)
        return statistics.median(samples)


def measure_peaks(timer: Timer, dtype: torch.dtype, matmul_size: int, copy_bytes: int) -> tuple[float, float]:
    """Achievable FLOP/s (a square GEMM) and bytes/s (a device-to-device copy) on ``timer.device``."""
    with torch.inference_mode():
        left = torch.randn(matmul_size, matmul_size, device=timer.device, dtype=dtype)
        right = torch.randn(matmul_size, matmul_size, device=timer.device, dtype=dtype)
        gemm_ms = timer.median_ms(lambda: torch.mm(left, right))
        left = right = torch.empty(0, device=timer.device)  # free the operands before the copy
        elements = max(1, copy_bytes // 4)
        src = torch.empty(elements, device=timer.device, dtype=torch.float32).uniform_()
        dst = torch.empty_like(src)
        copy_ms = timer.median_ms(lambda: dst.copy_(src))
    flops = 2.0 * matmul_size**3 / (gemm_ms / 1000.0)
    bandwidth = 2.0 * elements * 4 / (copy_ms / 1000.0)  # read and write
    return flops, bandwidth


class LayerBench:
    """Holds one layer shard's weights on the device and times its parts at a given token count."""

    def __init__(self, shapes: ShardShapes, timer: Timer, dtype: torch.dtype) -> None:
        self.shapes = shapes
        self.timer = timer
        self.dtype = dtype
        self.device = timer.device
        with torch.inference_mode():
            self.weights = [
                self._randn(lin.out_features, lin.in_features) * 0.02 for lin in self.shapes.linears
            ]
        self.attention_fallback = False  # True once GQA had to be emulated by repeating KV heads

    def _randn(self, *size: int) -> torch.Tensor:
        return torch.randn(*size, device=self.device, dtype=self.dtype)

    def linear_ms(self, tokens: int) -> float:
        """One pass of ``tokens`` tokens through QKV, O, gate/up and down (one layer, one shard)."""
        with torch.inference_mode():
            inputs = [self._randn(tokens, lin.in_features) for lin in self.shapes.linears]
            pairs = list(zip(inputs, self.weights, strict=True))

            def call() -> None:
                for x, w in pairs:
                    F.linear(x, w)

            return self.timer.median_ms(call)

    def prefill_attention_ms(self, tokens: int, context_tokens: int) -> float:
        """Causal attention of a chunk of ``tokens`` queries after ``context_tokens`` cached keys."""
        att = self.shapes.attention
        kv_len = context_tokens + tokens
        with torch.inference_mode():
            q = self._randn(1, att.num_heads, tokens, att.head_dim)
            k = self._randn(1, att.num_kv_heads, kv_len, att.head_dim)
            v = self._randn(1, att.num_kv_heads, kv_len, att.head_dim)
            mask = causal_lower_right(tokens, kv_len)
            return self.timer.median_ms(self._attention_call(att, q, k, v, mask))

    def decode_attention_ms(self, sequences: int, context_tokens: int) -> float:
        """One query per sequence for ``sequences`` sequences against ``context_tokens`` of KV each."""
        att = self.shapes.attention
        with torch.inference_mode():
            q = self._randn(sequences, att.num_heads, 1, att.head_dim)
            k = self._randn(sequences, att.num_kv_heads, context_tokens, att.head_dim)
            v = self._randn(sequences, att.num_kv_heads, context_tokens, att.head_dim)
            return self.timer.median_ms(self._attention_call(att, q, k, v, None))

    def _attention_call(
        self,
        att: AttentionShape,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> Callable[[], object]:
        """The SDPA call to time: native grouped-query attention, or repeated KV heads where unsupported."""
        gqa = att.num_heads != att.num_kv_heads

        def native() -> object:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)

        if not gqa or self.attention_fallback:
            if gqa:
                return self._repeated_kv_call(att, q, k, v, mask)
            return native
        try:
            native()
        except RuntimeError:
            self.attention_fallback = True
            return self._repeated_kv_call(att, q, k, v, mask)
        return native

    @staticmethod
    def _repeated_kv_call(
        att: AttentionShape, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> Callable[[], object]:
        group = att.num_heads // att.num_kv_heads
        k_full = k.repeat_interleave(group, dim=1)
        v_full = v.repeat_interleave(group, dim=1)

        def call() -> object:
            return F.scaled_dot_product_attention(q, k_full, v_full, attn_mask=mask)

        return call
