"""Start a job's engine workers as background processes and wait until they all heartbeat."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

from pronk.jobs.schema import JobConfig
from pronk.pronk_error import PronkError
from pronk.settings import Settings
from pronk.stack.processes import alive, spawn
from pronk.stack.state import worker_name
from pronk.worker_registry import worker_registry


class FleetStartError(PronkError, RuntimeError):
    pass


def start_workers(job: JobConfig, settings: Settings, indices: Sequence[int] | None = None) -> dict[str, int]:
    """Spawn the workers with these indices (default: all the job's `workers`); returns worker id -> pid."""
    return {
        worker_name(job.job_id, index): start_worker(job.job_id, index, settings)
        for index in indices or range(job.workers)
    }


def start_worker(job_id: str, index: int, settings: Settings) -> int:
    """Spawn worker `index` of the job in its own process group (vLLM's engine processes join it); returns its pid."""
    argv = [sys.executable, "-m", "pronk.stack.worker", "--job", job_id, "--index", str(index)]
    return spawn(
        argv, settings.logs_dir / f"{worker_name(job_id, index)}.log", env={"PRONK_DATA_DIR": str(settings.data_dir)}
    )


def wait_for_workers(job: JobConfig, settings: Settings, pids: dict[str, int], timeout_s: float = 300.0) -> None:
    registry = worker_registry(settings)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        live = {entry.worker_id for entry in registry.live(job.job_id)}
        if set(pids) <= live:
            return
        dead = [w for w, pid in pids.items() if not alive(pid)]
        if dead:
            logs = ", ".join(str(settings.logs_dir / f"{w}.log") for w in dead)
            raise FleetStartError(f"worker(s) {dead} exited during start-up; see {logs}")
        time.sleep(0.5)
    raise FleetStartError(f"workers of {job.job_id} not ready after {timeout_s:.0f}s; see {settings.logs_dir}")
