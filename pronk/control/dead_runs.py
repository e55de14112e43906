"""Flow runs whose process is gone, found and ended, so no dead run holds a deployment's concurrency slot.

A flow run killed without a hook (SIGKILL, OOM, `pronk stack down` taking its Prefect worker along, a lost host)
stays RUNNING in Prefect for good when no worker watched its process: the worker that started it died with it. It
keeps its deployment's concurrency slot, and the batch queue's next drainer waits behind it forever (issue 65).

Each of pronk's flows records where it runs, as labels of its flow run (`record_process`, an `on_running` hook):
host, pid and the pid's start time. `find_dead` then judges every unended run of pronk's flows:

- on this host, exactly: the recorded process runs, or it does not;
- on another host, or with no process recorded, by Prefect's own flow-run heartbeats (every
  `PREFECT_FLOWS_HEARTBEAT_FREQUENCY`, 30 s in pronk's processes): no heartbeat and no state change for
  `MISSED_HEARTBEATS` of them. Only a caller that has watched the server answer for that long
  judges this way (`judge_remote`): heartbeats sent while it was away may still arrive.

A dead run is marked `Crashed` (`Cancelled` when a cancel was asked for), which gives its slot back; the API's
reconcile loop then resumes its batch. `pronk stack up` runs this once, local runs only, before it deploys.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from pronk.control.flow_runs import mark_ended, runs_of
from pronk.host_process import HostProcess

if TYPE_CHECKING:
    from prefect.client.schemas.objects import FlowRun

logger = logging.getLogger(__name__)

PRONK_FLOWS = ("run-batch", "drain-batch-queue", "enrich-table", "leap", "improve", "herd")
"""The flows pronk deploys; runs of other flows on a shared server are never judged."""
HOST, PID, PID_STARTED = "pronk.host", "pronk.pid", "pronk.pid-started"
MISSED_HEARTBEATS = 3
"""A run on another host is dead after this many heartbeats missed in a row."""
PENDING_AFTER_S = 300.0
"""A run submitted (PENDING) whose process never started: a Prefect worker that died between the two."""
HEARTBEAT = "prefect.flow-run.heartbeat"
EVENTS_PAGE = 50
"""The most events Prefect's `/events/filter` answers at once."""


def record_process(flow: Any, flow_run: FlowRun, state: Any) -> None:
    """`on_running` hook of pronk's flows: label the flow run with the process that runs it (best effort: a run
    left unlabelled is judged by its heartbeats)."""
    from prefect import get_client

    process = HostProcess.this()
    labels: dict[str, bool | int | float | str] = {
        HOST: process.host,
        PID: str(process.pid),
        PID_STARTED: str(process.started or ""),
    }
    try:
        with get_client(sync_client=True) as client:
            client.update_flow_run_labels(flow_run.id, labels)
    except Exception as exc:  # noqa: BLE001 - the run goes on; heartbeats judge it
        logger.warning("flow run %s: recording its process failed: %s: %s", flow_run.id, type(exc).__name__, exc)


def process_of(labels: dict[str, Any]) -> HostProcess | None:
    """The process a run's labels name, or None (not labelled by `record_process`)."""
    try:
        started = labels.get(PID_STARTED)
        return HostProcess(str(labels[HOST]), int(labels[PID]), int(started) if started else None)
    except (KeyError, TypeError, ValueError):
        return None


@dataclass(frozen=True, slots=True)
class DeadRun:
    flow_run_id: str
    name: str
    ended: Literal["CRASHED", "CANCELLED"]
    why: str


