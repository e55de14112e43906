"""Both registries keep one semantics: announce upserts, withdraw removes, entries lists, live filters by heartbeat.

The PostgreSQL registry runs against a real server (the `postgres_server` fixture, started by the stack's starter).
"""

from __future__ import annotations

import threading
import time
import uuid

import psycopg
import pytest

from pronk.engine.registry import FileRegistry, PostgresRegistry, Registry, RegistryUnavailable, WorkerEntry
from pronk.engine.router import Router
from pronk.engine.worker_protocol import WorkerStats
from pronk.settings import Settings
from pronk.stack.postgres import PostgresServer
from pronk.worker_registry import worker_registry


def entry(job_id: str, worker_id: str, heartbeat_at: float, in_flight: int = 0) -> WorkerEntry:
    return WorkerEntry(
        worker_id=worker_id,
        job_id=job_id,
        url=f"http://10.0.0.1:81/{worker_id}",
        pid=123,
        started_at=heartbeat_at - 10,
        heartbeat_at=heartbeat_at,
        stats=WorkerStats(worker_id=worker_id, job_id=job_id, model_version="1", in_flight=in_flight),
    )


@pytest.fixture(params=["file", "postgres"])
def registry(request, tmp_path):
    if request.param == "file":
        yield FileRegistry(tmp_path, heartbeat_timeout_s=5.0)
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    made = PostgresRegistry(server.url("pronk"), heartbeat_timeout_s=5.0)
    yield made
    made.close()


@pytest.fixture
def job_id() -> str:
    """A job of its own per test: the PostgreSQL registry's table outlives a test."""
    return f"job-{uuid.uuid4().hex[:8]}"


def test_announce_upserts_and_entries_lists_by_worker_id(registry: Registry, job_id):
    now = time.time()
    registry.announce(entry(job_id, "w1", now))
    registry.announce(entry(job_id, "w0", now))
    registry.announce(entry(job_id, "w1", now + 1, in_flight=7))
    entries = registry.entries(job_id)
    assert [e.worker_id for e in entries] == ["w0", "w1"]
    assert entries[1].heartbeat_at == now + 1 and entries[1].stats.in_flight == 7
    assert entries[1] == entry(job_id, "w1", now + 1, in_flight=7)


def test_jobs_are_apart_and_withdraw_removes_one_worker(registry: Registry, job_id):
    now = time.time()
    other = f"{job_id}x"
    registry.announce(entry(job_id, "w0", now))
    registry.announce(entry(job_id, "w1", now))
    registry.announce(entry(other, "w0", now))
    registry.withdraw(job_id, "w0")
    registry.withdraw(job_id, "never-there")
    assert [e.worker_id for e in registry.entries(job_id)] == ["w1"]
    assert [e.worker_id for e in registry.entries(other)] == ["w0"]
    assert registry.entries("job-00000000") == []


def test_live_keeps_fresh_heartbeats_only(registry: Registry, job_id):
    now = time.time()
    registry.announce(entry(job_id, "fresh", now - 1))
    registry.announce(entry(job_id, "edge", now - 5))
    registry.announce(entry(job_id, "stale", now - 30))
    assert [e.worker_id for e in registry.live(job_id, now)] == ["edge", "fresh"]
    assert [e.worker_id for e in registry.live(job_id, now + 4.5)] == []
    assert "fresh" in [e.worker_id for e in registry.live(job_id)]  # now defaults to the clock


def test_registry_opens_by_location(tmp_path, postgres_server):
    assert isinstance(Registry.open(tmp_path), FileRegistry) and isinstance(Registry.open(str(tmp_path)), FileRegistry)
    assert isinstance(Registry.open("postgres://u@127.0.0.1/db"), PostgresRegistry)


def test_worker_registry_picks_the_registry_by_url(tmp_path, postgres_server):
    files = worker_registry(Settings(data_dir=tmp_path, heartbeat_timeout_s=7.0))
    assert isinstance(files, FileRegistry) and files.root == tmp_path / "registry" and files.heartbeat_timeout_s == 7.0
    url = postgres_server.url("pronk")
    database = worker_registry(Settings(data_dir=tmp_path, registry_url=url))
    assert isinstance(database, PostgresRegistry) and database.url == url
    with pytest.raises(ValueError, match="postgresql://"):
        Settings(registry_url="mysql://nope")


def test_two_hosts_see_each_others_workers(postgres_server, job_id):
    """Registries of separate processes share one table: what one announces, the other's router sees."""
    url = postgres_server.url("pronk")
    host_b, host_c, router_host = (PostgresRegistry(url) for _ in range(3))
    now = time.time()
    host_b.announce(entry(job_id, "b0", now))
    host_c.announce(entry(job_id, "c0", now))
    router = Router(job_id, router_host, token="t")
    assert {w.worker_id for w in router.workers()} == {"b0", "c0"}
    for made in (host_b, host_c, router_host):
        made.close()


def test_concurrent_first_use_makes_the_table_once(postgres_server, job_id):
    """Workers starting together race to create the table; the advisory lock lets each one through."""
    url = postgres_server.url("pronk")
    errors: list[BaseException] = []

    def announce(index: int) -> None:
        made = PostgresRegistry(url)
        try:
            made.announce(entry(job_id, f"w{index}", time.time()))
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)
        finally:
            made.close()

    threads = [threading.Thread(target=announce, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(PostgresRegistry(url).entries(job_id)) == 8


def test_a_malformed_row_is_skipped_not_fatal(postgres_server, job_id):
    url = postgres_server.url("pronk")
    made = PostgresRegistry(url)
    made.announce(entry(job_id, "w0", time.time()))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO pronk_workers VALUES (%s, 'bad', %s, %s)", (job_id, time.time(), '{"worker_id": 5}'))
    assert [e.worker_id for e in made.live(job_id)] == ["w0"]
    made.close()


def test_an_unreachable_database_is_registry_unavailable_and_the_router_keeps_its_last_read(postgres_server, job_id):
    made = PostgresRegistry(postgres_server.url("pronk"), heartbeat_timeout_s=5.0)
    made.announce(entry(job_id, "w0", time.time()))
    router = Router(job_id, made, refresh_interval_s=0.0, token="t")
    assert [w.worker_id for w in router.workers()] == ["w0"]
    made.url = PostgresServer(postgres_server.host, postgres_server.port, "wrong").url("pronk")
    made.close()
    with pytest.raises(RegistryUnavailable):
        made.live(job_id)
    assert [w.worker_id for w in router.workers()] == ["w0"]


def test_a_file_registry_that_cannot_write_is_registry_unavailable(tmp_path):
    blocker = tmp_path / "job-c0ffee01"
    blocker.write_text("a file where the job's folder should be")
    with pytest.raises(RegistryUnavailable):
        FileRegistry(tmp_path).announce(entry("job-c0ffee01", "w0", time.time()))
