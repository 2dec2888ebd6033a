"""Rate profiles of ``chunkpilot bench autoscale``: how much traffic arrives when, and of which kind.

A profile is a CSV with the header ``t_s,load[,workload]``: ``load`` is in replicas' worth of the
truth's optimum capacity at SLO on the profile's first workload (so a profile does not depend on the
truth, and a constant ``load`` is a constant request rate even where the workload changes), linear
between rows and held after the last one until ``t_s`` of the last row ends the profile;
``workload`` names a bundled trace (``azure_conv``, ``azure_code``, ``arxiv``) from that time on, the
first row's is required. Lines starting with ``#`` are comments. The shipped profiles live beside
this module (:func:`shipped_profiles`).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from chunkpilot.bench.exhaustive import WORKLOADS

__all__ = [
    "STEP_RISE",
    "RatePoint",
    "RateProfile",
    "RateProfileError",
    "read_rate_profile",
    "shipped_profiles",
]

PROFILES_DIR = Path(__file__).parent / "rate_profiles"
#: A rise of the load by this share of its value within a minute is a step (not a ramp to follow).
STEP_RISE = 0.25


class RateProfileError(ValueError):
    """A rate profile that cannot be read; the message names the file, the row and the fix."""


@dataclass(frozen=True)
class RatePoint:
    t_s: float
    load: float
    workload: str | None = None


@dataclass(frozen=True)
class RateProfile:
    """A piecewise-linear load over time with the workload in force (see the module docstring)."""

    name: str
    points: tuple[RatePoint, ...]

    @property
    def duration_s(self) -> float:
        return self.points[-1].t_s

    @property
    def first_workload(self) -> str:
        first = self.points[0].workload
        assert first is not None
        return first

    @property
    def peak(self) -> float:
        return max(p.load for p in self.points)

    @property
    def workloads(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p.workload for p in self.points if p.workload is not None))

    def load_at(self, t_s: float) -> float:
        times = [p.t_s for p in self.points]
        return float(np.interp(t_s, times, [p.load for p in self.points]))

    def workload_at(self, t_s: float) -> str:
        found = self.first_workload
        for point in self.points:
            if point.t_s > t_s:
                break
            if point.workload is not None:
                found = point.workload
        return found

    def steps(self) -> list[float]:
        """Times the load rises by more than :data:`STEP_RISE` of its value within a minute."""
        found: list[float] = []
        for a, b in zip(self.points, self.points[1:], strict=False):
            if b.load > a.load * (1 + STEP_RISE) and b.t_s - a.t_s <= 60.0:
                found.append(a.t_s)
        return found

    def arrivals(self, unit_req_s: float, seed: int) -> list[tuple[float, str]]:
        """Poisson arrivals at ``load(t) x unit_req_s`` requests/s (by thinning), each with the
        workload in force."""
        rng = np.random.default_rng(seed)
        top = self.peak * unit_req_s
        if top <= 0:
            return []
        count = rng.poisson(top * self.duration_s)
        times = np.sort(rng.uniform(0.0, self.duration_s, count))
        rates = np.interp(times, [p.t_s for p in self.points], [p.load * unit_req_s for p in self.points])
        kept = times[rng.uniform(0.0, top, count) < rates]
        return [(float(t), self.workload_at(float(t))) for t in kept]


def _fail(path: Path, row: int, message: str) -> RateProfileError:
    return RateProfileError(f"{path}: row {row}: {message}")


def read_rate_profile(path: Path) -> RateProfile:
    """The profile in ``path``, or a :class:`RateProfileError` naming the row and the fix."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise RateProfileError(f"cannot read the rate profile {path}: {exc.strerror or exc}") from exc
    lines = [
        (n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip() and not line.startswith("#")
    ]
    if not lines:
        raise RateProfileError(f"{path}: no rows; write a header t_s,load[,workload] and one row per time")
    header_row, header = lines[0]
    columns = [c.strip() for c in next(csv.reader([header]))]
    if columns[:2] != ["t_s", "load"] or columns[2:] not in ([], ["workload"]):
        raise _fail(path, header_row, f"the header is {header!r}; write t_s,load or t_s,load,workload")
    points: list[RatePoint] = []
    for row, line in lines[1:]:
        cells = [c.strip() for c in next(csv.reader([line]))]
        if len(cells) > len(columns) or len(cells) < 2:
            raise _fail(path, row, f"{line!r} has {len(cells)} cells; the header names {len(columns)}")
        try:
            t_s, load = float(cells[0]), float(cells[1])
        except ValueError:
            raise _fail(
                path, row, f"{line!r}: t_s and load must be numbers (seconds, replicas' worth)"
            ) from None
        if not (math.isfinite(t_s) and math.isfinite(load)) or load < 0:
            raise _fail(path, row, f"load {cells[1]} must be a finite number >= 0")
        if points and t_s <= points[-1].t_s:
            raise _fail(path, row, f"t_s {cells[0]} is not after the previous row's {points[-1].t_s:g}")
        if not points and t_s != 0:
            raise _fail(path, row, f"the first row must be at t_s 0, not {cells[0]}")
        workload = cells[2] if len(cells) > 2 and cells[2] else None
        if workload is not None and workload not in WORKLOADS:
            raise _fail(path, row, f"unknown workload {workload!r}; use one of {', '.join(WORKLOADS)}")
        if not points and workload is None:
            raise _fail(path, row, f"the first row must name its workload ({', '.join(WORKLOADS)})")
        points.append(RatePoint(t_s, load, workload))
    if len(points) < 2:
        raise RateProfileError(f"{path}: a profile needs at least two rows (its start and its end)")
    if max(p.load for p in points) <= 0:
        raise RateProfileError(f"{path}: every load is 0; nothing would arrive")
    return RateProfile(path.stem, tuple(points))


def shipped_profiles(names: Sequence[str] = ()) -> dict[str, Path]:
    """The bundled profiles by name (all of them without ``names``)."""
    found = {p.stem: p for p in sorted(PROFILES_DIR.glob("*.csv"))}
    unknown = [n for n in names if n not in found]
    if unknown:
        raise RateProfileError(f"no shipped rate profile {', '.join(unknown)}; shipped: {', '.join(found)}")
    return {n: found[n] for n in names} if names else found
