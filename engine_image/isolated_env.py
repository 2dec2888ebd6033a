"""Shared machinery of the cached, isolated Python environments (vLLM, SGLang, aiperf).

Each environment is a virtual environment under ``~/.cache/chunkpilot/envs/<folder>``
(``CHUNKPILOT_ENV_CACHE`` overrides the parent folder) with a manifest,
``chunkpilot-env.json``, recording its recipe revision and how it was built. A changed
recipe revision rebuilds it; one builder at a time holds ``<folder>.lock`` and logs every
command to ``<folder>.log``. The modules that use this keep only their recipe.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

MANIFEST_NAME = "chunkpilot-env.json"

#: Builds a fresh environment in ``root`` (logging to ``log``) and returns its manifest.
Build = Callable[[Path, Path], dict[str, object]]
#: Runs under the lock once the environment is ready: ``(root, manifest, log)``.
AfterReady = Callable[[Path, dict[str, object], Path], None]


class IsolatedEnvError(RuntimeError):
    """An isolated environment could not be created."""


@dataclasses.dataclass(frozen=True)
class IsolatedEnv:
    """A ready environment: its folder and interpreter."""

    root: Path

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    def manifest(self) -> dict[str, object]:
        return read_manifest(self.root)

    def pip_install(self, *args: str, quiet: bool = False) -> list[str]:
        """The command that runs ``pip install args`` with this environment's interpreter."""
        return [
            str(self.python),
            "-m",
            "pip",
            "--disable-pip-version-check",
            "install",
            *(["--quiet"] if quiet else []),
            *args,
        ]

    def report(self) -> str:
        """Its folder and manifest as indented JSON (what ``python -m ...env`` prints)."""
        return json.dumps({"path": str(self.root), **self.manifest()}, indent=2)


def cache_root() -> Path:
    """Parent folder of the cached environments."""
    override = os.environ.get("CHUNKPILOT_ENV_CACHE")
    if override:
        return Path(override)
    return Path.home() / ".cache" / "chunkpilot" / "envs"


def folder_size(path: Path) -> int:
    """Bytes of the regular files under ``path`` (symbolic links not followed)."""
    total = 0
    for dirpath, _dirnames, filenames in os.walk(path):
        for name in filenames:
            file = Path(dirpath, name)
            if not file.is_symlink():
                total += file.stat().st_size
    return total


def read_manifest(root: Path) -> dict[str, object]:
    """The manifest of the environment in ``root``; it must exist."""
    data: dict[str, object] = json.loads((root / MANIFEST_NAME).read_text())
    return data


def write_manifest(root: Path, manifest: dict[str, object]) -> None:
    """Record ``manifest`` as the environment's manifest."""
    (root / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2))


def run(argv: Sequence[str], log: Path, error: type[Exception] = IsolatedEnvError) -> str:
    """Run ``argv``, appending the command and its output to ``log``; return its stdout.

    A non-zero exit raises ``error`` naming the command and the log.
    """
    with log.open("a") as handle:
        handle.write(f"$ {' '.join(argv)}\n")
        handle.flush()
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=handle, text=True, check=False)
        handle.write(proc.stdout)
    if proc.returncode != 0:
        raise error(f"command failed ({proc.returncode}): {' '.join(argv)}; see {log}")
    return proc.stdout


def ensure_built(root: Path, recipe: int, build: Build, *, after: AfterReady | None = None) -> None:
    """Make ``root`` a ready environment of recipe revision ``recipe``.

    The environment is reused when its manifest names ``recipe``; otherwise it is removed
    and ``build`` makes it afresh (its manifest gains ``size_bytes``). ``after`` runs once
    it is ready, still under the lock. Concurrent callers wait for the first one's build.
    """
    root.parent.mkdir(parents=True, exist_ok=True)
    with (root.parent / f"{root.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        log = root.parent / f"{root.name}.log"
        manifest: dict[str, object] = {}
        if (root / MANIFEST_NAME).is_file():
            manifest = read_manifest(root)
        if manifest.get("recipe") != recipe:
            if root.exists():
                shutil.rmtree(root)
            log.write_text("")
            manifest = build(root, log)
            manifest["size_bytes"] = folder_size(root)
            write_manifest(root, manifest)
        if after is not None:
            after(root, manifest, log)


def check_supported(name: str, version: str, supported: str, error: type[Exception]) -> None:
    """Raise ``error`` unless ``version`` is the one ``supported`` release of ``name``."""
    if version != supported:
        raise error(f"only {name} {supported} is supported, not {version}")


@dataclasses.dataclass(frozen=True)
class EnvRecipe:
    """One environment: ``name`` at its one ``supported`` release, built by ``build``.

    It lives in ``<name>-<version>`` under :func:`cache_root`; ``revision`` is the recipe
    revision whose change rebuilds it, and ``error`` what a failure raises.
    """

    name: str
    supported: str
    revision: int
    build: Build
    error: type[Exception] = IsolatedEnvError

    def path(self, version: str) -> Path:
        """Folder of the cached environment of ``version``."""
        return cache_root() / f"{self.name}-{version}"

    def ensure(self, version: str, *, after: AfterReady | None = None) -> Path:
        """The folder of the ready environment of ``version``, built first when missing."""
        check_supported(self.name, version, self.supported, self.error)
        root = self.path(version)
        ensure_built(root, self.revision, self.build, after=after)
        return root


@dataclasses.dataclass(frozen=True)
class TorchFirstBuild:
    """How an engine's environment is built around PyPI's torch (a :data:`Build`).

    A fresh virtual environment gets ``torch``, then the engine's distribution without its
    dependencies, then what ``requirements`` lists once the engine's metadata is installed;
    ``smoke_test`` (Python code) must then run. The manifest records the recipe revision, the
    engine's version (under ``manifest_key``), torch's, the requirements and the build time.
    """

    recipe: int
    distribution: str
    version: str
    manifest_key: str
    torch_version: str
    requirements: Callable[[IsolatedEnv, Path], list[str]]
    smoke_test: str
    quiet: bool = False
    error: type[Exception] = IsolatedEnvError

    def __call__(self, root: Path, log: Path) -> dict[str, object]:
        started = time.monotonic()
        run([sys.executable, "-m", "venv", str(root)], log, self.error)
        env = IsolatedEnv(root)
        engine = f"{self.distribution}=={self.version}"
        for step in ([f"torch=={self.torch_version}"], ["--no-deps", engine]):
            run(env.pip_install(*step, quiet=self.quiet), log, self.error)
        reqs = self.requirements(env, log)
        run(env.pip_install(*reqs, quiet=self.quiet), log, self.error)
        run([str(env.python), "-c", self.smoke_test], log, self.error)
        return {
            "recipe": self.recipe,
            self.manifest_key: self.version,
            "torch": self.torch_version,
            "requirements": reqs,
            "build_seconds": round(time.monotonic() - started, 1),
        }

    def env_recipe(self) -> EnvRecipe:
        """The environment this builds: the distribution's folder, at its one supported version."""
        return EnvRecipe(self.distribution, self.version, self.recipe, self, self.error)
