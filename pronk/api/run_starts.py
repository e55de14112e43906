"""Starting batch runs behind the API: a create answers once the batch is recorded, and its run starts here.

A burst of creates used to wait on Prefect one by one inside the request: clients timed out while their batches
were made anyway (a retrying client submitted twice) and Prefect, swamped, answered 503 to a quarter of them.
Now the route records the batch (`validating`) and hands it over; at most `api_run_start_concurrency` starts
are in flight, and a refused start is tried again with backoff (the batch id is the run's idempotency key, so a
try that did reach Prefect makes no second run). A batch whose run never starts ends `failed` with
`run_not_started` and a message that names no internal address or id; the details go to the API's log. When the
API starts it hands over every API batch still `validating`, so a crash between the record and the start
leaves none waiting for ever.
"""

from __future__ import annotations

import asyncio
import logging
import random

from fastapi.concurrency import run_in_threadpool

from pronk.api.runs import start_batch_run
from pronk.batches.files import FileStore
from pronk.batches.schemas import Batch, BatchErrorData, BatchErrors
from pronk.batches.store import BatchStore
from pronk.settings import Settings
from pronk.stack.deployments import DeploymentStarter

logger = logging.getLogger(__name__)

NOT_STARTED = (
    "pronk could not start this batch's run: the orchestrator refused {attempts} times. Nothing ran; "
    "create the batch again."
)


class RunStarts:
    def __init__(self, settings: Settings, starter: DeploymentStarter, files: FileStore, batches: BatchStore) -> None:
        self.settings = settings
        self.starter = starter
        self.files = files
        self.batches = batches
        self.slots = asyncio.Semaphore(settings.api_run_start_concurrency)
        self.pending: set[asyncio.Task[None]] = set()

    def submit(self, batch_id: str) -> None:
        """Start the batch's run in the background (call from the API's event loop)."""
        task = asyncio.create_task(self._start(batch_id), name=f"start {batch_id}")
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def drain(self) -> None:
        """Wait for every start handed over so far (tests, and the API's shutdown)."""
        while self.pending:
            await asyncio.gather(*self.pending, return_exceptions=True)

    async def resubmit_waiting(self) -> list[str]:
        """Hand over every API batch still `validating`: its start may have been lost with the last API process.
        Run beside the API's start-up (it reads every batch record); a store it cannot read is logged."""
        try:
            records = await run_in_threadpool(self.batches.records)
        except Exception as exc:  # noqa: BLE001 - the API serves anyway; the next start tries again
            logger.warning("batches left validating were not looked for: %s: %s", type(exc).__name__, exc)
            return []
        waiting = [b.id for b in records if b.owner is not None and b.status == "validating"]
        for batch_id in waiting:
            self.submit(batch_id)
        return waiting

    async def _start(self, batch_id: str) -> None:
        attempts = self.settings.api_run_start_attempts
        delay = self.settings.api_run_start_first_delay_s
        async with self.slots:
            for attempt in range(1, attempts + 1):
                try:
                    batch = await run_in_threadpool(self.batches.load, batch_id)
                    if batch.status != "validating":
                        return
                    file = await run_in_threadpool(self.files.get, batch.input_file_id)
                    if file is None:
                        raise FileNotFoundError(f"input file {batch.input_file_id} is gone")
                    await start_batch_run(self.starter, batch, file.uri)
                    return
                except Exception:
                    logger.warning("start of %s refused (try %d of %d)", batch_id, attempt, attempts, exc_info=True)
                if attempt < attempts:
                    await asyncio.sleep(delay * random.uniform(0.5, 1.5))
                    delay *= 2
        await run_in_threadpool(self._not_started, batch_id, attempts)

    def _not_started(self, batch_id: str, attempts: int) -> None:
        batch: Batch = self.batches.load(batch_id)
        if batch.status != "validating":
            return
        message = NOT_STARTED.format(attempts=attempts)
        batch.errors = BatchErrors(data=[BatchErrorData(code="run_not_started", message=message)])
        batch.mark("failed")
        self.batches.save(batch)
        logger.error("batch %s failed: its run was refused %d times", batch_id, attempts)
