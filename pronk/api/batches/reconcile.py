"""Keep batch records true to their flow runs: no batch stays non-terminal after its flow run has ended.

A flow run's own hooks end its batch when the flow raises or is cancelled, but a process killed
outright (SIGKILL, OOM, a lost machine) runs no hook: the Prefect worker only marks the flow run
`Crashed`. So `pronk api` checks, every `reconcile_interval_s`, the latest run-batch flow runs that
crashed, failed or were cancelled; a batch still owned by such a run is resumed when it crashed
(a new run of the deployment, which runs only what no run persisted; at most `max_batch_runs` runs
in all), else ended `failed` (or `cancelled`) with its persisted lines in its output file.

Each check first ends the runs of pronk's flows whose process is gone (`pronk.control.dead_runs`): a drainer killed
with its Prefect worker, the subflow runs it took along, an enrichment run nobody watched. Nothing else would mark
them, and a dead drainer would hold the batch queue's only slot for good. Their batches are then resumed like any
crashed run's. Batches still queued wait for the next drainer, which the check asks for whenever the queue is not
empty; those that have waited `QUEUE_NOTE_AFTER_S` while no drainer runs say why on their record (`errors`), which
the official client reads.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal

from fastapi.concurrency import run_in_threadpool

from pronk.api.batches.flow_runs import resume_batch_run
from pronk.batches.queue import batch_id_of, enqueued_at
from pronk.batches.results import ResultParts
from pronk.batches.run import end_batch
from pronk.batches.schemas import TERMINAL_STATUSES, BatchErrorData, BatchErrors
from pronk.batches.store import BatchStore
from pronk.control.dead_runs import dead_after_s
from pronk.jobs.catalog import resolve_job
from pronk.protocol.error_codes import ErrorCode
from pronk.settings import Settings

if TYPE_CHECKING:
    from prefect.client.schemas.objects import FlowRun

    from pronk.api.batches.drainers import Drainers
    from pronk.api.batches.flow_runs import BatchFlowRuns
    from pronk.stack.deployments import DeploymentStarter

logger = logging.getLogger(__name__)

FIRST_CHECK_S = 5.0
"""The first check comes soon after start: batches may have lost their run while the API was down."""
QUEUE_NOTE_AFTER_S = 60.0
"""A batch queued this long while no drainer runs says why on its record."""
QUEUE_NOTES = 200
"""At most this many of the queue's first batches get the note: each costs a read and a write of its record."""


