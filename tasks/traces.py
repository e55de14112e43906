"""Prefect side of agent traces: step records beside the outputs, a per-trace table, MLflow traces."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from prefect import get_run_logger, task
from prefect.artifacts import acreate_table_artifact
from prefect.cache_policies import NO_CACHE

from pronk.agents.outcomes import LineFailure, RequestOutcome
from pronk.agents.step_records import StepRecorder, log_mlflow_traces
from pronk.batches.schemas import Batch
from pronk.jobs import JobConfig
from pronk.settings import Settings

TABLE_ROWS = 500


def scratch_dir(settings: Settings, batch_id: str) -> Path:
    """Where the run's tools may write (the `python` tool's sandbox folders live under it)."""
    return settings.data_dir / "scratch" / batch_id


def steps_uri(output_uri: str) -> str:
    """`<batch id>_steps.jsonl` beside `<batch id>_output.jsonl`."""
    return output_uri.removesuffix("_output.jsonl") + "_steps.jsonl"


def trace_rows(outcomes: list[RequestOutcome]) -> list[dict[str, object]]:
    """One row per line: its final state, as the Prefect UI shows it."""
    rows: list[dict[str, object]] = []
    for outcome in outcomes[:TABLE_ROWS]:
        result = outcome.result
        if isinstance(result, LineFailure):
            rows.append({"custom_id": outcome.custom_id, "state": "error", "finish_reason": result.code, "steps": 0})
            continue
        trace = result.summary
        rows.append(
            {
                "custom_id": outcome.custom_id,
                "state": "completed",
                "finish_reason": "replayed" if result.kind == "replay" else result.finish_reason,
                "steps": trace.steps if trace else 1,
                "traces": trace.traces if trace else 1,
                "tool_calls": sum(trace.tool_calls.values()) if trace else 0,
                "workers": ",".join(trace.workers if trace else [result.worker_id]),
                "cached_ratio": trace.cached_ratio if trace else None,
            }
        )
    return rows


@task(cache_policy=NO_CACHE, retries=2, retry_delay_seconds=1)
async def write_trace_outputs(
    recorder: StepRecorder, outcomes: list[RequestOutcome], batch: Batch, job: JobConfig, settings: Settings
) -> None:
    """Write `<batch>_steps.jsonl`, drop the tools' scratch folder, publish the per-trace table, log MLflow traces.

    MLflow traces only when the job's harness asks for them. The batch's output URI is set before this runs.
    """
    batch.steps_uri = steps_uri(str(batch.output_uri))
    await asyncio.to_thread(recorder.write, batch.steps_uri)
    await asyncio.to_thread(shutil.rmtree, scratch_dir(settings, batch.id), True)
    await acreate_table_artifact(
        table=trace_rows(outcomes), key=None, description=f"batch {batch.id}: traces (first {TABLE_ROWS})"
    )
    if job.harness.mlflow_traces:
        logged = await asyncio.to_thread(
            log_mlflow_traces,
            recorder.records,
            settings.tracking_uri,
            f"pronk-{job.job_id}",
            settings.artifact_root,
            job.harness.mlflow_traces,
        )
        get_run_logger().info("logged %d traces to MLflow", logged)
