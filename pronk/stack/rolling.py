"""Rolling restart: a job's running workers restarted one at a time, so a running batch never loses a step.

Each worker in turn is drained and started again with the job as it now resolves (its current configuration
version), and the next one waits until it serves again. Draining is SIGTERM to the worker alone: uvicorn stops
taking connections and finishes the requests in flight, then the worker withdraws from the registry and shuts
its engine down; a step sent to it meanwhile is refused and the router sends it to another worker. Its process
group is emptied after (`drain_timeout_s` bounds a hung drain). The supervisor is stopped for the restart (it
would restart the drained worker itself) and started again after, as `pronk stack up` does.

With one worker there is no other to take the steps: they wait in the router (up to its `wait_for_worker_s`)
while the worker starts again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time

from pronk.jobs.schema import JobConfig
from pronk.settings import Settings
from pronk.stack.fleet import start_worker, wait_for_workers
from pronk.stack.processes import alive, stop
from pronk.stack.state import SUPERVISOR, read_state, worker_name, worker_of, write_state
from pronk.stack.supervisor import start_supervisor, stop_supervisor

logger = logging.getLogger(__name__)


def drain(pid: int, timeout_s: float) -> None:
    """SIGTERM the worker alone, wait for it to finish its requests and exit, then empty its process group."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if not stop(pid, timeout_s=5.0):
        logger.error("worker process group %d outlived SIGKILL", pid)


def rolling_restart(
    job: JobConfig, settings: Settings, start_timeout_s: float = 300.0, drain_timeout_s: float = 120.0
) -> dict[str, int]:
    """Restart the job's workers one at a time with its current configuration (starting any the job now has
    more of, stopping any it has fewer of); returns worker id -> new pid."""
    state = read_state(settings)
    supervised = SUPERVISOR in state and alive(state[SUPERVISOR])
    if supervised:
        stop_supervisor(settings, state)
    restarted: dict[str, int] = {}
    try:
        for index in range(job.workers):
            name = worker_name(job.job_id, index)
            old = state.get(name, 0)
            if alive(old):
                logger.info("rolling restart of %s: draining pid %d", name, old)
                drain(old, drain_timeout_s)
            state[name] = start_worker(job.job_id, index, settings)
            write_state(settings, state)
            wait_for_workers(job, settings, {name: state[name]}, start_timeout_s)
            restarted[name] = state[name]
            logger.info("rolling restart of %s: serving again as pid %d", name, state[name])
        for name in [n for n in state if (w := worker_of(n)) and w[0] == job.job_id and w[1] >= job.workers]:
            drain(state.pop(name), drain_timeout_s)
            logger.info("rolling restart: stopped %s (the job now has %d workers)", name, job.workers)
    finally:
        write_state(settings, state)
        if supervised:
            start_supervisor(settings, state)
    return restarted
