"""Building blocks shared by the Chunkpilot custom resources.

Every API model derives from :class:`ApiModel`: snake_case attributes with
camelCase aliases, unknown fields rejected, and cross-field rules declared once
as :class:`CelRule` objects.  Each rule carries its CEL expression (rendered into
the CRD's ``x-kubernetes-validations`` by :mod:`chunkpilot.api.crdgen`) together
with a Python predicate that mirrors it, so a manifest can be rejected without a
cluster and the two checks cannot drift apart unnoticed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

# --------------------------------------------------------------------------- rules


@dataclass(frozen=True)
class CelRule:
    """One ``x-kubernetes-validations`` entry and its Python mirror.

    ``check`` returns True when the object is valid. The apiserver and
    :meth:`InferenceService.from_manifest` report the same static ``message``
    (it names the field and the fix). There is deliberately no
    ``messageExpression``: the apiserver's cost estimator rejects any that
    formats a number with ``string(int)``, so values cannot be interpolated.
    """

    rule: str
    message: str
    check: Callable[[Any], bool]
    field_path: str | None = None
    reason: str = "FieldValueInvalid"

    def violation(self, obj: Any) -> str | None:
        """Return the error message when ``obj`` breaks this rule, else None."""
        if self.check(obj):
            return None
        return self.message

    def to_schema(self) -> dict[str, Any]:
        """Render the rule as a CRD ``x-kubernetes-validations`` item."""
        item: dict[str, Any] = {"rule": self.rule, "message": self.message}
        if self.field_path is not None:
            item["fieldPath"] = self.field_path
            item["reason"] = self.reason
        return item


def _add_cel_rules(schema: dict[str, Any], cls: type[BaseModel]) -> None:
    rules: tuple[CelRule, ...] = getattr(cls, "cel_rules", ())
    if rules:
        schema["x-kubernetes-validations"] = [rule.to_schema() for rule in rules]


class ApiModel(BaseModel):
    """Base of every spec model: camelCase aliases, no unknown fields, CEL mirrors."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        extra="forbid",
        json_schema_extra=_add_cel_rules,
    )

    #: Cross-field rules checked here and rendered into the CRD schema of this object.
    cel_rules: ClassVar[tuple[CelRule, ...]] = ()

    @model_validator(mode="after")
    def _check_cel_rules(self) -> Self:
        failed = [(rule, msg) for rule in self.cel_rules if (msg := rule.violation(self)) is not None]
        if failed:
            paths = {rule.field_path or "" for rule, _ in failed}
            raise PydanticCustomError(
                "cel_rule",
                "{message}",
                {
                    "message": "; ".join(msg for _, msg in failed),
                    "field_path": paths.pop() if len(paths) == 1 else "",
                },
            )
        return self

    def to_k8s(self) -> dict[str, Any]:
        """JSON-ready dict with camelCase keys and unset optional fields left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class StatusModel(ApiModel):
    """Base of status models: tolerant of fields written by newer versions."""

    model_config = ConfigDict(extra="ignore")


# --------------------------------------------------------------------------- durations

DURATION_PATTERN = r"^[0-9]+(s|m|h)$"
_DURATION_RE = re.compile(DURATION_PATTERN)
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600}


def parse_duration(text: str) -> int:
    """Parse a Go-style duration with one unit (``30s``, ``5m``, ``1h``) into seconds.

    Raises ValueError naming the accepted form for anything else, including zero.
    """
    if not isinstance(text, str) or not _DURATION_RE.match(text):
        raise ValueError(f"invalid duration {text!r}: use a whole number followed by s, m or h, e.g. 5m")
    seconds = int(text[:-1]) * _UNIT_SECONDS[text[-1]]
    if seconds <= 0:
        raise ValueError(f"invalid duration {text!r}: must be greater than zero")
    return seconds


def format_duration(seconds: int) -> str:
    """Inverse of :func:`parse_duration` choosing the largest exact unit."""
    if seconds <= 0:
        raise ValueError("duration must be greater than zero")
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def duration_is_valid(text: str) -> bool:
    """True when ``text`` is a positive duration as accepted by :func:`parse_duration`."""
    try:
        parse_duration(text)
    except ValueError:
        return False
    return True


DURATION_MESSAGE = "must be a positive duration: a whole number followed by s, m or h, e.g. 30s, 5m, 1h"


def _check_duration(value: str) -> str:
    if not duration_is_valid(value):
        raise PydanticCustomError("duration", DURATION_MESSAGE)
    return value


#: A positive Go-style duration string with one unit; the CRD checks it with CEL.
Duration = Annotated[
    str,
    Field(
        max_length=16,
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.matches('^[0-9]+(s|m|h)$') && !self.matches('^0+[smh]$')",
                    "message": DURATION_MESSAGE,
                }
            ]
        },
    ),
    AfterValidator(_check_duration),
]


# --------------------------------------------------------------------------- conditions


class ConditionStatus(StrEnum):
    """Kubernetes condition status."""

    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class ConditionType(StrEnum):
    """Condition types set on an InferenceService."""

    READY = "Ready"
    PROGRESSING = "Progressing"
    SLO_MET = "SLOMet"
    TUNING = "Tuning"
    DEGRADED = "Degraded"
    METRICS_UNAVAILABLE = "MetricsUnavailable"
    SLO_INFEASIBLE = "SLOInfeasible"
    TWIN_UNAVAILABLE = "TwinUnavailable"
    TOPOLOGY_CHANGE = "TopologyChange"
    LIVE_ADJUST = "LiveAdjust"


class ConditionOwner(StrEnum):
    """The component that sets a condition: each condition type has exactly one writer."""

    OPERATOR = "operator"
    TUNER = "tuner"


#: Who sets each condition. The operator's status write and the tuner's refuse any other.
CONDITION_OWNERS: Mapping[ConditionType, ConditionOwner] = {
    ConditionType.READY: ConditionOwner.OPERATOR,
    ConditionType.PROGRESSING: ConditionOwner.OPERATOR,
    ConditionType.DEGRADED: ConditionOwner.OPERATOR,
    ConditionType.LIVE_ADJUST: ConditionOwner.OPERATOR,
    ConditionType.SLO_MET: ConditionOwner.TUNER,
    ConditionType.TUNING: ConditionOwner.TUNER,
    ConditionType.METRICS_UNAVAILABLE: ConditionOwner.TUNER,
    ConditionType.SLO_INFEASIBLE: ConditionOwner.TUNER,
    ConditionType.TWIN_UNAVAILABLE: ConditionOwner.TUNER,
    ConditionType.TOPOLOGY_CHANGE: ConditionOwner.TUNER,
}


class Condition(StatusModel):
    """A standard Kubernetes condition (metav1.Condition shape)."""

    type: str = Field(max_length=316, description="Condition type, e.g. Ready, Progressing, SLOMet, Tuning.")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(
        default="Unknown",
        max_length=1024,
        pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
        description="Machine-readable CamelCase reason for the last transition.",
    )
    message: str = Field(default="", max_length=32768, description="Human-readable details.")
    last_transition_time: datetime | None = Field(
        default=None, description="When the status last changed (RFC 3339)."
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation the condition was computed for."
    )


# --------------------------------------------------------------------------- measurements


class Measurement(StatusModel):
    """Latency and load measured over one window (from Prometheus); unset means no data."""

    itl_ms: float | None = Field(default=None, ge=0, description="Inter-token latency at itlQuantile, ms.")
    itl_quantile: float | None = Field(default=None, gt=0, lt=1, description="Quantile of itlMs.")
    ttft_ms: float | None = Field(default=None, ge=0, description="Time to first token at ttftQuantile, ms.")
    ttft_quantile: float | None = Field(default=None, gt=0, lt=1, description="Quantile of ttftMs.")
    throughput_tok_s: float | None = Field(
        default=None, ge=0, description="Generated plus prompt tokens per second."
    )
    goodput_req_s: float | None = Field(
        default=None, ge=0, description="Requests per second meeting both SLOs."
    )
    request_rate: float | None = Field(
        default=None, ge=0, description="Requests completed per second in the window."
    )
    samples: int | None = Field(default=None, ge=0, description="Requests observed in the window.")
    window: str | None = Field(default=None, max_length=16, description="Measurement window, e.g. 5m.")
    time: datetime | None = Field(default=None, description="End of the measurement window (RFC 3339).")


class ObjectMeta(BaseModel):
    """The parts of Kubernetes object metadata Chunkpilot reads; the rest is kept as is."""

    model_config = ConfigDict(alias_generator=to_camel, validate_by_name=True, extra="allow")

    name: str | None = None
    namespace: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    uid: str | None = None
    generation: int | None = None
    resource_version: str | None = None


# --------------------------------------------------------------------------- manifests


class ManifestError(ValueError):
    """A manifest failed validation; ``problems`` holds ``(field path, message)`` pairs."""

    def __init__(self, kind: str, problems: list[tuple[str, str]]) -> None:
        self.kind = kind
        self.problems = problems
        lines = "\n".join(f"  {path}: {message}" for path, message in problems)
        super().__init__(f"invalid {kind}:\n{lines}")


_FRIENDLY_MESSAGES = {
    "missing": "required field is missing",
    "extra_forbidden": "unknown field (check the spelling; fields are camelCase, e.g. maxNumSeqs)",
}


def _format_loc(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path or "<root>"


def problems_from(error: ValidationError) -> list[tuple[str, str]]:
    """Turn a pydantic error into ``(field path, message)`` pairs using manifest (camelCase) paths."""
    problems = []
    for item in error.errors(include_url=False):
        loc = tuple(item["loc"])
        # Errors from a union member carry the member's tag as an extra location part.
        loc = tuple(p for p in loc if not (isinstance(p, str) and p.startswith("function-after[")))
        path = _format_loc(loc)
        ctx = item.get("ctx") or {}
        field_path = ctx.get("field_path") if item["type"] in ("cel_rule", "extra_args") else None
        if field_path:
            path = f"{path}{field_path}" if path != "<root>" else field_path.lstrip(".")
        message = _FRIENDLY_MESSAGES.get(item["type"], item["msg"])
        problems.append((path, message))
    return problems


class Resource(ApiModel):
    """Base of the top-level custom resources (apiVersion, kind, metadata, spec, status)."""

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, Any]) -> Self:
        """Validate a manifest (as loaded from YAML or the API) into the model.

        Raises :class:`ManifestError` listing every problem with its field path,
        e.g. ``spec.engine.maxNumSeqs: Input should be greater than or equal to 1``.
        """
        try:
            return cls.model_validate(manifest)
        except ValidationError as error:
            raise ManifestError(cls.__name__, problems_from(error)) from None

    def to_manifest(self) -> dict[str, Any]:
        """The object as a Kubernetes manifest dict (camelCase, unset fields omitted)."""
        return self.to_k8s()
