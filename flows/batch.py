"""The batch flow: one Prefect flow run per batch, one task run per chunk of requests, steps straight to the router."""

from __future__ import annotations

import asyncio
import time
from typing import Literal

from prefect import flow, get_run_logger, runtime, task
from prefect.artifacts import (
    acreate_progress_artifact,
    acreate_table_artifact,
    aupdate_progress_artifact,
)
from prefect.cache_policies import NO_CACHE

from engine.registry import Registry
from engine.router import Router
from pronk import storage
from pronk.agents.harness import Harness
from pronk.agents.outcomes import RequestOutcome
from pronk.agents.step_records import StepRecorder
from pronk.batches.files import FileStore
from pronk.batches.input import BatchInputError, ValidRequest, error_line
from pronk.batches.outputs import output_line
from pronk.batches.schemas import (
    Batch,
    BatchErrorData,
    BatchErrors,
    ErrorCode,
    OutputLine,
    new_id,
)
from pronk.batches.store import BatchStore
from pronk.errors import PronkError
from pronk.jobs import JobConfig, get_job
from pronk.settings import get_settings
from tasks.files import read_input_file, validate_lines, write_result_files
from tasks.traces import scratch_dir, write_trace_outputs


class BatchFailed(PronkError, RuntimeError):
    """The batch ended `failed`; its record says why."""


class BatchRun:
    """Live state of one run, shared by its chunk tasks (a plain class, so Prefect passes it through untouched)."""

    def __init__(self, batch: Batch, job: JobConfig, harness: Harness, requests: list[ValidRequest]):
        self.batch = batch
        self.job = job
        self.harness = harness
        self.requests = requests
        self.slots = asyncio.Semaphore(job.max_concurrency)
        self.outcomes: list[RequestOutcome] = []
        self.workers_seen: set[str] = set()
        self.stop_reason: Literal["cancelled", "expired"] | None = None
        self.unstarted: list[ValidRequest] = []

    def record(self, outcome: RequestOutcome) -> None:
        self.outcomes.append(outcome)
        counts = self.batch.request_counts
        completion = outcome.completion
        if completion is None:
            counts.failed += 1
            return
        counts.completed += 1
        self.workers_seen.add(completion.worker_id)
        usage = completion.usage
        self.batch.usage.add(usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens)

    @property
    def done(self) -> int:
        return self.batch.request_counts.completed + self.batch.request_counts.failed


@task(cache_policy=NO_CACHE, task_run_name="requests-{start}-{stop}")
async def run_chunk(run: BatchRun, start: int, stop: int) -> int:
    """Run requests [start, stop) of the batch concurrently, bounded by the job's concurrency."""

    async def one(request: ValidRequest) -> None:
        async with run.slots:
            if run.stop_reason is not None:
                run.unstarted.append(request)
                return
            run.record(await run.harness.run_line(request))

    await asyncio.gather(*(one(r) for r in run.requests[start:stop]))
    return stop - start


async def report_progress(run: BatchRun, store: BatchStore, interval_s: float = 1.0) -> None:
    """About once a second: move the progress artifact and save the batch record (request_counts move)."""
    total = max(run.batch.request_counts.total, 1)
    artifact_id = await acreate_progress_artifact(progress=0.0, key=None, description=f"batch {run.batch.id}")
    while True:
        await asyncio.sleep(interval_s)
        await aupdate_progress_artifact(artifact_id, progress=100.0 * run.done / total)
        await asyncio.to_thread(check_stop, run, store)
        await asyncio.to_thread(store.save, run.batch)


# Cancellation and expiry are cooperative: the run stops starting requests, lets those in flight
# finish, and writes one error line per request it never started.
STOP_ERRORS = {
    "cancelled": (ErrorCode.CANCELLED, "the batch was cancelled before this request started"),
    "expired": (ErrorCode.EXPIRED, "the batch's completion window ended before this request started"),
}


def check_stop(run: BatchRun, store: BatchStore) -> None:
    """Stop the run when the API asked to cancel (the batch shows `cancelling`) or the completion window is over."""
    batch = run.batch
    if run.stop_reason is not None:
        return
    if store.cancel_requested(batch.id):
        run.stop_reason = "cancelled"
        batch.mark("cancelling")
    elif batch.expires_at is not None and time.time() >= batch.expires_at:
        run.stop_reason = "expired"


def unstarted_lines(run: BatchRun) -> list[OutputLine]:
    """One error line per request the stopped run never started; they count as failed."""
    if run.stop_reason is None:
        return []
    code, reason = STOP_ERRORS[run.stop_reason]
    run.batch.request_counts.failed += len(run.unstarted)
    return [error_line(r.line, r.custom_id, code, reason) for r in run.unstarted]


def final_status(run: BatchRun) -> Literal["completed", "cancelled", "expired"]:
    """`expired` only when the window cut requests off; a cancel request always ends `cancelled`."""
    if run.stop_reason == "expired" and not run.unstarted:
        return "completed"
    return run.stop_reason or "completed"


