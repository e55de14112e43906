"""Running batches behind the API: a create answers once the batch is recorded and queued, and a drainer runs it.

A burst of creates once started a run-batch flow run per batch, each its own process (issue 40: 50 processes at
once, Prefect's SQLite locked, 12 runs crashed at submission, one-line batches done after 20 minutes). Now the route
puts the batch in the batch queue (`pronk.batches.queue`) and asks here for a drainer: a run of the
`drain-batch-queue` deployment that runs the queued batches in order, each as a run-batch subflow run. One drainer
runs at a time (the deployment's concurrency limit); here the API keeps one more started but not yet running, so a
batch queued just as the running drainer ends still has one coming. Many creates at once make one check.

A refused start is tried again with backoff; if Prefect refuses every try, the batches stay queued and the
reconcile loop asks again on its next pass. When the API starts it queues every API batch still `validating` that
is in no queue (its create died between the record and the queue), and asks for a drainer.
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Annotated

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool

from pronk.api.batches.flow_runs import start_queue_drain
from pronk.batches.file_store import FileStore
from pronk.batches.queue import BatchQueue, batch_id_of
from pronk.batches.schemas import Batch
from pronk.batches.store import BatchStore
from pronk.settings import Settings
from pronk.stack.deployments import DeploymentStarter

logger = logging.getLogger(__name__)


class Drainers:
    """Queues the API's batches and keeps a drainer of the batch queue coming for them."""

    def __init__(self, settings: Settings, starter: DeploymentStarter, files: FileStore, batches: BatchStore) -> None:
        self.settings = settings
        self.starter = starter
        self.files = files
        self.batches = batches
        self.queue = BatchQueue(settings)
        self.next_drainer: str | None = None
        """The flow run id of the last drainer started: while it has yet to start, it will see every queued batch."""
        self.check_waiting = False
        """A drainer check is waiting for its turn: it will see every batch queued until it runs."""
        self.one_check = asyncio.Lock()
        self.pending: set[asyncio.Task[None]] = set()

    async def queue_batch(self, batch: Batch, input_uri: str) -> None:
        """Queue the recorded batch and see that a drainer is coming for it (call from the API's event loop)."""
        await run_in_threadpool(self.queue.put, batch, input_uri)
        self.want_drainer()

    def want_drainer(self) -> None:
        """Start a drainer in the background unless one has yet to start (call after queueing)."""
        if self.check_waiting:
            return
        self.check_waiting = True
        task = asyncio.create_task(self._keep_a_drainer_coming(), name="batch queue drainer")
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def drain(self) -> None:
        """Wait for every drainer check asked for so far (tests, and the API's shutdown)."""
        while self.pending:
            await asyncio.gather(*self.pending, return_exceptions=True)

    async def requeue_waiting(self) -> list[str]:
        """Queue every API batch still `validating` that no queue entry holds: its create may have died between the
        record and the queue. Run beside the API's start-up (it reads every batch record); trouble is logged."""
        try:
            records = await run_in_threadpool(self.batches.records)
            queued = {batch_id_of(name) for name in await run_in_threadpool(self.queue.names)}
            lost = [b for b in records if b.owner is not None and b.status == "validating" and b.id not in queued]
            for batch in lost:
                file = await run_in_threadpool(self.files.get, batch.input_file_id)
                if file is None:
                    logger.warning(
                        "batch %s is validating but its input file %s is gone", batch.id, batch.input_file_id
                    )
                    continue
                await run_in_threadpool(self.queue.put, batch, file.uri)
        except Exception as exc:  # noqa: BLE001 - the API serves anyway; the next start looks again
            logger.warning("batches left validating were not looked for: %s: %s", type(exc).__name__, exc)
            return []
        if lost or queued:
            self.want_drainer()
        return [b.id for b in lost]

    async def _keep_a_drainer_coming(self) -> None:
        async with self.one_check:
            self.check_waiting = False
            if self.next_drainer is not None and await self._waiting(self.next_drainer):
                return
            attempts = self.settings.api_run_start_attempts
            delay = self.settings.api_run_start_first_delay_s
            for attempt in range(1, attempts + 1):
                try:
                    self.next_drainer = await start_queue_drain(self.starter)
                    return
                except Exception:
                    logger.warning(
                        "start of a batch queue drainer refused (try %d of %d)", attempt, attempts, exc_info=True
                    )
                if attempt < attempts:
                    await asyncio.sleep(delay * random.uniform(0.5, 1.5))
                    delay *= 2
            logger.error("no batch queue drainer started after %d tries; the reconcile loop asks again", attempts)

    async def _waiting(self, flow_run_id: str) -> bool:
        try:
            return await self.starter.waiting(flow_run_id)
        except Exception as exc:  # noqa: BLE001 - unknown: start another; the deployment runs one at a time anyway
            logger.warning("cannot read drainer %s: %s: %s", flow_run_id, type(exc).__name__, exc)
            return False


def get_drainers(request: Request) -> Drainers:
    return request.app.state.drainers


DrainersDep = Annotated[Drainers, Depends(get_drainers)]
"""The app's `Drainers`, for the batch routes."""
