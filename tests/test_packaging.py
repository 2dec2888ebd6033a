"""The distribution's layout must never shadow the standard library."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

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


# --------------------------------------------------------------------------- installs into bare venvs

#: What a source checkout needs to build the distribution (no build/, no .venv, no caches).
SOURCES = ("setup.py", "pyproject.toml", "README.md", "LICENSE", "src", "operator", "tuner", "engine_image")


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the sources, so installs write their build/ there and not into the working tree."""
    root = tmp_path_factory.mktemp("checkout")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in SOURCES:
        source = REPO_ROOT / name
        if source.is_dir():
            shutil.copytree(source, root / name, ignore=ignore)
        else:
            shutil.copy2(source, root / name)
    return root


@pytest.fixture(scope="module")
def build_backend(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding only this environment's setuptools, for ``--no-build-isolation`` builds."""
    folder = tmp_path_factory.mktemp("backend")
    distribution = importlib.metadata.distribution("setuptools")
    site = Path(str(distribution.locate_file("")))
    metadata = f"setuptools-{distribution.version}.dist-info"
    for name in ("setuptools", "pkg_resources", "_distutils_hack", metadata):
        if (site / name).exists():
            (folder / name).symlink_to(site / name)
    assert (folder / metadata).exists(), f"no {metadata} in {site}"
    return folder


def bare_venv(path: Path) -> Path:
    """A new virtual environment without pip and without the system's site-packages."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=60)
    python = path / "bin" / "python"
    # Nothing of chunkpilot is visible before the install (so the install is what the checks see).
    probe = subprocess.run([str(python), "-c", "import chunkpilot"], capture_output=True, text=True, cwd="/")
    assert probe.returncode != 0, "chunkpilot is importable in a fresh venv: the checks would prove nothing"
    return python


def pip_install(python: Path, backend: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``pip install --no-deps --no-build-isolation ARGS`` into ``python``'s environment."""
    env = {**os.environ, "PYTHONPATH": str(backend), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("PYTHONSAFEPATH", None)
    argv = [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps"]
    return subprocess.run(
        [*argv, "--no-build-isolation", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


#: Imported from outside the checkout: every mapped folder resolves, ``operator`` stays the stdlib's.
IMPORT_CHECK = """
import json, operator
import chunkpilot.operator.config, chunkpilot.tuner, chunkpilot.engine
print(json.dumps({"operator": operator.__file__, "config": chunkpilot.operator.config.__file__}))
"""


def installed_imports(python: Path) -> dict[str, str]:
    result = subprocess.run(
        [str(python), "-c", IMPORT_CHECK],
        capture_output=True,
        text=True,
        cwd="/",
        env=dependencies_env(),
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    found: dict[str, str] = json.loads(result.stdout)
    return found


def dependencies_env() -> dict[str, str]:
    """An environment whose ``PYTHONPATH`` holds this environment's site-packages (the dependencies).

    Python does not run the ``.pth`` files of ``PYTHONPATH`` folders, so this environment's own
    editable chunkpilot stays invisible: a bare venv finds chunkpilot only through its own install.
    """
    site = sysconfig.get_paths()
    return {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys([site["purelib"], site["platlib"]]))}


def run_command(python: Path) -> subprocess.CompletedProcess[str]:
    """The installed ``chunkpilot --version``, its dependencies from :func:`dependencies_env`."""
    env = dependencies_env()
    command = python.parent / "chunkpilot"
    return subprocess.run(
        [str(command), "--version"],
        capture_output=True,
        text=True,
        cwd="/",
        env=env,
        timeout=120,
        check=False,
    )


@pytest.mark.slow
@pytest.mark.parametrize("editable", [True, False], ids=["pip-install-e", "pip-install"])
def test_pip_install_gives_a_working_command(
    editable: bool, checkout: Path, build_backend: Path, tmp_path: Path
) -> None:
    python = bare_venv(tmp_path / "venv")
    result = pip_install(python, build_backend, *(["-e", "."] if editable else ["."]), cwd=checkout)
    assert result.returncode == 0, result.stdout + result.stderr
    found = installed_imports(python)
    assert _is_stdlib(found["operator"]), found
    config = Path(found["config"])
    if editable:  # a strict editable install links the working files: edits are live
        assert config.resolve() == (checkout / "operator" / "config.py").resolve(), config
    else:
        assert config.is_relative_to(python.parent.parent), config
    command = run_command(python)
    assert command.returncode == 0, command.stderr
    assert command.stdout.startswith("chunkpilot "), command.stdout


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["lenient", "compat"])
def test_editable_modes_that_cannot_map_the_folders_say_what_to_run(
    mode: str, checkout: Path, build_backend: Path, tmp_path: Path
) -> None:
    python = bare_venv(tmp_path / "venv")
    result = pip_install(
        python, build_backend, "-e", ".", "--config-settings", f"editable_mode={mode}", cwd=checkout
    )
    assert result.returncode != 0
    assert "pip install -e ." in result.stderr and "editable_mode=strict" in result.stderr, result.stderr
