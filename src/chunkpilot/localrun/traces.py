"""Request traces for load generation: reading, arrival synthesis and time scaling.

Two CSV formats are understood, recognised by their header:

- Azure LLM inference trace: ``TIMESTAMP,ContextTokens,GeneratedTokens`` with date-time
  timestamps; arrivals are taken relative to the first row.
- Length-only traces (ShareGPT, arXiv summarisation): ``num_prefill_tokens,num_decode_tokens,...``
  without arrival times; arrivals are drawn from a Poisson process at a given rate.
"""

from __future__ import annotations

import csv
import enum
import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
LENGTH_COLUMNS = ("num_prefill_tokens", "num_decode_tokens")


class TraceError(ValueError):
    """A trace file that cannot be used, with the reason and the fix in the message."""


class TraceFormat(enum.Enum):
    """The CSV dialect of a trace file."""

    AZURE = "azure"
    LENGTHS = "lengths"


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


def detect_format(header: Sequence[str], path: Path) -> TraceFormat:
    """Return the format a CSV header announces, or raise naming the expected headers."""
    names = [column.strip() for column in header]
    if all(column in names for column in AZURE_COLUMNS):
        return TraceFormat.AZURE
    if all(column in names for column in LENGTH_COLUMNS):
        return TraceFormat.LENGTHS
    raise TraceError(
        f"{path}: unrecognised trace header {','.join(names)!r}; expected "
        f"{','.join(AZURE_COLUMNS)!r} (Azure) or one starting {','.join(LENGTH_COLUMNS)!r} (length-only)"
    )


def _positive_int(value: str, column: str, path: Path, line: int, *, allow_zero: bool = False) -> int:
    try:
        number = int(float(value))
    except ValueError:
        raise TraceError(f"{path}:{line}: column {column} is {value!r}, not a number") from None
    if number < 0 or (number == 0 and not allow_zero):
        raise TraceError(f"{path}:{line}: column {column} is {number}; it must be a positive token count")
    return number


def _parse_timestamp(value: str, path: Path, line: int) -> float:
    try:
        return datetime.fromisoformat(value.strip()).timestamp()
    except ValueError:
        raise TraceError(
            f"{path}:{line}: TIMESTAMP {value!r} is not a date-time like '2023-11-16 18:15:46.68'"
        ) from None


def read_trace(
    path: Path | str,
    *,
    rate: float | None = None,
    seed: int = 0,
    limit: int | None = None,
) -> list[TraceRequest]:
    """Read a trace file into requests ordered by arrival time (seconds from the first request).

    ``rate`` (requests per second) is required for length-only traces and, when given for an Azure
    trace, rescales its arrival times to that mean rate while keeping their burstiness.
    ``limit`` keeps the first N requests.
    """
    path = Path(path)
    if rate is not None and rate <= 0:
        raise TraceError(f"rate is {rate}; it must be a positive number of requests per second")
    if limit is not None and limit <= 0:
        raise TraceError(f"limit is {limit}; it must be a positive number of requests")
    try:
        handle = path.open(newline="")
    except OSError as error:
        raise TraceError(f"cannot read trace {path}: {error.strerror}") from None
    with handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None:
            raise TraceError(f"{path}: the trace file is empty")
        trace_format = detect_format(header, path)
        index = {name.strip(): position for position, name in enumerate(header)}
        if trace_format is TraceFormat.AZURE:
            requests = _read_azure(reader, index, path, limit)
            if rate is not None:
                requests = rescale_to_rate(requests, rate)
            return requests
        samples = _read_lengths(reader, index, path, limit)
    if rate is None:
        raise TraceError(
            f"{path} is a length-only trace without arrival times: pass a request rate (--rate) "
            "to draw Poisson arrivals"
        )
    return poisson_arrivals(samples, rate, seed=seed)


def _read_azure(
    rows: Iterable[list[str]], index: dict[str, int], path: Path, limit: int | None
) -> list[TraceRequest]:
    parsed: list[tuple[float, int, int]] = []
    for line, row in enumerate(rows, start=2):
        if not row:
            continue
        stamp = _parse_timestamp(row[index["TIMESTAMP"]], path, line)
        prompt = _positive_int(row[index["ContextTokens"]], "ContextTokens", path, line)
        output = _positive_int(row[index["GeneratedTokens"]], "GeneratedTokens", path, line)
        parsed.append((stamp, prompt, output))
        if limit is not None and len(parsed) >= limit:
            break
    if not parsed:
        raise TraceError(f"{path}: the trace has a header but no requests")
    parsed.sort(key=lambda item: item[0])
    start = parsed[0][0]
    return [TraceRequest(stamp - start, prompt, output) for stamp, prompt, output in parsed]


def _read_lengths(
    rows: Iterable[list[str]], index: dict[str, int], path: Path, limit: int | None
) -> list[LengthSample]:
    samples: list[LengthSample] = []
    for line, row in enumerate(rows, start=2):
        if not row:
            continue
        prompt = _positive_int(row[index["num_prefill_tokens"]], "num_prefill_tokens", path, line)
        output = _positive_int(row[index["num_decode_tokens"]], "num_decode_tokens", path, line)
        samples.append(LengthSample(prompt, output))
        if limit is not None and len(samples) >= limit:
            break
    if not samples:
        raise TraceError(f"{path}: the trace has a header but no requests")
    return samples


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
