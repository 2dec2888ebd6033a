"""Paged KV cache with prefix caching over block hashes (block size 16, LRU eviction).

Blocks are counted, not stored: a request holds ``plain`` blocks (private) and references to
``cached`` blocks (full prompt blocks identified by a chained hash). A cached block whose reference
count drops to zero stays resident and reusable until evicted, least recently freed first, when
plain free blocks run out. Requests without block hashes never enter the prefix cache.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from chunkpilot.engine.sim.compiled import picklable
from chunkpilot.engine.sim.profiles.loader import Accelerator, ModelProfile

BLOCK_SIZE = 16


@dataclass(frozen=True, slots=True)
class KVCapacity:
    """How the accelerator memory divides into weights, activations and KV blocks."""

    total_bytes: int
    weight_bytes: int
    activation_bytes: int
    kv_bytes: int
    num_blocks: int
    block_size: int

    @property
    def num_tokens(self) -> int:
        """Tokens the KV cache can hold."""
        return self.num_blocks * self.block_size


def kv_capacity(
    model: ModelProfile,
    accelerator: Accelerator,
    tensor_parallel_size: int,
    gpu_memory_utilization: float,
    max_num_batched_tokens: int,
    block_size: int = BLOCK_SIZE,
) -> KVCapacity:
    """KV blocks that fit in ``memory x utilisation - weights - activation reserve`` over all ranks.

    The activation reserve per rank is a fixed 1 GiB (CUDA graphs, allocator slack) plus the peak
    activations of a full-budget forward pass: hidden states, the QKV output and the gated MLP
    intermediate of ``max_num_batched_tokens`` tokens.
    """
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise ValueError("--gpu-memory-utilization must be in (0, 1]")
    tp = tensor_parallel_size
    total = int(accelerator.memory_bytes * gpu_memory_utilization) * tp
    per_token_activation = model.dtype_bytes * (
        4 * model.hidden_size + (2 * model.intermediate_size + 3 * model.num_heads * model.head_dim) / tp
    )
    activation = tp * (2**30 + int(max_num_batched_tokens * per_token_activation))
    kv_bytes = total - model.weight_bytes - activation
    per_block = model.kv_bytes_per_token * block_size
    blocks = kv_bytes // per_block if kv_bytes > 0 else 0
    if blocks <= 0:
        raise ValueError(
            f"{model.name} does not fit on {tp} x {accelerator.name} at --gpu-memory-utilization "
            f"{gpu_memory_utilization}: weights {model.weight_bytes / 2**30:.1f} GiB + activations "
            f"{activation / 2**30:.1f} GiB exceed {total / 2**30:.1f} GiB; raise "
            "--tensor-parallel-size or pick a larger accelerator"
        )
    return KVCapacity(total, model.weight_bytes, activation, int(kv_bytes), int(blocks), block_size)


class KVCacheManager:
    """Block accounting for all requests: allocation, prefix hits, release and eviction."""

    def __init__(
        self, num_blocks: int, block_size: int = BLOCK_SIZE, enable_prefix_caching: bool = True
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.free_plain = num_blocks
        self.ref_counts: dict[int, int] = {}
        self.evictable: OrderedDict[int, None] = OrderedDict()
        self.queries = 0
        self.hits = 0

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation may take (plain free ones plus evictable cached ones)."""
        return self.free_plain + len(self.evictable)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by requests (``vllm:kv_cache_usage_perc``)."""
        return 1.0 - self.num_free_blocks / self.num_blocks if self.num_blocks else 0.0

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens."""
        return -(-num_tokens // self.block_size)

    def lookup(self, block_hashes: tuple[int, ...], num_prompt_tokens: int) -> int:
        """Number of leading prompt blocks resident in the cache, capped so one token stays to compute."""
        if not self.enable_prefix_caching or not block_hashes:
            return 0
        limit = min(len(block_hashes), (num_prompt_tokens - 1) // self.block_size)
        hits = 0
        while hits < limit and block_hashes[hits] in self.ref_counts:
            hits += 1
        return hits

    def record_query(self, num_prompt_tokens: int, hit_blocks: int) -> None:
        """Count a prefix-cache query in tokens (``vllm:prefix_cache_queries_total``/``hits_total``)."""
        self.queries += num_prompt_tokens
        self.hits += hit_blocks * self.block_size

    def acquire_cached(self, block_hashes: tuple[int, ...]) -> None:
        """Take references on resident cached blocks (prefix hits)."""
        for h in block_hashes:
            count = self.ref_counts[h]
            if count == 0:
                del self.evictable[h]
            self.ref_counts[h] = count + 1

    def allocate(self, num_blocks: int) -> bool:
        """Take ``num_blocks`` plain blocks, evicting LRU cached blocks when needed; False if impossible."""
        if num_blocks <= 0:
            return True
        if num_blocks > self.free_plain + len(self.evictable):
            return False
        take = min(num_blocks, self.free_plain)
        self.free_plain -= take
        for _ in range(num_blocks - take):
            h, _ = self.evictable.popitem(last=False)
            del self.ref_counts[h]
        return True

    def promote(self, block_hash: int) -> bool:
        """Turn one plain block a request just filled into a cached block with ``block_hash``.

        Returns True when the hash was already resident: the request then shares that block and its
        own plain block is returned to the pool.
        """
        count = self.ref_counts.get(block_hash)
        if count is None:
            self.ref_counts[block_hash] = 1
            return False
        if count == 0:
            del self.evictable[block_hash]
        self.ref_counts[block_hash] = count + 1
        self.free_plain += 1
        return True

    def release(self, plain_blocks: int, cached_hashes: list[int]) -> None:
        """Free a request's blocks; cached ones become evictable, tail blocks first in LRU order."""
        self.free_plain += plain_blocks
        for h in reversed(cached_hashes):
            count = self.ref_counts[h] - 1
            self.ref_counts[h] = count
            if count == 0:
                self.evictable[h] = None

    def check_invariants(self, plain_held: int) -> None:
        """Assert that blocks held by requests plus free and evictable blocks equal the pool size."""
        referenced = sum(1 for c in self.ref_counts.values() if c > 0)
        assert self.free_plain >= 0, "negative free block count"
        assert len(self.evictable) == len(self.ref_counts) - referenced, "evictable set out of sync"
        total = plain_held + referenced + self.free_plain + len(self.evictable)
        assert total == self.num_blocks, f"KV block accounting drifted: {total} != {self.num_blocks}"


picklable(KVCapacity)
