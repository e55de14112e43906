"""The job catalog: a job is a model plus its configuration, one YAML file each under `deployments/jobs/`."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from pronk.config_files import load_config_file
from pronk.errors import PronkError
from pronk.settings import get_settings


class JobFileError(PronkError, ValueError):
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
    scheduling_policy: Literal["fcfs", "priority"] = Field(
        default="fcfs",
        description="vLLM's queue order; `priority` runs steps of earlier-started traces first (a returning step "
        "does not queue behind first steps of new traces).",
    )
    seed: int = Field(default=0, description="Engine seed.")
    load_format: Literal["auto", "safetensors", "dummy"] | None = Field(
        default=None,
        description="How vLLM loads weights; `dummy` makes random ones of the config's shape (benchmarks).",
    )
    hf_overrides: dict[str, int | float | str | bool] | None = Field(
        default=None,
        description="Overrides of the model's Hugging Face config, e.g. `max_position_embeddings` to run a "
        "RoPE model past its trained context (RoPE has no weights, so the checkpoint is unchanged).",
    )

    speculative_ngram_tokens: int = Field(
        default=0,
        ge=0,
        le=16,
        description="n-gram (prompt-lookup) speculative decoding: tokens proposed per step from matches of the "
        "latest tokens earlier in the context, all verified by the model in one pass (0 = off). Pays where outputs "
        "repeat their context (tool arguments quoting the prompt, extraction).",
    )

    def as_vllm_kwargs(self) -> dict[str, Any]:
        kwargs = self.model_dump(exclude_none=True, exclude={"speculative_ngram_tokens"})
        if self.speculative_ngram_tokens:
            kwargs["speculative_config"] = {
                "method": "ngram",
                "num_speculative_tokens": self.speculative_ngram_tokens,
                "prompt_lookup_min": 2,
                "prompt_lookup_max": 4,
            }
        return kwargs


class PythonToolLimits(BaseModel):
    """Limits of one `python` tool call's sandbox."""

    model_config = ConfigDict(extra="forbid")

    cpu_s: int = Field(default=5, ge=1, le=3600, description="CPU seconds (RLIMIT_CPU).")
    memory_mb: int = Field(default=512, ge=64, le=65536, description="Address space in MiB (RLIMIT_AS).")
    wall_s: float = Field(
        default=10.0, gt=0, le=3600, description="Wall-clock seconds before the process group is killed."
    )
    output_bytes: int = Field(
        default=8192, ge=256, le=1 << 24, description="Most bytes of stdout+stderr kept (and file size cap)."
    )
    processes: int = Field(
        default=32, ge=2, le=4096, description="Processes and threads in the sandbox (RLIMIT_NPROC)."
    )
    open_files: int = Field(
        default=64, ge=16, le=65536, description="Open file descriptors per process (RLIMIT_NOFILE)."
    )


MAX_TRACE_SAMPLE = 100
"""A sample is drawn as Prefect task runs after the batch; more would cost the server more than it shows a person."""


