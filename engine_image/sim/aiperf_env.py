"""Create and cache an isolated Python environment with the aiperf benchmark client.

aiperf brings its own pins (transformers, pandas, pyzmq, an older prometheus-client ...) that must
not disturb this project's, so it lives in its own virtual environment under
``~/.cache/chunkpilot/envs/aiperf-<version>`` (``CHUNKPILOT_ENV_CACHE`` overrides the parent
folder, as for the vLLM environment). A manifest records the recipe, the resolved packages and
how long the build took; a changed recipe rebuilds it.

``python -m chunkpilot.engine.sim.aiperf_env`` builds it (about 230 MB of wheels) or reports it.
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

AIPERF_VERSION = "0.13.0"
MANIFEST_NAME = "chunkpilot-env.json"
# Bump when the recipe below changes, so cached environments are rebuilt.
RECIPE_REVISION = 1


class AiperfEnvError(RuntimeError):
    """The aiperf environment could not be created."""


@dataclasses.dataclass(frozen=True)
class AiperfEnv:
    """A ready environment: its folder, interpreter and ``aiperf`` entry point."""

    root: Path

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def aiperf(self) -> Path:
        return self.root / "bin" / "aiperf"

    def manifest(self) -> dict[str, object]:
        data: dict[str, object] = json.loads((self.root / MANIFEST_NAME).read_text())
        return data


def env_path(version: str = AIPERF_VERSION) -> Path:
    """Folder of the cached environment."""
    return cache_root() / f"aiperf-{version}"


def _run(argv: Sequence[str], log: Path) -> str:
    with log.open("a") as handle:
        handle.write(f"$ {' '.join(argv)}\n")
        handle.flush()
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=handle, text=True, check=False)
        handle.write(proc.stdout)
    if proc.returncode != 0:
        raise AiperfEnvError(f"command failed ({proc.returncode}): {' '.join(argv)}; see {log}")
    return proc.stdout


def _build(root: Path, log: Path) -> dict[str, object]:
    started = time.monotonic()
    _run([sys.executable, "-m", "venv", str(root)], log)
    env = AiperfEnv(root)
    pip = [str(env.python), "-m", "pip", "--disable-pip-version-check"]
    _run([*pip, "install", "--quiet", f"aiperf=={AIPERF_VERSION}"], log)
    _run([str(env.aiperf), "--version"], log)
    frozen = _run([*pip, "freeze"], log).split()
    return {
        "recipe": RECIPE_REVISION,
        "aiperf": AIPERF_VERSION,
        "packages": frozen,
        "build_seconds": round(time.monotonic() - started, 1),
    }


def ensure(version: str = AIPERF_VERSION) -> AiperfEnv:
    """Return the cached environment, building it (a minute or two) when missing."""
    if version != AIPERF_VERSION:
        raise AiperfEnvError(f"only aiperf {AIPERF_VERSION} is supported, not {version}")
    cache_root().mkdir(parents=True, exist_ok=True)
    # One builder at a time: concurrent test sessions wait for the first one's build.
    with (cache_root() / f"aiperf-{version}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        root = env_path(version)
        manifest_file = root / MANIFEST_NAME
        manifest: dict[str, object] = {}
        if manifest_file.is_file():
            manifest = json.loads(manifest_file.read_text())
        if manifest.get("recipe") != RECIPE_REVISION:
            if root.exists():
                shutil.rmtree(root)
            log = root.parent / f"{root.name}.log"
            log.write_text("")
            manifest = _build(root, log)
            manifest["size_bytes"] = folder_size(root)
            manifest_file.write_text(json.dumps(manifest, indent=2))
        return AiperfEnv(root)


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
