"""Prefect tasks of a Leap: stage new weights on one worker, swap one worker to a staged version, run the job's
labelled set on chosen workers (the canary's measure).

Stage and swap are retried up to 3 attempts in all, except when the worker refused the checkpoint itself:
another attempt cannot make it fit. The labelled run is not retried: a line that fails counts as failed.
"""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from pronk.batches.schemas import CheckCounts, LinesChecked
from pronk.engine.client import WeightsRefused
from pronk.jobs.schema import JobConfig
from pronk.leap import canary
from pronk.leap.sequence import LeapRun
from pronk.protocol.lines import ValidRequest
from pronk.settings import Settings

ATTEMPTS = 3


def _retriable(task, task_run, state) -> bool:
    return not isinstance(state.data, WeightsRefused)


@task(
    cache_policy=NO_CACHE,
    retries=ATTEMPTS - 1,
    retry_delay_seconds=1,
    retry_condition_fn=_retriable,
    task_run_name="stage-{worker_id}",
)
async def stage_weights(run: LeapRun, worker_id: str, model_uri: str) -> None:
    """Download and validate `model_uri` on one worker while it keeps serving."""
    await run.stage(worker_id, model_uri)


@task(cache_policy=NO_CACHE, retries=ATTEMPTS - 1, retry_delay_seconds=1, task_run_name="reload-{worker_id}-{version}")
async def reload_weights(run: LeapRun, worker_id: str, version: str) -> None:
    """Swap one worker to a staged version at a step boundary (drain, reload, reset prefix cache, resume)."""
    await run.reload(worker_id, version)


@task(cache_policy=NO_CACHE, task_run_name="labelled-set-on-{worker_ids}")
async def measure_labelled(
    job: JobConfig,
    lines: list[ValidRequest],
    worker_ids: list[str],
    settings: Settings,
    scratch: Path,
    progress: LinesChecked,
) -> CheckCounts:
    """Run the job's labelled set on these workers only, counting the lines checked, and tally its checks."""
    return await canary.measure(job, lines, worker_ids, settings, scratch, progress)
