"""Enrichment overhead: the same rows through `enrich_table` vs the same agent lines as a plain batch (`run_batch`).

Starts its own embedded stack (Prefect server and the default job's workers, fresh data dir and
ports), makes a table of `--rows` synthetic companies, and alternates rounds: the rows' agent lines
(built by `pronk.enrich.lines`, seeded, so both sides ask for the same work) as one `run_batch` call,
and `enrich_table` on a fresh results folder (every row new: scan, fingerprint, lines, the same
batch inside the enrich flow run, parse, merge, versioned write, history, artifacts), in alternating order.
The goal: enrich's median wall time is at most 1.10x the batch's. Prints every round and the medians as JSON.

    .venv/bin/python -m bench.experiments.enrich [--rows 96] [--rounds 3] [--max-steps 2] [--tools search]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path

from bench.experiments import scratch_stack

GOAL = 1.10


def make_table(path: Path, rows: int) -> None:
    import polars as pl

    from pronk.settings import PROJECT_ROOT

    base = pl.read_csv(PROJECT_ROOT / "data" / "tables" / "companies.csv")
    repeated = pl.concat([base] * (rows // base.height + 1)).head(rows)
    repeated = repeated.with_columns(
        company_id=pl.int_range(1, rows + 1), name=pl.col("name") + " " + pl.int_range(1, rows + 1).cast(pl.String)
    )
    repeated.write_csv(path)


def write_spec(folder: Path, table: Path, args) -> Path:
    import yaml

    from pronk.settings import PROJECT_ROOT

    spec = yaml.safe_load((PROJECT_ROOT / "deployments" / "enrichments" / "companies.yaml").read_text())
    spec.update(
        {
            "name": "bench",
            "table": str(table),
            "filter": None,
            "schedule": None,
            "tools": args.tools,
            "max_steps": args.max_steps,
            "seed": 7,
        }
    )
    path = folder / "bench.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


async def plain_batch(spec_path: Path, folder: Path, tag: str, settings) -> float:
    """The same rows' lines as a batch file, through `run_batch` alone."""
    from pronk.enrich.lines import input_file
    from pronk.enrich.spec import load_spec
    from pronk.enrich.table import read_rows
    from pronk.flows.batch import run_batch
    from pronk.jobs.catalog import resolve_job

    spec = load_spec(spec_path)
    job = resolve_job(spec.job, settings)
    rows = read_rows(spec, settings).to_dicts()
    lines = folder / f"lines-{tag}.jsonl"
    lines.write_bytes(input_file(spec, job, [(f"row-{i}", row) for i, row in enumerate(rows)]))
    started = time.monotonic()
    batch = await run_batch(input_uri=str(lines), job_id=job.job_id, output_dir=str(folder / f"batch-{tag}"))
    assert batch["status"] == "completed", batch
    return time.monotonic() - started


async def enrich(spec_path: Path, folder: Path, tag: str) -> tuple[float, dict]:
    """The same rows through `enrich_table`, every row new (a fresh results folder)."""
    import yaml

    from pronk.flows.enrich import enrich_table

    spec = yaml.safe_load(spec_path.read_text())
    spec["results"] = str(folder / f"results-{tag}")
    fresh = folder / f"bench-{tag}.yaml"
    fresh.write_text(yaml.safe_dump(spec))
    started = time.monotonic()
    run = await enrich_table(spec=str(fresh))
    return time.monotonic() - started, run


async def measure(args, folder: Path, settings) -> list[dict]:
    folder.mkdir(parents=True, exist_ok=True)
    table = folder / "companies.csv"
    make_table(table, args.rows)
    spec = write_spec(folder, table, args)
    rounds = []
    for index in range(args.rounds):
        tag = f"r{index}"
        if index % 2 == 0:  # alternate which goes first, so neither always meets the warmer prefix cache
            batch_s = await plain_batch(spec, folder, tag, settings)
            enrich_s, run = await enrich(spec, folder, tag)
        else:
            enrich_s, run = await enrich(spec, folder, tag)
            batch_s = await plain_batch(spec, folder, tag, settings)
        rounds.append(
            {
                "round": index,
                "batch_s": round(batch_s, 3),
                "enrich_s": round(enrich_s, 3),
                "ratio": round(enrich_s / batch_s, 4),
                "enrich_steps": run["steps"],
                "enrich_failed": run["failed"],
            }
        )
        print(json.dumps(rounds[-1]), flush=True)
    return rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=96, help="rows of the table (and lines of the batch)")
    parser.add_argument("--rounds", type=int, default=3, help="batch/enrich pairs")
    parser.add_argument("--max-steps", type=int, default=2, help="agent steps per row")
    parser.add_argument("--tools", nargs="*", default=["search"], help="tools the agent may call")
    args = parser.parse_args()

    data_dir = scratch_stack("enrich") / "data"
    os.environ["PRONK_STORAGE_URI"] = str(data_dir / "store")
    from pronk.settings import get_settings
    from pronk.stack.prefect_env import configure_prefect

    get_settings.cache_clear()
    settings = get_settings()
    configure_prefect(settings)
    from pronk.stack import embedded

    try:
        embedded.up(settings, mlflow_ui=False, deploy=False, api=False, supervise=False)
        rounds = asyncio.run(measure(args, data_dir / "bench", settings))
    finally:
        embedded.down(settings)
    batch = statistics.median(r["batch_s"] for r in rounds)
    enriched = statistics.median(r["enrich_s"] for r in rounds)
    summary = {"batch_median_s": batch, "enrich_median_s": enriched, "ratio": round(enriched / batch, 4)}
    summary["goal"] = f"enrich <= {GOAL}x batch"
    summary["met"] = summary["ratio"] <= GOAL
    print(json.dumps({"config": vars(args), "rounds": rounds, "summary": summary}, indent=2))


if __name__ == "__main__":
    main()
