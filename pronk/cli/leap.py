"""Command line of Leap: `pronk weights upload`, `pronk model finetune-tiny`, `pronk leap` and `pronk leap status`
(its producer, `pronk improve`, is `pronk.cli.improve`)."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated

import typer

from pronk.cli.terminal import JobOption, fail
from pronk.settings import get_settings
from pronk.worker_registry import worker_registry

weights_app = typer.Typer(no_args_is_help=True, help="Register checkpoints as model versions.")
leap_app = typer.Typer(help="Leap: swap a running job's weights to a model version in place.")


@weights_app.command("upload")
def weights_upload(
    src: Annotated[str, typer.Argument(help="Checkpoint directory (Hugging Face format): a local path or s3://…")],
    model: Annotated[str, typer.Option("--model", help="Registered model name, e.g. pronk-tiny.")],
    job: Annotated[
        str | None,
        typer.Option("--job", help="Validate against this job's current model (default: the settings' default job)."),
    ] = None,
) -> None:
    """Validate a checkpoint against the model's current version and register it as the next version."""
    from pronk.jobs.catalog import resolve_job
    from pronk.models.checkpoints import CheckpointMismatch
    from pronk.models.versions import upload_checkpoint

    settings = get_settings()
    job_model = resolve_job(job or settings.default_job, settings).model
    try:
        result = upload_checkpoint(src, model, job_model=job_model, settings=settings)
    except (CheckpointMismatch, FileNotFoundError) as exc:
        fail(f"refused, nothing registered: {exc}")
    typer.echo(f"registered {result.uri} (parent version {result.parent_version})", err=True)
    typer.echo(result.model_dump_json())


def finetune_tiny(
    source: Annotated[str, typer.Option("--from", help="Version to start from.")] = "models:/pronk-tiny@live",
    steps: Annotated[int, typer.Option(min=1, help="Optimizer steps.")] = 12,
    learning_rate: Annotated[float, typer.Option("--lr", help="AdamW learning rate.")] = 3e-3,
    seed: Annotated[int, typer.Option(help="Seed of data order and optimizer.")] = 0,
) -> None:
    """Train the tiny model a few seconds on CPU and register the result as the next version."""
    from pronk.jobs.schema import ImproveConfig
    from pronk.models.tiny_finetune import TINY_TRAINING, finetune

    changed = {"max_steps": steps, "learning_rate": learning_rate, "seed": seed}
    result = finetune(get_settings(), source, ImproveConfig.model_validate({**TINY_TRAINING.model_dump(), **changed}))
    typer.echo(
        f"loss {result.first_loss:.3f} → {result.last_loss:.3f} in {result.train_seconds:.1f}s; registered "
        f"{result.uri}",
        err=True,
    )
    typer.echo(result.model_dump_json())


@leap_app.callback(invoke_without_command=True)
def leap_run(
    ctx: typer.Context,
    job: JobOption = None,
    version: Annotated[int | None, typer.Option("--version", min=1, help="Model version to serve.")] = None,
    alias: Annotated[str | None, typer.Option("--alias", help="Serve the version this alias names.")] = None,
    canary: Annotated[
        bool,
        typer.Option(
            "--canary/--no-canary",
            help="With the job's labelled set, switch one worker first and the rest only if its success rate holds.",
        ),
    ] = True,
) -> None:
    """Swap the job's running workers to a model version (`--version N` or `--alias A`); prints the Leap record.

    A job with a labelled set (`quality.labelled_set`) switches one worker first, runs the set on it beside the
    others, and refuses a version that passes fewer checks beyond noise; `--no-canary` skips that check.
    """
    if ctx.invoked_subcommand is not None:
        return
    from pronk.stack.prefect_env import configure_prefect

    settings = get_settings()
    configure_prefect(settings)
    from pronk.flows.leap import leap
    from pronk.jobs.catalog import resolve_job

    job_id = resolve_job(job or settings.default_job, settings).job_id
    # A refused or failed Leap (a PronkError) ends the command in one line: pronk.cli.main.
    record = asyncio.run(leap(job_id=job_id, version=version, alias=alias, canary=canary))
    typer.echo(f"{record['message']} (switch {record['switch_seconds'] or 0:.3f}s)", err=True)
    typer.echo(json.dumps(record))


@leap_app.command("status")
def leap_status(
    job: JobOption = None,
) -> None:
    """Each live worker's version and Leap state, and the job's latest Leap."""
    from pronk.jobs.catalog import resolve_job
    from pronk.leap.records import LeapStore

    settings = get_settings()
    job_id = resolve_job(job or settings.default_job, settings).job_id
    for entry in worker_registry(settings).live(job_id):
        staged = f"  staged {entry.stats.staged_version}" if entry.stats.staged_version else ""
        typer.echo(f"{entry.worker_id:24} {entry.stats.leap_state:10} {entry.stats.model_version}{staged}")
    record = LeapStore(settings).latest(job_id)
    if record is None:
        typer.echo(f"no Leap of {job_id} yet")
        return
    typer.echo(
        f"latest Leap {record.id}: {record.from_version} → {record.to_version} {record.status}: {record.message}"
    )
    if record.canary:
        typer.echo(f"  {record.canary_summary()}")
    for row in record.table():
        typer.echo("  " + "  ".join(f"{k}={v}" for k, v in row.items() if v not in (None, "")))


def register(app: typer.Typer, model_app: typer.Typer) -> None:
    """Add Leap's commands to the `pronk` command line."""
    app.add_typer(weights_app, name="weights")
    app.add_typer(leap_app, name="leap")
    model_app.command("finetune-tiny")(finetune_tiny)
