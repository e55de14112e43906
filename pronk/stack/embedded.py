"""The embedded stack: Prefect server (on PostgreSQL where the machine has it, `pronk.stack.postgres`, else
SQLite), MLflow UI on SQLite, a process work pool worker, and the default job's workers.

`pronk stack up` starts it all in the background under the data dir, records the pids in
`stack.json`, and leaves a supervisor (`pronk.stack.supervisor`) restarting workers that die;
`pronk stack down` stops the supervisor first, then the data dir's trace-sample drawer (which records no pid in
`stack.json`: `pronk.control.trace_sample.lock` finds it), then every process group it recorded.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from typing import Literal

from pronk.control.trace_sample.lock import running_drawer
from pronk.jobs.catalog import resolve_job
from pronk.jobs.schema import JobConfig
from pronk.models.imports import ensure_job_model
from pronk.models.registry import ensure_tiny_model
from pronk.settings import PROJECT_ROOT, Settings
from pronk.stack.fleet import start_workers, wait_for_workers
from pronk.stack.postgres import POSTGRES, PREFECT_ON_POSTGRES, cannot_start, cluster_dir, start_postgres
from pronk.stack.prefect_env import prefect_environment
from pronk.stack.prefect_yaml import write_prefect_yaml
from pronk.stack.processes import alive, group_members, spawn, stop_groups, wait_healthy
from pronk.stack.state import SUPERVISOR, read_state, state_path, worker_name, worker_of, write_state
from pronk.stack.supervisor import report_path, start_supervisor, stop_supervisor
from pronk.worker_token import worker_token

log = logging.getLogger(__name__)
WORK_POOL = "pronk"
TRACE_SAMPLE_DRAWER = "trace-sample drawer"
WORK_MAKERS = ("prefect-worker", "api")
"""What `down` stops first: the processes that send steps to the engine workers (the Prefect worker's flow runs)
or start runs (the API)."""
DATABASE_URL_KEYS = ("PREFECT_API_DATABASE_CONNECTION_URL", "PREFECT_SERVER_DATABASE_CONNECTION_URL")


def _prefect(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "prefect", *args],
        env={**os.environ, **env},
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def prefect_database(settings: Settings) -> Literal["sqlite", "postgres"]:
    """`settings.prefect_database` with `auto` resolved: the database the data dir holds already (a PostgreSQL
    cluster, or Prefect's SQLite file, so an earlier stack's runs stay visible), else PostgreSQL where the stack can
    start it, else SQLite."""
    if settings.prefect_database != "auto":
        return settings.prefect_database
    if (cluster_dir(settings) / "PG_VERSION").exists():
        return "postgres"
    if (settings.data_dir / "prefect" / "prefect.db").exists():
        return "sqlite"
    reason = cannot_start(settings)
    if reason is not None:
        log.info("Prefect on SQLite: %s", reason)
        return "sqlite"
    return "postgres"


def prefect_database_url(settings: Settings, state: dict[str, int]) -> str | None:
    """The PostgreSQL URL the Prefect server should use, starting the stack's own server for it when needed.

    None means Prefect's default (SQLite under the data dir), or a database URL the user set already
    (`PREFECT_API_DATABASE_CONNECTION_URL`), which the server reads from the environment itself.
    """
    if any(key in os.environ for key in DATABASE_URL_KEYS):
        return None
    if prefect_database(settings) == "sqlite" and not alive(state.get(POSTGRES, 0)):
        return None
    return start_postgres(settings, state).url("prefect", scheme="postgresql+asyncpg")


def start_prefect_server(settings: Settings, state: dict[str, int], database_url: str | None) -> None:
    """Start the Prefect server on `database_url` (from `prefect_database_url`) and wait until it answers."""
    env = prefect_environment(settings)
    if database_url is not None:
        env["PREFECT_API_DATABASE_CONNECTION_URL"] = database_url
    if (database_url or next((os.environ[k] for k in DATABASE_URL_KEYS if k in os.environ), "")).startswith("postgres"):
        env.update({key: os.environ.get(key, value) for key, value in PREFECT_ON_POSTGRES.items()})
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


def end_dead_flow_runs(settings: Settings) -> None:
    """Mark crashed the flow runs a stopped stack left RUNNING on this host (`pronk.control.dead_runs`), so none holds
    a deployment's concurrency slot; in a process of its own, as Prefect's settings are this stack's there. Trouble
    is logged: the API's reconcile loop looks again every `reconcile_interval_s`."""
    argv = [sys.executable, "-m", "pronk.control.dead_runs"]
    try:
        ended = subprocess.run(
            argv, env={**os.environ, **prefect_environment(settings)}, capture_output=True, text=True, timeout=120
        )
    except subprocess.TimeoutExpired:
        log.warning("looking for dead flow runs took over 120 s; the API's reconcile loop looks again")
        return
    if ended.returncode != 0:
        log.warning("looking for dead flow runs failed: %s", ended.stderr.strip()[-2000:])
    elif ended.stdout.strip():
        log.warning("flow runs left by a stopped stack:\n%s", ended.stdout.strip())


def deploy_flows(settings: Settings, state: dict[str, int]) -> None:
    """Create the process work pool, limited to `prefect_pool_concurrency` flow runs at once, deploy
    `deployments/prefect.yaml` and the enrichment specs' deployments (`pronk.stack.prefect_yaml`), and start a
    worker for the pool."""
    env = {
        **prefect_environment(settings),
        "PRONK_PROJECT_ROOT": str(PROJECT_ROOT),
        "PRONK_DATA_DIR": str(settings.data_dir),
        # A batch made through the API starts when the worker next polls (Prefect's default: every 10 s).
        "PREFECT_WORKER_QUERY_SECONDS": os.environ.get("PREFECT_WORKER_QUERY_SECONDS", "2"),
    }
    _prefect(["work-pool", "create", WORK_POOL, "--type", "process", "--overwrite"], env)
    limit = str(settings.prefect_pool_concurrency)
    limited = _prefect(["work-pool", "set-concurrency-limit", WORK_POOL, limit], env)
    if limited.returncode != 0:
        raise RuntimeError(f"limiting work pool {WORK_POOL} failed:\n{limited.stdout}\n{limited.stderr}")
    project = write_prefect_yaml(settings.data_dir / "prefect.yaml")
    deployed = _prefect(["--no-prompt", "deploy", "--all", "--prefect-file", str(project)], env)
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
        "pronk.api.app:from_environment",
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


def spawn_job(job: JobConfig, settings: Settings, state: dict[str, int]) -> dict[str, int]:
    """Spawn the job's workers that are not running (all of them on a first start), recorded in `state`, without
    waiting for them; returns worker id -> pid of those spawned."""
    missing = [i for i in range(job.workers) if not alive(state.get(worker_name(job.job_id, i), 0))]
    if not missing:
        return {}
    ensure_job_model(job.model, job.model_source, settings)
    pids = start_workers(job, settings, indices=missing)
    state.update(pids)
    return pids


def start_job(job: JobConfig, settings: Settings, state: dict[str, int]) -> None:
    """Start the job's workers that are not running and wait for them."""
    wait_for_workers(job, settings, spawn_job(job, settings, state))


def up(
    settings: Settings,
    job_name: str | None = None,
    mlflow_ui: bool = True,
    deploy: bool = True,
    api: bool = True,
    supervise: bool = True,
) -> dict[str, int]:
    """Bring the embedded stack up (idempotent: running parts are left alone) and (re)start its supervisor.

    A running supervisor is stopped first, so it and `up` never start the same worker twice; the new
    one starts with fresh restart counts, which also gives workers it had given up on another chance.
    `supervise=False` leaves it out, for callers that stop and start the workers themselves (benchmarks).
    """
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    state = read_state(settings)
    stop_supervisor(settings, state)
    try:
        worker_token(settings)  # made once here, before any worker or flow run races to make it
        ensure_tiny_model(settings)
        database_url = prefect_database_url(settings, state)  # PostgreSQL first: the workers may announce in it
        job = resolve_job(job_name or settings.default_job, settings)
        # The workers load their model (the longest start) while Prefect, MLflow and the API start beside them.
        workers = spawn_job(job, settings, state)
        start_prefect_server(settings, state, database_url)
        end_dead_flow_runs(settings)
        if mlflow_ui:
            start_mlflow_ui(settings, state)
        if deploy:
            deploy_flows(settings, state)
        if api:
            start_api(settings, state)
        wait_for_workers(job, settings, workers)
    finally:
        write_state(settings, state)
    if supervise:
        start_supervisor(settings, state)
    return state


def stop_trace_sample_drawer(settings: Settings, timeout_s: float = 10.0, kill_timeout_s: float = 5.0) -> bool:
    """Stop the data dir's trace-sample drawer, if one runs: SIGTERM, then SIGKILL after `timeout_s`; whether one ran.

    Flow runs start it, not `up`, and it would outlive the Prefect server it draws for. Before each signal the pid is
    checked to be still the drawer's (`running_drawer`), so a process that took over its pid is never signalled.
    """
    pid = running_drawer(settings)
    if pid is None:
        return False
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, kill_timeout_s)):
        if running_drawer(settings) != pid:
            return True
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return True
        deadline = time.monotonic() + wait_s
        while running_drawer(settings) == pid and time.monotonic() < deadline:
            time.sleep(0.1)
    if running_drawer(settings) == pid:
        log.error("%s: pid %d still runs after SIGKILL", TRACE_SAMPLE_DRAWER, pid)
    return True


