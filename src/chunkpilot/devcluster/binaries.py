"""Locate or build the control-plane binaries (etcd, Kubernetes, KWOK, helm).

Lookup order for each binary:

1. the build cache ``~/.cache/chunkpilot/bin/<component>-<version>/``;
2. ``$KUBEBUILDER_ASSETS`` and then ``$PATH``, accepted only when the binary reports the pinned
   version (so a stray older ``kubectl`` is never used);
3. a build from the pinned Go module (``gomod/<component>.mod`` + ``.sum``) through the module
   proxy, with GOPATH and GOCACHE inside the cache folder so later builds are incremental.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from chunkpilot.devcluster import paths
from chunkpilot.devcluster.components import (
    COMPONENTS,
    Binary,
    Command,
    GoComponent,
    command_of,
    component_of,
)

Progress = Callable[[str], None]

# Builds are heavy; keep the machine responsive for everything else.
_BUILD_NICENESS = 10
_HEARTBEAT_SECONDS = 30.0


class BinaryError(RuntimeError):
    """A binary could not be located or built."""


@dataclass(frozen=True)
class BinarySet:
    """Absolute paths of every control-plane executable."""

    paths: dict[Binary, Path]

    def __getitem__(self, binary: Binary) -> Path:
        return self.paths[binary]

    def path_entries(self) -> list[str]:
        """Folders to put in front of ``PATH`` so ``kubectl``/``helm``/``kwok`` resolve to these builds."""
        seen: list[str] = []
        for path in self.paths.values():
            folder = str(path.parent)
            if folder not in seen:
                seen.append(folder)
        return seen


def _silent(_: str) -> None:
    return None


def cached_binary_path(binary: Binary) -> Path:
    """Where the build cache keeps ``binary``."""
    return paths.bin_dir() / component_of(binary).key / binary.value


def reports_pinned_version(path: Path, command: Command) -> bool:
    """Whether the executable at ``path`` prints the pinned version marker."""
    try:
        result = subprocess.run(
            [str(path), *command.version_args],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return command.version_marker in result.stdout + result.stderr


def _external_candidates(binary: Binary) -> Iterator[Path]:
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets:
        yield Path(assets) / binary.value
    found = shutil.which(binary.value)
    if found:
        yield Path(found)


def locate(binary: Binary) -> Path | None:
    """The path of ``binary`` at the pinned version if it is cached or pre-installed, else ``None``."""
    cached = cached_binary_path(binary)
    if cached.is_file() and os.access(cached, os.X_OK):
        return cached
    command = command_of(binary)
    for candidate in _external_candidates(binary):
        if candidate.is_file() and reports_pinned_version(candidate, command):
            return candidate.resolve()
    return None


def go_executable() -> str:
    """The Go toolchain: ``$CHUNKPILOT_GO``, ``go`` on PATH, or ``/usr/local/go/bin/go``."""
    for candidate in (os.environ.get("CHUNKPILOT_GO"), shutil.which("go"), "/usr/local/go/bin/go"):
        if candidate and Path(candidate).is_file():
            return candidate
    raise BinaryError(
        "no Go toolchain found to build the control-plane binaries: install Go >= 1.26, put `go` on "
        "PATH (or set CHUNKPILOT_GO), or provide the binaries through KUBEBUILDER_ASSETS/PATH"
    )


def build_environment() -> dict[str, str]:
    """Environment for ``go build``: caches in the chunkpilot cache, module mode, static binaries."""
    env = dict(os.environ)
    env.update(
        GOPATH=str(paths.go_path()),
        GOMODCACHE=str(paths.go_path() / "pkg" / "mod"),
        GOCACHE=str(paths.go_cache()),
        GOFLAGS="-mod=mod",
        GOTOOLCHAIN="local",
        CGO_ENABLED="0",
    )
    return env


def build_arguments(component: GoComponent, command: Command, output: Path, parallelism: int) -> list[str]:
    """The ``go build`` argument list (after the ``go`` executable) for one binary."""
    ldflags = " ".join(("-s", "-w", *component.ldflags))
    return [
        "build",
        "-p",
        str(parallelism),
        "-trimpath",
        "-ldflags",
        ldflags,
        "-o",
        str(output),
        command.package,
    ]


def prepare_module(component: GoComponent) -> Path:
    """Write the pinned ``go.mod``/``go.sum`` of ``component`` into its scratch module folder."""
    work = paths.build_work_dir() / component.key
    work.mkdir(parents=True, exist_ok=True)
    data = resources.files("chunkpilot.devcluster.gomod")
    (work / "go.mod").write_text(data.joinpath(f"{component.name}.mod").read_text())
    pinned_sum = data.joinpath(f"{component.name}.sum")
    if pinned_sum.is_file():
        (work / "go.sum").write_text(pinned_sum.read_text())
    return work


@contextlib.contextmanager
def _heartbeat(progress: Progress, label: str) -> Iterator[None]:
    """Report every half minute that a long step is still running."""
    stop = threading.Event()
    started = time.monotonic()

    def beat() -> None:
        while not stop.wait(_HEARTBEAT_SECONDS):
            progress(f"  still {label} ({_format_duration(time.monotonic() - started)})")

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _format_duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def build_binary(binary: Binary, progress: Progress = _silent, parallelism: int = 2) -> Path:
    """Build ``binary`` from its pinned Go module into the cache and return its path."""
    component = component_of(binary)
    command = command_of(binary)
    go = go_executable()
    work = prepare_module(component)
    output = cached_binary_path(binary)
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(output.name + ".partial")
    log_path = paths.logs_dir() / f"build-{component.key}-{binary.value}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    argv = [
        "nice",
        "-n",
        str(_BUILD_NICENESS),
        go,
        *build_arguments(component, command, partial, parallelism),
    ]
    progress(f"building {binary.value} from {component.module}@{component.version} (log: {log_path})")
    started = time.monotonic()
    with _heartbeat(progress, f"building {binary.value}"), log_path.open("w") as log:
        result = subprocess.run(
            argv, cwd=work, env=build_environment(), stdout=log, stderr=subprocess.STDOUT, check=False
        )
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        raise BinaryError(
            f"building {binary.value} from {component.module}@{component.version} failed "
            f"(exit {result.returncode}); see {log_path}:\n{_tail(log_path)}"
        )
    partial.replace(output)
    progress(f"built {binary.value} in {_format_duration(time.monotonic() - started)}")
    return output


def ensure(binary: Binary, progress: Progress = _silent, parallelism: int = 2) -> Path:
    """The path of ``binary`` at the pinned version, building it if needed."""
    found = locate(binary)
    if found is not None:
        return found
    return build_binary(binary, progress, parallelism)


def ensure_all(
    binaries: Iterable[Binary] | None = None, progress: Progress = _silent, parallelism: int = 2
) -> BinarySet:
    """Locate or build every binary (default: all of them), reporting progress."""
    wanted = list(binaries) if binaries is not None else list(Binary)
    result: dict[Binary, Path] = {}
    for component in COMPONENTS:
        for command in component.commands:
            if command.binary in wanted:
                result[command.binary] = ensure(command.binary, progress, parallelism)
    return BinarySet(result)


def locate_all(binaries: Iterable[Binary] | None = None) -> BinarySet:
    """Locate every binary without building; raise :class:`BinaryError` naming the missing ones."""
    wanted = list(binaries) if binaries is not None else list(Binary)
    found = {binary: locate(binary) for binary in wanted}
    missing = [binary.value for binary, path in found.items() if path is None]
    if missing:
        raise BinaryError(
            f"control-plane binaries not built yet: {', '.join(missing)}; run `chunkpilot cluster fetch` "
            "(builds them from Go modules into ~/.cache/chunkpilot, a one-time job of a few tens of minutes)"
        )
    return BinarySet({binary: path for binary, path in found.items() if path is not None})
