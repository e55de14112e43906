"""Prefect tasks of the `herd` flow: profile the job, run one trial, apply the winner."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from pronk.herd.apply import apply_changes
from pronk.herd.profile import job_profile
from pronk.herd.tracking import log_profile
from pronk.herd.tuner import Trial
from pronk.jobs.schema import JobConfig
from pronk.settings import Settings


@task(name="herd-profile", cache_policy=NO_CACHE)
def profile_job(job_id: str, settings: Settings, runs: int | None = None) -> dict[str, Any]:
    """Profile the job's step records and log the profile to MLflow with histograms."""
    profile = job_profile(job_id, settings, runs)
    run_id = log_profile(profile, job_id, settings)
    get_run_logger().info("profile of %s (MLflow run %s):\n%s", job_id, run_id, profile.text())
    return {"mlflow_run_id": run_id, **profile.summary()}


@task(name="herd-trial", cache_policy=NO_CACHE)
def herd_trial(label: str, run: Callable[[], Trial]) -> Trial:
    """One configuration replayed on temporary workers; its figures are the task run's log line."""
    trial = run()
    figures = asdict(trial.measurement) if trial.measurement else {"error": trial.error}
    if trial.quality is not None:
        figures["labelled_set"] = trial.quality.describe()
    get_run_logger().info("trial %s %s: %s", label, trial.params or "current configuration", figures)
    return trial


@task(name="herd-apply", cache_policy=NO_CACHE)
def apply_winner(
    job_file: JobConfig, changes: dict[str, Any], mlflow_run_id: str, settings: Settings
) -> dict[str, Any]:
    """Record the winner as the job's next configuration version and roll it out."""
    version, applied = apply_changes(job_file, changes, mlflow_run_id, settings, "herd flow")
    get_run_logger().info(
        "job %s: configuration version %d applied (%s)", job_file.job_id, version.version, applied.mode
    )
    return {"version": version.version, "mode": applied.mode, "restarted": applied.restarted}
