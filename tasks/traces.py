"""Prefect side of agent traces in the flow run: a per-trace table, and the order for a sample drawn after it."""

from __future__ import annotations

import asyncio
import logging
import shutil
from pathlib import Path

from prefect.artifacts import acreate_table_artifact

from pronk.agents.outcomes import LineFailure, RequestOutcome
from pronk.agents.trace_dag import SampleCandidate, choose_sample
from pronk.batches.run import BatchRun
from pronk.settings import Settings
from tasks.prefect_calls import best_effort
from tasks.trace_sample import TABLE_ROWS, SampledTrace, SampleOrder, place_order, trace_table

logger = logging.getLogger(__name__)


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


def sample_of(run: BatchRun, size: int) -> list[SampledTrace]:
    """The run's sampled lines (every run of the batch counts): failed ones first, the rest spread over the input."""
    candidates = [
        SampleCandidate(f.line, f.output.custom_id or "", not f.ok, len(f.steps)) for f in run.finished.values()
    ]
    chosen = [run.finished[c.line] for c in choose_sample(candidates, size)]
    return [SampledTrace(line=f.line, custom_id=f.output.custom_id or "", ok=f.ok, steps=f.steps) for f in chosen]


def table_rows(run: BatchRun, sample: list[SampledTrace]) -> list[dict[str, object]]:
    """The per-trace table: the first `TABLE_ROWS` lines, then every sampled line past them."""
    head = sorted(run.finished.values(), key=lambda f: f.line)[:TABLE_ROWS]
    in_head = {f.line for f in head}
    return [f.row for f in head] + [run.finished[t.line].row for t in sample if t.line not in in_head]


async def publish_traces(run: BatchRun, settings: Settings, sample_size: int) -> None:
    """After the batch's results are written: drop the tools' scratch folder, hand the trace sample to its drawer.

    The drawer (`tasks.trace_sample`) draws the sample in this flow run's graph, logs it to MLflow and publishes
    the per-trace table with each sampled line's MLflow link once this flow run has ended; without a sample (or
    when the order cannot be left) the table is published here, without links. All of it is best effort.
    """
    batch = run.batch
    await asyncio.to_thread(shutil.rmtree, scratch_dir(settings, batch.id), True)
    sample = sample_of(run, sample_size)
    rows = table_rows(run, sample)
    if sample and batch.flow_run_id:
        order = SampleOrder(
            batch_id=batch.id, flow_run_id=batch.flow_run_id, job_id=run.job.job_id, traces=sample, rows=rows
        )
        try:
            await asyncio.to_thread(place_order, order, settings)
        except Exception as exc:  # noqa: BLE001 - the batch's results are written: its sample is for show
            logger.warning("batch %s: cannot start drawing its trace sample: %r", batch.id, exc)
        else:
            logger.info("batch %s: %d sampled traces will be drawn once this run has ended", batch.id, len(sample))
            return
    await best_effort(
        "trace table",
        acreate_table_artifact(
            table=trace_table(rows, {}), key=None, description=f"batch {batch.id}: traces (first {TABLE_ROWS} lines)"
        ),
    )
