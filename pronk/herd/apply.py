"""Apply a tuned configuration: it becomes the job's next configuration version, then reaches the running fleet.

Settings the router and harness read per run apply live: every batch run resolves its job when it starts, so the
next run uses them. Settings a worker reads when it starts (`trial.restart_key`: engine arguments, workers, the
priority queue, the admission budget, the KV host tier) reach the running workers by a rolling restart, one worker
at a time.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from pronk.herd.trial import restart_key
from pronk.jobs.schema import JobConfig
from pronk.jobs.sections import merge_sections
from pronk.jobs.versions import JobVersion, current_version, save_version, set_current_version, with_current_version
from pronk.settings import Settings
from pronk.stack.rolling import rolling_restart
from pronk.worker_registry import worker_registry

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Applied:
    version: int
    mode: str
    """`live` (settings read per run only, or no workers running) or `rolling restart`."""
    restarted: dict[str, int] = field(default_factory=dict)


def roll_out(job_file: JobConfig, before_key: str, settings: Settings) -> Applied:
    """Bring the running workers to the job's current configuration (a rolling restart when they need one)."""
    after = with_current_version(job_file, settings)
    version = current_version(job_file.job_id, settings)
    number = version.version if version else 0
    running = worker_registry(settings).live(job_file.job_id)
    if restart_key(after) == before_key or not running:
        return Applied(number, "live")
    logger.info("job %s: configuration version %d needs new workers: rolling restart", job_file.job_id, number)
    return Applied(number, "rolling restart", rolling_restart(after, settings))


def apply_changes(
    job_file: JobConfig, changes: dict[str, Any], mlflow_run_id: str | None, settings: Settings, note: str = ""
) -> tuple[JobVersion, Applied]:
    """Record `changes` (relative to the job as it runs now) as its next configuration version and roll it out.
    `job_file`: the job as its file says, without a configuration version (`resolve_job(..., versions=False)`)."""
    before = with_current_version(job_file, settings)
    current = current_version(job_file.job_id, settings)
    version = save_version(
        job_file, merge_sections(current.changes if current else {}, changes), mlflow_run_id, settings, note
    )
    return version, roll_out(job_file, restart_key(before), settings)


def use_version(job_file: JobConfig, number: int, settings: Settings) -> Applied:
    """Go back (or forward) to configuration version `number` (0: the job file alone) and roll it out."""
    before = with_current_version(job_file, settings)
    set_current_version(job_file.job_id, number, settings)
    return roll_out(job_file, restart_key(before), settings)