def down(settings: Settings) -> list[str]:
    """Stop everything `up` started and their process groups: the supervisor first (so it restarts nothing), then
    the trace-sample drawer that flow runs started (before the Prefect server it draws for), then what makes work (the
    Prefect worker with its flow runs, and the API), while the engine workers still serve their steps: a step cut
    off by a worker stopping first would end its line `engine_unavailable`, where a flow run stopped first leaves
    the line for its batch's next run. Then the workers (so they withdraw from the registry and take vLLM's engine
    processes with them), then the rest, PostgreSQL last (its clients first, so it has no sessions left to wait
    for). The processes of each wave stop together.
    """
    state = read_state(settings)
    stopped = [SUPERVISOR] if SUPERVISOR in state else []
    stop_supervisor(settings, state)
    if stop_trace_sample_drawer(settings):
        stopped.append(TRACE_SAMPLE_DRAWER)
    order = sorted(state, key=lambda name: (name not in WORK_MAKERS, worker_of(name) is None, name == POSTGRES, name))
    workers = [name for name in order if worker_of(name) is not None]
    makers = [name for name in order if name in WORK_MAKERS]
    rest = [n for n in order if n not in workers and n not in makers and n != POSTGRES]
    for wave in (makers, workers, rest, [POSTGRES]):
        pids = {name: state[name] for name in wave if name in state}
        emptied = stop_groups(pids.values())  # a wave stops together
        for name, pid in pids.items():
            if not emptied[pid]:
                log.error("%s: process group %d still has %s after SIGKILL", name, pid, group_members(pid))
    state_path(settings).unlink(missing_ok=True)
    report_path(settings).unlink(missing_ok=True)
    return stopped + order
