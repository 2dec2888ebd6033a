"""Install a Debian package on demand (for the test tooling's real servers: Prometheus, PostgreSQL)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

#: Serialises this machine's installs: apt-get fails at once, not waits, while another holds dpkg's lock
#: (parallel test workers each starting a Prometheus on a fresh machine).
INSTALL_LOCK = Path(tempfile.gettempdir()) / "chunkpilot-apt-get.lock"


class AptUnavailableError(RuntimeError):
    """``apt-get`` is missing or this process is not root: the user must install the package."""


class AptInstallError(RuntimeError):
    """``apt-get install`` failed; the message ends with its stderr."""


def install_package(package: str, progress: Callable[[str], None]) -> None:
    """``apt-get install -y --no-install-recommends PACKAGE``, refreshing the index once if needed."""
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        raise AptUnavailableError(f"cannot install {package}: apt-get needs root on a Debian/Ubuntu machine")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [apt, "install", "-y", "--no-install-recommends", package]
    progress(f"installing the {package} Debian package")
    with _one_install_at_a_time():
        _install(apt, install, env, package)


def locate_or_install(
    locate: Callable[[], T | None],
    package: str,
    progress: Callable[[str], None],
    *,
    not_installed: Exception,
    error: Callable[[str], Exception],
    installed_nothing: str,
) -> T:
    """What ``locate`` finds, installing ``package`` first when it finds nothing.

    Raises ``not_installed`` where this machine cannot install it (no apt-get, or not root),
    ``error(message)`` where the install fails or ``locate`` still finds nothing after it
    (message ``installed_nothing``).
    """
    found = locate()
    if found is not None:
        return found
    try:
        install_package(package, progress)
    except AptUnavailableError:
        raise not_installed from None
    except AptInstallError as failure:
        raise error(str(failure)) from None
    found = locate()
    if found is None:
        raise error(installed_nothing)
    return found


@contextlib.contextmanager
def _one_install_at_a_time() -> Iterator[None]:
    with INSTALL_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _install(apt: str, install: list[str], env: dict[str, str], package: str) -> None:
    if subprocess.run(install, env=env, capture_output=True, check=False).returncode == 0:
        return
    subprocess.run([apt, "update"], env=env, capture_output=True, check=False)
    result = subprocess.run(install, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise AptInstallError(f"`apt-get install {package}` failed:\n{result.stderr[-2000:]}")
