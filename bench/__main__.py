"""`python -m bench` (from the checkout): pronk against N stock vLLM servers on the same agent traces and single-step
file; prints the table. bench/ lives in the checkout, not in the installed package, and pronk never imports it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from bench.harness.config import BenchConfig
from pronk.settings import get_settings
from pronk.stack.prefect_env import configure_prefect

app = typer.Typer(add_completion=False)


@app.command()
def bench(
    job: Annotated[
        str | None, typer.Option("--job", help="Job id or name (default: the settings' default job).")
    ] = None,
    profile: Annotated[
        str,
        typer.Option(
            help="Workload profile (bench/harness/workload.py): cpu, agent-long, agent-real, smoke or reference."
        ),
    ] = "cpu",
    traces: Annotated[int | None, typer.Option(min=1, help="Root traces per round (default: the profile's).")] = None,
    rounds: Annotated[
        int, typer.Option(min=1, help="Rounds (seed + round each, setups rotated); every round is kept.")
    ] = 3,
    seed: Annotated[int, typer.Option(help="Workload seed.")] = 0,
    single_step_requests: Annotated[
        int, typer.Option(min=0, help="Lines of the single-step batch file (0: skip the single-step comparison).")
    ] = 64,
    limit: Annotated[
        bool, typer.Option(help="Also run the two offline limits (capacity-matched and compute-only).")
    ] = True,
    work_dir: Annotated[Path | None, typer.Option(help="Scratch folder (default: <data dir>/bench).")] = None,
    record: Annotated[
        bool,
        typer.Option(help="Write bench/RESULTS.md, bench/results/results.json and bench/results/completion_times.png."),
    ] = False,
) -> None:
    """pronk against N stock vLLM servers on the same agent traces and single-step file; prints the table."""
    from bench.harness.suite import run_bench  # imports vLLM (~10 s): not for --help

    settings = get_settings()
    configure_prefect(settings)
    config = BenchConfig(
        job=job or settings.default_job,
        profile=profile,
        traces=traces,
        rounds=rounds,
        seed=seed,
        single_step_requests=single_step_requests,
        limit=limit,
        work_dir=work_dir or settings.data_dir / "bench",
        record=record,
        command="python -m bench " + " ".join(sys.argv[1:]),
    )
    run_bench(config, settings, echo=typer.echo)


if __name__ == "__main__":
    app()
