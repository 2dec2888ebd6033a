"""Create and cache an isolated Python environment with the aiperf benchmark client.

aiperf brings its own pins (transformers, pandas, pyzmq, an older prometheus-client ...) that must
not disturb this project's, so it lives in its own virtual environment under
``~/.cache/chunkpilot/envs/aiperf-<version>`` (``CHUNKPILOT_ENV_CACHE`` overrides the parent
folder, as for the vLLM environment). A manifest records the recipe, the resolved packages and
how long the build took; a changed recipe rebuilds it.

``python -m chunkpilot.engine.sim.aiperf_env`` builds it (about 230 MB of wheels) or reports it.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from chunkpilot.engine import isolated_env

AIPERF_VERSION = "0.13.0"
# Bump when the recipe below changes, so cached environments are rebuilt.
RECIPE_REVISION = 1


class AiperfEnvError(isolated_env.IsolatedEnvError):
    """The aiperf environment could not be created."""


class AiperfEnv(isolated_env.IsolatedEnv):
    """A ready environment: its folder, interpreter and ``aiperf`` entry point."""

    @property
    def aiperf(self) -> Path:
        return self.root / "bin" / "aiperf"


_run = functools.partial(isolated_env.run, error=AiperfEnvError)


def _build(root: Path, log: Path) -> dict[str, object]:
    started = time.monotonic()
    _run([sys.executable, "-m", "venv", str(root)], log)
    env = AiperfEnv(root)
    _run(env.pip_install(f"aiperf=={AIPERF_VERSION}", quiet=True), log)
    _run([str(env.aiperf), "--version"], log)
    frozen = _run([str(env.python), "-m", "pip", "--disable-pip-version-check", "freeze"], log).split()
    return {
        "recipe": RECIPE_REVISION,
        "aiperf": AIPERF_VERSION,
        "packages": frozen,
        "build_seconds": round(time.monotonic() - started, 1),
    }


_RECIPE = isolated_env.EnvRecipe("aiperf", AIPERF_VERSION, RECIPE_REVISION, _build, AiperfEnvError)


def ensure(version: str = AIPERF_VERSION) -> AiperfEnv:
    """Return the cached environment, building it (a minute or two) when missing."""
    return AiperfEnv(_RECIPE.ensure(version))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m chunkpilot.engine.sim.aiperf_env``: build or report the environment."""
    del argv
    try:
        env = ensure()
    except AiperfEnvError as exc:
        print(f"aiperf environment: {exc}", file=sys.stderr)
        return 1
    manifest = env.manifest()
    print(
        json.dumps(
            {
                "path": str(env.root),
                "aiperf": manifest["aiperf"],
                "build_seconds": manifest["build_seconds"],
                "size_bytes": manifest["size_bytes"],
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
