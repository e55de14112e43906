"""`pronk keys` and `pronk api` as a user runs them (subprocesses on a local store)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx

from pronk.api.keys import ApiKeyStore
from pronk.engine.worker import free_port
from pronk.settings import Settings
from pronk.stack.processes import spawn, stop, wait_healthy

PRONK = str(Path(sys.executable).parent / "pronk")


def local_env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PRONK_DATA_DIR": str(tmp_path), "PRONK_STORAGE_URI": str(tmp_path / "store")}


def pronk(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PRONK, *args], env=env, capture_output=True, text=True, timeout=60)


def test_keys_create_list_revoke_store_only_a_hash(tmp_path):
    env = local_env(tmp_path)
    created = pronk(env, "keys", "create", "--owner", "team-a", "--name", "laptop")
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    store = ApiKeyStore(Settings(data_dir=tmp_path, storage_uri=str(tmp_path / "store")))
    record = store.lookup(key)
    assert key.startswith("pk-") and record.owner == "team-a" and record.name == "laptop"
    assert not any(key in p.read_text() for p in (tmp_path / "store").rglob("*") if p.is_file())

    listed = pronk(env, "keys", "list").stdout
    assert record.key_id in listed and "team-a" in listed and key not in listed
    assert pronk(env, "keys", "revoke", record.key_id).returncode == 0 and store.lookup(key) is None
    assert pronk(env, "keys", "revoke", record.key_id).returncode == 1
    assert pronk(env, "keys", "create", "--owner", "../etc").returncode == 1


def test_pronk_api_serves_with_auth_switched_on_the_command_line(tmp_path):
    port = free_port()
    pid = spawn([PRONK, "api", "--port", str(port), "--auth"], tmp_path / "api.log", env=local_env(tmp_path))
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", "pronk api", pid, tmp_path / "api.log", timeout_s=60)
        response = httpx.get(f"http://127.0.0.1:{port}/v1/batches")
        assert response.status_code == 401 and response.json()["error"]["code"] == "missing_api_key"
    finally:
        stop(pid)


def test_a_refusal_ends_the_command_with_its_message_and_no_traceback(tmp_path):
    for args in (("leap", "status", "--job", "nope"), ("job", "show", "--job", "nope")):
        done = pronk(local_env(tmp_path), *args)
        assert done.returncode == 1
        assert done.stderr.startswith("pronk: no job 'nope' (a job id or name); known: "), done.stderr
        assert "job-c0ffee01 (tiny-cpu)" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_batch_run_on_an_empty_file_a_directory_or_no_file_says_which_and_writes_nothing(tmp_path):
    env = local_env(tmp_path)
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n  \n")
    out = tmp_path / "out"
    for given, says in (
        (blank, "has no request lines (it is empty or blank): nothing was run or written"),
        (tmp_path, "is a directory"),
        (tmp_path / "missing.jsonl", "does not exist"),
    ):
        done = pronk(env, "batch", "run", str(given), "--out", str(out))
        assert done.returncode == 1 and done.stdout == "", done.stdout
        assert done.stderr.startswith("pronk: input ") and says in done.stderr, done.stderr
    assert not out.exists() and not (tmp_path / "store").exists()


def test_a_flow_run_logs_a_refusal_without_its_traceback_and_any_other_error_with_it():
    import logging

    from pronk.pronk_error import PronkError
    from pronk.stack.prefect_env import RefusalsWithoutTraceback

    def logged(exc: Exception) -> logging.LogRecord:
        try:
            raise exc
        except (PronkError, RuntimeError):
            record = logging.LogRecord("prefect.flow_runs", logging.ERROR, __file__, 1, "failed", None, sys.exc_info())
        assert RefusalsWithoutTraceback().filter(record)
        return record

    assert logged(PronkError("refused")).exc_info is None
    assert logged(RuntimeError("a bug")).exc_info is not None


def test_a_stack_that_is_not_up_ends_the_command_with_one_line_and_no_traceback(tmp_path):
    from pronk.batches.schemas import Batch
    from pronk.batches.store import BatchStore

    port = free_port()
    env = {**local_env(tmp_path), "PREFECT_API_URL": f"http://127.0.0.1:{port}/api"}
    batch = Batch(input_file_id=str(tmp_path / "in.jsonl"), job_id="job-c0ffee01", model="pronk-tiny")
    BatchStore(Settings(data_dir=tmp_path, storage_uri=str(tmp_path / "store"))).create(batch)
    done = pronk(env, "batch", "resume", batch.id, "--deployment")
    assert done.returncode == 1
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith(f"pronk: cannot reach http://127.0.0.1:{port} (All connection attempts failed): is the stack up?")
    )
    assert "Traceback" not in done.stderr, done.stderr
