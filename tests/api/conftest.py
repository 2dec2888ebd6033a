"""API test helpers: the example, valid and invalid manifests, parametrized by argument name.

A test taking ``example_path`` runs once per file in examples/, ``invalid_case`` once per
file in tests/api/invalid/ (each declares the message fragments it expects in
``# expect: FRAGMENT`` header lines), ``valid_path`` once per file in tests/api/valid/.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
INVALID = sorted((Path(__file__).parent / "invalid").glob("*.yaml"))
VALID = sorted((Path(__file__).parent / "valid").glob("*.yaml"))


@dataclass(frozen=True)
class InvalidCase:
    """An invalid manifest and the fragments its error message must contain."""

    path: Path
    manifest: dict[str, Any]
    expects: tuple[str, ...]

    @property
    def id(self) -> str:
        return self.path.stem


def load(path: Path) -> dict[str, Any]:
    document = yaml.safe_load(path.read_text())
    assert isinstance(document, dict), f"{path} is not one YAML mapping"
    return document


def invalid_case(path: Path) -> InvalidCase:
    """Read ``# expect: FRAGMENT`` header lines and the manifest."""
    expects = tuple(
        line.removeprefix("# expect:").strip()
        for line in path.read_text().splitlines()
        if line.startswith("# expect:")
    )
    assert expects, f"{path} declares no '# expect:' fragment"
    return InvalidCase(path, load(path), expects)


INVALID_CASES = [invalid_case(path) for path in INVALID]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "example_path" in metafunc.fixturenames:
        metafunc.parametrize("example_path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
    if "valid_path" in metafunc.fixturenames:
        metafunc.parametrize("valid_path", VALID, ids=[p.stem for p in VALID])
    if "invalid_case" in metafunc.fixturenames:
        metafunc.parametrize("invalid_case", INVALID_CASES, ids=[c.id for c in INVALID_CASES])


@pytest.fixture
def repo_root() -> Path:
    """The repository root."""
    return REPO


@pytest.fixture
def all_invalid_cases() -> list[InvalidCase]:
    """Every invalid manifest."""
    return INVALID_CASES
