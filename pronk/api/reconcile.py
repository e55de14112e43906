"""Keep batch records true to their flow runs: no batch stays non-terminal after its flow run has ended.

A flow run's own hooks end its batch when the flow raises or is cancelled, but a process killed
outright (SIGKILL, OOM, a lost machine) runs no hook: the Prefect worker only marks the flow run
`Crashed`. So `pronk api` checks, every `reconcile_interval_s`, the latest run-batch flow runs that
crashed, failed or were cancelled; a batch still owned by such a run is resumed when it crashed
(a new run of the deployment, which runs only what no run persisted; at most `max_batch_runs` runs
in all), else ended `failed` (or `cancelled`) with its persisted lines in its output file.

The batch queue's drainer runs API batches as subflow runs in its own process: when that process is killed, the
worker marks the drainer `Crashed` and nothing marks its subflow runs, so the check first marks them `Crashed`
too, and they are resumed like any crashed run. Batches still queued wait for the next drainer, which the check
asks for whenever the queue is not empty.

Each check also marks `Crashed` the flow run of an enrichment run whose process died (`check_enrichments`): no
Prefect worker watched a `pronk enrich run`, so nothing else would until the enrichment's next run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Literal

from fastapi.concurrency import run_in_threadpool

from pronk import storage
from pronk.api.runs import resume_batch_run
from pronk.batches.run import end_batch
from pronk.batches.schemas import TERMINAL_STATUSES
from pronk.batches.store import BatchStore
from pronk.control import flow_runs
from pronk.enrich import open_run
from pronk.enrich.spec import load_specs
from pronk.enrich.table import results_uri
from pronk.settings import Settings

if TYPE_CHECKING:
    from prefect.client.schemas.objects import FlowRun

    from pronk.api.run_starts import RunStarts
    from pronk.api.runs import BatchFlowRuns
    from pronk.stack.deployments import DeploymentStarter

logger = logging.getLogger(__name__)

FIRST_CHECK_S = 5.0
"""The first check comes soon after start: batches may have lost their run while the API was down."""


class Reconciler:
    def __init__(
        self,
        settings: Settings,
        runs: BatchFlowRuns,
        starter: DeploymentStarter,
        store: BatchStore,
        run_starts: RunStarts | None = None,
    ):
        self.settings = settings
        self.runs = runs
        self.starter = starter
        self.store = store
        self.run_starts = run_starts
        """Asked for a drainer when the batch queue is not empty (none: the queue is not looked at)."""
        self.settled: set[str] = set()
        """Flow runs already looked at by this process: each ended run is acted on once."""

    async def check(self) -> list[str]:
        """One pass; returns the ids of the batches it resumed or ended."""
        acted = []
        for orphan in await self.runs.orphaned():
            await self.runs.crash(str(orphan.id), "the batch queue drainer running it crashed")
        ended = await self.runs.ended()
        for flow_run in ended:
            run_id = str(flow_run.id)
            if run_id in self.settled:
                continue
            if await self._settle(flow_run):
                acted.append(str(flow_run.parameters.get("batch_id")))
            self.settled.add(run_id)
        self.settled &= {str(flow_run.id) for flow_run in ended}  # only what the query can still return
        if self.run_starts is not None and len(await run_in_threadpool(self.run_starts.queue.names)) > 0:
            self.run_starts.want_drainer()
        return acted

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
        if state == "CRASHED" and runs < self.settings.max_batch_runs:
            batch.flow_run_id = await resume_batch_run(self.starter, batch, dict(flow_run.parameters), runs + 1)
            await run_in_threadpool(self.store.save, batch)
            logger.warning("batch %s resumed as flow run %s (run %d): %s", batch_id, batch.flow_run_id, runs + 1, why)
            return True
        status: Literal["failed", "cancelled"] = "cancelled" if state == "CANCELLED" else "failed"
        if state == "CRASHED":
            why += f" (run {runs} of at most {self.settings.max_batch_runs})"
        input_uri = flow_run.parameters.get("input_uri")
        await run_in_threadpool(
            end_batch, batch_id, status, why, self.settings, input_uri if isinstance(input_uri, str) else None
        )
        return True

    async def check_enrichments(self) -> list[str]:
        """Mark crashed the flow run of every enrichment run whose process died (`pronk.enrich.open_run`); returns
        those flow runs. No hook of a SIGKILLed run ran, so nothing else would until the enrichment's next run."""
        folders = await run_in_threadpool(enrichment_results, self.settings)
        return await open_run.mark_dead_runs(folders, self.settings, flow_runs.flow_run_state, flow_runs.mark_crashed)

    async def loop(self) -> None:
        """Check every `reconcile_interval_s` until cancelled; trouble (Prefect down) waits for the next check.

        Batches and enrichment runs are checked apart: trouble that keeps one check failing (a batch record that does
        not load, a spec that does not parse) must not keep a dead enrichment's flow run `Running` for good."""
        await asyncio.sleep(min(FIRST_CHECK_S, self.settings.reconcile_interval_s))
        while True:
            if acted := await _tried("reconciling batches with their flow runs", self.check):
                logger.info("reconciled batches %s", acted)
            if crashed := await _tried("looking for dead enrichment runs", self.check_enrichments):
                logger.warning("marked crashed the flow runs of dead enrichment runs %s", crashed)
            await asyncio.sleep(self.settings.reconcile_interval_s)


async def _tried(what: str, check: Callable[[], Awaitable[list[str]]]) -> list[str]:
    """What one check acted on; nothing when it failed (logged: the next check tries again)."""
    try:
        return await check()
    except Exception as exc:  # noqa: BLE001 - the next check tries again
        logger.warning("%s failed: %s: %s", what, type(exc).__name__, exc)
        return []


def enrichment_results(settings: Settings) -> list[str]:
    """Every enrichment's results folder: those of the specs the stack deploys (`load_specs`, as `pronk stack up`
    reads them; a spec may keep its results anywhere) and every folder under the store's `enrichments/` (where a run
    of any other spec keeps them)."""
    root = storage.join(settings.store_uri, "enrichments")
    folders = {results_uri(spec, settings) for _, spec in load_specs()}
    folders |= {storage.join(root, name) for name in storage.list_names(root, settings)}
    return sorted(folders)
