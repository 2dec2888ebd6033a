"""Create and cache an isolated Python environment in which SGLang's own argument parser runs.

Only what ``sglang.srt.server_args`` needs to import and parse is installed: ``torch`` from
PyPI (no CPU-only wheel index is reachable here, so the CUDA build and its ``nvidia-*``
libraries come along; nothing is run on a GPU), ``sglang`` without its dependencies, then
the few modules its import chain loads, each at the version range SGLang's own metadata
asks for. The environment lives under ``~/.cache/chunkpilot/envs/sglang-<version>``
(``CHUNKPILOT_ENV_CACHE`` overrides the parent folder, as for the vLLM environment); a
manifest records the recipe, the build time and the size, and a changed recipe rebuilds it.

``python -m chunkpilot.engine.sglang.env`` builds it or reports it. The check itself
(:mod:`chunkpilot.engine.sglang.argcheck`) is a standard-library script run by path, so
this project is not installed into the environment.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from chunkpilot.engine.vllm_plugin.env import cache_root, folder_size

SGLANG_VERSION = "0.5.23"
#: The torch the vLLM environment uses (shared wheel cache); the parser does not depend on it.
TORCH_VERSION = "2.13.0"
#: Distributions imported by ``sglang.srt.server_args`` (found by importing it in an empty env).
IMPORT_REQUIREMENTS = (
    "numpy",
    "orjson",
    "psutil",
    "pybase64",
    "requests",
    "msgspec",
    "pillow",
    "starlette",
    "pydantic",
    "pyzmq",
    "tqdm",
    "ipython",
    "aiohttp",
    "packaging",
)
MANIFEST_NAME = "chunkpilot-env.json"
# Bump when the recipe below changes, so cached environments are rebuilt.
RECIPE_REVISION = 1

_PINS = """
import importlib.metadata as md, json, sys
from pip._vendor.packaging.requirements import Requirement
wanted = set(json.loads(sys.argv[1]))
out = {}
for line in md.requires("sglang") or []:
    req = Requirement(line)
    name = req.name.lower()
    if name in wanted and (req.marker is None or req.marker.evaluate({"extra": ""})):
        out[name] = name + str(req.specifier)
print(json.dumps([out.get(name, name) for name in sorted(wanted)]))
"""


class SGLangEnvError(RuntimeError):
    """The SGLang environment could not be created."""


@dataclasses.dataclass(frozen=True)
class SGLangEnv:
    """A ready environment: its folder and interpreter."""

    root: Path

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    def manifest(self) -> dict[str, object]:
        data: dict[str, object] = json.loads((self.root / MANIFEST_NAME).read_text())
        return data


def env_path(version: str = SGLANG_VERSION) -> Path:
    return cache_root() / f"sglang-{version}"


def _run(argv: Sequence[str], log: Path) -> str:
    with log.open("a") as handle:
        handle.write(f"$ {' '.join(argv)}\n")
        handle.flush()
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=handle, text=True, check=False)
        handle.write(proc.stdout)
    if proc.returncode != 0:
        raise SGLangEnvError(f"command failed ({proc.returncode}): {' '.join(argv)}; see {log}")
    return proc.stdout


def _pip(env: SGLangEnv, *args: str) -> list[str]:
    return [str(env.python), "-m", "pip", "--disable-pip-version-check", "install", "--quiet", *args]


def _build(root: Path, log: Path) -> dict[str, object]:
    started = time.monotonic()
    _run([sys.executable, "-m", "venv", str(root)], log)
    env = SGLangEnv(root)
    _run(_pip(env, f"torch=={TORCH_VERSION}"), log)
    _run(_pip(env, "--no-deps", f"sglang=={SGLANG_VERSION}"), log)
    reqs: list[str] = json.loads(_run([str(env.python), "-c", _PINS, json.dumps(IMPORT_REQUIREMENTS)], log))
    _run(_pip(env, *reqs), log)
    _run([str(env.python), "-c", "import sglang.srt.server_args"], log)
    return {
        "recipe": RECIPE_REVISION,
        "sglang": SGLANG_VERSION,
        "torch": TORCH_VERSION,
        "requirements": reqs,
        "build_seconds": round(time.monotonic() - started, 1),
    }


def ensure(version: str = SGLANG_VERSION) -> SGLangEnv:
    """Return the cached environment, building it (minutes, a few GB with torch) when missing."""
    if version != SGLANG_VERSION:
        raise SGLangEnvError(f"only sglang {SGLANG_VERSION} is supported, not {version}")
    cache_root().mkdir(parents=True, exist_ok=True)
    with (cache_root() / f"sglang-{version}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        root = env_path(version)
        manifest_file = root / MANIFEST_NAME
        log = root.parent / f"{root.name}.log"
        manifest: dict[str, object] = {}
        if manifest_file.is_file():
            manifest = json.loads(manifest_file.read_text())
        if manifest.get("recipe") != RECIPE_REVISION:
            if root.exists():
                shutil.rmtree(root)
            log.write_text("")
            manifest = _build(root, log)
            manifest["size_bytes"] = folder_size(root)
            manifest_file.write_text(json.dumps(manifest, indent=2))
        return SGLangEnv(root)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m chunkpilot.engine.sglang.env``: build or report the environment."""
    del argv
    env = ensure()
    print(json.dumps({"path": str(env.root), **env.manifest()}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
