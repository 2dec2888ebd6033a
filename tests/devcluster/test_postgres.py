"""The throwaway PostgreSQL: finds the Debian binaries, serves SQL on loopback, leaves nothing behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import sqlalchemy

from chunkpilot.devcluster.postgres import POSTGRES_BIN_ENV, PostgresServer, locate_bin_dir


def test_an_override_without_the_server_tools_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "initdb").write_text("")
    monkeypatch.setenv(POSTGRES_BIN_ENV, str(tmp_path))
    assert locate_bin_dir() is None


@pytest.mark.postgres
def test_server_serves_sql_and_cleans_up(postgres_server: PostgresServer) -> None:
    with pytest.raises(ValueError, match="database name"):
        postgres_server.create_database("Bad-Name")
    server = PostgresServer(postgres_server.bin_dir)
    with server:
        assert server.root is not None and server.process is not None
        root, pid = server.root, server.process.pid
        engine = sqlalchemy.create_engine(server.create_database("scratch"))
        with engine.connect() as connection:
            assert connection.execute(sqlalchemy.text("select 1 + 1")).scalar() == 2
        engine.dispose()
    assert not root.exists()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
