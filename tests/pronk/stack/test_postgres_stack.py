"""`pronk stack up --postgres` as a user types it: Prefect on the stack's PostgreSQL, workers announcing in it.

A stack of its own (data dir, ports, local store), started and stopped through the command line in subprocesses
with an environment of its own, beside the session's SQLite stack. A small batch runs through the run-batch
deployment; Prefect's flow and task runs must be rows of PostgreSQL's `flow_run` and `task_run` tables, the
workers rows of `pronk_workers`, and `stack down` must leave no PostgreSQL process.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import pytest

from pronk.batches.store import BatchStore
from pronk.engine.worker import free_port
from pronk.settings import Settings
from pronk.stack.postgres import POSTGRES, PostgresError, PostgresServer, find_binaries
from pronk.stack.processes import group_members
from tests.flows.deployment_runs import run_batch_deployment

pytestmark = pytest.mark.e2e
JOB = "job-c0ffee01"
DATA = Path(__file__).resolve().parents[2] / "data"


def pronk(env: dict[str, str], *args: str, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from pronk.cli.main import main; main()", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


@pytest.fixture
def postgres_stack():
    data_dir = Path(tempfile.mkdtemp(prefix="pronk-pgstack-"))
    try:
        find_binaries(Settings(data_dir=data_dir))
    except PostgresError as exc:
        pytest.skip(str(exc))
    server = PostgresServer("127.0.0.1", free_port(), secrets.token_urlsafe(16))
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_", "PRONK_"))}
    env.update(
        {
            "PRONK_DATA_DIR": str(data_dir),
            "PRONK_PREFECT_PORT": str(free_port()),
            "PRONK_MLFLOW_PORT": str(free_port()),
            "PRONK_API_PORT": str(free_port()),
            "PRONK_POSTGRES_PORT": str(server.port),
            "PRONK_POSTGRES_PASSWORD": server.password,
            "PRONK_REGISTRY_URL": server.url("pronk"),
        }
    )
    try:
        up = pronk(env, "stack", "up", "--postgres", "--job", "tiny-cpu", "--no-mlflow-ui", "--no-api")
        assert up.returncode == 0, up.stdout + up.stderr
        yield env, server, data_dir
    finally:
        state_file = data_dir / "stack.json"
        state = json.loads(state_file.read_text()) if state_file.exists() else {}
        down = pronk(env, "stack", "down", timeout_s=180)
        assert down.returncode == 0, down.stdout + down.stderr
        assert POSTGRES in state, f"stack up started no PostgreSQL: {state}"
        assert not group_members(state[POSTGRES]), "stack down left PostgreSQL running"
        cluster = str(data_dir / "postgres")
        left = [p for p in Path("/proc").iterdir() if p.name.isdigit() and cluster in _cmdline(p)]
        assert not left, f"processes on the cluster after stack down: {left}"
        shutil.rmtree(data_dir, ignore_errors=True)


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_a_batch_on_the_postgres_stack_keeps_prefects_state_and_the_registry_in_postgres(postgres_stack, tmp_path):
    env, server, data_dir = postgres_stack
    with psycopg.connect(server.url("pronk"), autocommit=True) as conn:
        workers = conn.execute("SELECT worker_id FROM pronk_workers WHERE job_id = %s ORDER BY 1", (JOB,)).fetchall()
    assert [w for (w,) in workers] == [f"{JOB}-w0", f"{JOB}-w1"]
    assert not list((data_dir / "registry").glob("*/*.json")), "a worker announced itself in the file registry"

    prefect_env = {
        **env,
        "PREFECT_API_URL": f"http://127.0.0.1:{env['PRONK_PREFECT_PORT']}/api",
        "PREFECT_HOME": str(data_dir / "prefect"),
    }
    started = run_batch_deployment(
        env=prefect_env,
        input_uri=DATA / "mixed_batch.jsonl",
        job_id=JOB,
        output_dir=tmp_path,
        batch_id="batch_onpostgres",
        trace_sample=0,
    )
    assert started.returncode == 0, started.stdout + started.stderr
    flow_run_id = re.search(r"UUID: ([0-9a-f-]{36})", started.stdout).group(1)  # type: ignore[union-attr]

    # The stack's own store (its data dir), not the S3 store this test session's environment may name.
    stored = BatchStore(Settings(data_dir=data_dir, storage_uri=str(data_dir / "store"))).load("batch_onpostgres")
    assert stored.status == "completed" and stored.request_counts.completed == 3
    steps = [json.loads(line) for line in Path(stored.steps_uri).read_text().splitlines()]
    assert {step["worker_id"] for step in steps} <= {w for (w,) in workers}

    with psycopg.connect(server.url("prefect"), autocommit=True) as conn:
        state = conn.execute("SELECT state_type FROM flow_run WHERE id = %s", (flow_run_id,)).fetchone()
        assert state == ("COMPLETED",)
        deadline = time.monotonic() + 60
        while True:  # task runs are recorded from events, a moment after the flow run ends
            task_runs = conn.execute(
                "SELECT count(*) FROM task_run WHERE flow_run_id = %s AND state_type = 'COMPLETED'", (flow_run_id,)
            ).fetchone()[0]
            if task_runs or time.monotonic() > deadline:
                break
            time.sleep(1)
    assert task_runs >= 1
    assert not list((data_dir / "prefect").glob("*.db")), "the Prefect server wrote a SQLite database"
