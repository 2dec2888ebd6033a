"""The generated CRDs: in sync with the model, structural, documented, and the CLI around them."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from chunkpilot.api import commands, crdgen
from chunkpilot.api.docs import render_reference


def _run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="chunkpilot")
    commands.register(parser.add_subparsers())
    args = parser.parse_args(["crds", *argv])
    code: int = args.func(args)
    return code


def _crd(definition: crdgen.ResourceDefinition) -> dict[str, Any]:
    return crdgen.build_crd(definition)


def _nodes(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from _nodes(sub, f"{path}.{name}")
    if "items" in node:
        yield from _nodes(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _nodes(node["additionalProperties"], f"{path}{{}}")


def _schema(definition: crdgen.ResourceDefinition) -> dict[str, Any]:
    schema: dict[str, Any] = _crd(definition)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


DEFINITIONS = pytest.mark.parametrize("definition", crdgen.DEFINITIONS, ids=lambda d: d.kind)


def test_committed_crds_and_reference_match_the_model(repo_root: Path) -> None:
    stale = commands.stale_files(repo_root / "crds", repo_root / "docs/reference/crds.md")
    assert not stale, "run `chunkpilot crds generate && chunkpilot crds docs`:\n" + "\n".join(stale.values())


def test_crds_directory_holds_exactly_the_generated_files(repo_root: Path) -> None:
    assert sorted(p.name for p in (repo_root / "crds").glob("*.yaml")) == sorted(crdgen.rendered_files())


def test_generation_is_deterministic() -> None:
    assert crdgen.rendered_files() == crdgen.rendered_files()
    assert render_reference() == render_reference()


@DEFINITIONS
def test_schema_is_structural(definition: crdgen.ResourceDefinition) -> None:
    for path, node in _nodes(_schema(definition)):
        assert not {"$ref", "$defs", "anyOf", "allOf", "oneOf", "title", "nullable"} & node.keys(), path
        assert "type" in node, f"{path} has no type"
        if node["type"] == "object" and path != ".metadata":
            assert "properties" in node or "additionalProperties" in node, f"{path}: untyped object"
        assert "x-kubernetes-preserve-unknown-fields" not in node, path
        if "exclusiveMinimum" in node:
            assert node["exclusiveMinimum"] is True and "minimum" in node, path


@DEFINITIONS
def test_every_field_has_a_description(definition: crdgen.ResourceDefinition) -> None:
    undocumented = [
        path
        for path, node in _nodes(_schema(definition))
        if path not in ("", ".metadata") and not path.endswith(("[]", "{}")) and not node.get("description")
    ]
    assert not undocumented


@DEFINITIONS
def test_lists_and_strings_checked_by_cel_are_bounded(definition: crdgen.ResourceDefinition) -> None:
    # Unbounded lists and strings make the apiserver's CEL cost estimate exceed its limit.
    for path, node in _nodes(_schema(definition)):
        if path in (".apiVersion", ".kind"):
            continue
        if node["type"] == "array":
            assert "maxItems" in node, f"{path} needs maxItems"
        if node["type"] == "string" and "enum" not in node and "format" not in node:
            assert "maxLength" in node, f"{path} needs maxLength"


def test_defaults_of_nested_objects_are_written_out_in_full() -> None:
    # The apiserver checks a default against its object's CEL rules before nested defaults apply,
    # so `{}` would break rules such as maxNumBatchedTokens >= maxNumSeqs.
    spec = _schema(crdgen.INFERENCE_SERVICE)["properties"]["spec"]["properties"]
    assert spec["engine"]["default"]["maxNumBatchedTokens"] == 8192
    assert spec["engine"]["default"]["maxNumSeqs"] == spec["engine"]["properties"]["maxNumSeqs"]["default"]
    assert spec["autotune"]["default"]["warmup"] == spec["autotune"]["properties"]["warmup"]["default"]
    assert spec["autotune"]["properties"]["abort"]["default"] == spec["autotune"]["default"]["abort"]
    assert spec["engine"]["properties"]["maxNumBatchedTokens"]["default"] == 8192
    assert "default" not in spec["slo"]


def test_quantiles_are_exclusive_bounds() -> None:
    spec = _schema(crdgen.INFERENCE_SERVICE)["properties"]["spec"]
    quantile = spec["properties"]["slo"]["properties"]["itl"]["properties"]["quantile"]
    assert quantile["minimum"] == 0 and quantile["exclusiveMinimum"] is True
    assert quantile["maximum"] == 1 and quantile["exclusiveMaximum"] is True


def test_names_subresources_and_columns() -> None:
    isvc = _crd(crdgen.INFERENCE_SERVICE)
    assert isvc["metadata"]["name"] == "inferenceservices.chunkpilot.io"
    names = isvc["spec"]["names"]
    assert names["shortNames"] == ["cpis"] and "isvc" not in names["shortNames"]
    assert names["categories"] == ["chunkpilot", "all"]
    version = isvc["spec"]["versions"][0]
    assert version["subresources"] == {
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.stableReplicas",
            "labelSelectorPath": ".status.selector",
        },
    }
    columns = [c["name"].upper() for c in version["additionalPrinterColumns"]]
    assert columns == [
        "READY", "BUDGET", "ITL", "TTFT", "SLO", "PHASE", "TRIAL",
        "REPLICAS", "DESIRED", "CAPACITY", "LOAD", "AGE",
    ]  # fmt: skip

    trial = _crd(crdgen.TUNING_TRIAL)
    assert trial["spec"]["names"]["shortNames"] == ["cptrial"]
    columns = [c["name"].upper() for c in trial["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert columns[:6] == ["SERVICE", "PARAMS", "ITL", "TTFT", "VERDICT", "PHASE"]


def test_conditions_are_a_map_keyed_by_type() -> None:
    conditions = _schema(crdgen.INFERENCE_SERVICE)["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert set(conditions["items"]["required"]) >= {"type", "status"}


def test_rendered_yaml_parses_back_to_the_crd() -> None:
    for definition in crdgen.DEFINITIONS:
        text = crdgen.render_crd(definition)
        assert text.startswith("# Generated")
        assert "&id" not in text, "no YAML anchors"
        assert yaml.safe_load(text) == _crd(definition)


# --------------------------------------------------------------------------- CLI


def test_cli_check_reports_stale_files_with_a_diff(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run("generate", "--out", str(tmp_path)) == 0
    assert _run("check", "--dir", str(tmp_path), "--no-docs") == 0
    target = tmp_path / "inferenceservices.chunkpilot.io.yaml"
    target.write_text(target.read_text().replace("default: 8192", "default: 4096"))
    capsys.readouterr()
    assert _run("check", "--dir", str(tmp_path), "--no-docs") == 1
    out = capsys.readouterr()
    assert "-                    default: 4096" in out.out and "+                    default: 8192" in out.out
    assert "chunkpilot crds generate" in out.err


def test_cli_docs_and_check(tmp_path: Path) -> None:
    docs = tmp_path / "crds.md"
    assert _run("generate", "--out", str(tmp_path)) == 0
    assert _run("check", "--dir", str(tmp_path), "--docs", str(docs)) == 1, "missing reference is stale"
    assert _run("docs", "--out", str(docs)) == 0
    assert _run("check", "--dir", str(tmp_path), "--docs", str(docs)) == 0


def test_cli_validate(repo_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    examples = sorted(str(p) for p in (repo_root / "examples").glob("*.yaml"))
    assert _run("validate", *examples) == 0
    invalid = repo_root / "tests/api/invalid/budget-below-max-num-seqs.yaml"
    assert _run("validate", str(invalid)) == 1
    assert (
        "spec.engine.maxNumBatchedTokens: maxNumBatchedTokens must be >= maxNumSeqs"
        in capsys.readouterr().err
    )


def test_reference_documents_every_rule_and_column() -> None:
    text = render_reference()
    for definition in crdgen.DEFINITIONS:
        assert f"## {definition.kind}" in text
        for column in definition.columns:
            assert column.json_path.replace("|", "\\|") in text
    assert "maxNumBatchedTokens must be >= maxNumSeqs" in text
    assert "### `InferenceService.spec.engine.speculative`" in text
