"""A batch's report on its Prefect run page and in the job's MLflow experiment (figures, completion times)."""

from __future__ import annotations

import asyncio
import logging

from prefect.artifacts import acreate_markdown_artifact

from pronk.batches.run import BatchRun
from pronk.herd.reports import RunFigures, batch_markdown, completion_times, log_batch_run
from pronk.settings import Settings
from tasks.prefect_calls import best_effort

logger = logging.getLogger(__name__)


async def publish_batch_report(run: BatchRun, settings: Settings) -> None:
    """Log the batch's figures to MLflow and put them, with its completion times, on the run page (best effort)."""
    records = run.step_records()
    versions = ",".join(sorted({r.model_version for r in records if r.model_version}))
    figures = RunFigures.of(run.batch, versions)
    times = completion_times(records)
    url = None
    try:
        _, url = await asyncio.to_thread(log_batch_run, figures, times, settings)
    except Exception as exc:  # noqa: BLE001 - the batch's own results are already written
        logger.warning("batch %s: logging its figures to MLflow failed: %s", run.batch.id, exc)
    await best_effort(
        "batch report",
        acreate_markdown_artifact(
            markdown=batch_markdown(figures, times, url), key=None, description=f"batch {run.batch.id}: report"
        ),
    )
