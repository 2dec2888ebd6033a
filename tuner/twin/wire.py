"""A ranking on the twin as plain JSON: the request a twin Job reads and the result it writes.

The twin's ranking (:func:`chunkpilot.tuner.twin.online.calibrate` with ``rank``) is a pure function
of an :class:`~chunkpilot.tuner.twin.online.Request`, so it can run anywhere the package is
installed. This module is its wire format: :func:`encode_request` / :func:`decode_request` carry the
request, :func:`rank` runs it and returns a :class:`RankingResult`, and :func:`encode_result` /
:func:`decode_result` carry what the operator needs back, which :func:`with_ranking` joins to the
operator's own fit. Both documents are versioned (:data:`API_VERSION`); anything malformed is a
:class:`WireError` that says what is wrong.

Conversion is `cattrs <https://catt.rs>`_'s: it builds the dataclasses through their constructors,
so the simulator's compiled classes load too. The one polymorphic field, the engine's scheduler
config, carries its engine's name.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, Final

import cattrs
from chunkpilot.engine.sim.scheduler import Engine, SchedulerConfig, scheduler_config_class
from chunkpilot.tuner.twin.online import Calibration, Request, calibrate
from chunkpilot.tuner.twin.search import Candidate

__all__ = [
    "API_VERSION",
    "RankingResult",
    "WireError",
    "decode_request",
    "decode_result",
    "encode_request",
    "encode_result",
    "rank",
    "with_ranking",
]

#: The version of both documents; a reader refuses any other.
API_VERSION: Final = "chunkpilot.io/twin-job/v1"
REQUEST_KIND: Final = "RankingRequest"
RESULT_KIND: Final = "RankingResult"


class WireError(ValueError):
    """A document that is not a ranking request or result of this version."""


@dataclass(frozen=True)
class RankingResult:
    """What a ranking adds to the operator's fit (:func:`with_ranking`), for the request's ``key``."""

    key: str
    ranked: tuple[Candidate, ...]
    incumbent: Candidate | None
    evaluations: int
    cpu_seconds: float
    #: Wall-clock seconds the ranking took where it ran.
    wall_seconds: float = 0.0


def _scheduler_fields(config: SchedulerConfig) -> dict[str, Any]:
    return {
        f.name: value.value if isinstance(value := getattr(config, f.name), Enum) else value
        for f in dataclasses.fields(config)
    }


def _scheduler_config(data: Any) -> SchedulerConfig:
    """The engine's scheduler config from its fields. By hand, not by type hints: compiled, the
    simulator's classes keep their fields but not every annotation; an enum field is known by its
    default."""
    if not isinstance(data, dict) or "engine" not in data:
        raise WireError("the engine's scheduler config needs its engine's name ('engine')")
    values = dict(data)
    try:
        cls = scheduler_config_class(Engine(values.pop("engine")))
    except ValueError as error:
        raise WireError(f"unknown engine in the scheduler config: {error}") from error
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise WireError(f"unknown fields of the {cls.engine.value} scheduler config: {', '.join(unknown)}")
    for name, value in values.items():
        default = known[name].default
        if isinstance(default, Enum) and value is not None:
            values[name] = type(default)(value)
    return cls(**values)


def _converter() -> cattrs.Converter:
    converter = cattrs.Converter(forbid_extra_keys=True)
    converter.register_unstructure_hook(
        SchedulerConfig, lambda config: {"engine": config.engine.value, **_scheduler_fields(config)}
    )
    converter.register_structure_hook(SchedulerConfig, lambda data, _: _scheduler_config(data))
    return converter


_CONVERTER: Final = _converter()


def _document(kind: str, body: dict[str, Any]) -> str:
    return json.dumps({"apiVersion": API_VERSION, "kind": kind, **body}, separators=(",", ":"))


def _body(text: str | bytes, kind: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError as error:
        raise WireError(f"not JSON: {error}") from error
    if not isinstance(data, dict):
        raise WireError(f"expected a JSON object of kind {kind}, got {type(data).__name__}")
    if data.get("apiVersion") != API_VERSION or data.get("kind") != kind:
        raise WireError(
            f"expected apiVersion {API_VERSION} kind {kind}, got apiVersion "
            f"{data.get('apiVersion')!r} kind {data.get('kind')!r}"
        )
    return {k: v for k, v in data.items() if k not in ("apiVersion", "kind")}


def _structure(data: Any, cls: Any, what: str) -> Any:
    try:
        return _CONVERTER.structure(data, cls)
    except WireError:
        raise
    except Exception as error:  # cattrs' ClassValidationError and the dataclasses' own checks
        detail = "; ".join(_reasons(error))
        raise WireError(f"invalid {what}: {detail}") from error


def _reasons(error: BaseException) -> list[str]:
    """What is wrong, field by field: our own messages where a hook raised one, else cattrs'."""
    if isinstance(error, WireError):
        return [str(error)]
    if not isinstance(error, cattrs.BaseValidationError):
        return [str(error)]
    own = error.subgroup(lambda e: isinstance(e, WireError))
    return list(_leaves(own)) if own is not None else list(cattrs.transform_error(error))


def _leaves(group: BaseExceptionGroup[BaseException]) -> Iterator[str]:
    for error in group.exceptions:
        if isinstance(error, BaseExceptionGroup):
            yield from _leaves(error)
        else:
            yield str(error)


def encode_request(request: Request) -> str:
    """The request as a ``RankingRequest`` document (its ``directory`` is the writer's; left out)."""
    body = _CONVERTER.unstructure(replace(request, directory=None), Request)
    return _document(REQUEST_KIND, {"request": body})


def decode_request(text: str | bytes) -> Request:
    """The request of a ``RankingRequest`` document; :class:`WireError` when it is not one."""
    body = _body(text, REQUEST_KIND)
    if "request" not in body:
        raise WireError("a RankingRequest needs its 'request'")
    request: Request = _structure(body["request"], Request, "ranking request")
    return request


def encode_result(result: RankingResult) -> str:
    """The result as a ``RankingResult`` document."""
    return _document(RESULT_KIND, {"result": _CONVERTER.unstructure(result, RankingResult)})


def decode_result(text: str | bytes) -> RankingResult:
    """The result of a ``RankingResult`` document; :class:`WireError` when it is not one."""
    body = _body(text, RESULT_KIND)
    if "result" not in body:
        raise WireError("a RankingResult needs its 'result'")
    result: RankingResult = _structure(body["result"], RankingResult, "ranking result")
    return result


def rank(request: Request) -> RankingResult:
    """Fit and rank as the operator would (:func:`~chunkpilot.tuner.twin.online.calibrate`)."""
    started = time.monotonic()
    calibration = calibrate(replace(request, rank=True))
    return RankingResult(
        key=request.key,
        ranked=calibration.ranked,
        incumbent=calibration.incumbent,
        evaluations=calibration.evaluations,
        cpu_seconds=calibration.cpu_seconds,
        wall_seconds=time.monotonic() - started,
    )


def with_ranking(calibration: Calibration, result: RankingResult) -> Calibration:
    """The operator's fit with a ranking made elsewhere; :class:`WireError` for another key's result."""
    if result.key != calibration.key:
        raise WireError(f"the result ranks twin {result.key!r}, not {calibration.key!r}")
    return replace(
        calibration,
        ranked=result.ranked,
        incumbent=result.incumbent,
        evaluations=result.evaluations,
        cpu_seconds=result.cpu_seconds,
    )