def verdict(
    run: FlowRun, last_heartbeat: datetime | None, now: datetime, judge_remote: bool, dead_after_s: float
) -> str | None:
    """Why the unended run is dead, or None while it may be alive."""
    process = process_of(dict(run.labels or {}))
    alive = process.alive() if process is not None else None
    if alive is True:
        return None
    if alive is False:
        assert process is not None
        return f"its process ({process.describe()}) is gone"
    if not judge_remote:
        return None
    since = run.state.timestamp if run.state is not None else run.created
    if since is None:
        return None
    signs = [since] + ([last_heartbeat] if last_heartbeat else [])
    quiet = (now - max(signs)).total_seconds()
    if last_heartbeat is None and run.state_type is not None and run.state_type.value == "PENDING":
        if quiet < PENDING_AFTER_S:
            return None
        return f"it was submitted {quiet:.0f}s ago and its process never started"
    if quiet < dead_after_s:
        return None
    where = f"on {process.host}" if process is not None else "with no process recorded"
    return f"no heartbeat for {quiet:.0f}s ({where})"


async def _last_heartbeats(run_ids: list[str], since: datetime) -> dict[str, datetime]:
    """Each run's newest heartbeat since `since` (runs without one are left out)."""
    from prefect import get_client
    from prefect.events.filters import EventFilter, EventNameFilter, EventOccurredFilter, EventResourceFilter

    ids = [f"prefect.flow-run.{run_id}" for run_id in run_ids]
    filter = EventFilter(
        occurred=EventOccurredFilter(since=since),  # type: ignore[arg-type]  # Prefect's DateTime is a datetime
        event=EventNameFilter(name=[HEARTBEAT]),
        resource=EventResourceFilter(id=ids),
    )
    newest: dict[str, datetime] = {}
    async with get_client() as client:
        page = await client.read_events(filter=filter, limit=EVENTS_PAGE)
        while True:
            for event in page.events:
                run_id = event.resource.id.removeprefix("prefect.flow-run.")
                newest[run_id] = max(event.occurred, newest.get(run_id, event.occurred))
            if page.next_page is None:
                return newest
            page = await client.read_events_page(str(page.next_page))


def dead_after_s() -> float:
    """How long a run on another host may stay quiet: `MISSED_HEARTBEATS` of Prefect's heartbeat interval."""
    from prefect.settings import get_current_settings

    return MISSED_HEARTBEATS * float(get_current_settings().flows.heartbeat_frequency or 180)


async def find_dead(judge_remote: bool) -> list[DeadRun]:
    """The unended runs of pronk's flows whose process is gone (raises when Prefect does not answer)."""
    now, quiet_s = datetime.now(UTC), dead_after_s()
    runs = await runs_of(PRONK_FLOWS, ["PENDING", "RUNNING", "CANCELLING"])
    beats = await _last_heartbeats([str(r.id) for r in runs], now - timedelta(seconds=quiet_s)) if runs else {}
    dead = []
    for run in runs:
        why = verdict(run, beats.get(str(run.id)), now, judge_remote, quiet_s)
        if why is not None:
            cancelling = run.state_type is not None and run.state_type.value == "CANCELLING"
            dead.append(DeadRun(str(run.id), run.name, "CANCELLED" if cancelling else "CRASHED", why))
    return dead


async def end_dead_runs(judge_remote: bool) -> list[DeadRun]:
    """Mark every dead run `Crashed` (or `Cancelled`); the runs marked. Each mark is best effort."""
    marked = []
    for run in await find_dead(judge_remote):
        if await mark_ended(run.flow_run_id, run.ended, f"pronk found it dead: {run.why}"):
            logger.warning("flow run %s (%s) marked %s: %s", run.name, run.flow_run_id, run.ended.lower(), run.why)
            marked.append(run)
    return marked


def main() -> None:
    """`python -m pronk.control.dead_runs`: end this host's dead runs once and print them (`pronk stack up` runs it
    before it deploys, for the runs a stopped stack left behind)."""
    import asyncio

    for run in asyncio.run(end_dead_runs(judge_remote=False)):
        print(f"{run.name} ({run.flow_run_id}) marked {run.ended.lower()}: {run.why}")


if __name__ == "__main__":
    main()
