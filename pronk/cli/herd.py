"""Command line of Herd: `pronk herd profile|tune|versions|use` and `pronk runs`."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from pronk.cli.terminal import JobOption, fail
from pronk.settings import get_settings

herd_app = typer.Typer(no_args_is_help=True, help="Herd: profile a job's traffic, tune its configuration, apply it.")


def _job(job: str | None, versions: bool = True):
    """The job the command names, resolved (with `versions` false: as its file says, no configuration version)."""
    from pronk.jobs.catalog import resolve_job

    try:
        settings = get_settings()
        return resolve_job(job or settings.default_job, settings, versions)
    except KeyError as exc:
        fail(str(exc.args[0]))


@herd_app.command("profile")
def herd_profile(
    job: JobOption = None,
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


@herd_app.command("tune")
def herd_tune(
    job: JobOption = None,
    budget_minutes: Annotated[float, typer.Option("--budget-minutes", help="Stop within this many minutes.")] = 10.0,
    sample: Annotated[int, typer.Option(help="Root traces of the job's own traffic replayed per trial.")] = 8,
    repeats: Annotated[int, typer.Option(help="Replays of the current configuration (the guard's noise).")] = 2,
    knobs: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated knobs to search (default: all; `live` = no new workers; `concurrency` = lines in "
            "flight and the KV host tier's size)."
        ),
    ] = None,
    max_workers: Annotated[int | None, typer.Option(help="Most workers a candidate may have.")] = None,
    time_scale: Annotated[float, typer.Option(help="Multiplies the replayed tool-call gaps.")] = 1.0,
    runs: Annotated[int | None, typer.Option(help="Profile only the job's last N batches.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the sample and of Optuna's sampler.")] = 0,
    apply: Annotated[bool, typer.Option(help="Apply the winner when the guard accepts it.")] = False,
) -> None:
    """Replay the job's own traces against candidate configurations on temporary workers; report (and apply) the
    winner. The summary is the last stdout line, as JSON."""
    from pronk.herd.apply import apply_changes
    from pronk.herd.profile import NoStepRecords
    from pronk.herd.tuner import TuneConfig, Tuner, chosen_knobs
    from pronk.jobs.versions import with_current_version

    settings = get_settings()
    job_file = _job(job, versions=False)
    config = with_current_version(job_file, settings)
    tune_config = TuneConfig(
        budget_minutes=budget_minutes,
        sample=sample,
        repeats=repeats,
        knobs=chosen_knobs(knobs.split(",") if knobs else None),
        max_workers=max_workers,
        time_scale=time_scale,
        runs=runs,
        seed=seed,
    )
    try:
        result = Tuner(config, settings, tune_config).tune()
    except (NoStepRecords, ValueError) as exc:
        fail(str(exc))
    summary = result.summary()
    for row, trial in zip(summary["table"], result.trials, strict=True):
        labelled = f"labelled set {trial.quality.describe()}  " if trial.quality is not None else ""
        typer.echo(
            f"{row['trial']:<22} {row['tasks_per_dollar']:>12,.1f} tasks/$  p50 {row['p50_s']}  p90 {row['p90_s']}  "
            f"cached {row['cached_ratio']}  {labelled}{row['error'] or json.dumps(row['params'])}",
            err=True,
        )
    if result.verdict is not None:
        typer.echo(f"guard: {'accepted' if result.verdict.accept else 'refused'}: {result.verdict.reason}", err=True)
        if apply and result.verdict.accept and result.winner is not None:
            version, applied = apply_changes(
                job_file, result.winner.changes, result.mlflow_run_id, settings, f"herd tune {result.winner.label}"
            )
            summary["applied"] = {"version": version.version, "mode": applied.mode, "restarted": applied.restarted}
            typer.echo(f"applied as configuration version {version.version} ({applied.mode})", err=True)
    typer.echo(json.dumps(summary, default=str))


@herd_app.command("versions")
def herd_versions(job: JobOption = None) -> None:
    """The job's configuration versions (the current one marked)."""
    from pronk.jobs.versions import current_version, job_versions

    config = _job(job)
    settings = get_settings()
    current = current_version(config.job_id, settings)
    for version in job_versions(config.job_id, settings):
        mark = "*" if current and current.version == version.version else " "
        typer.echo(f"{mark} v{version.version}  run {version.mlflow_run_id}  {json.dumps(version.changes)}")
    if current is None:
        typer.echo("* the job file alone (no version current)")


@herd_app.command("use")
def herd_use(
    version: Annotated[int, typer.Argument(help="Configuration version to make current; 0 = the job file alone.")],
    job: JobOption = None,
) -> None:
    """Make a configuration version current and roll it out (a rolling restart when workers need one)."""
    from pronk.herd.apply import use_version
    from pronk.jobs.schema import JobFileError

    config = _job(job, versions=False)
    try:
        applied = use_version(config, version, get_settings())
    except JobFileError as exc:
        fail(str(exc))
    typer.echo(f"job {config.job_id} runs configuration version {version} ({applied.mode})")


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

        from pronk.batches.report import recent_runs, runs_table
        from pronk.jobs.catalog import load_jobs

        settings = get_settings()
        job_ids = [_job(job).job_id] if job else sorted(load_jobs(settings))
        rows = recent_runs(settings, job_ids, limit)
        if as_json:
            for row in rows:
                typer.echo(json.dumps(asdict(row)))
        else:
            typer.echo(runs_table(rows))
