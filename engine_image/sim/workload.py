"""Workloads: request arrivals and lengths from traces or from a synthetic specification."""

from __future__ import annotations

import csv
import math
import random
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from pathlib import Path

from chunkpilot.engine.sim.compiled import picklable
from chunkpilot.engine.sim.kvcache import BLOCK_SIZE

BUNDLED_TRACES = ("azure_conv_2023", "azure_code_2023", "arxiv_summarization_lengths")


class WorkloadError(ValueError):
    """A trace or workload specification could not be used."""


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request of a workload: arrival (seconds from the start), prompt and output lengths."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    block_hashes: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Workload:
    """Requests sorted by arrival."""

    name: str
    requests: tuple[RequestSpec, ...]

    @property
    def lengths(self) -> list[tuple[int, int]]:
        """``(prompt, output)`` pairs in order."""
        return [(r.prompt_tokens, r.output_tokens) for r in self.requests]


def resolve_trace(name_or_path: str) -> Path:
    """A bundled trace by name (``azure_conv_2023``) or a path to a CSV file."""
    stem = name_or_path.removesuffix(".csv")
    if stem in BUNDLED_TRACES:
        with resources.as_file(
            resources.files("chunkpilot.engine.sim.traces").joinpath(f"{stem}.csv")
        ) as path:
            return Path(path)
    path = Path(name_or_path)
    if not path.is_file():
        raise WorkloadError(
            f"--trace {name_or_path}: no such file; bundled traces: {', '.join(BUNDLED_TRACES)}"
        )
    return path


def load_trace(
    name_or_path: str, rate: float | None = None, seed: int = 0, limit: int | None = None
) -> Workload:
    """Read an Azure trace (``TIMESTAMP,ContextTokens,GeneratedTokens``) or a length-only trace.

    Azure timestamps give the arrivals (relative to the first); a length-only trace
    (``num_prefill_tokens,num_decode_tokens,...``) needs ``rate`` for Poisson arrivals. ``rate`` on an
    Azure trace replaces its arrival times by Poisson arrivals at that rate.
    """
    path = resolve_trace(name_or_path)
    with path.open(newline="") as handle:
        reader = csv.reader(handle)
        header = [h.strip() for h in next(reader, [])]
        rows = [row for row in reader if row]
    if limit is not None:
        rows = rows[:limit]
    if header[:3] == ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]:
        lengths = [(max(1, int(r[1])), max(1, int(r[2]))) for r in rows]
        if rate is not None:
            return poisson(lengths, rate, seed, name=path.stem)
        arrivals = _azure_arrivals([r[0] for r in rows])
        specs = sorted(
            (RequestSpec(a, p, o) for a, (p, o) in zip(arrivals, lengths, strict=True)),
            key=lambda s: s.arrival_s,
        )
        return Workload(path.stem, tuple(specs))
    if header[:2] == ["num_prefill_tokens", "num_decode_tokens"]:
        if rate is None:
            raise WorkloadError(
                f"--trace {path}: a length-only trace has no arrival times; give --rate REQ_PER_S"
            )
        return poisson([(max(1, int(r[0])), max(1, int(r[1]))) for r in rows], rate, seed, name=path.stem)
    raise WorkloadError(
        f"--trace {path}: unknown header {header[:3]}; expected TIMESTAMP,ContextTokens,GeneratedTokens "
        "or num_prefill_tokens,num_decode_tokens,..."
    )


def _azure_arrivals(stamps: list[str]) -> list[float]:
    days: dict[str, float] = {}
    seconds: list[float] = []
    for stamp in stamps:
        date, _, clock = stamp.strip().partition(" ")
        base = days.get(date)
        if base is None:
            try:
                base = datetime.strptime(date, "%Y-%m-%d").timestamp()
            except ValueError as exc:
                raise WorkloadError(
                    f"bad TIMESTAMP {stamp!r}: expected 'YYYY-MM-DD HH:MM:SS.fffffff'"
                ) from exc
            days[date] = base
        hh, mm, ss = clock.split(":")
        seconds.append(base + int(hh) * 3600 + int(mm) * 60 + float(ss))
    start = min(seconds) if seconds else 0.0
    return [s - start for s in seconds]


