"""The API's batch runs on Prefect: starting the batch queue's drainer or another run of a batch, and what the server
knows of ended runs (for the reconcile loop and `pronk stack status`)."""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any

from pronk.batches.schemas import Batch
from pronk.control.flow_runs import runs_of
from pronk.stack.deployments import API_TAG, DeploymentStarter

if TYPE_CHECKING:
    from prefect.client.schemas.objects import FlowRun

    from pronk.control.dead_runs import DeadRun

FLOW = "run-batch"
RUN_BATCH = "run-batch/run-batch"
DRAINER_FLOW = "drain-batch-queue"
DRAIN_BATCH_QUEUE = "drain-batch-queue/drain-batch-queue"


async def start_queue_drain(runs: DeploymentStarter) -> str:
    """A drainer of the batch queue, named by when it was asked for; it runs after the one running now, if any."""
    name = f"batch-queue-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:6]}"
    return await runs.start(DRAIN_BATCH_QUEUE, {}, name, [API_TAG])


async def resume_batch_run(runs: DeploymentStarter, batch: Batch, parameters: dict[str, Any], attempt: int) -> str:
    """Another run of the batch with its first run's parameters; it runs only what no run persisted."""
    return await runs.start(RUN_BATCH, parameters, f"{batch.id}-run-{attempt}", [API_TAG, batch.job_id, "resumed"])


class BatchFlowRuns:
    """What the Prefect server knows of the API's flow runs: which ended badly, which died without ending, the
    batch queue's drainers, and how many runs a batch has had."""

    async def ended(self) -> list[FlowRun]:
        """The latest run-batch flow runs that crashed, failed or were cancelled."""
        return await runs_of([FLOW], ["CRASHED", "FAILED", "CANCELLED"])

    async def end_dead(self, judge_remote: bool) -> list[DeadRun]:
        """Mark `Crashed` the runs of pronk's flows whose process is gone (`pronk.control.dead_runs`)."""
        from pronk.control.dead_runs import end_dead_runs

        return await end_dead_runs(judge_remote)

    async def drainers(self) -> list[FlowRun]:
        """The batch queue's drainers that have not ended: the one running, and those waiting for its slot."""
        unended = ["SCHEDULED", "PENDING", "RUNNING", "CANCELLING", "PAUSED"]
        return await runs_of([DRAINER_FLOW], unended, newest_first=False, limit=20)

    async def count(self, batch_id: str) -> int:
        """How many flow runs the batch has had (each is named by the batch's id, a resumed one `<id>-run-<n>`)."""
        from prefect import get_client
        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

        async with get_client() as client:
            return await client.count_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_=batch_id)))
