"""The chunk task of the batch flow: one task run per chunk of a batch's unfinished lines."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from pronk.agents.harness import Harness
from pronk.batches.run import BatchRun


@task(cache_policy=NO_CACHE, task_run_name="requests-{start}-{stop}")
async def run_chunk(run: BatchRun, harness: Harness, start: int, stop: int) -> int:
    """Run the unfinished requests [start, stop) of the batch concurrently, bounded by the job's concurrency."""
    await run.run_lines(harness, start, stop)
    return stop - start
