"""Keep the docs true: every command block marked ``runnable`` in README.md and docs/ runs and succeeds.

A block is marked by its info string, e.g. ```` ```sh runnable ````. It runs with ``bash -e -u`` from
the repository root, with this environment's ``chunkpilot`` first on PATH. Blocks that need a GPU or a
cluster are simply not marked.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```(?P<info>[^\n`]*)\n(?P<body>.*?)^```\s*$", re.MULTILINE | re.DOTALL)


def runnable_blocks(path: Path) -> list[tuple[int, str]]:
    """``(line, script)`` of each block in ``path`` whose info string contains ``runnable``."""
    text = path.read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        if "runnable" in match.group("info").split():
            found.append((text.count("\n", 0, match.start()) + 1, match.group("body")))
    return found


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


BLOCKS = [
    pytest.param(script, id=f"{path.relative_to(ROOT)}:{line}")
    for path in doc_files()
    for line, script in runnable_blocks(path)
]


def test_the_docs_mark_runnable_blocks() -> None:
    assert len(BLOCKS) >= 3, "runnable doc blocks went missing"


def test_block_parser_finds_only_marked_blocks(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("```sh\nnot me\n```\n\n```sh runnable\necho hi\n```\n```yaml\nkey: value\n```\n")
    assert runnable_blocks(page) == [(5, "echo hi\n")]


@pytest.mark.parametrize("script", BLOCKS)
def test_runnable_block_succeeds(script: str) -> None:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    result = subprocess.run(
        ["bash", "-e", "-u", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, (
        f"exit {result.returncode}\n{script}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    )
