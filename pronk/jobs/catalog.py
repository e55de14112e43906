"""The job catalog: a job is a model plus its configuration, one YAML file each under `deployments/jobs/`.

`base: NAME` names another job file of the same folder: the file then states only its differences, merged over the
base section by section and key by key (`pronk.jobs.sections.merge_sections`), the same merge a configuration version
of the Herd applies over its job file when the job is resolved (`resolve_job`, `pronk.jobs.versions`).

Only the entry points read the catalog: an API route, a command, a flow at its top, a worker as it starts. Each
resolves its job once (base merged, defaults filled, its configuration version applied, validated) and hands the
`JobConfig` down to the harness, the router and the domain, which never look a job up themselves (an import-linter
contract in pyproject.toml keeps it so).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pronk.config_files import describe, read_mapping
from pronk.jobs.schema import JobConfig, JobFileError
from pronk.jobs.sections import FLAT_KEYS, flat_keys, merge_sections
from pronk.jobs.versions import with_current_version
from pronk.pronk_error import PronkError
from pronk.settings import Settings

logger = logging.getLogger(__name__)


def _raw_job_file(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The mapping of `path` with its `base:` chain merged under it; `name` defaults to the file's stem."""
    raw = read_mapping(path, JobFileError, "job file")
    old = flat_keys(raw)
    if old:
        moves = ", ".join(f"{key} → {FLAT_KEYS[key]}" for key in old)
        raise JobFileError(
            f"{path}: keys of the flat job-file format ({moves}); job files have sections now: "
            f"run `pronk job migrate {path}` to rewrite it"
        )
    raw.setdefault("name", path.stem)
    base = raw.pop("base", None)
    if base is None:
        return raw
    if not isinstance(base, str) or not base or "/" in base or base.startswith("."):
        raise JobFileError(f"{path}: key 'base' value {base!r}: must name a job file of the same folder")
    base_path = path.parent / f"{base}.yaml"
    if base_path in seen or base_path == path:
        chain = " → ".join(p.stem for p in (*seen, path, base_path))
        raise JobFileError(f"{path}: key 'base' value {base!r}: the bases form a circle ({chain})")
    if not base_path.is_file():
        raise JobFileError(f"{path}: key 'base' value {base!r}: no job file {base_path}")
    inherited = _raw_job_file(base_path, (*seen, path))
    inherited.pop("name")
    return merge_sections(inherited, raw)


def load_job_file(path: Path) -> JobConfig:
    """The job `path` describes, its base merged in; any problem raises `JobFileError` naming file, key and value."""
    raw = _raw_job_file(path)
    try:
        return JobConfig.model_validate(raw)
    except ValidationError as exc:
        raise JobFileError(describe(exc, path, raw)) from exc


def _read_catalog(folder: Path) -> tuple[dict[str, JobConfig], list[JobFileError]]:
    """The folder's jobs by id, and the files that could not be read; duplicate ids are an error."""
    jobs: dict[str, JobConfig] = {}
    broken: list[JobFileError] = []
    for path in sorted(folder.glob("*.yaml")):
        try:
            job = load_job_file(path)
        except JobFileError as exc:
            broken.append(exc)
            continue
        if job.job_id in jobs:
            raise JobFileError(
                f"{path}: key 'job_id' value {job.job_id!r}: already used by job '{jobs[job.job_id].name}'"
            )
        jobs[job.job_id] = job
    return jobs, broken


def load_jobs(settings: Settings, versions: bool = True) -> dict[str, JobConfig]:
    """Every job of `settings.jobs_dir`, by job id, with its current configuration version applied unless `versions`
    is false (the job files alone); a file that cannot be read, or a duplicate id, is an error."""
    jobs, broken = _read_catalog(settings.jobs_dir)
    if broken:
        raise broken[0]
    if not versions:
        return jobs
    return {job_id: with_current_version(job, settings) for job_id, job in jobs.items()}


class UnknownJob(PronkError, KeyError):
    """No job file has this id or name. A `KeyError` too, for callers that look jobs up as a mapping."""

    def __str__(self) -> str:  # KeyError's own quotes the message as a repr
        return str(self.args[0])


def resolve_job(job: str, settings: Settings, versions: bool = True) -> JobConfig:
    """A job by id or by name, resolved: its file with its base merged and its current configuration version applied
    (unless `versions` is false: the job file alone), validated.

        Another job file that cannot be read does not stop this one (a batch must not fail for a neighbour's typo);
        it is logged, and named when the job is not found.
    """
    jobs, broken = _read_catalog(settings.jobs_dir)
    found = jobs.get(job) or next((candidate for candidate in jobs.values() if candidate.name == job), None)
    if found is None:
        unreadable = "".join(f"; unreadable: {exc}" for exc in broken)
        known = ", ".join(f"{job_id} ({jobs[job_id].name})" for job_id in sorted(jobs)) or "none"
        raise UnknownJob(f"no job {job!r} (a job id or name); known: {known}{unreadable}")
    for exc in broken:
        logger.warning("job file skipped: %s", exc)
    return with_current_version(found, settings) if versions else found


class AmbiguousModel(PronkError, ValueError):
    """No job, or several jobs none of which stands out, serve the model a batch names."""


def job_for_model(
    model: str, jobs: dict[str, JobConfig], has_live_workers: Callable[[str], bool], default_job: str
) -> JobConfig:
    """The job a batch naming only `model` goes to: the one job serving it; else, of several, the one with live
    workers; else, of those with live workers (or of all when none has any), the default job (`default_job`, an id
    or a name); else `AmbiguousModel`, naming the jobs. Two job files may serve one model (a CPU and a GPU fleet of
    it), and usually only one of them is up."""
    serving = sorted((j for j in jobs.values() if j.served_model_name == model), key=lambda j: j.job_id)
    if len(serving) == 1:
        return serving[0]
    if not serving:
        raise AmbiguousModel(
            f"no job serves model {model!r}; jobs serve {sorted({j.served_model_name for j in jobs.values()})}"
        )
    live = [j for j in serving if has_live_workers(j.job_id)]
    candidates = live or serving
    if len(candidates) == 1:
        return candidates[0]
    default = [j for j in candidates if default_job in (j.job_id, j.name)]
    if default:
        return default[0]
    names = ", ".join(f"{j.job_id} ({j.name}{', live' if j in live else ''})" for j in serving)
    raise AmbiguousModel(f"jobs {names} all serve model {model!r}; pass job_id")
