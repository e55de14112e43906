"""A job's configuration versions: the Herd tuner's winners, kept as changes over the job file, which stays the base.

Each version is `v<N>.json` under `versions_dir(job_id)`; `current` names the one in force, which
`with_current_version` merges over the job file when the job is resolved (`pronk.jobs.catalog.resolve_job`; 0 or no
file: the job file alone). The reader (`current_changes`, `with_current_version`) and the writer (`save_version`,
`set_current_version`) of that folder live here together.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from pronk.jobs.schema import JobConfig, JobFileError
from pronk.jobs.sections import merge_sections, migrate_flat
from pronk.settings import Settings

TUNABLE_KEYS = frozenset(
    {"engine", "scheduling", "harness", "tools", "observability", "workers", "cpu_cores_per_worker"}
)
"""What a configuration version may change; the job's identity, model and price per core stay the job file's."""


class JobVersion(BaseModel):
    """A configuration version of a job: changes over the job file."""

    job_id: str = Field(pattern=r"^job-[0-9a-f]{8}$")
    version: int = Field(ge=1, description="1, 2, … in the order they were applied.")
    changes: dict[str, Any] = Field(description="Keys of the job file to change (sections merge key by key).")
    mlflow_run_id: str | None = Field(default=None, description="The tuning run the version came from.")
    created_at: float = Field(default_factory=time.time)
    note: str = ""


def versions_dir(job_id: str, settings: Settings) -> Path:
    """Where the Herd keeps a job's configuration versions: `<data dir>/job_versions/<id>/`, with `current` naming
    the version in force and `v<N>.json` holding each version's changes."""
    return settings.data_dir / "job_versions" / job_id


def current_version_path(job_id: str, settings: Settings) -> Path | None:
    """The file of the job's configuration version in force, or None when the job runs as its file says."""
    folder = versions_dir(job_id, settings)
    try:
        number = int((folder / "current").read_text().strip())
    except (OSError, ValueError):
        return None
    return folder / f"v{number}.json" if number else None


def current_changes(job_id: str, settings: Settings) -> dict[str, Any]:
    """The changes of the job's configuration version in force (empty when the job runs as its file says); a version
    written before job files had sections is read in sections (`migrate_flat`)."""
    path = current_version_path(job_id, settings)
    if path is None:
        return {}
    try:
        changes = json.loads(path.read_text())["changes"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise JobFileError(f"{path}: the current configuration version of {job_id} is unreadable: {exc}") from exc
    if not isinstance(changes, dict):
        raise JobFileError(f"{path}: the current configuration version of {job_id} has no mapping of changes")
    return migrate_flat(changes)


def with_changes(job: JobConfig, changes: dict[str, Any]) -> JobConfig:
    """`job` with `changes` merged over it (`merge_sections`), validated like a job file; `job` itself when there
    are none.

    A CPU worker with more cores costs more: the price scales with `cpu_cores_per_worker` when it changes.
    """
    if not changes:
        return job
    merged = merge_sections(job.model_dump(), changes)
    if merged["device"] == "cpu" and "price_per_worker_hour" not in changes:
        merged["price_per_worker_hour"] = (
            job.price_per_worker_hour * merged["cpu_cores_per_worker"] / job.cpu_cores_per_worker
        )
    try:
        return JobConfig.model_validate(merged)
    except ValueError as exc:
        raise JobFileError(f"job {job.job_id}: configuration changes {changes} are invalid: {exc}") from exc


def with_current_version(job: JobConfig, settings: Settings) -> JobConfig:
    """The job file `job` with its configuration version in force applied (itself when none is)."""
    return with_changes(job, current_changes(job.job_id, settings))


def job_versions(job_id: str, settings: Settings) -> list[JobVersion]:
    """Every configuration version of the job, oldest first."""
    folder = versions_dir(job_id, settings)
    versions = []
    for path in sorted(folder.glob("v*.json"), key=lambda p: int(p.stem[1:]) if p.stem[1:].isdigit() else 0):
        try:
            versions.append(JobVersion.model_validate_json(path.read_text()))
        except ValueError as exc:
            raise JobFileError(f"{path}: not a job configuration version: {exc}") from exc
    return versions


def current_version(job_id: str, settings: Settings) -> JobVersion | None:
    """The version in force (named by `current`), or None when the job runs as its file says."""
    path = current_version_path(job_id, settings)
    if path is None:
        return None
    try:
        return JobVersion.model_validate_json(path.read_text())
    except (OSError, ValueError) as exc:
        raise JobFileError(f"{path}: the current configuration version of {job_id} is unreadable: {exc}") from exc


def check_tunable(job: JobConfig, changes: dict[str, Any]) -> JobConfig:
    """`job` with `changes`, refused when they touch a key a configuration version may not change."""
    unknown = set(changes) - TUNABLE_KEYS
    if unknown:
        raise JobFileError(f"job {job.job_id}: keys {sorted(unknown)} are not tunable (only {sorted(TUNABLE_KEYS)})")
    return with_changes(job, changes)


def save_version(
    job: JobConfig, changes: dict[str, Any], mlflow_run_id: str | None, settings: Settings, note: str = ""
) -> JobVersion:
    """Record `changes` to the job file `job` as its next configuration version and make it current.

    The changes are checked against the job file first; each file is written whole (write, then rename).
    """
    check_tunable(job, changes)
    job_id = job.job_id
    folder = versions_dir(job_id, settings)
    folder.mkdir(parents=True, exist_ok=True)
    existing = job_versions(job_id, settings)
    version = JobVersion(
        job_id=job_id,
        version=(existing[-1].version if existing else 0) + 1,
        changes=changes,
        mlflow_run_id=mlflow_run_id,
        note=note,
    )
    _write_whole(folder / f"v{version.version}.json", version.model_dump_json(indent=2))
    set_current_version(job_id, version.version, settings)
    return version


def set_current_version(job_id: str, number: int, settings: Settings) -> None:
    """Make version `number` current (0: the job file alone)."""
    folder = versions_dir(job_id, settings)
    folder.mkdir(parents=True, exist_ok=True)
    if number and not (folder / f"v{number}.json").exists():
        raise JobFileError(f"job {job_id} has no configuration version {number}")
    _write_whole(folder / "current", json.dumps(number))


def _write_whole(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)
