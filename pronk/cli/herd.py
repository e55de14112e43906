"""Command line of Herd: `pronk herd profile|tune|versions|use` and `pronk runs`."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from pronk.cli.terminal import fail
from pronk.settings import get_settings

herd_app = typer.Typer(no_args_is_help=True, help="Herd: profile a job's traffic, tune its configuration, apply it.")
JobArg = Annotated[str | None, typer.Option("--job", help="Job id or name (default: the settings' default job).")]


def _job(job: str | None):
    from pronk.jobs import get_job

    try:
        return get_job(job or get_settings().default_job)
    except KeyError as exc:
        fail(str(exc.args[0]))


@herd_app.command("profile")
def herd_profile(
    job: JobArg = None,
    runs: Annotated[int | None, typer.Option(help="Profile only the job's last N batches.")] = None,
    mlflow: Annotated[bool, typer.Option(help="Also log the profile as an MLflow run with histograms.")] = True,
) -> None:
    """Print the job's traffic profile from its step records, and log it to MLflow with histograms."""
    from pronk.herd.profile import NoStepRecords, job_profile
    from pronk.herd.tracking import log_profile

    settings = get_settings()
    config = _job(job)
    try:
        profile = job_profile(config.job_id, settings, runs)
    except NoStepRecords as exc:
        fail(str(exc))
    typer.echo(profile.text())
    if mlflow:
        run_id = log_profile(profile, config.job_id, settings)
        typer.echo(f"MLflow run {run_id} (experiment pronk-{config.job_id})", err=True)


def register(app: typer.Typer) -> None:
    """Add `pronk herd …` and `pronk runs` to the command line."""
    app.add_typer(herd_app, name="herd")

    @app.command("runs")
    def runs(
        job: Annotated[str | None, typer.Option("--job", help="Only this job's batches (id or name).")] = None,
        limit: Annotated[int, typer.Option(help="Most batches shown, newest first.")] = 20,
        as_json: Annotated[bool, typer.Option("--json", help="One JSON object per batch instead of a table.")] = False,
    ) -> None:
        """A table of recent batches: status, lines, tokens, cached %, cost, tasks per dollar, duration, model."""
        from dataclasses import asdict

        from pronk.herd.reports import recent_runs, runs_table
        from pronk.jobs import load_jobs

        settings = get_settings()
        job_ids = [_job(job).job_id] if job else sorted(load_jobs())
        rows = recent_runs(settings, job_ids, limit)
        if as_json:
            for row in rows:
                typer.echo(json.dumps(asdict(row)))
        else:
            typer.echo(runs_table(rows))
