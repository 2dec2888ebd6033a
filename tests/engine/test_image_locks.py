"""The images install every Python dependency from a hashed lock, and the locks match the project's pins.

A lock (``engine_image/requirements/*.txt``) pins every package with its sha256 hashes; the
Dockerfiles install it with ``--require-hashes`` (a changed or substituted file fails the build) and
then the project itself without dependencies or a build environment of its own. A pin changed in
``pyproject.toml`` without regenerating the lock fails here.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOCKS = ROOT / "engine_image" / "requirements"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
#: Each image's Dockerfile, and the lock of its dependencies (None: the base image brings them).
IMAGES = {
    "engine_image/Dockerfile.sim": "sim.txt",
    "engine_image/probe/Dockerfile": "probe.txt",
    "engine_image/Dockerfile": None,
}
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([^\s;\\]+)")


def _name(text: str) -> str:
    return re.sub(r"[-_.]+", "-", text).lower()


def lock(name: str) -> dict[str, tuple[str, list[str]]]:
    """``package -> (version, hashes)`` of a lock file."""
    pins: dict[str, tuple[str, list[str]]] = {}
    current: str | None = None
    for line in (LOCKS / name).read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        match = _PIN.match(stripped)
        if match:
            current = _name(match.group(1))
            pins[current] = (match.group(3), [])
        elif stripped.startswith("--hash=") and current is not None:
            pins[current][1].append(stripped.removeprefix("--hash=").rstrip(" \\"))
        else:
            raise AssertionError(f"{name}: unexpected line {line!r}")
    return pins


def pins(requirements: list[str]) -> dict[str, str]:
    found = {}
    for requirement in requirements:
        match = _PIN.match(requirement)
        assert match, f"pyproject.toml: {requirement!r} is not pinned with =="
        found[_name(match.group(1))] = match.group(3)
    return found


@pytest.mark.parametrize("name", ["sim.txt", "probe.txt", "build.txt", "native.txt"])
def test_every_package_is_pinned_with_its_hashes(name: str) -> None:
    locked = lock(name)
    assert locked, name
    for package, (version, hashes) in locked.items():
        assert hashes and all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in hashes), (package, version)


@pytest.mark.parametrize(("name", "extra"), [("sim.txt", "router"), ("probe.txt", "probe")])
def test_a_lock_holds_the_projects_pins_and_its_images_extra(name: str, extra: str) -> None:
    project = PYPROJECT["project"]
    wanted = {**pins(project["dependencies"]), **pins(project["optional-dependencies"][extra])}
    locked = lock(name)
    differ = {
        p: (v, locked.get(p, ("missing",))[0]) for p, v in wanted.items() if locked.get(p, ("",))[0] != v
    }
    assert not differ, f"{name} is stale (pyproject pin, lock): {differ}; regenerate it"


def test_the_core_compiler_lock_holds_the_native_extras_pins() -> None:
    wanted = pins(PYPROJECT["project"]["optional-dependencies"]["native"])
    locked = {p: v for p, (v, _) in lock("native.txt").items()}
    assert {p: locked.get(p) for p in wanted} == wanted, "native.txt is stale: regenerate it"
    shared = {p: v for p, (v, _) in lock("sim.txt").items() if p in locked}
    assert all(locked[p] == v for p, v in shared.items()), f"native.txt and sim.txt disagree: {shared}"
    assert "--require-hashes -r engine_image/requirements/native.txt" in " ".join(
        _runs("engine_image/Dockerfile.sim")
    )


def test_the_build_backend_is_the_one_build_system_pins() -> None:
    assert {p: v for p, (v, _) in lock("build.txt").items()} == pins(PYPROJECT["build-system"]["requires"])


def _runs(dockerfile: str) -> list[str]:
    text = (ROOT / dockerfile).read_text().replace("\\\n", " ")
    return [line.strip()[4:] for line in text.splitlines() if line.strip().startswith("RUN ")]


@pytest.mark.parametrize("dockerfile", list(IMAGES))
def test_images_install_from_the_locks_and_nothing_unhashed(dockerfile: str) -> None:
    installs = [
        part.strip()
        for run in _runs(dockerfile)
        for part in run.split("&&")
        if re.search(r"\bpip install\b", part)
    ]
    assert any("--require-hashes -r engine_image/requirements/build.txt" in i for i in installs), installs
    if IMAGES[dockerfile]:
        assert any(
            f"--require-hashes -r engine_image/requirements/{IMAGES[dockerfile]}" in i for i in installs
        )
    for install in installs:
        hashed = "--require-hashes" in install
        own = "--no-deps" in install and "--no-build-isolation" in install
        assert hashed or own, f"{dockerfile}: an install that checks no hash: {install}"
