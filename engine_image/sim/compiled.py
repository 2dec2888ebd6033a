"""The simulator's compiled core: its hot modules built with mypyc, used when built from these sources.

The scheduler loops, the KV-cache accounting, the step-time model and the offline and disaggregated
drivers are plain, strictly typed Python. ``chunkpilot sim build-core`` compiles them with mypyc into
``~/.cache/chunkpilot/sim-core/<key>/``, where ``<key>`` digests every source file of the simulator and
the interpreter's ABI. On import the package puts a build of its key in front of its own folder, so the
compiled modules load instead of the Python ones; an edited source changes the key and the package
falls back to Python until the core is rebuilt. Both give the same answers bit for bit
(``tests/engine/sim/test_core_reference.py`` runs each).

``CHUNKPILOT_SIM_CORE`` picks the core: ``auto`` (the default: compiled when built, else Python),
``python``, or ``compiled`` (an ImportError saying how to build it when there is none).
"""

from __future__ import annotations

import copyreg
import dataclasses
import hashlib
import importlib.machinery
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, MutableSequence
from pathlib import Path
from typing import Any

#: The modules compiled, in the simulator package: everything a simulated step runs through.
COMPILED_MODULES = (
    "kvcache",
    "steptime",
    "scheduler",
    "sglang_scheduler",
    "trtllm_scheduler",
    "engine",
    "offline",
    "disagg",
    "workload",
)
MODE_ENV = "CHUNKPILOT_SIM_CORE"
CACHE_ENV = "CHUNKPILOT_SIM_CORE_CACHE"
MODES = ("auto", "python", "compiled")
#: Written last into a finished build: a folder without it is ignored.
MARKER = "build.json"
PACKAGE = "chunkpilot.engine.sim"


class BuildError(RuntimeError):
    """The compiled core could not be built; the message says why and what to do."""


def cache_root() -> Path:
    """Where builds live: ``$CHUNKPILOT_SIM_CORE_CACHE`` or ``~/.cache/chunkpilot/sim-core``."""
    override = os.environ.get(CACHE_ENV)
    return Path(override) if override else Path.home() / ".cache" / "chunkpilot" / "sim-core"


def sources_key(package_dir: Path | None = None) -> str:
    """Digest of the simulator's Python sources and the interpreter's extension ABI."""
    root = package_dir or Path(__file__).parent
    digest = hashlib.sha256(importlib.machinery.EXTENSION_SUFFIXES[0].encode())
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:20]


def build_dir(key: str | None = None) -> Path:
    """The build folder for ``key`` (the current sources' by default)."""
    return cache_root() / (key or sources_key())


def _module_dir(build: Path) -> Path:
    return build.joinpath(*PACKAGE.split("."))


def mode() -> str:
    """The core asked for through ``CHUNKPILOT_SIM_CORE``."""
    chosen = os.environ.get(MODE_ENV, "auto") or "auto"
    if chosen not in MODES:
        raise ImportError(f"{MODE_ENV}={chosen!r}: use one of {', '.join(MODES)}")
    return chosen


def activate(package_path: MutableSequence[str]) -> Path | None:
    """Put the matching build in front of ``package_path`` (the package's ``__path__``); its folder,
    or None when the Python modules are used."""
    chosen = mode()
    if chosen == "python":
        return None
    build = build_dir()
    if not (build / MARKER).is_file():
        if chosen == "compiled":
            raise ImportError(
                f"{MODE_ENV}=compiled but no compiled core is built for these sources "
                f"(looked in {build}): run `chunkpilot sim build-core`, or unset {MODE_ENV}"
            )
        return None
    if str(build) not in sys.path:
        sys.path.append(str(build))  # mypyc's shared library is a top-level module
    package_path.insert(0, str(_module_dir(build)))
    return build


def picklable(*classes: type) -> None:
    """Let these frozen dataclasses cross process boundaries when compiled: mypyc's classes unpickle by
    assigning their fields, which a frozen class refuses, so each is rebuilt from its fields instead."""
    for cls in classes:
        copyreg.pickle(cls, _by_fields)


def _by_fields(instance: Any) -> tuple[type, tuple[Any, ...]]:
    return type(instance), tuple(getattr(instance, f.name) for f in dataclasses.fields(instance))


def core_in_use() -> str:
    """``compiled`` when the scheduler module loads from a build, else ``python``."""
    spec = importlib.util.find_spec(f"{PACKAGE}.scheduler")
    origin = (spec.origin if spec is not None else None) or ""
    return "compiled" if origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)) else "python"


def build(echo: Callable[[str], None] = print, force: bool = False) -> Path:
    """Compile :data:`COMPILED_MODULES` with mypyc into the build folder of the current sources.

    Raises :class:`BuildError` when mypyc or a C compiler is missing or compilation fails; nothing is
    left half-written (the build is assembled aside and moved into place last).
    """
    key = sources_key()
    target = build_dir(key)
    if (target / MARKER).is_file() and not force:
        echo(f"compiled simulator core already built: {target}")
        return target
    if shutil.which(os.environ.get("CC", "cc")) is None:
        raise BuildError("no C compiler (cc) on PATH: install gcc, or keep the pure-Python core")
    try:
        import mypyc  # noqa: F401  (mypyc ships with mypy)
    except ImportError as exc:
        raise BuildError(
            "mypyc is not installed: pip install 'chunkpilot[native]' (it ships with mypy)"
        ) from exc
    started = time.monotonic()
    echo(f"compiling {len(COMPILED_MODULES)} simulator modules with mypyc (about a minute on 2 cores) ...")
    with tempfile.TemporaryDirectory(prefix="chunkpilot-sim-core-") as tmp:
        work = Path(tmp)
        shutil.copytree(
            Path(__file__).parent.parent.parent,  # the installed chunkpilot package (links followed)
            work / "chunkpilot",
            ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.csv", "*.png", "*.yaml"),
        )
        if sources_key(_module_dir(work)) != key:
            raise BuildError("the simulator's sources changed while they were copied: run the build again")
        sources = [str(_module_dir(work).relative_to(work) / f"{name}.py") for name in COMPILED_MODULES]
        run = subprocess.run(
            [sys.executable, "-m", "mypyc", *sources],
            cwd=work,
            env={**os.environ, "MYPYC_OPT_LEVEL": "3"},
            capture_output=True,
            text=True,
            check=False,
        )
        if run.returncode != 0:
            tail = "\n".join((run.stdout + run.stderr).strip().splitlines()[-15:])
            raise BuildError(f"mypyc failed (exit {run.returncode}):\n{tail}")
        suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
        staging = cache_root() / f".{key}.partial-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        _module_dir(staging).mkdir(parents=True)
        for name in COMPILED_MODULES:
            shutil.copy2(_module_dir(work) / f"{name}{suffix}", _module_dir(staging) / f"{name}{suffix}")
        for library in work.glob(f"*__mypyc{suffix}"):
            shutil.copy2(library, staging / library.name)
        seconds = time.monotonic() - started
        record = {
            "key": key,
            "modules": list(COMPILED_MODULES),
            "python": sys.version,
            "build_s": round(seconds),
        }
        (staging / MARKER).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        shutil.rmtree(target, ignore_errors=True)
        os.replace(staging, target)
    echo(f"compiled simulator core built in {seconds:.0f} s: {target}")
    return target
