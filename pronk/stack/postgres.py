"""The stack's own PostgreSQL server: a cluster under the data dir, made and started from the machine's binaries.

`pronk stack up` runs the Prefect server on it where it can (`PRONK_PREFECT_DATABASE=auto`, see
`embedded.prefect_database`), and it can hold the engine workers' registry (`PRONK_REGISTRY_URL`) for workers on
other hosts. The cluster lives in `data_dir/postgres` and its address and password in `data_dir/postgres.json`
(mode 0600), so a later `stack up` finds the same server. PostgreSQL refuses to run as root: run as root, pronk
runs it as the system user `postgres` (the Debian package's), creating a system user `pronk-postgres` where there is
none.

Clients log in as `pronk` with a password (SCRAM) over TCP only, on `postgres_host` (127.0.0.1 by default): no
Unix socket, so nothing depends on a socket folder another user owns.
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import secrets
import shutil
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import psycopg

from pronk.engine.worker import free_port
from pronk.pronk_error import PronkError
from pronk.settings import Settings
from pronk.stack.processes import alive, spawn

log = logging.getLogger(__name__)

POSTGRES = "postgres"
"""The server's name in `stack.json`."""
USER = "pronk"
DATABASES = ("prefect", "pronk")
"""Prefect's database, and pronk's own (the worker registry)."""
_SYSTEM_USERS = ("postgres", "pronk-postgres")

PREFECT_ON_POSTGRES = {
    # Prefect's defaults (5 s to connect, 5 + 10 pooled connections) made its server answer 500 when the 2-core
    # machine was loaded: opening a PostgreSQL session (a backend process each) timed out. Keep more sessions
    # open and give a connection and a statement 30 s.
    "PREFECT_SERVER_DATABASE_CONNECTION_TIMEOUT": "30",
    "PREFECT_SERVER_DATABASE_TIMEOUT": "30",
    "PREFECT_SERVER_DATABASE_SQLALCHEMY_POOL_SIZE": "20",
    "PREFECT_SERVER_DATABASE_SQLALCHEMY_MAX_OVERFLOW": "20",
}
"""Settings of a Prefect server on PostgreSQL; values already in the environment win."""


