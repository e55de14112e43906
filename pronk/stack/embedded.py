"""The embedded stack: Prefect server, MLflow UI on SQLite, a process work pool worker, and the default job's workers.

`pronk stack up` starts it all in the background under the data dir and records the pids in
`stack.json`; `pronk stack down` stops them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from pronk.jobs import JobConfig, get_job
from pronk.models.registry import ensure_tiny_model
from pronk.settings import PROJECT_ROOT, Settings
from pronk.stack.fleet import start_workers, wait_for_workers
from pronk.stack.prefect_env import prefect_environment
from pronk.stack.processes import alive, spawn, stop, wait_healthy

WORK_POOL = "pronk"


def _state_path(settings: Settings) -> Path:
    return settings.data_dir / "stack.json"


def read_state(settings: Settings) -> dict[str, int]:
    path = _state_path(settings)
    return json.loads(path.read_text()) if path.exists() else {}


def _write_state(settings: Settings, state: dict[str, int]) -> None:
    _state_path(settings).write_text(json.dumps(state, indent=2))


def _prefect(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "prefect", *args],
        env={**os.environ, **env},
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def start_prefect_server(settings: Settings, state: dict[str, int]) -> None:
    env = prefect_environment(settings)
    if "prefect-server" not in state or not alive(state["prefect-server"]):
        log = settings.logs_dir / "prefect-server.log"
        argv = [
            sys.executable,
            "-m",
            "prefect",
            "server",
            "start",
            "--host",
            "127.0.0.1",
            "--port",
            str(settings.prefect_port),
        ]
        state["prefect-server"] = spawn(argv, log, env=env)
        wait_healthy(env["PREFECT_API_URL"] + "/health", "Prefect server", state["prefect-server"], log)


def deploy_flows(settings: Settings, state: dict[str, int]) -> None:
    """Create the process work pool, deploy `deployments/prefect.yaml`, and start a worker for the pool."""
    env = {
        **prefect_environment(settings),
        "PRONK_PROJECT_ROOT": str(PROJECT_ROOT),
        "PRONK_DATA_DIR": str(settings.data_dir),
        # A batch made through the API starts when the worker next polls (Prefect's default: every 10 s).
        "PREFECT_WORKER_QUERY_SECONDS": os.environ.get("PREFECT_WORKER_QUERY_SECONDS", "2"),
    }
    _prefect(["work-pool", "create", WORK_POOL, "--type", "process", "--overwrite"], env)
    deployed = _prefect(["--no-prompt", "deploy", "--all", "--prefect-file", "deployments/prefect.yaml"], env)
    if deployed.returncode != 0:
        raise RuntimeError(f"prefect deploy failed:\n{deployed.stdout}\n{deployed.stderr}")
    if "prefect-worker" not in state or not alive(state["prefect-worker"]):
        argv = [sys.executable, "-m", "prefect", "worker", "start", "--pool", WORK_POOL, "--type", "process"]
        state["prefect-worker"] = spawn(argv, settings.logs_dir / "prefect-worker.log", env=env, cwd=PROJECT_ROOT)


def start_mlflow_ui(settings: Settings, state: dict[str, int]) -> None:
    if "mlflow-server" in state and alive(state["mlflow-server"]):
        return
    log = settings.logs_dir / "mlflow-server.log"
    argv = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        settings.tracking_uri,
        "--default-artifact-root",
        settings.artifact_root.as_uri(),
        "--host",
        "127.0.0.1",
        "--port",
        str(settings.mlflow_port),
        "--workers",
        "1",
    ]
    state["mlflow-server"] = spawn(argv, log)


def start_api(settings: Settings, state: dict[str, int]) -> None:
    """Serve `pronk api` (the OpenAI-compatible Files and Batches API) on 127.0.0.1:`api_port`."""
    if "api" in state and alive(state["api"]):
        return
    log = settings.logs_dir / "api.log"
    argv = [
        sys.executable,
        "-m",
        "uvicorn",
        "pronk.api.app:create_app",
        "--factory",
        "--host",
        "127.0.0.1",
        "--port",
        str(settings.api_port),
        "--log-level",
        "warning",
    ]
    env = {**prefect_environment(settings), "PRONK_DATA_DIR": str(settings.data_dir)}
    state["api"] = spawn(argv, log, env=env, cwd=PROJECT_ROOT)
    wait_healthy(f"http://127.0.0.1:{settings.api_port}/health", "pronk API", state["api"], log)


def start_job(job: JobConfig, settings: Settings, state: dict[str, int]) -> None:
    """Start the job's workers that are not running (all of them on a first start) and wait for them."""
    wanted = range(job.workers)
    missing = [i for i in wanted if not alive(state.get(f"{job.job_id}-w{i}", 0))]
    if not missing:
        return
    pids = start_workers(job, settings, indices=missing)
    state.update(pids)
    wait_for_workers(job, settings, pids)


def up(
    settings: Settings, job_name: str | None = None, mlflow_ui: bool = True, deploy: bool = True, api: bool = True
) -> dict[str, int]:
    """Bring the embedded stack up (idempotent: running parts are left alone)."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    state = read_state(settings)
    try:
        ensure_tiny_model(settings)
        start_prefect_server(settings, state)
        if mlflow_ui:
            start_mlflow_ui(settings, state)
        if deploy:
            deploy_flows(settings, state)
        if api:
            start_api(settings, state)
        start_job(get_job(job_name or settings.default_job), settings, state)
    finally:
        _write_state(settings, state)
    return state


def down(settings: Settings) -> list[str]:
    """Stop everything `up` started, workers first so they withdraw from the registry."""
    state = read_state(settings)
    order = sorted(state, key=lambda name: (not name.startswith("job-"), name))
    for name in order:
        stop(state[name])
    _state_path(settings).unlink(missing_ok=True)
    return order
