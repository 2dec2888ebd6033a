"""A throwaway PostgreSQL server on loopback, for tests of the Optuna storage mirror.

The binaries come from Debian's ``postgresql`` package (``/usr/lib/postgresql/<version>/bin``),
installed on demand with ``apt-get`` when running as root. The cluster lives in a fresh
temporary directory, listens on a free loopback port with ``trust`` authentication for one
superuser, and is removed on exit. PostgreSQL refuses to run as root: as root, ``initdb`` and
the server run as the unprivileged ``postgres`` account (created by the package) via ``setpriv``.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from chunkpilot.devcluster.debian import locate_or_install
from chunkpilot.devcluster.ports import LOOPBACK, free_port
from chunkpilot.devcluster.processes import ManagedProcess, StartupError

POSTGRES_BIN_ENV = "CHUNKPILOT_POSTGRES_BIN"
DEBIAN_PACKAGE = "postgresql"
DEBIAN_BIN_GLOB = "/usr/lib/postgresql/*/bin"
SERVICE_ACCOUNT = "postgres"
SUPERUSER = "chunkpilot"
_REQUIRED = ("initdb", "postgres", "pg_isready", "createdb")
_DB_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class PostgresError(RuntimeError):
    """PostgreSQL could not be found, installed or started; the message names the fix."""


class PostgresUnavailableError(PostgresError):
    """This machine cannot run PostgreSQL at all (not root and not installed, or no unprivileged account)."""


def _version_key(path: Path) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", path.parent.name) or ["0"])


def locate_bin_dir() -> Path | None:
    """``$CHUNKPILOT_POSTGRES_BIN`` or the newest ``/usr/lib/postgresql/*/bin`` holding the server tools."""
    override = os.environ.get(POSTGRES_BIN_ENV)
    candidates = (
        [Path(override)] if override else sorted(Path("/").glob(DEBIAN_BIN_GLOB[1:]), key=_version_key)
    )
    for directory in reversed(candidates):
        if all((directory / tool).is_file() for tool in _REQUIRED):
            return directory
    return None


def ensure_bin_dir(progress: Callable[[str], None] = lambda _msg: None) -> Path:
    """The PostgreSQL bin directory, installing the Debian package first when it is missing."""
    return locate_or_install(
        locate_bin_dir,
        DEBIAN_PACKAGE,
        progress,
        not_installed=PostgresUnavailableError(
            "PostgreSQL is not installed: install the `postgresql` package (Debian/Ubuntu: "
            f"`sudo apt-get install -y {DEBIAN_PACKAGE}`) or point {POSTGRES_BIN_ENV} at its bin directory"
        ),
        error=PostgresError,
        installed_nothing=(
            f"the {DEBIAN_PACKAGE} package installed no {DEBIAN_BIN_GLOB} with {', '.join(_REQUIRED)}"
        ),
    )


@dataclass(frozen=True)
class RunAs:
    """The account the server runs as: ``argv`` prefix and ownership for its directories."""

    prefix: tuple[str, ...]
    uid: int
    gid: int

    @classmethod
    def for_current_user(cls) -> RunAs:
        """Ourselves when not root; the ``postgres`` account (via ``setpriv``) when root."""
        if os.geteuid() != 0:
            return cls((), os.geteuid(), os.getegid())
        setpriv = shutil.which("setpriv")
        try:
            account = pwd.getpwnam(SERVICE_ACCOUNT)
        except KeyError:
            account = None
        if setpriv is None or account is None:
            raise PostgresUnavailableError(
                "PostgreSQL refuses to run as root and this machine has no way to drop privileges "
                f"(needs the `{SERVICE_ACCOUNT}` account, created by the {DEBIAN_PACKAGE} package, and "
                "`setpriv` from util-linux); run the tests as an unprivileged user"
            )
        prefix = (
            setpriv,
            f"--reuid={account.pw_uid}",
            f"--regid={account.pw_gid}",
            "--init-groups",
            "--",
        )
        return cls(prefix, account.pw_uid, account.pw_gid)

    def argv(self, command: Sequence[str]) -> list[str]:
        return [*self.prefix, *command]


class PostgresServer:
    """A PostgreSQL cluster in a temporary directory; use as a context manager.

    :attr:`url` is the SQLAlchemy URL (psycopg 3 driver) of the ``chunkpilot`` database;
    :meth:`create_database` makes more databases (for example one per test).
    """

    def __init__(self, bin_dir: Path | None = None, *, startup_timeout: float = 60.0) -> None:
        self.bin_dir = bin_dir or ensure_bin_dir()
        self.run_as = RunAs.for_current_user()
        self.startup_timeout = startup_timeout
        self.port = 0
        self.root: Path | None = None
        self.process: ManagedProcess | None = None

    # --------------------------------------------------------------- lifecycle

    def start(self) -> PostgresServer:
        """Create the cluster and start the server; raise :class:`PostgresError` with the log on failure."""
        # Not under pytest's tmp dirs: those are private to root and the server runs as another user.
        self.root = Path(tempfile.mkdtemp(prefix="chunkpilot-postgres-"))
        data, sockets = self.root / "data", self.root / "run"
        sockets.mkdir()
        for path in (self.root, sockets):
            os.chown(path, self.run_as.uid, self.run_as.gid)
        initdb = self.run_as.argv(
            [
                str(self.bin_dir / "initdb"),
                "-D",
                str(data),
                "-U",
                SUPERUSER,
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ]
        )
        result = subprocess.run(initdb, capture_output=True, text=True, check=False, cwd=self.root)
        if result.returncode != 0:
            raise PostgresError(
                f"initdb failed ({' '.join(initdb)}):\n{(result.stdout + result.stderr)[-2000:]}"
            )
        self.port = free_port()
        server = [
            str(self.bin_dir / "postgres"),
            "-D", str(data),
            "-p", str(self.port),
            "-k", str(sockets),
            "-c", f"listen_addresses={LOOPBACK}",
            "-c", "fsync=off",
            "-c", "synchronous_commit=off",
            "-c", "full_page_writes=off",
        ]  # fmt: skip
        self.process = ManagedProcess(
            "postgres", self.run_as.argv(server), self.root / "postgres.log", cwd=self.root
        )
        self.process.start()
        try:
            self.process.wait_until(self._ready, self.startup_timeout, "accepting connections")
            self.create_database(SUPERUSER)
        except (StartupError, PostgresError) as error:
            self.stop()
            raise PostgresError(str(error)) from error
        return self

    def _ready(self) -> bool:
        probe = [str(self.bin_dir / "pg_isready"), "-h", LOOPBACK, "-p", str(self.port), "-U", SUPERUSER]
        return subprocess.run(probe, capture_output=True, check=False).returncode == 0

    def stop(self) -> None:
        """Fast shutdown (SIGINT), then the process group is terminated; the directory is removed."""
        if self.process is not None and self.process.running():
            try:
                os.kill(self.process.pid, signal.SIGINT)
                assert self.process.popen is not None
                self.process.popen.wait(timeout=15)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
            self.process.stop()
        self.process = None
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # --------------------------------------------------------------- use

    def url_for(self, database: str, driver: str = "psycopg") -> str:
        """SQLAlchemy URL of ``database`` on this server."""
        return f"postgresql+{driver}://{SUPERUSER}@{LOOPBACK}:{self.port}/{database}"

    @property
    def url(self) -> str:
        """SQLAlchemy URL of the ``chunkpilot`` database."""
        return self.url_for(SUPERUSER)

    def create_database(self, name: str) -> str:
        """Create an empty database (lowercase letters, digits, ``_``) and return its URL."""
        if not _DB_NAME.match(name):
            raise ValueError(f"database name {name!r}: use lowercase letters, digits and '_' (at most 63)")
        command = [
            str(self.bin_dir / "createdb"),
            "-h",
            LOOPBACK,
            "-p",
            str(self.port),
            "-U",
            SUPERUSER,
            name,
        ]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise PostgresError(f"createdb {name} failed: {result.stderr.strip()}")
        return self.url_for(name)

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the server log."""
        return self.process.tail(lines) if self.process is not None else "(not running)"
