"""Command line of enrichment jobs: `pronk enrich run SPEC [--limit N]` and `pronk enrich show SPEC`."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from pronk.cli.terminal import batch_progress, fail
from pronk.settings import get_settings

enrich_app = typer.Typer(no_args_is_help=True, help="Keep a table's columns filled by agents (enrichment specs).")

SpecArgument = Annotated[
    str, typer.Argument(help="A spec file, or the name of one in deployments/enrichments/ (e.g. companies).")
]


@enrich_app.command("run")
def enrich_run(
    spec: SpecArgument,
    limit: Annotated[int | None, typer.Option(min=1, help="Ask about at most this many rows in this run.")] = None,
) -> None:
    """Enrich the rows that are new or changed since the last run; print the run's summary last, as one JSON line."""
    import asyncio

    from pronk.stack.prefect_env import configure_prefect

    settings = get_settings()
    configure_prefect(settings)
    from pronk.enrich.open_run import EnrichRunning, read_open_run
    from pronk.enrich.spec import EnrichSpecError, load_spec
    from pronk.enrich.table import results_uri
    from pronk.flows.enrich import enrich_table
    from pronk.host_process import HostProcess
    from pronk.protocol.ids import new_id

    try:
        enrichment = load_spec(spec)
    except EnrichSpecError as exc:
        fail(str(exc))
    name, results = enrichment.name, results_uri(enrichment, settings)
    batch_id = new_id("batch")

    def asking() -> str:
        """The batch this process asks: a run taking over a crashed one's runs on under that run's batch."""
        marker = read_open_run(results, settings)
        return marker.batch_id if marker is not None and marker.process() == HostProcess.this() else batch_id

    with batch_progress(asking, name):
        try:
            run = asyncio.run(enrich_table(spec=spec, limit=limit, batch_id=batch_id))
        except (EnrichSpecError, EnrichRunning) as exc:
            fail(f"enrichment {name} refused, nothing written: {exc}")
    typer.echo(
        f"enrichment {name}: {run['rows']} rows; {run['new']} new, {run['changed']} changed, {run['retried']} retried,"
        f" {run['skipped']} skipped, {run['failed']} failed, {run['pending']} pending; {run['steps']} engine steps,"
        f" {run['cost_usd']:.6f} USD; {run['version_uri']}",
        err=True,
    )
    _print_head(name, spec)
    typer.echo(json.dumps(run))


def _print_head(name: str, spec: str, rows: int = 10) -> None:
    import polars as pl

    from pronk.enrich.spec import load_spec
    from pronk.enrich.table import read_current, results_uri

    settings = get_settings()
    enrichment = load_spec(spec)
    table = read_current(results_uri(enrichment, settings), settings)
    if table is None:
        typer.echo(f"enrichment {name} has no enriched table yet", err=True)
        return
    columns = [c for c in (*enrichment.key, *enrichment.outputs, "_check", "_error") if c in table.columns]
    with pl.Config(tbl_rows=rows, tbl_cols=len(columns), fmt_str_lengths=40, tbl_width_chars=160):
        typer.echo(table.select(columns).head(rows), err=True)


@enrich_app.command("show")
def enrich_show(
    spec: SpecArgument,
    rows: Annotated[int, typer.Option(min=1, help="Rows of the table to show.")] = 10,
) -> None:
    """The current enriched table's head and the history of runs."""
    from pronk.enrich.history import History
    from pronk.enrich.spec import EnrichSpecError, load_spec
    from pronk.enrich.table import CURRENT, results_uri

    settings = get_settings()
    try:
        enrichment = load_spec(spec)
    except EnrichSpecError as exc:
        fail(str(exc))
    results = results_uri(enrichment, settings)
    typer.echo(f"{results}/{CURRENT}", err=True)
    _print_head(enrichment.name, spec, rows)
    for run in History(results, settings).runs():
        typer.echo(
            f"{run.run_id}  rows={run.rows} new={run.new} changed={run.changed} retried={run.retried} "
            f"skipped={run.skipped} failed={run.failed} pending={run.pending} steps={run.steps} "
            f"cost={run.cost_usd:.6f} tasks_per_dollar={run.tasks_per_dollar} model={run.model_version}"
        )


def register(app: typer.Typer) -> None:
    """Add `pronk enrich` to the `pronk` command line."""
    app.add_typer(enrich_app, name="enrich")
