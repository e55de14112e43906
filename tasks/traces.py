"""Prefect side of agent traces: step records beside the outputs, a per-trace table, MLflow traces."""

from __future__ import annotations

import asyncio
import logging
import shutil
from pathlib import Path

from prefect.artifacts import acreate_table_artifact

from pronk.agents.outcomes import LineFailure, RequestOutcome
from pronk.agents.step_records import log_mlflow_traces
from pronk.batches.run import BatchRun
from pronk.settings import Settings
from tasks.prefect_calls import best_effort

logger = logging.getLogger(__name__)

TABLE_ROWS = 500


def scratch_dir(settings: Settings, batch_id: str) -> Path:
    """Where the run's tools may write (the `python` tool's sandbox folders live under it)."""
    return settings.data_dir / "scratch" / batch_id


def trace_row(outcome: RequestOutcome) -> dict[str, object]:
    """A line's row of the per-trace table: its final state, as the Prefect UI shows it.

    Kept with the line's persisted result, so a resumed run's table shows every line.
    """
    result = outcome.result
    if isinstance(result, LineFailure):
        return {"custom_id": outcome.custom_id, "state": "error", "finish_reason": result.code, "steps": 0}
    trace = result.summary
    return {
        "custom_id": outcome.custom_id,
        "state": "completed",
        "finish_reason": "replayed" if result.kind == "replay" else result.finish_reason,
        "steps": trace.steps if trace else 1,
        "traces": trace.traces if trace else 1,
        "tool_calls": sum(trace.tool_calls.values()) if trace else 0,
        "workers": ",".join(trace.workers if trace else [result.worker_id]),
        "cached_ratio": trace.cached_ratio if trace else None,
    }


async def publish_traces(run: BatchRun, settings: Settings) -> None:
    """Drop the tools' scratch folder, publish the per-trace table, log MLflow traces if the job asks.

    Runs after the batch is terminal: the Prefect table is best effort, and MLflow trouble is logged,
    never a reason to fail a batch whose results are written.
    """
    batch, job = run.batch, run.job
    await asyncio.to_thread(shutil.rmtree, scratch_dir(settings, batch.id), True)
    rows = [f.row for f in sorted(run.finished.values(), key=lambda f: f.line)[:TABLE_ROWS]]
    await best_effort(
        "trace table",
        acreate_table_artifact(table=rows, key=None, description=f"batch {batch.id}: traces (first {TABLE_ROWS})"),
    )
    if not job.harness.mlflow_traces:
        return
    try:
        logged = await asyncio.to_thread(
            log_mlflow_traces,
            run.step_records(),
            settings.tracking_uri,
            f"pronk-{job.job_id}",
            settings.artifact_root,
            job.harness.mlflow_traces,
        )
    except Exception as exc:  # noqa: BLE001 - the batch's own results are already written
        logger.warning("batch %s: logging MLflow traces failed: %s", batch.id, exc)
        return
    logger.info("batch %s: logged %d traces to MLflow", batch.id, logged)
