"""The stack's PostgreSQL starter: binaries found, a cluster made and started as a non-root user, logins by password."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import tempfile
from pathlib import Path

import psycopg
import pytest

from pronk.settings import Settings
from pronk.stack.postgres import PostgresError, PostgresServer, closed_ancestor, connect, find_binaries, server_of


def test_url_quotes_the_password_and_brackets_ipv6():
    server = PostgresServer("::1", 5433, "a/b@c:d")
    assert (
        server.url("prefect", scheme="postgresql+asyncpg")
        == "postgresql+asyncpg://pronk:a%2Fb%40c%3Ad@[::1]:5433/prefect"
    )


def test_server_of_keeps_the_port_and_password_it_chose(tmp_path):
    settings = Settings(data_dir=tmp_path)
    first = server_of(settings)
    assert first.port > 0 and len(first.password) >= 24
    assert server_of(settings) == first
    kept = tmp_path / "postgres.json"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert json.loads(kept.read_text()) == {"port": first.port, "password": first.password}
    assert server_of(Settings(data_dir=tmp_path, postgres_port=6543)).port == 6543


def test_missing_binaries_are_named(tmp_path):
    with pytest.raises(PostgresError, match="PRONK_POSTGRES_BIN_DIR"):
        find_binaries(Settings(data_dir=tmp_path, postgres_bin_dir=tmp_path))


def test_server_takes_a_password_login_and_has_pronks_databases(postgres_server):
    with connect(postgres_server) as conn:
        names = {row[0] for row in conn.execute("SELECT datname FROM pg_database")}
        assert {"prefect", "pronk"} <= names
        assert conn.execute("SHOW listen_addresses").fetchone() == ("127.0.0.1",)
    wrong = PostgresServer(postgres_server.host, postgres_server.port, "not-the-password")
    with pytest.raises(psycopg.OperationalError, match="password"):
        connect(wrong).close()


def test_server_runs_as_a_non_root_user(postgres_server):
    with connect(postgres_server) as conn:  # the backend exits with its connection: read its owner while it lives
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        uid = os.stat(f"/proc/{pid}").st_uid
    assert uid != 0 or os.geteuid() != 0, "PostgreSQL runs as root"
    assert pwd.getpwuid(uid).pw_name in (
        {"postgres", "pronk-postgres"} if os.geteuid() == 0 else {pwd.getpwuid(os.geteuid()).pw_name}
    )


def test_a_database_url_already_set_is_honoured_and_no_server_is_started(tmp_path, monkeypatch):
    from pronk.stack.embedded import prefect_database_url

    state: dict[str, int] = {}
    assert prefect_database_url(Settings(data_dir=tmp_path, prefect_database="sqlite"), state) is None
    monkeypatch.setenv("PREFECT_API_DATABASE_CONNECTION_URL", "postgresql+asyncpg://u:p@db.example:5432/prefect")
    assert prefect_database_url(Settings(data_dir=tmp_path, prefect_database="postgres"), state) is None
    assert state == {} and not (tmp_path / "postgres").exists()


def test_auto_keeps_the_database_the_data_dir_holds(tmp_path):
    from pronk.stack.embedded import prefect_database

    (tmp_path / "prefect").mkdir()
    (tmp_path / "prefect" / "prefect.db").touch()
    assert prefect_database(Settings(data_dir=tmp_path)) == "sqlite"
    (tmp_path / "postgres").mkdir()
    (tmp_path / "postgres" / "PG_VERSION").write_text("15\n")
    assert prefect_database(Settings(data_dir=tmp_path)) == "postgres"
    assert prefect_database(Settings(data_dir=tmp_path, prefect_database="sqlite")) == "sqlite"


def test_auto_picks_postgres_where_the_stack_can_start_it_and_sqlite_where_not(tmp_path):
    from pronk.stack.embedded import prefect_database

    assert prefect_database(Settings(data_dir=tmp_path / "a", postgres_bin_dir=tmp_path)) == "sqlite"  # no binaries
    try:
        find_binaries(Settings(data_dir=tmp_path))
    except PostgresError:
        pytest.skip("no PostgreSQL binaries on this machine")
    base = Path(tempfile.mkdtemp())  # under /tmp, not pytest's 0700 folders
    try:
        (base / "open").mkdir(mode=0o711)
        (base / "shut").mkdir(mode=0o700)
        base.chmod(0o711)
        assert prefect_database(Settings(data_dir=base / "open" / "data")) == "postgres"
        # Run as root, the server runs as another user, who must pass through every folder above the data dir.
        shut = prefect_database(Settings(data_dir=base / "shut" / "data"))
        assert shut == ("sqlite" if os.geteuid() == 0 else "postgres")
    finally:
        shutil.rmtree(base)


def test_closed_ancestor_names_the_first_folder_a_user_cannot_pass():
    base = Path(tempfile.mkdtemp())
    try:
        (base / "shut" / "inner").mkdir(parents=True)
        (base / "shut").chmod(0o700)
        base.chmod(0o711)
        assert closed_ancestor(base / "shut" / "inner" / "data", -1) == base / "shut"
        assert closed_ancestor(base / "shut" / "inner" / "data", os.geteuid()) is None  # their own folders
        assert closed_ancestor(base / "new" / "data", -1) is None  # folders not made yet are made passable
    finally:
        shutil.rmtree(base)