def summary_table(batch: Batch) -> list[dict[str, object]]:
    usage = batch.usage
    rows = {
        "status": batch.status,
        "requests total": batch.request_counts.total,
        "requests completed": batch.request_counts.completed,
        "requests failed": batch.request_counts.failed,
        "prompt tokens": usage.input_tokens,
        "cached prompt tokens": usage.input_tokens_details.cached_tokens,
        "completion tokens": usage.output_tokens,
        "worker seconds": round(batch.worker_seconds, 3),
        "processing cost (USD)": round(batch.processing_cost, 8),
        "tasks per dollar": batch.tasks_per_dollar,
    }
    return [{"figure": k, "value": v} for k, v in rows.items()]


def _finish_accounting(run: BatchRun, elapsed_s: float) -> None:
    batch = run.batch
    batch.worker_seconds = max(len(run.workers_seen), 1) * elapsed_s
    batch.processing_cost = batch.worker_seconds / 3600.0 * run.job.price_per_worker_hour
    completed = batch.request_counts.completed
    batch.tasks_per_dollar = completed / batch.processing_cost if batch.processing_cost > 0 else None


@flow(name="run-batch", log_prints=False)
async def run_batch(
    input_uri: str,
    job_id: str,
    output_dir: str | None = None,
    batch_id: str | None = None,
    completion_window: Literal["24h", "unlimited"] = "24h",
    metadata: dict[str, str] | None = None,
    chunk_size: int = 64,
) -> dict:
    """Run an OpenAI batch input file on a job's engine workers; write output and error files."""
    logger = get_run_logger()
    settings = get_settings()
    store = BatchStore(settings)
    job = get_job(job_id)
    if batch_id and store.exists(batch_id):
        batch = store.load(batch_id)
    else:
        batch = Batch(
            id=batch_id or new_id("batch"),
            input_file_id=input_uri,
            job_id=job.job_id,
            model=job.served_model_name,
            completion_window=completion_window,
            metadata=metadata,
        )
    batch.price_per_worker_hour = job.price_per_worker_hour
    batch.flow_run_id = str(runtime.flow_run.id) if runtime.flow_run.id else None
    base = output_dir or storage.join(settings.store_uri, "outputs", batch.id)
    batch.output_uri = storage.join(base, f"{batch.id}_output.jsonl")
    batch.error_uri = storage.join(base, f"{batch.id}_error.jsonl")
    store.save(batch)

    try:
        validated = validate_lines(read_input_file(input_uri), job)
    except Exception as exc:  # any failure to read the input ends the batch `failed`, never stuck `validating`
        if not isinstance(exc, BatchInputError):
            logger.exception("batch %s: reading its input failed", batch.id)
        message = str(exc) if isinstance(exc, BatchInputError) else f"cannot validate the input: {type(exc).__name__}"
        batch.errors = BatchErrors(
            data=[BatchErrorData(code="invalid_input_file", message=message, param="input_file_id")]
        )
        batch.mark("failed")
        store.save(batch)
        raise BatchFailed(f"batch {batch.id} failed: {exc}") from exc

    batch.request_counts.total = validated.total
    batch.request_counts.failed = len(validated.errors)
    batch.mark("in_progress")
    store.save(batch)
    logger.info("batch %s: %d lines, %d invalid, job %s", batch.id, validated.total, len(validated.errors), job.job_id)

    router = Router(
        job.job_id, Registry.from_settings(settings), policy=job.harness.routing, admission=job.harness.admission
    )
    run = BatchRun(
        batch, job, Harness(router, job, StepRecorder(), scratch_dir(settings, batch.id)), validated.requests
    )
    check_stop(run, store)
    reporter = asyncio.create_task(report_progress(run, store))
    started = time.monotonic()
    try:
        await asyncio.gather(
            *(
                run_chunk(run, start, min(start + chunk_size, len(run.requests)))
                for start in range(0, len(run.requests), chunk_size)
            )
        )
    finally:
        reporter.cancel()
        await router.aclose()
    check_stop(run, store)
    _finish_accounting(run, time.monotonic() - started)

    if run.stop_reason != "cancelled":
        batch.mark("finalizing")
    store.save(batch)
    outcomes = sorted(run.outcomes, key=lambda o: o.line)
    outputs = [output_line(o) for o in outcomes if o.completion is not None]
    failures = [output_line(o) for o in outcomes if o.completion is None]
    errors = sorted(validated.errors + failures + unstarted_lines(run), key=lambda line: line.error.line or 0)
    write_result_files(batch.output_uri, batch.error_uri, outputs, errors)
    await write_trace_outputs(run.harness.recorder, outcomes, batch, job, settings)
    FileStore(settings).attach_results(batch)
    batch.mark(final_status(run))
    store.save(batch)
    await acreate_table_artifact(table=summary_table(batch), key=None, description=f"batch {batch.id} summary")
    logger.info("batch %s %s: %s", batch.id, batch.status, batch.request_counts.model_dump())
    return batch.model_dump(mode="json")
