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

import functools
import json
from collections.abc import Sequence
from pathlib import Path

from chunkpilot.engine import isolated_env

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


class SGLangEnvError(isolated_env.IsolatedEnvError):
    """The SGLang environment could not be created."""


class SGLangEnv(isolated_env.IsolatedEnv):
    """A ready environment: its folder and interpreter."""


_run = functools.partial(isolated_env.run, error=SGLangEnvError)


def _import_requirements(env: isolated_env.IsolatedEnv, log: Path) -> list[str]:
    """The distributions ``sglang.srt.server_args`` imports, at the ranges SGLang's metadata asks."""
    pins: list[str] = json.loads(_run([str(env.python), "-c", _PINS, json.dumps(IMPORT_REQUIREMENTS)], log))
    return pins


_build = isolated_env.TorchFirstBuild(
    recipe=RECIPE_REVISION,
    distribution="sglang",
    version=SGLANG_VERSION,
    manifest_key="sglang",
    torch_version=TORCH_VERSION,
    requirements=_import_requirements,
    smoke_test="import sglang.srt.server_args",
    quiet=True,
    error=SGLangEnvError,
)
_RECIPE = _build.env_recipe()


def ensure(version: str = SGLANG_VERSION) -> SGLangEnv:
    """Return the cached environment, building it (minutes, a few GB with torch) when missing."""
    return SGLangEnv(_RECIPE.ensure(version))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m chunkpilot.engine.sglang.env``: build or report the environment."""
    del argv
    print(ensure().report())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