def poisson(lengths: list[tuple[int, int]], rate: float, seed: int = 0, name: str = "poisson") -> Workload:
    """Requests with the given lengths, in order, arriving as a Poisson process of ``rate`` req/s."""
    if not rate > 0:
        raise WorkloadError("--rate must be > 0 requests per second")
    rng = random.Random(seed)
    t = 0.0
    specs: list[RequestSpec] = []
    for prompt, output in lengths:
        specs.append(RequestSpec(t, prompt, output))
        t += rng.expovariate(rate) if math.isfinite(rate) else 0.0
    return Workload(name, tuple(specs))


def prefix_hashes(prompt_tokens: int, shared_tokens: int, group: int, unique: int) -> tuple[int, ...]:
    """Block hashes of a prompt whose first ``shared_tokens`` tokens are common to its ``group``."""
    shared_blocks = min(shared_tokens, prompt_tokens) // BLOCK_SIZE
    total_blocks = prompt_tokens // BLOCK_SIZE
    chain = hash((0x9E3779B9, group))
    hashes: list[int] = []
    for i in range(total_blocks):
        chain = hash((chain, i)) if i < shared_blocks else hash((chain, unique, i))
        hashes.append(chain)
    return tuple(hashes)


def parse_workload_spec(spec: str) -> Workload:
    """Synthetic workload from ``key=value`` pairs separated by commas.

    Keys: ``n`` (requests, default 1000), ``rate`` (Poisson req/s; ``inf`` = all at once; default 4),
    ``prompt`` and ``output`` (tokens: ``N`` or ``A-B`` uniform; defaults 1024 and 128),
    ``prefix`` (tokens of a shared prompt prefix, enabling prefix-cache hits; default 0),
    ``groups`` (distinct shared prefixes, assigned round-robin; default 1), ``seed`` (default 0).
    Example: ``n=500,rate=8,prompt=512-2048,output=64-256,prefix=1024,groups=4``.
    """
    values: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        key, sep, value = part.partition("=")
        if not sep:
            raise WorkloadError(f"--workload {spec!r}: {part!r} is not key=value")
        values[key.strip()] = value.strip()
    known = {"n", "rate", "prompt", "output", "prefix", "groups", "seed"}
    unknown = sorted(set(values) - known)
    if unknown:
        raise WorkloadError(f"--workload: unknown key(s) {unknown}; known keys: {sorted(known)}")
    try:
        n = int(values.get("n", "1000"))
        rate = float(values.get("rate", "4"))
        prefix = int(values.get("prefix", "0"))
        groups = max(1, int(values.get("groups", "1")))
        seed = int(values.get("seed", "0"))
        prompt = _range(values.get("prompt", "1024"), "prompt")
        output = _range(values.get("output", "128"), "output")
    except ValueError as exc:
        raise WorkloadError(f"--workload {spec!r}: {exc}") from exc
    if n < 1:
        raise WorkloadError("--workload: n must be >= 1")
    rng = random.Random(seed)
    lengths = [(rng.randint(*prompt), rng.randint(*output)) for _ in range(n)]
    base = poisson(lengths, rate, seed, name="synthetic")
    if prefix <= 0:
        return base
    specs = tuple(
        RequestSpec(
            r.arrival_s,
            r.prompt_tokens,
            r.output_tokens,
            prefix_hashes(r.prompt_tokens, prefix, i % groups, i),
        )
        for i, r in enumerate(base.requests)
    )
    return Workload("synthetic", specs)


def _range(text: str, name: str) -> tuple[int, int]:
    low, sep, high = text.partition("-")
    lo = int(low)
    hi = int(high) if sep else lo
    if lo < 1 or hi < lo:
        raise ValueError(f"{name} must be N or A-B with 1 <= A <= B")
    return lo, hi


picklable(RequestSpec, Workload)
