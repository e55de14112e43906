"""What the API starts as Prefect deployment runs: a batch's run (`run-batch`) and a Leap (`leap`)."""

from __future__ import annotations

from pronk.batches.schemas import Batch
from pronk.stack.deployments import DeploymentStarter

RUN_BATCH = "run-batch/run-batch"
LEAP = "leap/leap"
TAG = "pronk-api"


async def start_batch_run(runs: DeploymentStarter, batch: Batch, input_uri: str) -> str:
    """The flow finds the batch record the API saved."""
    parameters = {"input_uri": input_uri, "job_id": batch.job_id, "batch_id": batch.id}
    return await runs.start(RUN_BATCH, parameters, batch.id, [TAG, batch.job_id])


async def start_leap(runs: DeploymentStarter, job_id: str, version: int, leap_id: str) -> str:
    """The flow keeps the Leap's record under `leap_id`, where the API saved it `queued`."""
    parameters = {"job_id": job_id, "version": version, "leap_id": leap_id}
    return await runs.start(LEAP, parameters, leap_id, [TAG, job_id])
