"""The batch flow: one flow run per run of a batch, one task run per chunk of requests, steps straight to the router.

The flow resolves its job, opens the batch's record (named by its flow run) and hands both to the batch's steps
(`pronk.tasks.batch.run_opened_batch`: read, validate, run the chunks, write, report); its hooks end the batch when the
run fails or is cancelled. A run started again for the same batch (a Prefect retry, `pronk batch resume`, the API's
reconcile loop) runs only the lines no earlier run persisted.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Annotated, Literal

from prefect import flow, runtime
from pydantic import Field

from pronk.batches.prompt_length import input_limits
from pronk.batches.run import end_batch, open_batch
from pronk.batches.store import BatchStore
from pronk.control.dead_runs import record_process
from pronk.jobs.catalog import resolve_job
from pronk.jobs.schema import MAX_TRACE_SAMPLE
from pronk.settings import get_settings
from pronk.stack.prefect_env import show_pronk_logs
from pronk.tasks.batch import CHUNK_SIZE, run_opened_batch


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
    chunk_size: int = CHUNK_SIZE,
    trace_sample: Annotated[int | None, Field(ge=0, le=MAX_TRACE_SAMPLE)] = None,
) -> dict:
    """Run an OpenAI batch input file on a job's engine workers; write output and error files.

    `trace_sample` traces (default: the job's `observability.trace_sample`) are drawn in this run's graph as task
    runs per step and tool call, and logged to MLflow, by a process of their own once this run has ended.
    """
    show_pronk_logs()
    settings = get_settings()
    job = await asyncio.to_thread(resolve_job, job_id, settings)
    flow_run_id = str(runtime.flow_run.id) if runtime.flow_run.id else None
    if batch_id is None and flow_run_id is not None:
        batch_id = batch_id_of_flow_run(flow_run_id)
    store = BatchStore(settings)
    batch = open_batch(store, settings, job, input_uri, batch_id, flow_run_id, output_dir, completion_window, metadata)
    return await run_opened_batch(batch, job, input_uri, settings, chunk_size, trace_sample)
