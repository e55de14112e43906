"""Prefect side of agent traces: step records beside the outputs, a per-trace table, MLflow traces."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from prefect import get_run_logger, task
from prefect.artifacts import acreate_table_artifact
from prefect.cache_policies import NO_CACHE

from pronk.agents.completions import RequestOutcome
from pronk.agents.step_records import StepRecorder, log_mlflow_traces
from pronk.batches.schemas import Batch
from pronk.jobs import JobConfig
from pronk.settings import Settings

TABLE_ROWS = 500


def scratch_dir(settings: Settings, batch_id: str) -> Path:
    """Where the run's tools may write (the `python` tool's sandbox folders live under it)."""
    return settings.data_dir / "scratch" / batch_id


def steps_uri(batch: Batch) -> str:
    return batch.output_uri.removesuffix("_output.jsonl") + "_steps.jsonl"


def trace_rows(outcomes: list[RequestOutcome]) -> list[dict[str, object]]:
    """One row per line: its final state, as the Prefect UI shows it."""
    rows = []
    for outcome in outcomes[:TABLE_ROWS]:
        line = outcome.output
        if line.error is not None:
            rows.append({"custom_id": line.custom_id, "state": "error", "finish_reason": line.error.code, "steps": 0})
            continue
        body = line.response.body
        trace = body.get("pronk", {}).get("trace", {})
        rows.append(
            {
                "custom_id": line.custom_id,
                "state": "completed",
                "finish_reason": body["choices"][0]["finish_reason"] if "choices" in body else "replayed",
                "steps": trace.get("steps", 1),
                "traces": trace.get("traces", 1),
                "tool_calls": sum(trace.get("tool_calls", {}).values()),
                "workers": ",".join(trace.get("workers", [body.get("pronk", {}).get("worker_id", "")])),
                "cached_ratio": trace.get("cached_ratio"),
            }
        )
    return rows


@task(cache_policy=NO_CACHE, retries=2, retry_delay_seconds=1)
async def write_trace_outputs(
    recorder: StepRecorder, outcomes: list[RequestOutcome], batch: Batch, job: JobConfig, settings: Settings
) -> None:
    """Write `<batch>_steps.jsonl`, drop the tools' scratch folder, publish the per-trace table, log MLflow traces if asked."""
    batch.steps_uri = steps_uri(batch)
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
