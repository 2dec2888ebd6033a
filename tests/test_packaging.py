"""The distribution's layout must never shadow the standard library."""

from __future__ import annotations

import importlib
import subprocess
import sys
import sysconfig
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
STDLIB = Path(sysconfig.get_paths()["stdlib"]).resolve()


def _is_stdlib(module_file: str) -> bool:
    return Path(module_file).resolve().is_relative_to(STDLIB)


def test_import_operator_is_stdlib_in_test_process() -> None:
    module = importlib.import_module("operator")
    assert module.__file__ is not None
    assert _is_stdlib(module.__file__), module.__file__
    assert module.add(2, 3) == 5


def test_import_operator_is_stdlib_from_repository_root() -> None:
    for flags in ([], ["-S"]):  # with and without site initialisation
        out = subprocess.run(
            [sys.executable, *flags, "-c", "import operator; print(operator.__file__)"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert _is_stdlib(out), f"python {flags} -c resolved operator to {out}"


def test_operator_folder_is_imported_under_the_namespace() -> None:
    module = importlib.import_module("chunkpilot.operator")
    paths = [Path(p).resolve() for p in module.__path__]
    assert (REPO_ROOT / "operator").resolve() in paths or any(p.name == "operator" for p in paths)
    assert not (REPO_ROOT / "operator" / "__init__.py").exists()


def test_console_command_is_installed() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "chunkpilot.cli", "--version"], capture_output=True, text=True, check=True
    ).stdout
    assert out.startswith("chunkpilot ")
