"""Prefect's server on SQLite vs PostgreSQL: recorded task runs per second and flow-run start latency.

Each round starts, per database, a fresh Prefect server (pronk's tuned server settings, an empty database: a new
SQLite file, or a new database on a PostgreSQL server started once with pronk's starter) and measures:

- recorded task runs/s: one flow run calls `--tasks` trivial tasks in a row (a client process of its own); the
  clock runs from the flow's start until the server counts all of them Completed;
- flow-run start latency: a deployment served with `flow.serve` (polling every second) gets `--starts` flow
  runs created one after another; each one's latency is its Running state's time minus its creation time.

The backends alternate within each round and every round's value is kept; the report gives medians and ranges.

    .venv/bin/python -m bench.prefect_db [--rounds 3] [--tasks 500] [--starts 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import httpx

RESULTS = Path(__file__).with_name("prefect_db.json")


def many_tasks(n: int) -> None:
    """The client side: one flow run of `n` task runs; prints when the flow started."""
    from prefect import flow, task

    @task
    def noop(i: int) -> int:
        return i

    @flow(name="many-tasks")
    def many() -> None:
        print(json.dumps({"started": time.time()}), flush=True)
        for i in range(n):
            noop(i)

    many()


def serve_hello() -> None:
    from prefect import flow

    @flow(name="hello")
    def hello() -> None:
        pass

    hello.serve(name="latency", print_starting_message=False)


def _env(api_url: str, home: Path, database_url: str | None) -> dict[str, str]:
    from pronk.stack.postgres import PREFECT_ON_POSTGRES
    from pronk.stack.prefect_env import TUNED_SERVER

    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(TUNED_SERVER)
    env.update(
        {
            "PREFECT_HOME": str(home),
            "PREFECT_API_URL": api_url,
            "PREFECT_LOGGING_LEVEL": "WARNING",
            "PREFECT_UI_ENABLED": "false",
            "PREFECT_RUNNER_POLL_FREQUENCY": "1",
        }
    )
    if database_url:
        env["PREFECT_API_DATABASE_CONNECTION_URL"] = database_url
        env.update(PREFECT_ON_POSTGRES)
    return env


def _completed_task_runs(api: str) -> int:
    body = {"task_runs": {"state": {"type": {"any_": ["COMPLETED"]}}}}
    return int(httpx.post(f"{api}/task_runs/count", json=body, timeout=10).json())


def _stamp(value: str) -> float:
    return datetime.fromisoformat(value).timestamp()


def measure(database_url: str | None, tasks: int, starts: int) -> dict[str, float | list[float]]:
    from engine.worker import free_port
    from pronk.stack.processes import stop, wait_healthy

    home = Path(tempfile.mkdtemp(prefix="prefect-db-"))
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = _env(api, home, database_url)
    argv = [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)]
    with open(home / "server.log", "ab") as server_log:  # kept: the report names where to look
        server = subprocess.Popen(argv, env=env, stdout=server_log, stderr=subprocess.STDOUT, start_new_session=True)
    served = None
    try:
        wait_healthy(f"{api}/health", "Prefect server", server.pid, home / "server.log", timeout_s=180)
        client = subprocess.run(
            [sys.executable, "-m", "bench.prefect_db", "--client", str(tasks)],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if client.returncode != 0:
            raise RuntimeError(client.stderr[-2000:])
        started = json.loads(client.stdout.strip().splitlines()[0])["started"]
        client_done = time.time()
        while _completed_task_runs(api) < tasks:
            if time.time() - started > 300:
                raise RuntimeError("task runs not all recorded after 300 s")
            time.sleep(0.1)
        recorded = time.time()

        served = subprocess.Popen(
            [sys.executable, "-m", "bench.prefect_db", "--serve"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 120
        while True:
            found = httpx.get(f"{api}/deployments/name/hello/latency", timeout=10)
            if found.status_code == 200:
                deployment_id = found.json()["id"]
                break
            if time.monotonic() > deadline:
                raise RuntimeError("the served deployment never appeared")
            time.sleep(0.5)
        time.sleep(2)  # let the runner make its first poll
        latencies = []
        for _ in range(starts):
            run = httpx.post(f"{api}/deployments/{deployment_id}/create_flow_run", json={}, timeout=10).json()
            while True:
                state = httpx.get(f"{api}/flow_runs/{run['id']}", timeout=10).json()
                if state["start_time"]:
                    latencies.append(_stamp(state["start_time"]) - _stamp(run["created"]))
                    break
                time.sleep(0.1)
            while httpx.get(f"{api}/flow_runs/{run['id']}", timeout=10).json()["state_type"] == "RUNNING":
                time.sleep(0.2)
        return {
            "server_log": str(home / "server.log"),
            "task_runs_per_s": tasks / (recorded - started),
            "client_task_runs_per_s": tasks / (client_done - started),
            "start_latency_s": statistics.median(latencies),
            "start_latencies_s": latencies,
        }
    finally:
        for process in (served, server):
            if process is not None:
                stop(process.pid)
                process.wait()


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=500)
    parser.add_argument("--starts", type=int, default=3)
    parser.add_argument("--client", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        return many_tasks(args.client)
    if args.serve:
        return serve_hello()

    from pronk.settings import Settings
    from pronk.stack.postgres import POSTGRES, connect, start_postgres
    from pronk.stack.processes import stop

    settings = Settings(data_dir=Path(tempfile.mkdtemp(prefix="prefect-db-pg-")))
    state: dict[str, int] = {}
    server = start_postgres(settings, state)
    rounds: dict[str, list[dict]] = {"sqlite": [], "postgres": []}
    try:
        for r in range(args.rounds):
            with connect(server) as conn:
                conn.execute(f'CREATE DATABASE "prefect_round{r}"')
            urls = {"sqlite": None, "postgres": server.url(f"prefect_round{r}", scheme="postgresql+asyncpg")}
            for name in ["sqlite", "postgres"] if r % 2 == 0 else ["postgres", "sqlite"]:
                result = measure(urls[name], args.tasks, args.starts)
                rounds[name].append(result)
                print(f"round {r + 1} {name}: {json.dumps(result)}", flush=True)
    finally:
        stop(state[POSTGRES])
    report = {"tasks": args.tasks, "starts": args.starts, "cores": os.cpu_count(), "rounds": rounds}
    RESULTS.write_text(json.dumps(report, indent=2))
    print("\n| database | recorded task runs/s | client task runs/s | flow-run start latency (s) |")
    print("| --- | --- | --- | --- |")
    for name, values in rounds.items():
        print(
            f"| {name} | {_spread([v['task_runs_per_s'] for v in values])} "
            f"| {_spread([v['client_task_runs_per_s'] for v in values])} "
            f"| {_spread([v['start_latency_s'] for v in values])} |"
        )


if __name__ == "__main__":
    main()
