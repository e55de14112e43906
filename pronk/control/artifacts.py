"""A batch run's artifacts on its Prefect run page: progress, the summary table, the report, the per-trace table.

Every call is best effort (`best_effort`): the batch record in the store is the source of truth, so a Prefect
server that is down costs a run its artifacts, never its progress or its end.
"""

from __future__ import annotations

import asyncio
import logging
from uuid import UUID

from prefect.artifacts import (
    acreate_markdown_artifact,
    acreate_progress_artifact,
    acreate_table_artifact,
    aupdate_progress_artifact,
)

from pronk.batches.report import RunFigures, batch_markdown, completion_times, log_batch_run
from pronk.batches.run import BatchRun
from pronk.control.calls import best_effort
from pronk.settings import Settings

logger = logging.getLogger(__name__)


class ProgressArtifact:
    """The run's progress bar: created on the first report, moved on every later one that changes it. The batch
    reports about once a second while its lines take tens of seconds each; sending the same value again cost the
    flow's process and the Prefect server CPU beside the engines for nothing."""

    def __init__(self, description: str):
        self.description = description
        self.artifact_id: UUID | None = None
        self.shown: float | None = None

    async def __call__(self, percent: float) -> None:
        if self.artifact_id is None:
            self.artifact_id = await best_effort(
                "progress artifact",
                acreate_progress_artifact(progress=percent, key=None, description=self.description),
            )
            self.shown = percent
        elif percent != self.shown:
            moved = aupdate_progress_artifact(self.artifact_id, progress=percent)
            if await best_effort("progress update", moved) is not None:  # else the next report tries again
                self.shown = percent


async def publish_summary(run: BatchRun) -> None:
    """The batch's figures as a table on the run page."""
    await best_effort(
        "summary table",
        acreate_table_artifact(table=run.summary_table(), key=None, description=f"batch {run.batch.id} summary"),
    )


async def publish_batch_report(run: BatchRun, settings: Settings) -> None:
    """Log the batch's figures and every finished line's row (its check with it) to MLflow, and put the figures,
    with its completion times, on the run page."""
    records = run.step_records()
    versions = ",".join(sorted({r.model_version for r in records if r.model_version}))
    figures = RunFigures.of(run.batch, versions)
    times = completion_times(records)
    rows = [f.row for f in sorted(run.finished.values(), key=lambda f: f.line)]
    url = None
    try:
        _, url = await asyncio.to_thread(log_batch_run, figures, times, rows, settings)
    except Exception as exc:  # noqa: BLE001 - the batch's own results are already written
        logger.warning("batch %s: logging its figures to MLflow failed: %s", run.batch.id, exc)
    await best_effort(
        "batch report",
        acreate_markdown_artifact(
            markdown=batch_markdown(figures, times, url), key=None, description=f"batch {run.batch.id}: report"
        ),
    )
