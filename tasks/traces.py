"""Prefect side of agent traces: a per-trace table, and a sample drawn as task runs and logged as MLflow traces."""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from pathlib import Path

from prefect.artifacts import acreate_markdown_artifact, acreate_table_artifact

from pronk.agents.outcomes import LineFailure, RequestOutcome
from pronk.agents.step_records import StepRecord, log_mlflow_traces
from pronk.agents.trace_dag import DagNode, SampleCandidate, choose_sample, readable, trace_dag
from pronk.batches.results import FinishedLine
from pronk.batches.run import BatchRun
from pronk.settings import Settings
from tasks.prefect_calls import best_effort
from tasks.trace_dags import TASK_RUNS_PER_S, draw_trace_dags

logger = logging.getLogger(__name__)

TABLE_ROWS = 500
DRAW_GRACE_S = 30.0
"""A Prefect server that stops answering costs the run at most this long beyond the drawing's own pace."""
MARKDOWN_SAFE = str.maketrans({c: "_" for c in "|[]<>`*\\"})
"""A custom id is hostile input: in the sample's markdown it shows as text, never as a link, tag or table cell break."""


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


def sample_of(run: BatchRun, size: int) -> list[FinishedLine]:
    """The run's sampled lines (every run of the batch counts): failed ones first, the rest spread over the input."""
    candidates = [
        SampleCandidate(f.line, f.output.custom_id or "", not f.ok, len(f.steps)) for f in run.finished.values()
    ]
    return [run.finished[c.line] for c in choose_sample(candidates, size)]


def mlflow_trace_url(settings: Settings, experiment_id: str, trace_id: str) -> str:
    """The MLflow UI's page of one trace."""
    return f"{settings.mlflow_ui_url}/#/experiments/{experiment_id}/traces?selectedEvaluationId={trace_id}"


async def log_sample_to_mlflow(run: BatchRun, sample: list[FinishedLine], settings: Settings) -> dict[str, str]:
    """The sampled traces as MLflow traces; each sampled line's custom_id → its URL in the MLflow UI.

    MLflow trouble is logged, never a reason to fail a batch whose results are written.
    """
    batch, job = run.batch, run.job
    if not sample or not job.harness.mlflow_traces:
        return {}
    records = [StepRecord(**row) for f in sample for row in f.steps]
    try:
        experiment_id, logged = await asyncio.to_thread(
            log_mlflow_traces,
            records,
            settings.tracking_uri,
            f"pronk-{job.job_id}",
            settings.artifact_root,
            {"pronk.batch_id": batch.id, "pronk.job_id": job.job_id},
        )
    except Exception as exc:  # noqa: BLE001 - the batch's own results are already written
        logger.warning("batch %s: logging MLflow traces failed: %s", batch.id, exc)
        return {}
    logger.info("batch %s: logged %d sampled traces to MLflow", batch.id, len(logged))
    roots = {r.custom_id or "": r.root_trace_id for r in records}
    return {
        cid: mlflow_trace_url(settings, experiment_id, logged[root]) for cid, root in roots.items() if root in logged
    }


async def draw_sample(run: BatchRun, dags: list[list[DagNode]]) -> int:
    """The sampled traces as task runs in this flow run's graph; how many task runs ran (best effort)."""
    timeout_s = sum(len(d) for d in dags) / TASK_RUNS_PER_S + DRAW_GRACE_S
    try:
        return await asyncio.wait_for(draw_trace_dags(dags), timeout_s)
    except Exception as exc:  # noqa: BLE001 - the drawing is for show: the batch has ended already
        logger.warning("batch %s: drawing the sampled traces failed: %s", run.batch.id, exc)
        return 0


def sample_markdown(
    batch_id: str, sample: list[FinishedLine], links: dict[str, str], dags: list[list[DagNode]] | None = None
) -> str:
    """The sampled traces, each with its state and a link to its MLflow trace (when logged), then each one's task
    runs with their figures (as their state messages say)."""
    lines = [
        f"# Sampled traces of batch {batch_id}",
        "",
        "Each is drawn in this run's graph as task runs named `<trace> step <n>: <tool>`.",
        "",
        "| line | custom_id | state | steps | MLflow trace |",
        "| --- | --- | --- | --- | --- |",
    ]
    for f in sample:
        cid = f.output.custom_id or ""
        link = f"[open]({links[cid]})" if cid in links else "—"
        state = "completed" if f.ok else "error"
        lines.append(f"| {f.line} | {_cell(cid)} | {state} | {len(f.steps)} | {link} |")
    for f, dag in zip(sample, dags or [], strict=False):
        lines += ["", f"## {_cell(f.output.custom_id or '')}", "", "| task run | figures |", "| --- | --- |"]
        lines += [f"| {_cell(n.name)}{' (failed)' if n.failed else ''} | {_cell(n.summary)} |" for n in dag]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return readable(text, 400).translate(MARKDOWN_SAFE)


async def publish_traces(run: BatchRun, settings: Settings, sample_size: int) -> None:
    """After the batch has ended: drop the tools' scratch folder, draw and log the sample, publish the trace tables.

    The sample is drawn in Prefect and logged to MLflow at once; the per-trace table (its first rows, then
    every sampled line) links each sampled line to its MLflow trace. All of it is best effort.
    """
    batch = run.batch
    await asyncio.to_thread(shutil.rmtree, scratch_dir(settings, batch.id), True)
    sample = sample_of(run, sample_size)
    dags = [trace_dag([StepRecord(**row) for row in f.steps]) for f in sample]
    started = time.monotonic()
    links, drawn = await asyncio.gather(log_sample_to_mlflow(run, sample, settings), draw_sample(run, dags))
    if sample:
        logger.info(
            "batch %s: %d sampled traces drawn as %d task runs and logged to MLflow in %.2f s",
            batch.id,
            len(sample),
            drawn,
            time.monotonic() - started,
        )
    head = sorted(run.finished.values(), key=lambda f: f.line)[:TABLE_ROWS]
    in_head = {f.line for f in head}
    shown = head + [f for f in sample if f.line not in in_head]
    rows = [{**f.row, "mlflow_trace": links.get(f.output.custom_id or "", "")} for f in shown]
    await best_effort(
        "trace table",
        acreate_table_artifact(
            table=rows, key=None, description=f"batch {batch.id}: traces (first {TABLE_ROWS}, then the sampled ones)"
        ),
    )
    if sample:
        await best_effort(
            "sampled traces",
            acreate_markdown_artifact(
                markdown=sample_markdown(batch.id, sample, links, dags),
                key=None,
                description=f"batch {batch.id}: sampled traces",
            ),
        )
