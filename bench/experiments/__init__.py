"""Experiments: one question each, answered by a script that records its section of bench/RESULTS.md."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pronk.jobs.schema import JobConfig
    from pronk.settings import Settings


def scratch_stack(name: str, **env: str) -> Path:
    """A fresh folder for an experiment's own embedded stack, with the environment pointing the stack there on free
    ports (Prefect, MLflow's UI, the API), so it never meets a stack already running; `env` adds settings. The stack's
    data dir is `<folder>/data`. The folder lets others pass (0711), as a data dir a user picks does: run as root,
    the stack's PostgreSQL runs as another user, who must reach its cluster, else the stack keeps Prefect on SQLite."""
    from pronk.engine.worker import free_port

    work = Path(tempfile.mkdtemp(prefix=f"pronk-bench-{name}-"))
    work.chmod(0o711)
    ports = {f"PRONK_{part}_PORT": str(free_port()) for part in ("PREFECT", "MLFLOW", "API")}
    os.environ.update({"PRONK_DATA_DIR": str(work / "data"), **ports, **env})
    return work


def scratch_stack_for(name: str, job: str, **env: str) -> tuple[Path, Settings, JobConfig]:
    """`scratch_stack` whose default job is `job` (a name or id), with Prefect's settings pointing at its server:
    the folder, the settings and the job, for an experiment that then calls `pronk.stack.embedded.up`."""
    from pronk.jobs.catalog import resolve_job
    from pronk.settings import get_settings
    from pronk.stack.prefect_env import configure_prefect

    work = scratch_stack(name, **env)
    get_settings.cache_clear()
    resolved = resolve_job(job, get_settings())
    os.environ["PRONK_DEFAULT_JOB"] = resolved.job_id
    get_settings.cache_clear()
    settings = get_settings()
    configure_prefect(settings)
    return work, settings, resolved
