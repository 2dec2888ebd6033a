"""Static validation of the engine image's Dockerfile (no Docker engine needed).

Parses ``engine_image/Dockerfile`` and checks what a build would need: a
pinned upstream vLLM base at a supported version, every copied path present in
the build context (the repository root), every package folder of the
distribution copied, the plugin installed and import-checked, and the
``vllm serve`` entrypoint.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from chunkpilot.engine.vllm_plugin import render

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILE = ROOT / "engine_image" / "Dockerfile"
KNOWN_INSTRUCTIONS = {
    "FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME", "USER",
    "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL",
}  # fmt: skip


@dataclass(frozen=True)
class Instruction:
    line: int
    keyword: str
    value: str


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions with continuation lines joined and comments dropped."""
    instructions: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1])
            continue
        pending.append(stripped)
        joined = " ".join(part.strip() for part in pending)
        keyword, _, value = joined.partition(" ")
        instructions.append(Instruction(start, keyword.upper(), value.strip()))
        pending = []
    assert not pending, f"Dockerfile ends inside a continuation started on line {start}"
    return instructions


@pytest.fixture(scope="module")
def instructions() -> list[Instruction]:
    return parse_dockerfile(DOCKERFILE.read_text())


def _one(instructions: list[Instruction], keyword: str) -> Instruction:
    found = [i for i in instructions if i.keyword == keyword]
    assert len(found) == 1, f"expected one {keyword}, found {len(found)}"
    return found[0]


def test_parser_joins_continuations_and_skips_comments() -> None:
    parsed = parse_dockerfile('# c\nFROM a:1\nRUN x \\\n  # inner\n  && y\nENTRYPOINT ["a"]\n')
    assert [(i.keyword, i.value) for i in parsed] == [
        ("FROM", "a:1"),
        ("RUN", "x && y"),
        ("ENTRYPOINT", '["a"]'),
    ]


def test_only_known_instructions(instructions: list[Instruction]) -> None:
    unknown = [(i.line, i.keyword) for i in instructions if i.keyword not in KNOWN_INSTRUCTIONS]
    assert not unknown


def test_base_is_the_pinned_upstream_vllm_image(instructions: list[Instruction]) -> None:
    assert instructions[0].keyword == "FROM", "the Dockerfile must start with FROM"
    base = _one(instructions, "FROM").value
    match = re.fullmatch(r"vllm/vllm-openai:v(\d+\.\d+\.\d+)", base)
    assert match, (
        f"base {base!r} must be vllm/vllm-openai:v<major.minor.patch> (a pinned release, not latest)"
    )
    assert match.group(1) in render.SUPPORTED_VLLM_VERSIONS, (
        f"base vLLM {match.group(1)} is not in SUPPORTED_VLLM_VERSIONS {render.SUPPORTED_VLLM_VERSIONS}"
    )
    assert render.engine_image(match.group(1)).endswith(f":vllm-v{match.group(1)}")


def test_copied_paths_exist_and_cover_every_package_folder(instructions: list[Instruction]) -> None:
    copied: set[str] = set()
    for instruction in instructions:
        if instruction.keyword not in {"COPY", "ADD"}:
            continue
        assert instruction.keyword == "COPY", f"line {instruction.line}: use COPY, not ADD"
        parts = [p for p in shlex.split(instruction.value) if not p.startswith("--")]
        for source in parts[:-1]:
            assert (ROOT / source).exists(), f"line {instruction.line}: {source} is not in the build context"
            copied.add(source.rstrip("/"))
    setup = ast.parse((ROOT / "setup.py").read_text())
    roots = next(
        ast.literal_eval(node.value)
        for node in ast.walk(setup)
        if isinstance(node, ast.Assign)
        and any(getattr(t, "id", None) == "PACKAGE_ROOTS" for t in node.targets)
    )
    folders = {folder.split("/")[0] for folder in roots.values()}
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    needed = folders | {"pyproject.toml", "setup.py", pyproject["project"]["readme"]}
    assert needed <= copied, f"the build needs {sorted(needed - copied)} copied"


def test_plugin_is_installed_without_dependencies_and_import_checked(instructions: list[Instruction]) -> None:
    runs = " ; ".join(i.value for i in instructions if i.keyword == "RUN")
    assert re.search(r"pip install [^;&]*--no-deps[^;&]* \.(\s|$)", runs), (
        "the project must be pip-installed (--no-deps)"
    )
    assert "vllm.general_plugins" in runs
    for module in ("chunkpilot.engine.vllm_plugin.scheduler", "chunkpilot.engine.vllm_plugin.endpoint"):
        assert module in runs, f"the build must import {module}"


def test_entrypoint_is_vllm_serve(instructions: list[Instruction]) -> None:
    entrypoint = _one(instructions, "ENTRYPOINT").value
    assert json.loads(entrypoint) == ["vllm", "serve"], 'ENTRYPOINT must be the exec form ["vllm", "serve"]'
    assert instructions[-1].keyword in {"ENTRYPOINT", "CMD", "WORKDIR", "USER"}


def test_entry_points_name_the_plugin_objects() -> None:
    groups = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    general = groups["vllm.general_plugins"]
    endpoint = groups["vllm.endpoint_plugins"]
    assert general == {render.GENERAL_PLUGIN: "chunkpilot.engine.vllm_plugin.plugin:register"}
    assert endpoint == {render.ENDPOINT_PLUGIN: "chunkpilot.engine.vllm_plugin.endpoint:LiveAdjustEndpoint"}
    for target in (*general.values(), *endpoint.values()):
        module, _, name = target.partition(":")
        path = ROOT / "engine_image" / Path(*module.split(".")[2:]).with_suffix(".py")
        tree = ast.parse(path.read_text())
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
        assert name in defined, f"{target}: {name} is not defined in {path.relative_to(ROOT)}"
