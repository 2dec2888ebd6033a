"""Request traces for load generation: reading (through the simulator's reader), arrival
synthesis, load scaling and mapping onto wall-clock time.

Two CSV formats are understood, recognised by their header: the Azure LLM inference trace
(``TIMESTAMP,ContextTokens,GeneratedTokens``; arrivals relative to the first row) and length-only
traces (``num_prefill_tokens,num_decode_tokens,...``; Poisson arrivals at a given rate).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from chunkpilot.engine.sim.workload import WorkloadError, load_trace


class TraceError(ValueError):
    """A trace file that cannot be used, with the reason and the fix in the message."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace: arrival time in trace seconds, prompt and output lengths in tokens."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class LengthSample:
    """Prompt and output lengths of one request, before arrival times are assigned."""

    prompt_tokens: int
    output_tokens: int


def read_trace(
    name_or_path: Path | str,
    *,
    rate: float | None = None,
    seed: int = 0,
    limit: int | None = None,
) -> list[TraceRequest]:
    """Read a trace into requests ordered by arrival time (seconds from the first request).

    ``name_or_path`` is a CSV file or the name of a trace bundled with the simulator
    (``azure_conv_2023``, ``azure_code_2023``, ``arxiv_summarization_lengths``). The simulator's
    reader is used, so offline simulations and live load see the same requests: Azure timestamps
    give the arrivals; ``rate`` (requests per second) draws Poisson arrivals instead, and is
    required for length-only traces. ``limit`` keeps the first N requests.
    """
    if rate is not None and rate <= 0:
        raise TraceError(f"rate is {rate}; it must be a positive number of requests per second")
    if limit is not None and limit <= 0:
        raise TraceError(f"limit is {limit}; it must be a positive number of requests")
    try:
        workload = load_trace(str(name_or_path), rate=rate, seed=seed, limit=limit)
    except WorkloadError as error:
        raise TraceError(str(error)) from None
    except (ValueError, IndexError) as error:
        raise TraceError(f"{name_or_path}: malformed row ({error}); check the trace's columns") from None
    except OSError as error:
        raise TraceError(f"cannot read trace {name_or_path}: {error.strerror}") from None
    if not workload.requests:
        raise TraceError(f"{name_or_path}: the trace has no requests")
    return [TraceRequest(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in workload.requests]


def poisson_arrivals(samples: Sequence[LengthSample], rate: float, *, seed: int = 0) -> list[TraceRequest]:
    """Assign Poisson arrivals at ``rate`` requests per second; the first request arrives at 0."""
    if rate <= 0:
        raise TraceError(f"rate is {rate}; it must be a positive number of requests per second")
    rng = random.Random(seed)
    clock = 0.0
    requests: list[TraceRequest] = []
    for position, sample in enumerate(samples):
        if position:
            clock += rng.expovariate(rate)
        requests.append(TraceRequest(clock, sample.prompt_tokens, sample.output_tokens))
    return requests


def read_rate_schedule(path: Path | str) -> list[tuple[float, float]]:
    """A rate schedule: CSV ``t_s,rate`` (trace seconds from 0, requests/s; linear between rows, the
    last row ends it); lines starting with ``#`` are comments. A bad file is named with its row."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as error:
        raise TraceError(f"cannot read the rate schedule {path}: {error.strerror}") from None
    rows = [(n, line.strip()) for n, line in enumerate(lines, 1) if line.strip() and not line.startswith("#")]
    if not rows or [c.strip() for c in rows[0][1].split(",")] != ["t_s", "rate"]:
        raise TraceError(f"{path}: the first row must be the header t_s,rate")
    points: list[tuple[float, float]] = []
    for n, line in rows[1:]:
        try:
            t_s, rate = (float(c) for c in line.split(","))
        except ValueError:
            raise TraceError(f"{path}: row {n}: {line!r} is not two numbers t_s,rate") from None
        if rate < 0 or (points and t_s <= points[-1][0]) or (not points and t_s != 0):
            raise TraceError(
                f"{path}: row {n}: times start at 0 and increase, rates are >= 0 requests/s ({line!r})"
            )
        points.append((t_s, rate))
    if len(points) < 2 or max(rate for _, rate in points) <= 0:
        raise TraceError(f"{path}: a schedule needs two rows or more and a rate above 0 somewhere")
    return points


def scheduled_arrivals(
    requests: Sequence[TraceRequest], schedule: Sequence[tuple[float, float]], *, seed: int = 0
) -> list[TraceRequest]:
    """The requests' lengths, in order and repeated as needed, arriving as a Poisson process whose
    rate follows ``schedule`` (:func:`read_rate_schedule`) until its last row."""
    if not requests:
        raise TraceError("the trace has no requests to schedule")
    rng = random.Random(seed)
    top = max(rate for _, rate in schedule)
    end = schedule[-1][0]
    out: list[TraceRequest] = []
    t, segment = 0.0, 0
    while True:
        t += rng.expovariate(top)
        if t >= end:
            return out
        while schedule[segment + 1][0] < t:
            segment += 1
        (t0, r0), (t1, r1) = schedule[segment], schedule[segment + 1]
        rate = r0 + (r1 - r0) * (t - t0) / (t1 - t0)
        if rng.random() * top < rate:
            sample = requests[len(out) % len(requests)]
            out.append(TraceRequest(t, sample.prompt_tokens, sample.output_tokens))


def mean_rate(requests: Sequence[TraceRequest]) -> float:
    """Mean arrival rate in requests per trace second (``inf`` when all arrive at once)."""
    if len(requests) < 2:
        return float("inf")
    span = requests[-1].arrival_s - requests[0].arrival_s
    return float("inf") if span <= 0 else (len(requests) - 1) / span


def rescale_to_rate(requests: Sequence[TraceRequest], rate: float) -> list[TraceRequest]:
    """Stretch or compress arrival times so the mean rate becomes ``rate`` (burst shape is kept)."""
    if rate <= 0:
        raise TraceError(f"rate is {rate}; it must be a positive number of requests per second")
    native = mean_rate(requests)
    if native == float("inf"):
        return list(requests)
    factor = native / rate
    return [TraceRequest(r.arrival_s * factor, r.prompt_tokens, r.output_tokens) for r in requests]


def scale_load(requests: Sequence[TraceRequest], factor: float) -> list[TraceRequest]:
    """Offer ``factor`` times the trace's load: arrival times divided by ``factor`` (bursts kept)."""
    if factor <= 0:
        raise TraceError(f"load factor is {factor}; it must be positive (1 = the trace as recorded)")
    return [TraceRequest(r.arrival_s / factor, r.prompt_tokens, r.output_tokens) for r in requests]


def iter_wall_schedule(
    requests: Sequence[TraceRequest],
    *,
    time_scale: float = 1.0,
    duration_s: float | None = None,
    max_requests: int | None = None,
    repeat: bool = False,
) -> Iterator[TraceRequest]:
    """Map trace arrivals onto wall-clock offsets, cut to the run's bounds.

    ``time_scale`` X means the engines run X times faster than real hardware, so the trace is
    replayed X times faster to offer them the same load: wall offset = trace arrival / X.
    ``duration_s`` (wall seconds) and ``max_requests`` bound the run; ``repeat`` replays the trace
    again from its start (after one mean inter-arrival gap) until a bound is reached.
    """
    if time_scale <= 0:
        raise TraceError(f"time_scale is {time_scale}; it must be positive (1 = real time)")
    if duration_s is not None and duration_s <= 0:
        raise TraceError(f"duration is {duration_s}; it must be a positive number of seconds")
    if max_requests is not None and max_requests <= 0:
        raise TraceError(f"max_requests is {max_requests}; it must be positive")
    if repeat and duration_s is None and max_requests is None:
        raise TraceError("a repeated trace needs a bound: give a duration or a maximum number of requests")
    if not requests:
        return
    rate = mean_rate(requests)
    gap = 0.0 if rate == float("inf") else 1.0 / rate
    period = requests[-1].arrival_s - requests[0].arrival_s + gap
    emitted = 0
    cycle = 0
    while True:
        shift = cycle * period
        for request in requests:
            offset = (request.arrival_s + shift) / time_scale
            if duration_s is not None and offset >= duration_s:
                return
            yield TraceRequest(offset, request.prompt_tokens, request.output_tokens)
            emitted += 1
            if max_requests is not None and emitted >= max_requests:
                return
        if not repeat or period <= 0:
            return
        cycle += 1


def wall_schedule(
    requests: Sequence[TraceRequest],
    *,
    time_scale: float = 1.0,
    duration_s: float | None = None,
    max_requests: int | None = None,
    repeat: bool = False,
) -> list[TraceRequest]:
    """:func:`iter_wall_schedule` as a list."""
    return list(
        iter_wall_schedule(
            requests, time_scale=time_scale, duration_s=duration_s, max_requests=max_requests, repeat=repeat
        )
    )


def cap_lengths(
    requests: Sequence[TraceRequest], *, max_prompt_tokens: int | None, max_output_tokens: int | None
) -> list[TraceRequest]:
    """Clip prompt and output lengths (for example to fit the served model's context length)."""
    clipped: list[TraceRequest] = []
    for request in requests:
        prompt = (
            request.prompt_tokens
            if max_prompt_tokens is None
            else min(request.prompt_tokens, max_prompt_tokens)
        )
        output = (
            request.output_tokens
            if max_output_tokens is None
            else min(request.output_tokens, max_output_tokens)
        )
        clipped.append(TraceRequest(request.arrival_s, prompt, output))
    return clipped
