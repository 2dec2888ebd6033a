"""A cached torch for running the probe on the CPU without putting torch into the project's environment.

PyPI's Linux torch wheel is built against CUDA: ``libtorch_cpu.so`` and
``libtorch_cuda.so`` link ``libcudart``, cuBLAS, cuDNN, NCCL and the other
CUDA libraries of the ``nvidia-*`` wheels, so ``pip install --no-deps torch``
does not even import. The whole dependency set (about 2.7 GB of wheels,
4.7 GB installed) is therefore installed once, with pip's ordinary resolver,
into a directory under ``~/.cache/chunkpilot/torch/`` keyed by the torch
version and the interpreter, and put in front of the probe's ``PYTHONPATH``::

    PYTHONPATH=$(chunkpilot probe torch-env) chunkpilot probe --model llama-3.1-8b --out p.json

Without a GPU the CUDA libraries are loaded but never used.
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

__all__ = [
    "ENV_CACHE_DIR",
    "MIN_FREE_BYTES",
    "TorchEnvError",
    "ensure_torch",
    "overlay_dir",
    "probe_environment",
    "torch_in_environment",
    "torch_requirement",
]

#: Overrides the cache root (default ``~/.cache/chunkpilot``).
ENV_CACHE_DIR = "CHUNKPILOT_CACHE_DIR"
#: Free disk space the install needs: the installed tree plus pip's unpacking room.
MIN_FREE_BYTES = 8 * 2**30
_FALLBACK_REQUIREMENT = "torch==2.13.0"  # the ``probe`` extra in pyproject.toml
_CHECK = "import torch; x = torch.ones(4, 4); assert float((x @ x).sum()) == 64.0; print(torch.__version__)"
_COMPLETE = ".complete"

Progress = Callable[[str], None]


class TorchEnvError(RuntimeError):
    """Torch could not be installed or imported (the message says why and what to do)."""


def torch_requirement() -> str:
    """The torch pin of the ``probe`` extra, read from the installed distribution's metadata."""
    try:
        requirements = importlib.metadata.requires("chunkpilot") or []
    except importlib.metadata.PackageNotFoundError:
        return _FALLBACK_REQUIREMENT
    for requirement in requirements:
        spec, _, marker = requirement.partition(";")
        if re.match(r"\s*torch\s*==", spec) and "probe" in marker:
            return spec.replace(" ", "")
    return _FALLBACK_REQUIREMENT


def _cache_root() -> Path:
    configured = os.environ.get(ENV_CACHE_DIR)
    return Path(configured) if configured else Path.home() / ".cache" / "chunkpilot"


def overlay_dir(requirement: str | None = None) -> Path:
    """Where the torch of ``requirement`` for this interpreter and platform is (or will be) installed."""
    pin = re.sub(r"[^A-Za-z0-9.]+", "-", requirement or torch_requirement()).strip("-")
    python = f"cp{sys.version_info.major}{sys.version_info.minor}"
    platform = re.sub(r"[^a-z0-9]+", "_", sysconfig.get_platform().lower())
    return _cache_root() / "torch" / f"{pin}-{python}-{platform}"


def _check_import(path: Path | None) -> str:
    """Import torch and run a CPU matmul in a fresh interpreter; return torch's version."""
    env = probe_environment(path) if path is not None else dict(os.environ)
    result = subprocess.run(
        [sys.executable, "-c", _CHECK], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-5:])
        raise TorchEnvError(f"torch does not import from {path or 'the environment'}:\n{tail}")
    return result.stdout.strip()


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one install at a time; others wait and reuse it
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def ensure_torch(progress: Progress | None = None, requirement: str | None = None) -> Path:
    """Install torch into :func:`overlay_dir` unless it is there already; return that directory.

    The install goes into a temporary directory renamed into place after a CPU
    matmul succeeded, so an interrupted install is never mistaken for a complete
    one. Raises :class:`TorchEnvError` when pip or the import fails.
    """
    say = progress or (lambda _message: None)
    pin = requirement or torch_requirement()
    target = overlay_dir(pin)
    if (target / _COMPLETE).is_file():
        return target
    with _locked(target.parent):
        if (target / _COMPLETE).is_file():
            return target
        free = shutil.disk_usage(target.parent).free
        if free < MIN_FREE_BYTES:
            raise TorchEnvError(
                f"installing {pin} needs about {MIN_FREE_BYTES / 2**30:.0f} GiB free under {target.parent} "
                f"({free / 2**30:.1f} GiB free); free some space or set {ENV_CACHE_DIR}"
            )
        staging = target.with_name(f".{target.name}.partial")
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(target, ignore_errors=True)
        say(f"installing {pin} with its CUDA libraries into {target} (about 2.7 GB to download, once)")
        started = time.monotonic()
        command = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-cache-dir",
            "--target",
            str(staging),
            pin,
        ]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-8:])
            raise TorchEnvError(f"pip could not install {pin} (exit {result.returncode}):\n{tail}")
        version = _check_import(staging)
        (staging / _COMPLETE).write_text(f"{pin}\n{version}\n", encoding="utf-8")
        staging.rename(target)
        say(f"torch {version} ready in {target} ({time.monotonic() - started:.0f} s)")
    return target


def probe_environment(path: Path | None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with ``path`` first on ``PYTHONPATH``."""
    env = dict(os.environ if base is None else base)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(path), env.get("PYTHONPATH", "")) if p)
    return env


def torch_in_environment() -> bool:
    """True when this interpreter can import torch without the cached install."""
    return importlib.util.find_spec("torch") is not None
