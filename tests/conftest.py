"""Test settings: every test session gets its own data dir and ports, set before Prefect is imported.

The `stack` fixture starts the real embedded stack once per session (Prefect server, the run-batch
deployment with a process worker, the tiny model in MLflow on SQLite, two vLLM workers, `pronk api`
with auth on). Files and batch records live on moto's S3 server (`object_store`), whose address is
put in the environment before the stack starts, so every process shares one bucket.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from pronk.engine.worker import free_port

_DATA_DIR = Path(tempfile.mkdtemp(prefix="pronk-test-"))
os.environ.update(
    {
        "PRONK_DATA_DIR": str(_DATA_DIR),
        "PRONK_PREFECT_PORT": str(free_port()),
        "PRONK_MLFLOW_PORT": str(free_port()),
        "PRONK_API_PORT": str(free_port()),
        "PRONK_API_AUTH": "true",
        "PRONK_WEIGHTS_ROOT": tempfile.gettempdir(),  # checkpoints the tests upload over HTTP live in tmp dirs
        "PRONK_RECONCILE_INTERVAL_S": "3",
        "PRONK_DEFAULT_JOB": "job-c0ffee01",  # the tiny random model: fast, and no test asserts what a model writes
    }
)
for key in [k for k in os.environ if k.startswith("PREFECT_")]:
    del os.environ[key]

from pronk.settings import Settings, get_settings  # noqa: E402
from pronk.stack.prefect_env import configure_prefect  # noqa: E402

get_settings.cache_clear()
configure_prefect(get_settings())

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """The tiny model made once for the session's unit tests (its tokenizer's training takes ~10 s): treat it as
    read-only, copy it to change it."""
    from pronk.models.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def object_store():
    """moto's S3 server on 127.0.0.1 as the store (`PRONK_STORAGE_URI=s3://…`) of this process and all it spawns."""
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    os.environ.update(
        {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "PRONK_S3_ENDPOINT_URL": endpoint,
            "PRONK_STORAGE_URI": "s3://pronk-test/store",
        }
    )
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="pronk-test")
    get_settings.cache_clear()
    try:
        yield endpoint
    finally:
        server.stop()


@pytest.fixture(scope="session")
def settings(object_store) -> Settings:
    return get_settings()


@pytest.fixture(scope="session")
def stack(settings: Settings):
    """The real embedded stack with the default job's two workers; stopped at the end of the session.

    Stopping it must leave none of the process groups it recorded (vLLM's engine processes included), nor the
    trace-sample drawer its batches started.
    """
    from pronk.control.trace_sample.lock import running_drawer
    from pronk.stack import embedded
    from pronk.stack.processes import group_members

    try:
        embedded.up(settings, mlflow_ui=False)
        yield settings
    finally:
        groups = embedded.read_state(settings)
        embedded.down(settings)
        survivors = {name: group_members(pid) for name, pid in groups.items() if group_members(pid)}
        assert not survivors, f"stack down left processes behind: {survivors}"
        assert running_drawer(settings) is None, "stack down left the trace-sample drawer running"


@pytest.fixture(scope="session")
def postgres_server():
    """A PostgreSQL server of its own, started by the stack's starter (`pronk.stack.postgres`) under a temporary
    data dir and stopped at the end of the session; skipped where the machine has no PostgreSQL binaries.

    The data dir is made in the system's temp folder, not pytest's: run as root, the server runs as another user,
    who cannot pass through pytest's 0700 folders.
    """
    from pronk.stack.postgres import POSTGRES, PostgresError, find_binaries, start_postgres
    from pronk.stack.processes import group_members, stop

    settings = Settings(data_dir=Path(tempfile.mkdtemp(prefix="pronk-postgres-")))
    try:
        find_binaries(settings)
    except PostgresError as exc:
        pytest.skip(str(exc))
    state: dict[str, int] = {}
    try:
        yield start_postgres(settings, state)
    finally:
        if POSTGRES in state:
            stop(state[POSTGRES])
            assert not group_members(state[POSTGRES]), "PostgreSQL left processes behind"
        shutil.rmtree(settings.data_dir, ignore_errors=True)
