"""The job catalog: a job is a model plus its configuration, one YAML file each under `deployments/jobs/`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pronk.settings import get_settings


class JobFileError(ValueError):
    """A job file that cannot be used; the message names the file, the key and the value."""


class EngineArgs(BaseModel):
    """The vLLM engine arguments a job may set (a checked subset of `AsyncEngineArgs`)."""

    model_config = ConfigDict(extra="forbid")

    max_model_len: int = Field(default=4096, ge=16, description="Longest prompt plus output, in tokens.")
    dtype: str = Field(default="auto", pattern=r"^(auto|float32|float16|bfloat16)$", description="Weight dtype.")
    max_num_seqs: int = Field(default=64, ge=1, le=4096, description="Most sequences scheduled at once.")
    max_num_batched_tokens: int | None = Field(default=None, ge=16, description="Token budget of one engine step.")
    block_size: int | None = Field(default=None, ge=1, description="KV cache block size in tokens.")
    kv_cache_memory_bytes: int | None = Field(
        default=None, ge=1 << 20, description="KV cache size in bytes; required on CPU, where vLLM cannot size it."
    )
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1, description="GPU share for the engine.")
    tensor_parallel_size: int = Field(default=1, ge=1, description="GPUs per worker.")
    enable_prefix_caching: bool = Field(default=True, description="Reuse KV of shared prefixes across steps.")
    enforce_eager: bool = Field(default=True, description="Skip graph capture (faster start, fine for small models).")
    seed: int = Field(default=0, description="Engine seed.")

    def as_vllm_kwargs(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class JobConfig(BaseModel):
    """One job: which model, how its engine runs, how many workers, what an hour of a worker costs."""

    model_config = ConfigDict(extra="forbid")

    job_id: str = Field(pattern=r"^job-[0-9a-f]{8}$", description="Stable id, `job-` and 8 hex digits.")
    name: str = Field(min_length=1, description="Human name, usually the file's stem.")
    model: str = Field(
        min_length=1, description="Model URI: a local directory, `s3://bucket/path`, or `models:/name@alias`."
    )
    served_model_name: str = Field(min_length=1, description="The `model` a batch line must name for this job.")
    device: str = Field(default="cpu", pattern=r"^(cpu|cuda)$", description="Where the engine runs.")
    workers: int = Field(default=1, ge=1, le=64, description="Engine workers to start for this job.")
    cpu_cores_per_worker: int = Field(default=1, ge=1, description="CPU cores pinned to each worker (CPU jobs).")
    engine: EngineArgs = Field(default_factory=EngineArgs)
    price_per_worker_hour: float = Field(ge=0, description="USD per worker-hour, for processing cost.")
    max_concurrency: int = Field(default=32, ge=1, le=4096, description="Requests in flight per batch run.")
    default_max_tokens: int = Field(default=256, ge=1, description="`max_tokens` when a request sets none.")


def _describe(exc: ValidationError, path: Path, raw: dict[str, Any]) -> str:
    problems = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "<root>"
        value: Any = raw
        for part in err["loc"]:
            value = value.get(part) if isinstance(value, dict) else None
        problems.append(f"{path}: key '{key}' value {value!r}: {err['msg']}")
    return "; ".join(problems)


def load_job_file(path: Path) -> JobConfig:
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise JobFileError(f"{path}: cannot read job file: {exc}") from exc
    if not isinstance(raw, dict):
        raise JobFileError(f"{path}: a job file must be a mapping, got {type(raw).__name__}")
    raw.setdefault("name", path.stem)
    try:
        return JobConfig.model_validate(raw)
    except ValidationError as exc:
        raise JobFileError(_describe(exc, path, raw)) from exc


def load_jobs(jobs_dir: Path | None = None) -> dict[str, JobConfig]:
    """Every job in the folder, by job id; duplicate ids are an error."""
    folder = jobs_dir or get_settings().jobs_dir
    jobs: dict[str, JobConfig] = {}
    for path in sorted(folder.glob("*.yaml")):
        job = load_job_file(path)
        if job.job_id in jobs:
            raise JobFileError(f"{path}: key 'job_id' value {job.job_id!r}: already used by job '{jobs[job.job_id].name}'")
        jobs[job.job_id] = job
    return jobs


def get_job(job: str, jobs_dir: Path | None = None) -> JobConfig:
    """A job by id or by name."""
    jobs = load_jobs(jobs_dir)
    if job in jobs:
        return jobs[job]
    for candidate in jobs.values():
        if candidate.name == job:
            return candidate
    raise KeyError(f"no job {job!r}; known: {', '.join(sorted(jobs)) or 'none'}")
