"""Prefill/decode disaggregation on the twin: which split of the service's replicas meets both SLOs.

When colocated tuning ends ``SLOInfeasible``, the tuner asks the service's twin (the fitted step
profile and the captured workload) what a disaggregated topology would serve: ``P`` prefill
replicas and ``D = replicas - P`` decode replicas (the same GPU count), each pool with its own
knobs, the KV cache shipped between them. The search is small and CPU-bounded:

1. every P:D split with the default pool knobs (:data:`PREFILL_BUDGETS` [0] for prefill, the
   stable config's ``maxNumSeqs`` for decode);
2. at the best split, the prefill pool's budget, then the decode pool's ``maxNumSeqs``
   (coordinate ascent over :data:`PREFILL_BUDGETS` and :data:`DECODE_SEQS`).

Evaluating one layout is a :class:`LayoutEvaluator` (the simulator's disaggregated capacity search
on the twin's profile and workload, :func:`twin_evaluator`; tests pass their own). Everything here
is pure apart from that call and :func:`time.process_time`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol

from chunkpilot.tuner.twin.search import Ranking

__all__ = [
    "DECODE_SEQS",
    "PREFILL_BUDGETS",
    "Layout",
    "LayoutCapacity",
    "LayoutEvaluator",
    "Pool",
    "Recommendation",
    "SLOText",
    "TopologySearch",
    "decode_pool",
    "kv_bytes_per_request",
    "recommendation_message",
    "search_topologies",
    "splits",
]

#: Prefill pool budgets tried (tokens per forward pass; a prefill engine runs no decodes, so its
#: budget trades TTFT under load against activation memory, not ITL). The first is the default.
PREFILL_BUDGETS: Final = (8192, 4096, 16384, 2048)
#: Decode pool ``maxNumSeqs`` tried after the stable config's own (more sequences per step: more
#: throughput per decode replica, longer steps).
DECODE_SEQS: Final = (64, 128, 256, 512)
#: Layouts evaluated at most in one search (the CPU budget usually binds first).
MAX_EVALUATIONS: Final = 24


@dataclass(frozen=True, slots=True, order=True)
class Pool:
    """One pool of a disaggregated topology: its replicas and the knobs that matter for its role."""

    replicas: int
    max_num_batched_tokens: int
    max_num_seqs: int


@dataclass(frozen=True, slots=True, order=True)
class Layout:
    """A disaggregated topology: the prefill pool and the decode pool."""

    prefill: Pool
    decode: Pool

    @property
    def replicas(self) -> int:
        return self.prefill.replicas + self.decode.replicas

    def describe(self) -> str:
        """``1 prefill + 3 decode replicas``."""
        return f"{self.prefill.replicas} prefill + {self.decode.replicas} decode replicas"

    def knobs(self) -> str:
        """The pools' knobs, in the API's names."""
        return (
            f"prefill maxNumBatchedTokens {self.prefill.max_num_batched_tokens}, "
            f"decode maxNumSeqs {self.decode.max_num_seqs}"
        )


@dataclass(frozen=True, slots=True)
class LayoutCapacity:
    """The predicted capacity at SLO of a layout (the whole service, requests/s; 0: no rate meets it).

    ``itl_ms`` / ``ttft_ms``: the SLO quantiles at that rate (or at the lowest rate probed when
    infeasible, NaN when unknown); ``kv_transfer_ms``: the mean KV hop per request.
    """

    layout: Layout
    capacity_req_s: float
    itl_ms: float = math.nan
    ttft_ms: float = math.nan
    kv_transfer_ms: float = math.nan

    @property
    def feasible(self) -> bool:
        return self.capacity_req_s > 0


class LayoutEvaluator(Protocol):
    """Capacity at SLO of one disaggregated layout (the whole service)."""

    def __call__(self, layout: Layout) -> LayoutCapacity: ...


class TopologySearch(Ranking[LayoutCapacity]):
    """Every layout evaluated (best first) and what the search cost."""


def splits(replicas: int) -> list[tuple[int, int]]:
    """Every ``(prefill, decode)`` split of ``replicas`` (at least 2: one replica per pool).

    Decode-heavy splits first: decode holds every running sequence for its whole output, so most
    workloads need more decode than prefill replicas (the order breaks ties in the ranking).
    """
    n = max(2, replicas)
    return [(p, n - p) for p in range(1, n)]


def decode_pool(replicas: int, seqs: int, budget: int) -> Pool:
    """A decode pool of ``seqs`` sequences: its budget is ``budget`` (the stable config's), never below
    its ``maxNumSeqs`` (a decode step schedules one token per running sequence)."""
    return Pool(replicas, max(budget, seqs), seqs)


def starting_layout(
    prefill: int, decode: int, seqs: int, budget: int, prefill_budget: int = PREFILL_BUDGETS[0]
) -> Layout:
    """``prefill`` + ``decode`` replicas with the knobs a layout search starts from: the prefill
    pool at ``prefill_budget`` tokens, both pools at the stable config's ``seqs``, the decode pool
    at its ``budget`` (:func:`decode_pool`)."""
    return Layout(Pool(prefill, prefill_budget, seqs), decode_pool(decode, seqs, budget))


def _key(result: LayoutCapacity, order: Sequence[Layout]) -> tuple[float, float, int]:
    # Most capacity; then the lower ITL quantile (more headroom); then the order evaluated.
    itl = result.itl_ms if math.isfinite(result.itl_ms) else math.inf
    return (-result.capacity_req_s, itl, order.index(result.layout))


def search_topologies(
    evaluate: LayoutEvaluator,
    replicas: int,
    *,
    decode_seqs: int,
    decode_budget: int,
    cpu_budget_s: float = 30.0,
    max_evaluations: int = MAX_EVALUATIONS,
    prefill_budgets: Sequence[int] = PREFILL_BUDGETS,
    decode_seq_choices: Sequence[int] = DECODE_SEQS,
    clock: Callable[[], float] = time.process_time,
) -> TopologySearch:
    """Rank disaggregated layouts of ``replicas`` by predicted capacity at SLO, best first.

    ``decode_seqs`` / ``decode_budget``: the decode pool's default knobs (the stable config's); a
    decode pool's budget never falls below its ``maxNumSeqs``. Stops when ``cpu_budget_s`` (of
    ``clock``) or ``max_evaluations`` is spent; the first split is always evaluated.
    """
    started = clock()
    known: dict[Layout, LayoutCapacity] = {}
    order: list[Layout] = []

    def spent() -> bool:
        return bool(known) and (clock() - started >= cpu_budget_s or len(known) >= max_evaluations)

    def run(layouts: Iterable[Layout]) -> None:
        for layout in layouts:
            if spent():
                return
            if layout in known:
                continue
            order.append(layout)
            known[layout] = evaluate(layout)

    first_budget = prefill_budgets[0] if prefill_budgets else PREFILL_BUDGETS[0]
    run(
        starting_layout(p, d, decode_seqs, decode_budget, first_budget)
        for p, d in sorted(splits(replicas), key=lambda s: (s[0] > s[1], abs(s[0] * 3 - s[1])))
    )
    best = min(known.values(), key=lambda r: _key(r, order)).layout
    run(Layout(Pool(best.prefill.replicas, b, decode_seqs), best.decode) for b in prefill_budgets)
    best = min(known.values(), key=lambda r: _key(r, order)).layout
    run(
        Layout(best.prefill, decode_pool(best.decode.replicas, s, decode_budget))
        for s in sorted(set(decode_seq_choices) | {decode_seqs})
    )
    ranked = tuple(sorted(known.values(), key=lambda r: _key(r, order)))
    return TopologySearch(ranked, len(known), clock() - started)


def kv_bytes_per_request(kv_bytes_per_token: int, mean_prompt_tokens: float) -> float:
    """The KV cache a prefill replica ships per request (bytes).

    ``kv_bytes_per_token`` = layers x 2 x KV heads x head dim x dtype bytes.
    """
    return kv_bytes_per_token * max(0.0, mean_prompt_tokens)


@dataclass(frozen=True, slots=True)
class SLOText:
    """The SLO as the messages state it."""

    itl_quantile: float
    itl_ms: float
    ttft_quantile: float
    ttft_ms: float

    def __str__(self) -> str:
        return (
            f"ITL p{self.itl_quantile * 100:g} ≤ {self.itl_ms:g} ms and "
            f"TTFT p{self.ttft_quantile * 100:g} ≤ {self.ttft_ms:g} ms"
        )


@dataclass(frozen=True, slots=True)
class Recommendation:
    """What the twin says about disaggregating the service.

    ``colocated_req_s``: the best colocated capacity at SLO the twin found for the whole service
    (its replicas x one replica's capacity; 0: no rate meets the SLOs); ``search``: the layouts.
    """

    replicas: int
    colocated_req_s: float
    search: TopologySearch
    kv_bandwidth_gbps: float
    kv_latency_ms: float
    kv_mb_per_request: float
    notes: tuple[str, ...] = field(default=())

    @property
    def best(self) -> LayoutCapacity | None:
        return self.search.best

    @property
    def meets(self) -> bool:
        """Some disaggregated layout meets both SLOs at some rate."""
        return self.best is not None and self.best.feasible

    @property
    def pays(self) -> bool:
        """The best layout serves more within the SLOs than colocated does on the same replicas."""
        return self.best is not None and self.best.capacity_req_s > self.colocated_req_s


def _rate(value: float) -> str:
    return f"{value:.3g} req/s"


def recommendation_message(rec: Recommendation, slo: SLOText) -> str:
    """One paragraph for the ``SLOInfeasible`` condition and its Event."""
    on = f"{rec.replicas} replica" + ("s" if rec.replicas != 1 else "")
    colocated = (
        f"colocated reaches {_rate(rec.colocated_req_s)} on {on}"
        if rec.colocated_req_s > 0
        else f"colocated meets them at no rate on {on}"
    )
    kv = (
        f"KV transfer {rec.kv_mb_per_request:.0f} MB per request at {rec.kv_bandwidth_gbps:g} GB/s "
        f"+ {rec.kv_latency_ms:g} ms"
    )
    split_note = (
        f" (one replica per pool at least: {rec.best.layout.replicas} GPUs where the service has "
        f"{rec.replicas})"
        if rec.best is not None and rec.best.layout.replicas != rec.replicas
        else ""
    )
    best = rec.best
    evaluated = f"{rec.search.evaluations} topologies evaluated on the twin"
    if best is None:
        return f"Disaggregation: nothing evaluated on the twin; {colocated}."
    if not best.feasible:
        return (
            f"Disaggregation would not help: no prefill/decode split of {best.layout.replicas} replicas "
            f"meets {slo} on the twin either ({evaluated}; {kv}); {colocated}."
        )
    head = (
        f"{best.layout.describe()} ({best.layout.knobs()}) meet {slo} up to "
        f"{_rate(best.capacity_req_s)} on the twin{split_note}; {colocated}"
    )
    if rec.pays:
        return f"Disaggregation: {head} ({evaluated}; {kv})."
    return (
        f"Disaggregation does not pay here: {head}, no less ({evaluated}; {kv}); "
        "more replicas help more than a split."
    )
