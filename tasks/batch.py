"""The batch's steps in Prefect, for the batch flow and the enrich flow: read and validate its input (a task run
each), run its unfinished lines (one task run per chunk), then finish and publish it.

`run_opened_batch` is the sequence both flows run once they hold the batch's record and its resolved job; it calls
the domain (`pronk.batches.run.BatchRun` keeps the bookkeeping) and pronk's Prefect client side (`pronk.control`),
never a flow: a flow calls these steps, the steps call the domain, one way down.
"""

from __future__ import annotations

import asyncio

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from pronk import storage
from pronk.agents.harness import Harness, job_router
from pronk.agents.step_records import StepRecorder
from pronk.agents.tools.scratch import scratch_dir
from pronk.batches.file_store import FileStore
from pronk.batches.input import BatchInputError, ValidatedInput, validate_input
from pronk.batches.progress import progress_kept
from pronk.batches.prompt_length import input_limits
from pronk.batches.results import ResultParts
from pronk.batches.run import BatchFailed, BatchRun, finish_run, reject_input
from pronk.batches.schemas import TERMINAL_STATUSES, Batch
from pronk.batches.store import BatchStore
from pronk.control.artifacts import ProgressArtifact, publish_batch_report, publish_summary
from pronk.control.trace_sample.drawer import publish_traces
from pronk.herd.profile import in_flight_start
from pronk.jobs.schema import JobConfig
from pronk.settings import Settings

CHUNK_SIZE = 64
"""Requests a chunk's task run holds unless the run asks otherwise (`run_batch`'s `chunk_size`)."""


@task(cache_policy=NO_CACHE, retries=2, retry_delay_seconds=1)
def read_input_file(uri: str, settings: Settings) -> bytes:
    """Read the batch input file from a local path or s3://."""
    try:
        return storage.read_bytes(uri, settings)
    except (OSError, ValueError) as exc:
        raise BatchInputError(f"cannot read input file {uri}: {exc}") from exc


@task(cache_policy=NO_CACHE)
def validate_lines(data: bytes, job: JobConfig, settings: Settings) -> ValidatedInput:
    """Split the input into valid requests and error lines; prompts too long for the job are rejected here."""
    return validate_input(data, job, input_limits(job, settings))


@task(cache_policy=NO_CACHE, task_run_name="requests-{start}-{stop}")
async def run_chunk(run: BatchRun, harness: Harness, start: int, stop: int) -> int:
    """Run the unfinished requests [start, stop) of the batch concurrently, bounded by the job's concurrency."""
    await run.run_lines(harness, start, stop)
    return stop - start


async def run_opened_batch(
    batch: Batch,
    job: JobConfig,
    input_uri: str,
    settings: Settings,
    chunk_size: int = CHUNK_SIZE,
    trace_sample: int | None = None,
) -> dict:
    """Run the batch `pronk.batches.run.open_batch` recorded for this flow run, on `job` (resolved by the flow):
    read and validate its input, run the lines no earlier run persisted, write its files, publish its summary,
    report and trace sample (`trace_sample` traces; None: the job's). Returns the batch object."""
    logger = get_run_logger()
    store = BatchStore(settings)
    if batch.status in TERMINAL_STATUSES:
        logger.info("batch %s is already %s: nothing to run", batch.id, batch.status)
        return batch.model_dump(mode="json")
    try:
        validated = validate_lines(read_input_file(input_uri, settings), job, settings)
    except Exception as exc:  # any failure to read the input ends the batch `failed`, never stuck `validating`
        if not isinstance(exc, BatchInputError):
            logger.exception("batch %s: reading its input failed", batch.id)
        reject_input(batch, store, exc)
        raise BatchFailed(f"batch {batch.id} failed: {exc}") from exc
    start = (
        await asyncio.to_thread(in_flight_start, job.job_id, settings)
        if job.scheduling.concurrency == "adaptive"
        else None
    )
    run = BatchRun.resume(batch, job, validated, ResultParts(batch.id, settings), batch.flow_run_id, start)
    batch.mark("in_progress")
    store.save(batch)
    logger.info(
        "batch %s: %d lines, %d invalid, %d finished by earlier runs, job %s",
        batch.id,
        validated.total,
        len(validated.errors),
        len(run.finished),
        job.job_id,
    )
    router = job_router(job, settings)
    harness = Harness(
        router, job, StepRecorder(), scratch_dir(settings, batch.id), sandbox_bwrap=settings.sandbox_bwrap
    )
    run.check_stop(store)
    try:
        async with progress_kept(run, store, ProgressArtifact(f"batch {batch.id}")):
            await asyncio.gather(*(run_chunk(run, harness, first, stop) for first, stop in run.chunks(chunk_size)))
    finally:
        await router.aclose()
    finish_run(run, store, FileStore(settings))

    await publish_summary(run)
    await publish_batch_report(run, settings)
    await publish_traces(run, settings, job.observability.trace_sample if trace_sample is None else trace_sample)
    logger.info("batch %s %s: %s", batch.id, batch.status, batch.request_counts.model_dump())
    return batch.model_dump(mode="json")