class Reconciler:
    def __init__(
        self,
        settings: Settings,
        runs: BatchFlowRuns,
        starter: DeploymentStarter,
        store: BatchStore,
        drainers: Drainers | None = None,
    ):
        self.settings = settings
        self.runs = runs
        self.starter = starter
        self.store = store
        self.drainers = drainers
        """Asked for a drainer when the batch queue is not empty (none: the queue is not looked at)."""
        self.settled: set[str] = set()
        """Flow runs already looked at by this process: each ended run is acted on once."""
        self.watching_since: float | None = None
        """Since when every check reached Prefect: only a check that has watched that long judges runs on other hosts
        by their heartbeats (`pronk.control.dead_runs`)."""

    async def check(self) -> list[str]:
        """One pass; returns the ids of the batches it resumed or ended."""
        acted = []
        now = time.monotonic()
        watched = self.watching_since is not None and now - self.watching_since >= dead_after_s()
        try:
            await self.runs.end_dead(judge_remote=watched)
        except Exception:
            self.watching_since = None
            raise
        self.watching_since = self.watching_since or now
        ended = await self.runs.ended()
        for flow_run in ended:
            run_id = str(flow_run.id)
            if run_id in self.settled:
                continue
            if await self._settle(flow_run):
                acted.append(str(flow_run.parameters.get("batch_id")))
            self.settled.add(run_id)
        self.settled &= {str(flow_run.id) for flow_run in ended}  # only what the query can still return
        if self.drainers is not None and (names := await run_in_threadpool(self.drainers.queue.names)):
            self.drainers.want_drainer()
            await self._note_waiting(names)
        return acted

    async def _note_waiting(self, names: list[str]) -> None:
        """Say on each batch queued for `QUEUE_NOTE_AFTER_S` why it still waits, when no drainer runs."""
        drainers = await self.runs.drainers()
        if any(d.state_type is not None and d.state_type.value == "RUNNING" for d in drainers):
            return
        waited = [n for n in names[:QUEUE_NOTES] if time.time() - enqueued_at(n) >= QUEUE_NOTE_AFTER_S]
        if waited:
            note = queue_note(drainers, len(names))
            for name in waited:
                await run_in_threadpool(self._note, batch_id_of(name), note)

    def _note(self, batch_id: str, message: str) -> None:
        try:
            batch = self.store.load(batch_id)
        except FileNotFoundError:
            return
        if batch.status != "validating":
            return
        batch.errors = BatchErrors(data=[BatchErrorData(code=ErrorCode.QUEUE_WAITING, message=message)])
        self.store.save(batch)

    async def _settle(self, flow_run: FlowRun) -> bool:
        batch_id = flow_run.parameters.get("batch_id")
        if not isinstance(batch_id, str):
            return False
        try:
            batch = await run_in_threadpool(self.store.load, batch_id)
        except FileNotFoundError:
            return False
        if batch.status in TERMINAL_STATUSES or batch.flow_run_id not in (None, str(flow_run.id)):
            return False  # ended already, or a newer run owns it
        state = flow_run.state_type.value if flow_run.state_type else "UNKNOWN"
        why = f"its flow run {flow_run.id} ended {state}" + (f": {flow_run.state.message}" if flow_run.state else "")
        runs = await self.runs.count(batch_id)
        fruitless = runs - await run_in_threadpool(ResultParts(batch_id, self.settings).productive_runs)
        if state == "CRASHED" and fruitless < self.settings.max_batch_runs:
            batch.flow_run_id = await resume_batch_run(self.starter, batch, dict(flow_run.parameters), runs + 1)
            await run_in_threadpool(self.store.save, batch)
            logger.warning("batch %s resumed as flow run %s (run %d): %s", batch_id, batch.flow_run_id, runs + 1, why)
            return True
        status: Literal["failed", "cancelled"] = "cancelled" if state == "CANCELLED" else "failed"
        if state == "CRASHED":
            why += f" ({fruitless} runs ended without finishing a line; at most {self.settings.max_batch_runs})"
        input_uri = flow_run.parameters.get("input_uri")
        job = await run_in_threadpool(resolve_job, batch.job_id, self.settings)
        await run_in_threadpool(
            end_batch, batch_id, job, status, why, self.settings, input_uri if isinstance(input_uri, str) else None
        )
        return True

    async def loop(self) -> None:
        """Check every `reconcile_interval_s` until cancelled; trouble (Prefect down) waits for the next check."""
        await asyncio.sleep(min(FIRST_CHECK_S, self.settings.reconcile_interval_s))
        while True:
            if acted := await _tried("reconciling batches with their flow runs", self.check):
                logger.info("reconciled batches %s", acted)
            await asyncio.sleep(self.settings.reconcile_interval_s)


def queue_note(drainers: list[FlowRun], queued: int) -> str:
    """Why a queued batch waits, from the drainers that have not ended (none of them running)."""
    at = datetime.now(UTC).strftime("%H:%M:%S UTC")
    ahead = f"{queued} batches are queued"
    if not drainers:
        return f"waiting for the batch queue's drainer: at {at} none was running or scheduled (asked for); {ahead}"
    first = drainers[0]
    state = first.state.name if first.state is not None else "unknown"
    since = first.state.timestamp.strftime("%H:%M:%S UTC") if first.state is not None else "?"
    return (
        f"waiting for the batch queue's drainer: at {at} none was running; drainer {first.name} has been {state} "
        f"since {since}; {ahead}"
    )


async def _tried(what: str, check: Callable[[], Awaitable[list[str]]]) -> list[str]:
    """What one check acted on; nothing when it failed (logged: the next check tries again)."""
    try:
        return await check()
    except Exception as exc:  # noqa: BLE001 - the next check tries again
        logger.warning("%s failed: %s: %s", what, type(exc).__name__, exc)
        return []
