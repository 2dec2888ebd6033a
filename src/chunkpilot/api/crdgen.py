"""Generate the CustomResourceDefinitions in ``crds/`` from the pydantic models.

The pydantic JSON schema is turned into a *structural* OpenAPI v3 schema as the
apiserver requires: references inlined, optional fields made plain (no
``nullable``: a null is pruned like an absent field), exclusive bounds in the
OpenAPI 3.0 boolean form, no titles, defaults of nested objects written out in
full (the apiserver checks a default against the object's CEL rules as it stands,
before the nested fields' own defaults apply). ``x-kubernetes-validations`` come from
the models' :class:`~chunkpilot.api.common.CelRule` declarations.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema, to_jsonable_python

from chunkpilot.api.common import Resource
from chunkpilot.api.inferenceservice import InferenceService, InferenceServiceSpec, InferenceServiceStatus
from chunkpilot.api.names import GROUP, ISVC_PLURAL, TRIAL_PLURAL, VERSION
from chunkpilot.api.tuningtrial import TuningTrial, TuningTrialSpec, TuningTrialStatus

HEADER = "# Generated from chunkpilot.api by `chunkpilot crds generate`; do not edit by hand.\n"


@dataclass(frozen=True)
class PrinterColumn:
    """One ``additionalPrinterColumns`` entry."""

    name: str
    json_path: str
    type: str = "string"
    description: str = ""
    priority: int = 0

    def to_schema(self) -> dict[str, Any]:
        column: dict[str, Any] = {"name": self.name, "type": self.type, "jsonPath": self.json_path}
        if self.description:
            column["description"] = self.description
        if self.priority:
            column["priority"] = self.priority
        return column


@dataclass(frozen=True)
class ResourceDefinition:
    """Everything needed to render one CRD."""

    resource: type[Resource]
    spec: type[BaseModel]
    status: type[BaseModel]
    plural: str
    short_names: tuple[str, ...]
    categories: tuple[str, ...]
    columns: tuple[PrinterColumn, ...]
    #: The ``scale`` subresource's paths (None: none).
    scale: dict[str, str] | None = None

    @property
    def kind(self) -> str:
        return self.resource.__name__

    @property
    def name(self) -> str:
        return f"{self.plural}.{GROUP}"

    @property
    def filename(self) -> str:
        return f"{self.name}.yaml"


_AGE = PrinterColumn("Age", ".metadata.creationTimestamp", "date")

INFERENCE_SERVICE = ResourceDefinition(
    resource=InferenceService,
    spec=InferenceServiceSpec,
    status=InferenceServiceStatus,
    plural=ISVC_PLURAL,
    short_names=("cpis",),
    categories=("chunkpilot", "all"),
    columns=(
        PrinterColumn("Ready", '.status.conditions[?(@.type=="Ready")].status', description="Ready status"),
        PrinterColumn(
            "Budget", ".status.appliedConfig.maxNumBatchedTokens", "integer", "Applied token budget"
        ),
        PrinterColumn("ITL", ".status.summary.itl", description="Measured/target inter-token latency"),
        PrinterColumn("TTFT", ".status.summary.ttft", description="Measured/target time to first token"),
        PrinterColumn("SLO", ".status.summary.slo", description="Met, Violated or Unknown"),
        PrinterColumn("Phase", ".status.phase"),
        PrinterColumn("Trial", ".status.currentTrial", description="Running tuning trial"),
        PrinterColumn("Replicas", ".status.stableReplicas", "integer", "Stable engine pods"),
        PrinterColumn(
            "Desired",
            ".status.scaling.desiredReplicas",
            "integer",
            "Stable replicas the planner asks for (scaling.mode Advise or Auto)",
        ),
        PrinterColumn(
            "Capacity",
            ".status.twin.capacityReqS",
            "number",
            description="Predicted capacity at SLO of the stable config, requests/s per replica (twin)",
        ),
        PrinterColumn(
            "Load", ".status.twin.liveRequestRate", "number", description="Live requests/s per stable replica"
        ),
        _AGE,
    ),
    scale={
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.stableReplicas",
        "labelSelectorPath": ".status.selector",
    },
)

TUNING_TRIAL = ResourceDefinition(
    resource=TuningTrial,
    spec=TuningTrialSpec,
    status=TuningTrialStatus,
    plural=TRIAL_PLURAL,
    short_names=("cptrial",),
    categories=("chunkpilot",),
    columns=(
        PrinterColumn("Service", ".spec.serviceName"),
        PrinterColumn("Params", ".status.paramsSummary", description="Knobs under trial"),
        PrinterColumn("ITL", ".status.summary.itl", description="Canary/target inter-token latency"),
        PrinterColumn("TTFT", ".status.summary.ttft", description="Canary/target time to first token"),
        PrinterColumn("Verdict", ".status.verdict"),
        PrinterColumn("Phase", ".status.phase"),
        PrinterColumn("Objective", ".status.objective", "number", priority=1),
        PrinterColumn(
            "Capacity",
            ".status.twin.capacityReqS",
            "number",
            description="Predicted capacity at SLO, requests/s per replica (twin)",
        ),
        PrinterColumn("TwinErr", ".status.twin.error", "number", description="Twin error on the canary"),
        _AGE,
    ),
)

DEFINITIONS: tuple[ResourceDefinition, ...] = (INFERENCE_SERVICE, TUNING_TRIAL)


# --------------------------------------------------------------------------- schema conversion


class _CrdJsonSchema(GenerateJsonSchema):
    """Pydantic JSON schema with defaults for ``default_factory`` fields."""

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> JsonSchemaValue:
        factory = schema.get("default_factory")
        if factory is None or schema.get("default_factory_takes_data"):
            return super().default_schema(schema)
        value = factory()  # type: ignore[call-arg]  # factories here take no arguments
        inner = self.generate_inner(schema["schema"])
        # A nested object's default is written out in full: the apiserver validates it against the
        # object's CEL rules without first applying the nested fields' defaults.
        if isinstance(value, BaseModel):
            default = value.model_dump(mode="json", by_alias=True, exclude_none=True)
        else:
            default = to_jsonable_python(value)
        return {**inner, "default": default}


_DROP_KEYS = {"title"}


def _structural(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Convert one pydantic JSON schema node into a structural OpenAPI v3 schema node."""
    node = dict(node)
    if "$ref" in node:
        target = defs[node.pop("$ref").rsplit("/", 1)[-1]]
        node = {**target, **node}
    if "allOf" in node and len(node["allOf"]) == 1:
        node = {**node.pop("allOf")[0], **node}
        return _structural(node, defs)
    if "anyOf" in node:
        branches = [b for b in node.pop("anyOf") if b.get("type") != "null"]
        if len(branches) != 1:
            raise ValueError(f"unions are not supported in a structural schema: {branches}")
        node = {**branches[0], **node}
        return _structural(node, defs)

    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP_KEYS:
            continue
        if key == "default" and value is None:
            continue
        if key == "additionalProperties":
            if isinstance(value, dict):
                out[key] = _structural(value, defs)
            continue  # `false` (extra="forbid") is implied: unknown fields are pruned or rejected
        if key == "properties":
            out[key] = {name: _structural(sub, defs) for name, sub in value.items()}
        elif key == "items":
            out[key] = _structural(value, defs)
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key == "x-kubernetes-validations":
            out[key] = [_order_rule(rule) for rule in value]
        elif key == "const":
            out["enum"] = [value]
        else:
            out[key] = value
    return _order(out)


