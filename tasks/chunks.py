"""The chunk task of the batch flow, and the progress loop that persists finished lines while chunks run."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from prefect import task
from prefect.artifacts import acreate_progress_artifact, aupdate_progress_artifact
from prefect.cache_policies import NO_CACHE

from pronk.agents.harness import Harness
from pronk.batches.run import BatchRun
from pronk.batches.store import BatchStore
from pronk.protocol.lines import ValidRequest
from tasks.prefect_calls import best_effort
from tasks.traces import trace_row

logger = logging.getLogger(__name__)

PERSIST_EVERY_S = 2.0
"""Finished lines are written as one part about this often: a crash loses at most this much, plus what was in flight."""


@task(cache_policy=NO_CACHE, task_run_name="requests-{start}-{stop}")
async def run_chunk(run: BatchRun, harness: Harness, start: int, stop: int) -> int:
    """Run the unfinished requests [start, stop) of the batch concurrently, bounded by the job's concurrency."""

    async def one(request: ValidRequest) -> None:
        async with run.slots:
            if run.stop_reason is not None:
                run.unstarted.append(request)
                return
            outcome = await harness.run_line(request)
            run.record(outcome, harness.recorder.take_line(request.custom_id), trace_row(outcome))

    await asyncio.gather(*(one(r) for r in run.todo[start:stop]))
    return stop - start


async def run_chunks(run: BatchRun, harness: Harness, store: BatchStore, chunk_size: int) -> None:
    """All unfinished requests, one task run per chunk, while a loop persists results and reports progress."""
    stopped = asyncio.Event()
    reporter = asyncio.create_task(report_progress(run, store, stopped))
    try:
        await asyncio.gather(
            *(
                run_chunk(run, harness, start, min(start + chunk_size, len(run.todo)))
                for start in range(0, len(run.todo), chunk_size)
            )
        )
    finally:
        stopped.set()
        await reporter


async def report_progress(run: BatchRun, store: BatchStore, stopped: asyncio.Event, interval_s: float = 1.0) -> None:
    """About once a second: persist finished lines, check for a stop, save the record, move the progress artifact.

    The record in the store is the source of truth: storage trouble is retried on the next tick and a
    Prefect API that is down only skips the artifact, so neither stops the run.
    """
    total = max(run.batch.request_counts.total, 1)
    artifact_id = None
    last_persist = time.monotonic()
    while not stopped.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopped.wait(), interval_s)
        if stopped.is_set():
            return
        if time.monotonic() - last_persist >= PERSIST_EVERY_S:
            last_persist = time.monotonic()
            seq, lines = run.take_pending()
            try:
                await asyncio.to_thread(run.persist, seq, lines)
            except Exception as exc:  # noqa: BLE001 - the next tick writes them again
                logger.warning("batch %s: persisting %d lines failed, retrying: %s", run.batch.id, len(lines), exc)
                run.pending[:0] = lines
        try:
            await asyncio.to_thread(run.check_stop, store)
            await asyncio.to_thread(store.save, run.batch)
        except Exception as exc:  # noqa: BLE001 - the next tick saves again
            logger.warning("batch %s: saving progress failed: %s", run.batch.id, exc)
        progress = 100.0 * run.done / total
        if artifact_id is None:
            artifact_id = await best_effort(
                "progress artifact",
                acreate_progress_artifact(progress=progress, key=None, description=f"batch {run.batch.id}"),
            )
        else:
            await best_effort("progress update", aupdate_progress_artifact(artifact_id, progress=progress))
