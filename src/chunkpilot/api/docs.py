"""Render the CRD reference (``docs/reference/crds.md``) from the generated schemas."""

from __future__ import annotations

from typing import Any, Final

from chunkpilot.api.crdgen import DEFINITIONS, ResourceDefinition, build_crd
from chunkpilot.api.knobs import DIALECTS, ENGINE_NAMES, KNOBS, EngineFlag
from chunkpilot.api.names import API_VERSION

HEADER = (
    "<!-- Generated from chunkpilot.api by `chunkpilot crds docs`; do not edit by hand. -->\n\n"
    "# Custom resource reference\n\n"
    f"API group version `{API_VERSION}`. Both resources are namespaced. Fields are camelCase;"
    " unset optional fields are omitted. Rules marked CEL are enforced by the apiserver"
    " (`x-kubernetes-validations`) and, with the same messages, by"
    " `chunkpilot crds validate` and `InferenceService.from_manifest` without a cluster.\n"
)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _type_of(node: dict[str, Any]) -> str:
    kind = str(node.get("type", "any"))
    if kind == "array":
        return f"[]{_type_of(node.get('items', {}))}"
    if kind == "object" and "additionalProperties" in node:
        return f"map[string]{_type_of(node['additionalProperties'])}"
    if "format" in node:
        return f"{kind} ({node['format']})"
    return kind


#: Schema keywords shown as their value in a sentence, in the order they are listed.
_PLAIN_CONSTRAINTS: Final = (
    ("minLength", "length >= {}"),
    ("maxLength", "length <= {}"),
    ("pattern", "matches `{}`"),
    ("maxItems", "at most {} items"),
    ("maxProperties", "at most {} entries"),
)


def _constraints(node: dict[str, Any]) -> str:
    parts = []
    if "enum" in node:
        parts.append("one of " + ", ".join(f"`{value}`" for value in node["enum"]))
    if "minimum" in node:
        parts.append(f"{'>' if node.get('exclusiveMinimum') else '>='} {node['minimum']}")
    if "maximum" in node:
        parts.append(f"{'<' if node.get('exclusiveMaximum') else '<='} {node['maximum']}")
    parts.extend(text.format(node[key]) for key, text in _PLAIN_CONSTRAINTS if key in node)
    if node.get("type") != "object":  # object rules are listed in the object's own section
        parts.extend(f"CEL: {rule['message']}" for rule in node.get("x-kubernetes-validations", []))
    return "; ".join(parts)


def _default(node: dict[str, Any]) -> str:
    if "default" not in node:
        return ""
    value = node["default"]
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if value == {}:
        return "`{}`"
    if value == []:
        return "`[]`"
    return f"`{value}`"


def _object_section(path: str, node: dict[str, Any], lines: list[str]) -> None:
    """Append a table for object ``node`` at ``path``, then sections for its nested objects."""
    lines.append(f"### `{path}`\n")
    if node.get("description"):
        lines.append(f"{node['description']}\n")
    required = set(node.get("required", []))
    lines.append("| Field | Type | Required | Default | Description | Validation |")
    lines.append("|---|---|---|---|---|---|")
    nested: list[tuple[str, dict[str, Any]]] = []
    for name, sub in node.get("properties", {}).items():
        cells = (
            f"`{name}`",
            _type_of(sub),
            "yes" if name in required else "",
            _default(sub),
            sub.get("description", ""),
            _constraints(sub),
        )
        lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
        if sub.get("type") == "object" and "properties" in sub:
            nested.append((f"{path}.{name}", sub))
        items = sub.get("items", {})
        if sub.get("type") == "array" and items.get("type") == "object" and "properties" in items:
            nested.append((f"{path}.{name}[]", items))
    rules = node.get("x-kubernetes-validations", [])
    if rules:
        lines.append("\nCross-field rules (CEL):\n")
        for rule in rules:
            lines.append(f"- `{rule['rule']}`: {rule['message']}")
    lines.append("")
    for sub_path, sub in nested:
        _object_section(sub_path, sub, lines)


def _resource_section(definition: ResourceDefinition, lines: list[str]) -> None:
    crd = build_crd(definition)
    names = crd["spec"]["names"]
    version = crd["spec"]["versions"][0]
    root = version["schema"]["openAPIV3Schema"]
    lines.append(f"## {definition.kind}\n")
    lines.append(f"{root['description']}\n")
    lines.append(f"- CRD: `{definition.name}`; plural `{names['plural']}`")
    lines.append(f"- Short names: {', '.join(f'`{n}`' for n in names['shortNames'])}")
    lines.append(f"- Categories: {', '.join(f'`{c}`' for c in names['categories'])}")
    lines.append("- Subresources: `status`\n")
    lines.append("Columns of `kubectl get`:\n")
    lines.append("| Column | JSONPath | Type |")
    lines.append("|---|---|---|")
    for column in version["additionalPrinterColumns"]:
        lines.append(f"| {column['name'].upper()} | `{_cell(column['jsonPath'])}` | {column['type']} |")
    lines.append("")
    for rule in root.get("x-kubernetes-validations", []):
        lines.append(f"Object rule (CEL): `{rule['rule']}`: {rule['message']}\n")
    for part in ("spec", "status"):
        _object_section(f"{definition.kind}.{part}", root["properties"][part], lines)


def _flag_cell(flag: EngineFlag | None) -> str:
    if flag is None:
        return "refused (UnsupportedKnob)"
    text = f"options file `{flag.flag}`" if flag.yaml else f"`{flag.flag}`"
    if flag.since is not None:
        text += f" (since {flag.since})"
    if flag.until is not None:
        text += f" (until {flag.until}" + (
            "; later: the Chunkpilot scheduler plugin)" if flag.plugin else ")"
        )
    return text


def render_knob_table() -> str:
    """The knob mapping table (``spec.engine`` field -> each engine's setting), from the knob table."""
    header = "| `spec.engine` field | " + " | ".join(ENGINE_NAMES[d] for d in DIALECTS) + " |"
    lines = [header, "|" + " --- |" * (len(DIALECTS) + 1)]
    for row in KNOBS:
        cells = [_flag_cell(row.flags.get(dialect)) for dialect in DIALECTS]
        lines.append(f"| `{row.camel}` | " + " | ".join(_cell(cell) for cell in cells) + " |")
    return "\n".join(lines) + "\n"


def render_reference() -> str:
    """The Markdown CRD reference, exactly as committed in ``docs/reference/crds.md``."""
    lines = [HEADER]
    for definition in DEFINITIONS:
        _resource_section(definition, lines)
    lines += [
        "## Engine knob mapping\n",
        "What each `spec.engine` knob renders per engine kind (the simulator takes vLLM's flags);"
        " a knob set for an engine without a setting is refused with the `UnsupportedKnob` condition.\n",
        render_knob_table(),
    ]
    return "\n".join(lines).rstrip("\n") + "\n"