class HarnessConfig(BaseModel):
    """How the job's server-side agent harness runs traces; a batch line may ask for less, never more."""

    model_config = ConfigDict(extra="forbid")

    max_steps: int = Field(
        default=8, ge=1, le=256, description="Most model steps per trace (children count their own)."
    )
    tools: list[str] = Field(
        default_factory=lambda: ["python", "sql", "search", "spawn_subagents"],
        description="Tools agent lines may use: built-in names or `package.module:object` import paths.",
    )
    step_max_tokens: int = Field(default=256, ge=1, description="Cap on tokens one step may generate.")
    step_timeout_s: float = Field(default=120.0, gt=0, description="Seconds one model step may take.")
    tool_timeout_s: float = Field(
        default=15.0, gt=0, description="Seconds one tool call may take (python has its own wall limit too)."
    )
    trace_timeout_s: float = Field(
        default=900.0, gt=0, description="Seconds a whole trace (with its children) may take."
    )
    max_fan_out: int = Field(
        default=4, ge=0, le=64, description="Most child traces one spawn_subagents call may start."
    )
    max_depth: int = Field(default=1, ge=0, le=4, description="Nesting levels of subagents (0 forbids fan-out).")
    max_step_retries: int = Field(
        default=2, ge=0, le=10, description="Retries of a failed step (engine trouble, unparsable call)."
    )
    kv_pin_ttl_s: float = Field(
        default=30.0,
        ge=0,
        description="Keep a trace's prefix pinned in its worker's KV cache this long across a tool-call gap (0 = off).",
    )
    kv_pin_ttl: Literal["fixed", "auto"] = Field(
        default="fixed",
        description="`fixed`: pins last `kv_pin_ttl_s`; `auto`: per tool, from the run's measured tool-call gaps "
        "(p90 x 1.25, clamped; `kv_pin_ttl_s` until a tool has 5 samples).",
    )
    routing: str = Field(
        default="trace_affinity", description="Routing policy for this job's steps (engine.routing.POLICIES)."
    )
    admission: Literal["none", "kv_budget"] = Field(
        default="none",
        description="`kv_budget`: workers admit traces by KV capacity (shared by every run of the job), new traces "
        "go to the worker with the most room, started traces before new ones (engine.admission).",
    )
    kv_budget_headroom: float | None = Field(
        default=None,
        ge=0,
        lt=1,
        description="With `admission: kv_budget`, the share of each worker's KV cache kept out of the budget; read "
        "when a worker starts (default: `PRONK_KV_BUDGET_HEADROOM`, 0.1).",
    )
    kv_budget_growth_steps: float | None = Field(
        default=None,
        ge=0,
        description="With `admission: kv_budget`, a new trace starts only while each worker keeps room for this many "
        "more steps of every resident trace (at its measured growth per step): fewer pauses and less recompute, "
        "fewer traces to fill tool gaps. Read when a worker starts (default: `PRONK_KV_BUDGET_GROWTH_STEPS`, 0).",
    )
    tables_dir: str = Field(
        default="data/tables", description="Tables the `sql` tool sees (csv/parquet; relative to the project root)."
    )
    corpus_dir: str = Field(
        default="data/corpus", description="Documents the `search` tool ranks (relative to the project root)."
    )
    python: PythonToolLimits = Field(default_factory=PythonToolLimits)
    trace_sample: int = Field(
        default=10,
        ge=0,
        le=MAX_TRACE_SAMPLE,
        description="Traces per run drawn as DAGs of step and tool task runs in the Prefect UI and logged to MLflow "
        "(failed ones first, the rest spread over the input; 0 = none).",
    )
    mlflow_traces: bool = Field(default=True, description="Log the run's sampled traces to MLflow as traces.")


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
    max_output_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Largest `max_tokens` a request may ask for; default: `engine.max_model_len - 1`.",
    )
    harness: HarnessConfig = Field(
        default_factory=HarnessConfig, description="The agent harness: steps, tools, limits."
    )

    @property
    def output_token_cap(self) -> int:
        """The most tokens one request may ask to generate."""
        return self.max_output_tokens or self.engine.max_model_len - 1


def load_job_file(path: Path) -> JobConfig:
    return load_config_file(path, JobConfig, JobFileError, "job file")


TUNABLE_KEYS = frozenset({"engine", "harness", "max_concurrency", "workers", "cpu_cores_per_worker"})
"""What a configuration version may change; the job's identity, model and price per core stay the job file's."""


class JobVersion(BaseModel):
    """A configuration version of a job (the Herd tuner's winner): changes over the job file, which stays the base."""

    model_config = ConfigDict(extra="forbid")

    job_id: str = Field(pattern=r"^job-[0-9a-f]{8}$")
    version: int = Field(ge=1, description="1, 2, … in the order they were applied.")
    changes: dict[str, Any] = Field(
        description="Keys of the job file to change (`engine`/`harness` sections merge key by key)."
    )
    mlflow_run_id: str | None = Field(default=None, description="The tuning run the version came from.")
    created_at: float = Field(default_factory=time.time)
    note: str = ""


def versions_dir(job_id: str) -> Path:
    """Where a job's configuration versions live: beside the stack's state (`<data dir>/job_versions/<job id>/`)."""
    return get_settings().data_dir / "job_versions" / job_id


def job_versions(job_id: str) -> list[JobVersion]:
    """Every configuration version of the job, oldest first."""
    folder = versions_dir(job_id)
    versions = []
    for path in sorted(folder.glob("v*.json"), key=lambda p: int(p.stem[1:]) if p.stem[1:].isdigit() else 0):
        try:
            versions.append(JobVersion.model_validate_json(path.read_text()))
        except ValueError as exc:
            raise JobFileError(f"{path}: not a job configuration version: {exc}") from exc
    return versions


