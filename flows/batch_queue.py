"""The batch queue's drainer: one flow run that runs the API's waiting batches, each as a `run-batch` subflow run.

A process per batch cost every small batch a Python start, Prefect's and pronk's imports and a worker poll, and a
burst of them swamped the machine and Prefect's database (issue 40). The drainer takes the queue in order
(`pronk.batches.queue`), runs up to `batch_queue_concurrency` batches at once in its own process, and ends once the
queue has stayed empty for `batch_queue_idle_s`. Each batch is still a flow run named by its batch id, with its own
task runs, artifacts and hooks; the deployment's concurrency limit of one keeps two drainers from running at once.
"""

from __future__ import annotations

import asyncio
import time

from prefect import flow, get_run_logger

from pronk.batches.queue import BatchQueue, Entry, runnable
from pronk.batches.store import BatchStore
from pronk.control.dead_runs import record_process
from pronk.flows.batch import run_batch
from pronk.settings import get_settings
from pronk.stack.prefect_env import show_pronk_logs

POLL_S = 0.5
"""How often the drainer looks at the queue while it waits (a listing of one folder of the store)."""


@flow(name="drain-batch-queue", log_prints=False, on_running=[record_process])
async def drain_batch_queue() -> dict[str, int]:
    """Run the API's queued batches in order, `batch_queue_concurrency` at once, until the queue stays empty."""
    show_pronk_logs()
    logger = get_run_logger()
    settings = get_settings()
    queue, store = BatchQueue(settings), BatchStore(settings)
    running: dict[str, asyncio.Task[None]] = {}
    ran = skipped = 0
    idle_since = time.monotonic()

    async def run(entry: Entry) -> None:
        queued = entry.run
        state = await run_batch(
            input_uri=queued.input_uri, job_id=queued.job_id, batch_id=queued.batch_id, return_state=True
        )
        if not state.is_completed():
            logger.warning("batch %s: its run ended %s: %s", queued.batch_id, state.type.value, state.message)
        await asyncio.to_thread(queue.remove, entry)

    while True:
        room = settings.batch_queue_concurrency - len(running)
        waiting = await asyncio.to_thread(queue.first, room, frozenset(running)) if room else []
        for entry in waiting:
            try:
                batch = await asyncio.to_thread(store.load, entry.run.batch_id)
            except FileNotFoundError:
                batch = None
            if batch is None or not runnable(batch):
                logger.info("batch %s is ended or owned by another run: left to it", entry.run.batch_id)
                await asyncio.to_thread(queue.remove, entry)
                skipped += 1
                continue
            running[batch.id] = asyncio.create_task(run(entry), name=batch.id)
            ran += 1
        if running:
            done, _ = await asyncio.wait(running.values(), timeout=POLL_S, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                del running[task.get_name()]
                if task.exception() is not None:  # the store failed under it: the entry stays for the next drainer
                    logger.error("batch %s: its run could not be finished: %r", task.get_name(), task.exception())
            idle_since = time.monotonic()
        elif waiting:
            continue  # every entry read was left to the run that owns it: look at the next ones at once
        elif time.monotonic() - idle_since >= settings.batch_queue_idle_s:
            break
        else:
            await asyncio.sleep(POLL_S)
    logger.info("batch queue drained: %d batches run, %d left to the runs that own them", ran, skipped)
    return {"ran": ran, "skipped": skipped}
