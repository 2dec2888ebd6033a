"""Which requests may prefill in a step under the partial-prefill limits (pure logic).

Requests that have started prefilling hold a *slot* until their prompt is
computed. At most ``max_num_partial_prefills`` slots exist and at most
``max_long_partial_prefills`` of them may hold long prompts, so a short prompt
arriving behind a long document finds a free lane instead of queueing behind it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Generic, TypeVar

from chunkpilot.engine.vllm_plugin.config import PartialPrefillLimits

K = TypeVar("K")


@dataclasses.dataclass(frozen=True)
class PrefillCandidate(Generic[K]):
    """A request that still has prompt tokens to compute."""

    key: K
    prompt_tokens: int
    # True when it already holds a slot (it is RUNNING with a partial prefill).
    started: bool


@dataclasses.dataclass(frozen=True)
class LanePlan(Generic[K]):
    """The step's decision: who may prefill, who waits, and the per-request chunk cap."""

    allowed: frozenset[K]
    held_back: tuple[K, ...]
    num_long: int
    # Per-request prefill tokens this step, or 0 for no cap (a single prefill).
    chunk_cap: int


def plan_lanes(
    candidates: Sequence[PrefillCandidate[K]], limits: PartialPrefillLimits, token_budget: int
) -> LanePlan[K]:
    """Choose the prefills of one step.

    ``candidates`` come in scheduling order: started prefills first (in running
    order), then waiting requests in queue order. Started prefills keep their
    slots first; waiting requests take the free ones, a long prompt only while a
    long slot is free, so later short prompts may pass a long one.
    """
    allowed: list[K] = []
    held_back: list[K] = []
    num_long = 0
    for group in (
        (c for c in candidates if c.started),
        (c for c in candidates if not c.started),
    ):
        for candidate in group:
            long = limits.is_long(candidate.prompt_tokens)
            if len(allowed) >= limits.max_num_partial_prefills or (
                long and num_long >= limits.max_long_partial_prefills
            ):
                held_back.append(candidate.key)
                continue
            allowed.append(candidate.key)
            num_long += long
    # Several prefills share the step's budget; 0 (no cap) when one or none prefills.
    cap = max(1, token_budget // len(allowed)) if len(allowed) > 1 else 0
    return LanePlan(frozenset(allowed), tuple(held_back), num_long, cap)


def reinsert_in_order(
    original: Iterable[K], current: Sequence[K], held: Iterable[K], *, new_first: bool
) -> list[K]:
    """Restore held-back items at their original positions in a queue.

    ``current`` is the queue after a step ran without the held items. Items that
    were not in ``original`` joined during the step: preempted requests are put
    in front of the waiting queue (``new_first``), admitted ones behind the
    running list.
    """
    held_set = set(held)
    current_set = set(current)
    original_list = list(original)
    original_set = set(original_list)
    kept = [item for item in original_list if item in held_set or item in current_set]
    new = [item for item in current if item not in original_set]
    return new + kept if new_first else kept + new
