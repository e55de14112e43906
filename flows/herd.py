"""The Herd flow: profile a job's traffic, tune its configuration on temporary workers, apply the winner.

Profile, every trial and apply are task runs, so the run page lists each trial with its figures; the tuning run
and its trials are also MLflow runs of the job's experiment. The `herd` deployment runs it on demand or on its
(inactive by default) schedule.
"""

from __future__ import annotations

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from pronk.control.dead_runs import record_process
from pronk.herd.tuner import TuneConfig, Tuner, chosen_knobs
from pronk.jobs.catalog import resolve_job
from pronk.jobs.versions import with_current_version
from pronk.settings import get_settings
from pronk.stack.prefect_env import show_pronk_logs
from pronk.tasks.herd import apply_winner, herd_trial, profile_job


@flow(name="herd", log_prints=False, on_running=[record_process])
def herd(
    job_id: str,
    budget_minutes: float = 10.0,
    sample: int = 8,
    repeats: int = 2,
    knobs: list[str] | None = None,
    max_workers: int | None = None,
    time_scale: float = 1.0,
    runs: int | None = None,
    apply: bool = False,
) -> dict:
    """Profile the job, replay its traces against Optuna's candidates within the budget, apply the winner when
    `apply` and the guard accepts it. `knobs`: names of `pronk.herd.tuner.KNOBS`, or one group of its `KNOB_GROUPS`
    (["live"], ["concurrency"])."""
    show_pronk_logs()
    logger = get_run_logger()
    settings = get_settings()
    job_file = resolve_job(job_id, settings, versions=False)
    job = with_current_version(job_file, settings)
    profile_job(job.job_id, settings, runs)
    config = TuneConfig(
        budget_minutes=budget_minutes,
        sample=sample,
        repeats=repeats,
        knobs=chosen_knobs(knobs),
        max_workers=max_workers,
        time_scale=time_scale,
        runs=runs,
    )
    result = Tuner(
        job, settings, config, lambda label, run: herd_trial.with_options(task_run_name=label)(label, run)
    ).tune()
    summary = result.summary()
    if apply and result.verdict is not None and result.verdict.accept and result.winner is not None:
        summary["applied"] = apply_winner(job_file, result.winner.changes, result.mlflow_run_id, settings)
    create_markdown_artifact(markdown=result.markdown(), key=None, description=f"herd tuning of {job.job_id}")
    logger.info("herd %s: %d trials, verdict %s", job.job_id, len(result.trials), summary["verdict"])
    return summary