_KEY_ORDER = (
    "description",
    "type",
    "format",
    "enum",
    "default",
    "minimum",
    "exclusiveMinimum",
    "maximum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "maxProperties",
    "required",
    "properties",
    "additionalProperties",
    "items",
)


def _order(node: dict[str, Any]) -> dict[str, Any]:
    """Stable, readable key order (description first, x-kubernetes-* last)."""
    rank = {key: i for i, key in enumerate(_KEY_ORDER)}
    return dict(sorted(node.items(), key=lambda kv: (rank.get(kv[0], len(rank)), kv[0])))


_RULE_KEY_ORDER = ("rule", "message", "messageExpression", "fieldPath", "reason")


def _order_rule(rule: dict[str, Any]) -> dict[str, Any]:
    return {key: rule[key] for key in _RULE_KEY_ORDER if key in rule}


def openapi_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of ``model`` (a spec or status model)."""
    raw = model.model_json_schema(by_alias=True, mode="validation", schema_generator=_CrdJsonSchema)
    defs = raw.pop("$defs", {})
    return _structural(raw, defs)


def _root_schema(definition: ResourceDefinition) -> dict[str, Any]:
    spec = openapi_schema(definition.spec)
    status = openapi_schema(definition.status)
    root: dict[str, Any] = {
        "description": (definition.resource.__doc__ or definition.kind).strip(),
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {
                "description": "APIVersion defines the versioned schema of this representation of an object.",
                "type": "string",
            },
            "kind": {"description": "Kind is the REST resource this object represents.", "type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }
    rules = getattr(definition.resource, "cel_rules", ())
    if rules:
        root["x-kubernetes-validations"] = [rule.to_schema() for rule in rules]
    return root


def build_crd(definition: ResourceDefinition) -> dict[str, Any]:
    """The CustomResourceDefinition (apiextensions.k8s.io/v1) for one resource."""
    kind = definition.kind
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": definition.name,
            "labels": {"app.kubernetes.io/name": "chunkpilot", "app.kubernetes.io/part-of": "chunkpilot"},
        },
        "spec": {
            "group": GROUP,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": definition.plural,
                "singular": kind.lower(),
                "shortNames": list(definition.short_names),
                "categories": list(definition.categories),
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {
                        "status": {},
                        **({"scale": dict(definition.scale)} if definition.scale else {}),
                    },
                    "additionalPrinterColumns": [column.to_schema() for column in definition.columns],
                    "schema": {"openAPIV3Schema": _root_schema(definition)},
                }
            ],
        },
    }


class _Dumper(yaml.SafeDumper):
    """Block-style YAML without anchors; multi-line strings as literal blocks."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str_representer(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str_representer)


def render_crd(definition: ResourceDefinition) -> str:
    """The CRD as YAML text, exactly as committed in ``crds/``."""
    body = yaml.dump(build_crd(definition), Dumper=_Dumper, sort_keys=False, width=110, allow_unicode=True)
    return HEADER + body


def rendered_files() -> dict[str, str]:
    """File name -> content of every generated CRD."""
    return {definition.filename: render_crd(definition) for definition in DEFINITIONS}


def write_crds(out_dir: Path) -> list[Path]:
    """Write every CRD into ``out_dir``; returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for filename, text in rendered_files().items():
        path = out_dir / filename
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
