"""One settings object for every pronk process, read from `PRONK_*` environment variables."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

PROJECT_ROOT = Path(__file__).resolve().parent.parent


class Settings(BaseSettings):
    """Where pronk keeps its state and how its processes find each other."""

    model_config = SettingsConfigDict(env_prefix="PRONK_", extra="ignore")

    data_dir: Path = Field(
        default=PROJECT_ROOT / ".pronk",
        description="Root of the embedded stack's state: Prefect and MLflow databases, models, registry, logs.",
    )
    jobs_dir: Path = Field(
        default=PROJECT_ROOT / "deployments" / "jobs",
        description="Folder of job files (`<name>.yaml`).",
    )
    default_job: str = Field(
        default="job-5a011201",
        description="Job the CLI and stack use when none is named: smollm2-cpu, a real instruct model on CPU (the "
        "test suite sets tiny-cpu, job-c0ffee01).",
    )
    prefect_port: int = Field(default=4200, ge=1, le=65535, description="Port of the embedded Prefect server.")
    mlflow_port: int = Field(default=5000, ge=1, le=65535, description="Port of the embedded MLflow UI server.")
    mlflow_tracking_uri: str | None = Field(
        default=None, description="MLflow tracking URI; defaults to SQLite under data_dir."
    )
    worker_token: SecretStr | None = Field(
        default=None,
        description="Token every request to an engine worker carries; unset: the stack's `data_dir/worker-token`. "
        "Set the same one on every host of a cluster.",
    )
    worker_tls_cert: Path | None = Field(
        default=None,
        description="PEM certificate (chain) an engine worker serves HTTPS with, set with `worker_tls_key`; its "
        "subjectAltName must hold the host name or address of the URL the worker advertises. Unset: plain HTTP.",
    )
    worker_tls_key: Path | None = Field(
        default=None, description="PEM private key of `worker_tls_cert`, readable by the worker's user only."
    )
    worker_tls_ca: Path | None = Field(
        default=None,
        description="PEM CA bundle routers, Leaps and every other caller verify `https://` workers against; unset: "
        "the system's trust store.",
    )
    leap_canary_timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="Longest a Leap's canary may take to run the labelled set on both versions; past it the canary "
        "goes back and the Leap is refused.",
    )
    worker_base_port: int = Field(default=8100, ge=1, le=65535, description="First port engine workers listen on.")
    heartbeat_interval_s: float = Field(
        default=1.0, gt=0, description="How often a worker refreshes its registry entry."
    )
    heartbeat_timeout_s: float = Field(
        default=5.0, gt=0, description="A worker whose heartbeat is older than this is dropped by the router."
    )
    worker_restart_base_delay_s: float = Field(
        default=1.0, gt=0, description="The supervisor's first restart delay for a dead worker; it doubles per failure."
    )
    worker_restart_max_delay_s: float = Field(default=60.0, gt=0, description="Longest restart delay.")
    worker_restart_max_failures: int = Field(
        default=5, ge=1, description="The supervisor gives up on a worker after this many failures in the window."
    )
    worker_restart_window_s: float = Field(default=600.0, gt=0, description="Window for `worker_restart_max_failures`.")
    worker_restart_reset_s: float = Field(
        default=120.0, gt=0, description="A worker serving this long since its last start has its backoff reset."
    )
    storage_uri: str | None = Field(
        default=None,
        description="Where files and batch records live: a folder or `s3://bucket/prefix`; defaults to data_dir/store.",
    )
    s3_endpoint_url: str | None = Field(
        default=None, description="S3 endpoint for s3:// paths (a moto server or MinIO); None means AWS."
    )
    api_port: int = Field(default=8000, ge=1, le=65535, description="Port of `pronk api` on 127.0.0.1.")
    api_auth: bool = Field(
        default=False,
        description="Require a bearer API key (`pronk keys create`); off, every caller is the owner `local`.",
    )
    api_max_upload_bytes: int = Field(
        default=200 * 1024 * 1024, ge=1, description="Largest file `POST /v1/files` accepts."
    )
    sandbox_bwrap: str = Field(
        default="bwrap",
        description="bubblewrap binary the `python` tool isolates code with; where it cannot run, the tool refuses.",
    )
    api_max_upload_lines: int = Field(default=50_000, ge=1, description="Most request lines in one batch input file.")
    api_max_body_bytes: int = Field(
        default=1024 * 1024, ge=1, description="Largest request body of any route but `POST /v1/files` (JSON bodies)."
    )
    api_body_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="Seconds a JSON request body may take to arrive, and an upload may wait for its next part (408).",
    )
    max_line_bytes: int = Field(
        default=4 * 1024 * 1024,
        ge=1024,
        description="Longest batch input line in bytes; a longer line becomes an error line before it is parsed.",
    )
    weights_root: Path | None = Field(
        default=None,
        description="Server paths `/v1/weights/*` accepts as sources must be under it; unset: only s3:// and models:/.",
    )
    reconcile_interval_s: float = Field(
        default=30.0,
        ge=0,
        description="How often `pronk api` looks for batches whose flow run ended without ending them (0: never).",
    )
    max_batch_runs: int = Field(
        default=3,
        ge=1,
        description="Runs of a batch that may end without finishing a line: a crashed run is resumed until then, "
        "else the batch ends failed. A run that persisted lines (cut short by a restart, say) does not count.",
    )
    api_run_start_attempts: int = Field(
        default=6,
        ge=1,
        description="Tries to start the batch queue's drainer in a row; after them the reconcile loop tries again.",
    )
    api_run_start_first_delay_s: float = Field(
        default=0.5, ge=0, description="The wait before the second try to start a run; it doubles after each try."
    )
    batch_queue_concurrency: int = Field(
        default=8, ge=1, description="API batches the batch queue's drainer runs at once (each a subflow run)."
    )
    batch_queue_idle_s: float = Field(
        default=5.0, ge=0, description="How long the batch queue's drainer waits on an empty queue before it ends."
    )
    prefect_pool_concurrency: int = Field(
        default=4,
        ge=1,
        description="Flow-run processes the stack's work pool `pronk` runs at once (Prefect's work pool concurrency "
        "limit): runs past it wait their turn, in order, instead of starting a process each.",
    )
    prefect_database: Literal["auto", "sqlite", "postgres"] = Field(
        default="auto",
        description="The Prefect server's database: SQLite under data_dir, or a PostgreSQL server the stack starts "
        "(none is started when PREFECT_API_DATABASE_CONNECTION_URL names one already). `auto`: what the data dir "
        "holds already, else PostgreSQL where the machine has it (SQLite's write lock stalls bursts of batches), "
        "else SQLite.",
    )
    postgres_host: str = Field(default="127.0.0.1", description="Address the stack's PostgreSQL server listens on.")
    postgres_port: int = Field(
        default=0,
        ge=0,
        le=65535,
        description="Port of the stack's PostgreSQL server; 0 picks a free one once and keeps it.",
    )
    postgres_password: str | None = Field(
        default=None,
        description="Password of the stack's PostgreSQL user `pronk`, used when its cluster is made; "
        "unset, a random one is made and kept in data_dir/postgres.json.",
    )
    postgres_bin_dir: Path | None = Field(
        default=None,
        description="Folder holding `initdb` and `postgres`; unset, found on PATH or under /usr/lib/postgresql.",
    )
    registry_url: str | None = Field(
        default=None,
        description="Where engine workers announce themselves: `postgresql://user:password@host:port/db` for a "
        "registry every host shares; unset, a folder of files under data_dir (one machine).",
    )

    @field_validator("registry_url")
    @classmethod
    def _postgres_registry(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("postgresql://", "postgres://")):
            raise ValueError("registry_url must be a postgresql:// URL (or unset for the file registry)")
        return value

    @model_validator(mode="after")
    def _worker_tls_pair(self) -> Settings:
        if (self.worker_tls_cert is None) != (self.worker_tls_key is None):
            raise ValueError("worker_tls_cert and worker_tls_key go together: set both (HTTPS workers) or neither")
        return self

    @property
    def tracking_uri(self) -> str:
        return self.mlflow_tracking_uri or f"sqlite:///{self.data_dir / 'mlflow.db'}"

    @property
    def mlflow_ui_url(self) -> str:
        """Where a person opens MLflow: the tracking server when it is one, else the embedded stack's MLflow UI."""
        uri = self.tracking_uri
        return uri.rstrip("/") if uri.startswith(("http://", "https://")) else f"http://127.0.0.1:{self.mlflow_port}"

    @property
    def store_uri(self) -> str:
        return self.storage_uri or str(self.data_dir / "store")

    @property
    def artifact_root(self) -> Path:
        return self.data_dir / "mlartifacts"

    @property
    def registry_dir(self) -> Path:
        return self.data_dir / "registry"

    @property
    def logs_dir(self) -> Path:
        return self.data_dir / "logs"

    @property
    def batches_dir(self) -> Path:
        return self.data_dir / "batches"

    @property
    def models_dir(self) -> Path:
        return self.data_dir / "models"


@lru_cache
def get_settings() -> Settings:
    return Settings()
