"""Start a batch's run as a run of the `run-batch` Prefect deployment, without waiting for it."""

from __future__ import annotations

from pronk.batches.schemas import Batch
from pronk.settings import Settings
from pronk.stack.prefect_env import configure_prefect

DEPLOYMENT = "run-batch/run-batch"


class PrefectRuns:
    """The process work pool's worker picks the run up; the flow finds the batch record the API saved."""

    def __init__(self, settings: Settings):
        configure_prefect(settings)

    async def start(self, batch: Batch, input_uri: str) -> str:
        from prefect.deployments import arun_deployment

        flow_run = await arun_deployment(
            name=DEPLOYMENT,
            parameters={"input_uri": input_uri, "job_id": batch.job_id, "batch_id": batch.id},
            timeout=0,
            as_subflow=False,
            flow_run_name=batch.id,
            idempotency_key=batch.id,
            tags=["pronk-api", batch.job_id],
        )
        return str(flow_run.id)
