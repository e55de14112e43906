"""Command line of the improve loop (Leap's producer): `pronk improve`, rounds of rollouts, training and a Leap
through the canary, and the labelled sets it learns from: `pronk improve training-set` (the agent training set) and
`pronk improve enrichment-sets` (an enrichment's training and held-out sets)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Annotated

import typer

from pronk.cli.terminal import JobOption, improve_reading, progress_bar
from pronk.settings import get_settings

improve_app = typer.Typer()


@improve_app.callback(invoke_without_command=True)
def improve(
    ctx: typer.Context,
    job: JobOption = None,
    rounds: Annotated[
        int | None, typer.Option(min=1, help="Rounds to run (default: the job's improve.rounds).")
    ] = None,
    canary: Annotated[
        bool,
        typer.Option(
            "--canary/--no-canary", help="Leap each new version through the canary on the job's held-out set."
        ),
    ] = True,
    seed: Annotated[
        int | None, typer.Option(help="First rollout seed (default: the job's improve.seed); rounds draw from it.")
    ] = None,
    training_set: Annotated[
        str | None, typer.Option(help="Labelled lines to learn from (default: the job's improve.training_set).")
    ] = None,
    held_out: Annotated[
        str | None,
        typer.Option(help="Labelled lines the canary judges each version on (default: the job's quality set)."),
    ] = None,
) -> None:
    """Improve the job's weights from its own checked traces: rollouts of its training set on the running workers,
    the passes kept, a bounded fine-tune, the next MLflow version, a Leap through the canary; round after round.
    On a terminal a progress bar shows each round's rollouts checked, training steps and loss, and canary lines.
    `training-set` and `enrichment-sets` write the labelled sets it learns from."""
    if ctx.invoked_subcommand is not None:
        return
    from pronk.stack.prefect_env import configure_prefect

    settings = get_settings()
    configure_prefect(settings)
    from pronk.flows.improve import improve as improve_flow
    from pronk.jobs.catalog import resolve_job

    job_id = resolve_job(job or settings.default_job, settings).job_id
    with progress_bar(improve_reading(job_id, time.time(), settings), f"improve {job_id}"):
        records = asyncio.run(  # NotImprovable, a PronkError, ends the command in one line (pronk.cli.main)
            improve_flow(
                job_id=job_id, rounds=rounds, canary=canary, seed=seed, training_set=training_set, held_out=held_out
            )
        )
    for record in records:
        typer.echo(f"round {record['round']} ({record['id']}): {record['status']}: {record['message']}", err=True)
    typer.echo(json.dumps(records))


@improve_app.command("training-set")
def training_set_command(
    job: Annotated[
        str, typer.Option("--job", help="The job whose sql and search tools look the answers up.")
    ] = "smollm2-cpu",
    seed: Annotated[int, typer.Option(help="Seed of the tasks drawn.")] = 0,
    out: Annotated[
        Path | None, typer.Option(help="Where to write it (default: data/labelled/agent-train.jsonl).")
    ] = None,
) -> None:
    """Generate the agent training set: tasks of the held-out set's families whose checks are computed or looked up
    with the job's own tools, none of them a held-out task; the same seed writes the same file."""
    from pronk.agents.tools import job_tools
    from pronk.improve.agent_training_set import TRAINING_SET, write_training_set
    from pronk.jobs.catalog import resolve_job

    settings = get_settings()
    target = out or TRAINING_SET
    lines = write_training_set(job_tools(resolve_job(job, settings), settings.sandbox_bwrap), seed, target)
    typer.echo(f"wrote {lines} lines to {target}")


@improve_app.command("enrichment-sets")
def enrichment_sets_command(
    spec: Annotated[str, typer.Option(help="An enrichment spec with a labelled sample (`labels:`).")] = "companies",
    rows: Annotated[int, typer.Option(help="Made-up rows of the training set.")] = 96,
    seed: Annotated[int, typer.Option(help="Seed of the made-up rows.")] = 0,
    out: Annotated[Path | None, typer.Option(help="Folder to write both sets in (default: data/labelled).")] = None,
) -> None:
    """Write an enrichment's two sets for `pronk improve --training-set … --held-out …`: its labelled rows as the
    enrichment asks them (held out, for the canary) and made-up rows of the same template to learn from."""
    from pronk.enrich.spec import load_spec
    from pronk.improve.enrichment_sets import LABELLED, write_sets
    from pronk.jobs.catalog import resolve_job

    settings = get_settings()
    enrichment = load_spec(spec)
    for path in write_sets(enrichment, resolve_job(enrichment.job, settings), rows, seed, out or LABELLED, settings):
        typer.echo(f"wrote {path}")


def register(app: typer.Typer) -> None:
    """Add `pronk improve …` to the command line."""
    app.add_typer(improve_app, name="improve")
