"""The batch flow: one flow run per run of a batch, one task run per chunk of requests, steps straight to the router.

Read, validate, run the chunks, write, report; the bookkeeping lives in `pronk.batches.run.BatchRun`.
A run started again for the same batch (a Prefect retry, `pronk batch resume`, the API's reconcile
loop) runs only the lines no earlier run persisted.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Annotated, Literal

from prefect import flow, get_run_logger, runtime
from pydantic import Field

from pronk.agents.harness import Harness, job_router
from pronk.agents.step_records import StepRecorder
from pronk.agents.tools.scratch import scratch_dir
from pronk.batches.file_store import FileStore
from pronk.batches.input import BatchInputError
from pronk.batches.progress import progress_kept
from pronk.batches.prompt_length import input_limits
from pronk.batches.results import ResultParts
from pronk.batches.run import BatchRun, end_batch, finish_run, open_batch, reject_input
from pronk.batches.schemas import TERMINAL_STATUSES
from pronk.batches.store import BatchStore
from pronk.control.artifacts import ProgressArtifact, publish_batch_report, publish_summary
from pronk.control.dead_runs import record_process
from pronk.control.trace_sample.drawer import publish_traces
from pronk.herd.profile import in_flight_start
from pronk.jobs.catalog import resolve_job
from pronk.jobs.schema import MAX_TRACE_SAMPLE, JobConfig
from pronk.pronk_error import PronkError
from pronk.settings import Settings, get_settings
from pronk.stack.prefect_env import show_pronk_logs
from tasks.chunks import run_chunk
from tasks.files import read_input_file, validate_lines


class BatchFailed(PronkError, RuntimeError):
    """The batch ended `failed`; its record says why."""


def _end_batch(flow_run, status: Literal["failed", "cancelled"], message: str) -> None:
    parameters = flow_run.parameters
    if batch_id := parameters.get("batch_id"):
        settings = get_settings()
        job = resolve_job(parameters["job_id"], settings)
        limits = input_limits(job, settings)
        end_batch(batch_id, job, status, message, settings, parameters.get("input_uri"), limits=limits)


def _end_on_failure(flow, flow_run, state) -> None:
    """The flow raised: end its batch `failed` with what finished (a no-op when the batch is already terminal)."""
    _end_batch(flow_run, "failed", f"the run raised: {state.message}")


def _end_on_cancellation(flow, flow_run, state) -> None:
    """The flow run was cancelled in Prefect: end its batch `cancelled` with what finished."""
    _end_batch(flow_run, "cancelled", "the flow run was cancelled")


def batch_id_of_flow_run(flow_run_id: str) -> str:
    """The batch id of a run started without one (`prefect deployment run` with only an input): its flow run's id.

    So the flow run is named by its batch however it was started, and a retry of that flow run resumes that batch.
    """
    return "batch_" + uuid.UUID(flow_run_id).hex[:24]


def run_name() -> str:
    """The flow run's name: its batch id (a resumed run started as `<batch id>-run-<n>` keeps that name)."""
    parameters = runtime.flow_run.parameters
    batch_id = parameters.get("batch_id") or batch_id_of_flow_run(str(runtime.flow_run.id))
    current = runtime.flow_run.name or ""
    return current if current.startswith(f"{batch_id}-run-") else batch_id


@flow(
    name="run-batch",
    flow_run_name=run_name,
    log_prints=False,
    on_failure=[_end_on_failure],
    on_cancellation=[_end_on_cancellation],
    on_running=[record_process],
)
async def run_batch(
    input_uri: str,
    job_id: str,
    output_dir: str | None = None,
    batch_id: str | None = None,
    completion_window: Literal["24h", "unlimited"] = "24h",
    metadata: dict[str, str] | None = None,
    chunk_size: int = 64,
    trace_sample: Annotated[int | None, Field(ge=0, le=MAX_TRACE_SAMPLE)] = None,
) -> dict:
    """Run an OpenAI batch input file on a job's engine workers; write output and error files.

    `trace_sample` traces (default: the job's `observability.trace_sample`) are drawn in this run's graph as task
    runs per step and tool call, and logged to MLflow, by a process of their own once this run has ended.
    """
    show_pronk_logs()
    settings = get_settings()
    job = await asyncio.to_thread(resolve_job, job_id, settings)
    return await run_job_batch(
        job, input_uri, settings, output_dir, batch_id, completion_window, metadata, chunk_size, trace_sample
    )


async def run_job_batch(
    job: JobConfig,
    input_uri: str,
    settings: Settings,
    output_dir: str | None = None,
    batch_id: str | None = None,
    completion_window: Literal["24h", "unlimited"] = "24h",
    metadata: dict[str, str] | None = None,
    chunk_size: int = 64,
    trace_sample: int | None = None,
) -> dict:
    """`run_batch`'s body, for a job resolved by the caller: the batch flow's, or the enrich flow's, which runs its
    rows as a batch inside its own flow run (the same validation, chunk tasks, durable parts, progress artifact and
    files as any batch, without a subflow's start-up)."""
    logger = get_run_logger()
    store = BatchStore(settings)
    flow_run_id = str(runtime.flow_run.id) if runtime.flow_run.id else None
    if batch_id is None and flow_run_id is not None:
        batch_id = batch_id_of_flow_run(flow_run_id)
    batch = open_batch(store, settings, job, input_uri, batch_id, flow_run_id, output_dir, completion_window, metadata)
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
    run = BatchRun.resume(batch, job, validated, ResultParts(batch.id, settings), flow_run_id, start)
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
    harness = Harness(router, job, StepRecorder(), scratch_dir(settings, batch.id))
    run.check_stop(store)
    try:
        async with progress_kept(run, store, ProgressArtifact(f"batch {batch.id}")):
            await asyncio.gather(*(run_chunk(run, harness, start, stop) for start, stop in run.chunks(chunk_size)))
    finally:
        await router.aclose()
    finish_run(run, store, FileStore(settings))

    await publish_summary(run)
    await publish_batch_report(run, settings)
    await publish_traces(run, settings, job.observability.trace_sample if trace_sample is None else trace_sample)
    logger.info("batch %s %s: %s", batch.id, batch.status, batch.request_counts.model_dump())
    return batch.model_dump(mode="json")