def current_version(job_id: str) -> JobVersion | None:
    """The version in force (named by `current`), or None when the job runs as its file says."""
    folder = versions_dir(job_id)
    try:
        number = int((folder / "current").read_text().strip())
    except (OSError, ValueError):
        return None
    if number == 0:
        return None
    path = folder / f"v{number}.json"
    try:
        return JobVersion.model_validate_json(path.read_text())
    except (OSError, ValueError) as exc:
        raise JobFileError(f"{path}: the current configuration version of {job_id} is unreadable: {exc}") from exc


def with_changes(job: JobConfig, changes: dict[str, Any]) -> JobConfig:
    """`job` with `changes` applied (sections merge key by key), validated like a job file."""
    unknown = set(changes) - TUNABLE_KEYS
    if unknown:
        raise JobFileError(f"job {job.job_id}: keys {sorted(unknown)} are not tunable (only {sorted(TUNABLE_KEYS)})")
    merged = job.model_dump()
    for key, value in changes.items():
        merged[key] = {**merged[key], **value} if isinstance(value, dict) and isinstance(merged[key], dict) else value
    if merged["device"] == "cpu":  # a CPU worker with more cores costs more: the price is for the job's cores
        merged["price_per_worker_hour"] = (
            job.price_per_worker_hour * merged["cpu_cores_per_worker"] / job.cpu_cores_per_worker
        )
    try:
        return JobConfig.model_validate(merged)
    except ValueError as exc:
        raise JobFileError(f"job {job.job_id}: configuration changes {changes} are invalid: {exc}") from exc


def apply_version(job: JobConfig) -> JobConfig:
    """The job as its current configuration version makes it (itself when it has none)."""
    version = current_version(job.job_id)
    return with_changes(job, version.changes) if version else job


def save_version(job: JobConfig, changes: dict[str, Any], mlflow_run_id: str | None, note: str = "") -> JobVersion:
    """Record `changes` to the job file `job` as its next configuration version and make it current.

    The changes are checked against the job file first; each file is written whole (write, then rename).
    """
    with_changes(job, changes)
    job_id = job.job_id
    folder = versions_dir(job_id)
    folder.mkdir(parents=True, exist_ok=True)
    existing = job_versions(job_id)
    version = JobVersion(
        job_id=job_id,
        version=(existing[-1].version if existing else 0) + 1,
        changes=changes,
        mlflow_run_id=mlflow_run_id,
        note=note,
    )
    _write_whole(folder / f"v{version.version}.json", version.model_dump_json(indent=2))
    set_current_version(job_id, version.version)
    return version


def set_current_version(job_id: str, number: int) -> None:
    """Make version `number` current (0: the job file alone)."""
    folder = versions_dir(job_id)
    folder.mkdir(parents=True, exist_ok=True)
    if number and not (folder / f"v{number}.json").exists():
        raise JobFileError(f"job {job_id} has no configuration version {number}")
    _write_whole(folder / "current", json.dumps(number))


def _write_whole(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def load_jobs(jobs_dir: Path | None = None, versions: bool = True) -> dict[str, JobConfig]:
    """Every job in the folder, by job id, with its current configuration version applied unless `versions`
    is false (the job files alone); duplicate ids are an error."""
    folder = jobs_dir or get_settings().jobs_dir
    jobs: dict[str, JobConfig] = {}
    for path in sorted(folder.glob("*.yaml")):
        job = load_job_file(path)
        if job.job_id in jobs:
            raise JobFileError(
                f"{path}: key 'job_id' value {job.job_id!r}: already used by job '{jobs[job.job_id].name}'"
            )
        jobs[job.job_id] = job
    return {job_id: apply_version(job) for job_id, job in jobs.items()} if versions else jobs


def get_job(job: str, jobs_dir: Path | None = None, versions: bool = True) -> JobConfig:
    """A job by id or by name, with its current configuration version unless `versions` is false."""
    jobs = load_jobs(jobs_dir, versions)
    if job in jobs:
        return jobs[job]
    for candidate in jobs.values():
        if candidate.name == job:
            return candidate
    raise KeyError(f"no job {job!r}; known: {', '.join(sorted(jobs)) or 'none'}")
