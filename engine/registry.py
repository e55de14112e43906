"""Where live workers announce themselves, refreshed by a heartbeat: one interface, two places.

`FileRegistry` (the embedded default) keeps one JSON file per worker on the data directory: it needs no extra
service, survives any single process, and is atomic to update (write then rename). `PostgresRegistry` keeps one
row per worker in a PostgreSQL table, so routers on every host see the workers of every host. Either way the
router treats an entry whose heartbeat is older than the timeout as a dead worker; heartbeats are the workers'
own clocks, so hosts sharing a PostgreSQL registry need synchronised clocks (NTP), well within the timeout.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from abc import ABC, abstractmethod
from pathlib import Path

import psycopg
from psycopg.types.json import Jsonb
from pydantic import BaseModel, ValidationError

from pronk.engine.engine_error import EngineError
from pronk.engine.worker_protocol import WorkerStats

log = logging.getLogger(__name__)


class WorkerEntry(BaseModel):
    worker_id: str
    job_id: str
    url: str
    pid: int
    started_at: float
    heartbeat_at: float
    stats: WorkerStats


class RegistryUnavailable(EngineError):
    """The registry could not be read or written (its folder or its database); the caller may try again later."""


class Registry(ABC):
    """The workers of each job: `announce` (insert or refresh), `withdraw`, `entries`, and `live` ones."""

    def __init__(self, heartbeat_timeout_s: float = 5.0):
        self.heartbeat_timeout_s = heartbeat_timeout_s

    @staticmethod
    def open(location: str | Path, heartbeat_timeout_s: float = 5.0) -> Registry:
        """The registry at `location`: a `postgresql://` (or `postgres://`) URL, else a folder of worker files."""
        if isinstance(location, str) and location.startswith(("postgresql://", "postgres://")):
            return PostgresRegistry(location, heartbeat_timeout_s)
        return FileRegistry(Path(location), heartbeat_timeout_s)

    @abstractmethod
    def announce(self, entry: WorkerEntry) -> None: ...

    @abstractmethod
    def withdraw(self, job_id: str, worker_id: str) -> None: ...

    @abstractmethod
    def entries(self, job_id: str) -> list[WorkerEntry]:
        """Every entry of the job, fresh or not, ordered by worker id; an unreadable entry is skipped."""

    def live(self, job_id: str, now: float | None = None) -> list[WorkerEntry]:
        """Workers of the job whose heartbeat is fresh."""
        now = time.time() if now is None else now
        return [e for e in self.entries(job_id) if now - e.heartbeat_at <= self.heartbeat_timeout_s]


class FileRegistry(Registry):
    def __init__(self, root: Path, heartbeat_timeout_s: float = 5.0):
        super().__init__(heartbeat_timeout_s)
        self.root = root

    def _path(self, job_id: str, worker_id: str) -> Path:
        return self.root / job_id / f"{worker_id}.json"

    def announce(self, entry: WorkerEntry) -> None:
        path = self._path(entry.job_id, entry.worker_id)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(entry.model_dump_json())
            tmp.replace(path)
        except OSError as exc:
            raise RegistryUnavailable(f"cannot write {path}: {exc}") from exc

    def withdraw(self, job_id: str, worker_id: str) -> None:
        self._path(job_id, worker_id).unlink(missing_ok=True)

    def entries(self, job_id: str) -> list[WorkerEntry]:
        entries = []
        for path in sorted((self.root / job_id).glob("*.json")):
            try:
                entries.append(WorkerEntry.model_validate(json.loads(path.read_text())))
            except (OSError, ValueError):
                continue
        return entries


_SCHEMA = """
CREATE TABLE IF NOT EXISTS pronk_workers (
    job_id text NOT NULL,
    worker_id text NOT NULL,
    heartbeat_at double precision NOT NULL,
    entry jsonb NOT NULL,
    PRIMARY KEY (job_id, worker_id)
)
"""
_SCHEMA_LOCK = 0x70726F6E6B  # any constant: serialises the first CREATE TABLE of concurrent workers


class PostgresRegistry(Registry):
    """One row per worker in `pronk_workers` (made on first use), upserted by each heartbeat.

    One connection per instance, opened on first use, in autocommit, shared by its threads under a lock and
    opened again after a failure; every failure to reach the database is a `RegistryUnavailable`.
    """

    def __init__(self, url: str, heartbeat_timeout_s: float = 5.0, timeout_s: float = 3.0):
        super().__init__(heartbeat_timeout_s)
        self.url = url
        self.timeout_s = timeout_s
        self._conn: psycopg.Connection | None = None
        self._lock = threading.Lock()

    def _connect(self) -> psycopg.Connection:
        conn = psycopg.connect(
            self.url,
            autocommit=True,
            connect_timeout=max(1, round(self.timeout_s)),
            options=f"-c statement_timeout={int(self.timeout_s * 1000)}",
        )
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            conn.execute(_SCHEMA)
        return conn

    def _execute(self, query: str, params: tuple) -> list[tuple]:
        with self._lock:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = self._connect()
                cursor = self._conn.execute(query, params)
                return cursor.fetchall() if cursor.description else []
            except psycopg.Error as exc:
                if self._conn is not None:
                    self._conn.close()
                self._conn = None
                raise RegistryUnavailable(f"worker registry in PostgreSQL: {exc}") from exc

    def announce(self, entry: WorkerEntry) -> None:
        self._execute(
            "INSERT INTO pronk_workers (job_id, worker_id, heartbeat_at, entry) VALUES (%s, %s, %s, %s) "
            "ON CONFLICT (job_id, worker_id) "
            "DO UPDATE SET heartbeat_at = EXCLUDED.heartbeat_at, entry = EXCLUDED.entry",
            (entry.job_id, entry.worker_id, entry.heartbeat_at, Jsonb(entry.model_dump(mode="json"))),
        )

    def withdraw(self, job_id: str, worker_id: str) -> None:
        self._execute("DELETE FROM pronk_workers WHERE job_id = %s AND worker_id = %s", (job_id, worker_id))

    def entries(self, job_id: str) -> list[WorkerEntry]:
        rows = self._execute("SELECT entry FROM pronk_workers WHERE job_id = %s ORDER BY worker_id", (job_id,))
        return self._valid(rows)

    def live(self, job_id: str, now: float | None = None) -> list[WorkerEntry]:
        now = time.time() if now is None else now
        rows = self._execute(
            "SELECT entry FROM pronk_workers WHERE job_id = %s AND heartbeat_at >= %s ORDER BY worker_id",
            (job_id, now - self.heartbeat_timeout_s),
        )
        return self._valid(rows)

    @staticmethod
    def _valid(rows: list[tuple]) -> list[WorkerEntry]:
        entries = []
        for (entry,) in rows:
            try:
                entries.append(WorkerEntry.model_validate(entry))
            except ValidationError:
                log.warning("skipping a malformed worker registry row: %.200r", entry)
        return entries

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
            self._conn = None