class PostgresError(PronkError, RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class PostgresServer:
    """Where the stack's PostgreSQL listens and how to log in."""

    host: str
    port: int
    password: str
    user: str = USER

    def url(self, database: str, scheme: str = "postgresql") -> str:
        """`scheme://user:password@host:port/database`; Prefect needs `postgresql+asyncpg`."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{quote(self.user, safe='')}:{quote(self.password, safe='')}@{host}:{self.port}/{database}"


def cluster_dir(settings: Settings) -> Path:
    return settings.data_dir / "postgres"


def _info_path(settings: Settings) -> Path:
    return settings.data_dir / "postgres.json"


def server_of(settings: Settings) -> PostgresServer:
    """The stack's server: the port and password chosen when its cluster was made, else chosen now and kept.

    `postgres_port` and `postgres_host`, when set, win over what was kept; the password is the cluster's.
    """
    path = _info_path(settings)
    kept = json.loads(path.read_text()) if path.exists() else {}
    port = settings.postgres_port or int(kept.get("port") or free_port())
    password = kept.get("password") or settings.postgres_password or secrets.token_urlsafe(24)
    if kept.get("port") != port or kept.get("password") != password:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"port": port, "password": password}))
        tmp.chmod(0o600)
        tmp.replace(path)
    return PostgresServer(settings.postgres_host, port, password)


def find_binaries(settings: Settings) -> Path:
    """The folder holding `initdb` and `postgres`: `postgres_bin_dir`, else PATH's, else the newest of
    /usr/lib/postgresql/<version>/bin (Debian keeps them off PATH)."""
    candidates: list[Path] = []
    if settings.postgres_bin_dir is not None:
        candidates.append(settings.postgres_bin_dir)
    else:
        on_path = shutil.which("initdb")
        if on_path:
            candidates.append(Path(on_path).resolve().parent)
        versions = Path("/usr/lib/postgresql").glob("*/bin")
        candidates += sorted(versions, key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0, reverse=True)
    for folder in candidates:
        if all(os.access(folder / name, os.X_OK) for name in ("initdb", "postgres")):
            return folder
    raise PostgresError(
        "PostgreSQL's initdb and postgres not found (looked in "
        f"{', '.join(map(str, candidates)) or 'PATH and /usr/lib/postgresql/*/bin'}); "
        "install the `postgresql` package (scripts/install.sh does) or set PRONK_POSTGRES_BIN_DIR"
    )


def system_user() -> str | None:
    """The user the server runs as: None (ourselves) unless we are root, which PostgreSQL refuses."""
    if os.geteuid() != 0:
        return None
    for name in _SYSTEM_USERS:
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    name = _SYSTEM_USERS[-1]
    made = subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        capture_output=True,
        text=True,
    )
    if made.returncode != 0:
        raise PostgresError(f"PostgreSQL cannot run as root and `useradd {name}` failed: {made.stderr.strip()}")
    return name


def _give_to(folder: Path, user: str | None) -> None:
    """Make `folder` (the cluster's) the server user's, mode 0700, and let that user reach it through its parents."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    if user is None:
        return
    entry = pwd.getpwnam(user)
    os.chown(folder, entry.pw_uid, entry.pw_gid)
    parent = folder.parent
    if parent.stat().st_mode & stat.S_IXOTH == 0:
        parent.chmod(parent.stat().st_mode | stat.S_IXOTH)  # the data dir: pass through only, no listing
    closed = closed_ancestor(parent, entry.pw_uid)
    if closed is not None:
        raise PostgresError(f"{closed} does not let user {user} through (o+x), so PostgreSQL cannot reach {folder}")


def closed_ancestor(folder: Path, uid: int) -> Path | None:
    """The first existing folder above `folder` that user `uid` cannot pass through (not theirs, no o+x)."""
    for ancestor in folder.resolve().parents:
        try:
            mode = ancestor.stat()
        except FileNotFoundError:  # made later, by mkdir, passable
            continue
        if mode.st_uid != uid and mode.st_mode & stat.S_IXOTH == 0:
            return ancestor
    return None


def cannot_start(settings: Settings) -> str | None:
    """Why the stack could not run its own PostgreSQL server for this data dir, or None when it can: no binaries,
    or (run as root, so the server runs as another user) a folder above the data dir that user cannot pass."""
    try:
        find_binaries(settings)
    except PostgresError as exc:
        return str(exc)
    if os.geteuid() != 0:
        return None
    uids = [entry.pw_uid for entry in pwd.getpwall() if entry.pw_name in _SYSTEM_USERS]
    closed = closed_ancestor(settings.data_dir, uids[0] if uids else -1)
    return None if closed is None else f"{closed} does not let PostgreSQL's system user through (o+x)"


def init_cluster(settings: Settings, server: PostgresServer, user: str | None) -> None:
    """Make the cluster (`initdb`) unless it exists; the superuser is `pronk` with the server's password."""
    folder = cluster_dir(settings)
    if (folder / "PG_VERSION").exists():
        return
    if folder.exists() and any(folder.iterdir()):
        raise PostgresError(f"{folder} is neither empty nor a PostgreSQL cluster; move it away")
    _give_to(folder, user)
    password_file = settings.data_dir / f".postgres-password.{os.getpid()}"
    password_file.write_text(server.password + "\n")
    password_file.chmod(0o600)
    try:
        if user is not None:
            entry = pwd.getpwnam(user)
            os.chown(password_file, entry.pw_uid, entry.pw_gid)
        argv = [str(find_binaries(settings) / "initdb"), "-D", str(folder), "-U", USER, f"--pwfile={password_file}"]
        argv += ["--auth=scram-sha-256", "--encoding=UTF8", "--no-locale"]
        made = subprocess.run(
            argv, capture_output=True, text=True, timeout=300, user=user, group=_group(user), extra_groups=_extra(user)
        )
    finally:
        password_file.unlink(missing_ok=True)
    if made.returncode != 0:
        raise PostgresError(f"initdb failed:\n{made.stdout}\n{made.stderr}")
    with open(folder / "pg_hba.conf", "a") as hba:
        # Reachable only where `listen_addresses` binds (127.0.0.1 unless postgres_host says otherwise), by password.
        hba.write("host all all all scram-sha-256\n")


def _group(user: str | None) -> int | None:
    return pwd.getpwnam(user).pw_gid if user is not None else None


def _extra(user: str | None) -> list[int] | None:
    return [] if user is not None else None


def connect(server: PostgresServer, database: str = "postgres", timeout_s: float = 5.0) -> psycopg.Connection:
    return psycopg.connect(server.url(database), connect_timeout=max(1, int(timeout_s)), autocommit=True)


def wait_ready(server: PostgresServer, pid: int, log_path: Path, timeout_s: float = 60.0) -> None:
    """Wait until the server takes logins; fail at once if process `pid` exits, or after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            connect(server, timeout_s=2.0).close()
            return
        except psycopg.OperationalError as exc:
            if not alive(pid):
                raise PostgresError(f"PostgreSQL exited during start-up; see {log_path}") from exc
            if time.monotonic() > deadline:
                raise PostgresError(f"PostgreSQL not ready after {timeout_s:.0f}s: {exc}; see {log_path}") from exc
        time.sleep(0.3)


def create_databases(server: PostgresServer) -> None:
    with connect(server) as conn:
        for name in DATABASES:
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is None:
                conn.execute(f'CREATE DATABASE "{name}"')


def start_postgres(settings: Settings, state: dict[str, int]) -> PostgresServer:
    """Make the cluster if needed, start the server unless `state` has it running, and create pronk's databases.

    The server's pid goes into `state` under `postgres`, so `stack down` stops it (last, after its clients).
    """
    server = server_of(settings)
    if POSTGRES in state and alive(state[POSTGRES]):
        return server
    user = system_user()
    init_cluster(settings, server, user)
    log_path = settings.logs_dir / "postgres.log"
    argv = [str(find_binaries(settings) / "postgres"), "-D", str(cluster_dir(settings)), "-p", str(server.port)]
    argv += ["-c", f"listen_addresses={server.host}", "-c", "unix_socket_directories=", "-c", "max_connections=200"]
    state[POSTGRES] = spawn(argv, log_path, user=user)
    wait_ready(server, state[POSTGRES], log_path)
    create_databases(server)
    log.info("PostgreSQL on %s:%d (data in %s)", server.host, server.port, cluster_dir(settings))
    return server
