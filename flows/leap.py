"""The Leap flow: swap a job's running fleet to an MLflow model version in place, in seconds, with no redeploy.

A recipe over `pronk.leap.sequence`: check the target against the fleet, switch one worker first and hold the rest
back unless its success rate on the job's labelled set holds (`pronk.leap.canary`, when the job has one), stage
the target on every worker, swap every worker at a step boundary, roll back what switched if the fleet cannot all
switch, and move the job's alias only when the whole fleet serves the new version. The record is published as a
table artifact whatever happened.
"""

from __future__ import annotations

import asyncio

from prefect import flow, get_run_logger, runtime
from prefect.artifacts import acreate_table_artifact

from pronk.agents.tools.scratch import scratch_dir
from pronk.batches.schemas import CheckCounts, LinesChecked
from pronk.control.dead_runs import record_process
from pronk.jobs.catalog import resolve_job
from pronk.leap import canary as canaries
from pronk.leap import sequence as leaps
from pronk.leap.records import LeapRecord, LeapStore
from pronk.leap.sequence import LeapFailed, LeapRefused
from pronk.protocol.lines import ValidRequest
from pronk.settings import get_settings
from pronk.stack.prefect_env import show_pronk_logs
from pronk.tasks.leap import measure_labelled, reload_weights, stage_weights
from pronk.worker_token import worker_client

__all__ = ["LeapFailed", "LeapRefused", "leap"]


async def _publish(record: LeapRecord) -> None:
    await acreate_table_artifact(
        table=record.table(),
        key=f"leap-{record.job_id}",
        description=f"Leap {record.id} of {record.job_id} to {record.to_version}: {record.status}. {record.message}"
        + (f"\n\n{record.canary_summary()}" if record.canary else ""),
    )


@flow(name="leap", log_prints=False, on_running=[record_process])
async def leap(
    job_id: str,
    version: int | None = None,
    alias: str | None = None,
    leap_id: str | None = None,
    canary: bool = True,
    labelled_set: str | None = None,
) -> dict:
    """Swap a job's running workers to version N (or the version alias A names) of its model; its alias follows.

    With a labelled set (and `canary`), one worker switches first and the rest follow only if its success rate holds.
    `labelled_set` replaces the job's `quality.labelled_set` for this Leap's canary.
    """
    show_pronk_logs()
    logger = get_run_logger()
    settings = get_settings()
    flow_run_id = str(runtime.flow_run.id) if runtime.flow_run.id else None
    try:
        job = (await asyncio.to_thread(resolve_job, job_id, settings)).with_labelled_set(labelled_set)
        record = await asyncio.to_thread(leaps.begin, job, version, alias, settings, leap_id, flow_run_id)
        lines = await asyncio.to_thread(canaries.labelled_set, job, record, canary, settings)
    except LeapRefused as exc:
        if exc.record is not None:
            await _publish(exc.record)
        raise
    workers = worker_client(settings, timeout_s=leaps.WORKER_TIMEOUT_S)
    run = leaps.LeapRun(record, LeapStore(settings), workers)

    async def measure(labelled: list[ValidRequest], worker_ids: list[str], progress: LinesChecked) -> CheckCounts:
        return await measure_labelled(job, labelled, worker_ids, settings, scratch_dir(settings, record.id), progress)

    try:
        failed: list[str] = []
        if lines is not None:
            failed = await canaries.trial(
                run, job, lines, stage_weights, reload_weights, measure, settings.leap_canary_timeout_s
            )
            logger.info("leap %s: %s", record.id, record.canary_summary())
        if not failed:
            failed = await leaps.switch(run, stage_weights, reload_weights)
        await leaps.conclude(run, failed, reload_weights, settings)
        logger.info("leap %s: %s in %.3fs", record.id, record.message, record.switch_seconds or 0.0)
        return record.model_dump(mode="json")
    except (LeapRefused, LeapFailed):
        logger.error("leap %s: %s", record.id, record.message)
        raise
    finally:
        await run.save()
        await workers.aclose()
        await _publish(record)
