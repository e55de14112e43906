"""An enrichment's open run, Prefect-free: who is asking its rows now, so a run after a crash takes over its work.

While a run asks rows it keeps a marker, `open_run.json`, under the enrichment's results folder: its run id, its
batch, the hash of its lines file, its flow run, and the host and process that run it. A run that ends, well or
with a handled failure, removes it. A process killed outright (SIGKILL, OOM, a lost machine) leaves it behind, and
its flow run RUNNING in Prefect, since no hook of it ran.

The next run of the enrichment reads the marker before it plans. When that run is alive (same host, the process
still there; or, from another host, a flow run Prefect does not show ended) it refuses, naming it. When it is gone,
the new run has its flow run marked crashed (the caller's Prefect call: `pronk.control.flow_runs`) and takes over its
batch: if the rows it asks now make the same lines file (same hash), it runs under the old batch's id, so
`BatchRun.resume` skips every line the dead run persisted; otherwise it ends the old batch `failed` with what that
run persisted (`end_batch`, as the API's reconcile loop does for plain batches).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from pydantic import BaseModel, ValidationError

from pronk import storage
from pronk.batches.results import ResultParts
from pronk.batches.run import end_batch
from pronk.batches.schemas import TERMINAL_STATUSES, Batch
from pronk.batches.store import BatchStore
from pronk.host_process import HostProcess
from pronk.jobs.schema import JobConfig
from pronk.pronk_error import PronkError
from pronk.settings import Settings

logger = logging.getLogger(__name__)

OPEN_RUN = "open_run.json"

ENDED_FLOW_RUN_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "CRASHED"})
"""Prefect state types of a flow run that has ended: its process no longer runs the enrichment."""

StateOf = Callable[[str], Awaitable[str | None]]
"""A flow run's state type (`RUNNING`, `CRASHED`, …), or None when Prefect cannot say."""
MarkCrashed = Callable[[str, str], Awaitable[object]]
"""Mark a flow run crashed, with a message (best effort)."""


class EnrichRunning(PronkError, RuntimeError):
    """Another run of the enrichment is alive: this one refuses before it reads or writes anything."""


class OpenRun(BaseModel):
    """The marker of a run asking rows."""

    run_id: str
    spec: str
    batch_id: str
    lines_uri: str
    lines_sha256: str
    flow_run_id: str | None = None
    host: str
    pid: int
    pid_started: int | None = None
    """The process's start time (clock ticks since boot, from /proc), so a reused pid is not taken for it."""
    started_at: str

    def process(self) -> HostProcess:
        return HostProcess(self.host, self.pid, self.pid_started)

    def describe(self) -> str:
        flow_run = f"flow run {self.flow_run_id}" if self.flow_run_id else "a run outside Prefect"
        return f"{flow_run} (run {self.run_id}, pid {self.pid} on {self.host}, since {self.started_at})"


def marker_uri(results: str) -> str:
    return storage.join(results, OPEN_RUN)


def read_open_run(results: str, settings: Settings) -> OpenRun | None:
    """The marker under the results folder, or None (none, or one that does not parse: logged and ignored)."""
    uri = marker_uri(results)
    if not storage.exists(uri, settings):
        return None
    try:
        return OpenRun.model_validate_json(storage.read_bytes(uri, settings))
    except (OSError, ValidationError) as exc:
        logger.warning("ignoring the unreadable open-run marker %s: %s", uri, exc)
        return None


def close(results: str, run_id: str, settings: Settings) -> None:
    """Remove the marker when it is run `run_id`'s (never another run's)."""
    marker = read_open_run(results, settings)
    if marker is not None and marker.run_id == run_id:
        storage.delete(marker_uri(results), settings)


def is_gone(marker: OpenRun, flow_run_state: str | None) -> bool:
    """Whether the marker's run no longer runs: its flow run ended, or (same host) its process is gone."""
    if flow_run_state in ENDED_FLOW_RUN_STATES:
        return True
    return marker.process().alive() is False  # another host (None): Prefect does not show it ended, it may run


async def check_earlier(
    spec: str, results: str, settings: Settings, flow_run_id: str | None, state_of: StateOf, mark_crashed: MarkCrashed
) -> OpenRun | None:
    """Before a run plans: the marker of an earlier run that died (its flow run now marked crashed), or None.

    Raises `EnrichRunning` when the earlier run is alive.
    """
    earlier = read_open_run(results, settings)
    if earlier is None:
        return None
    own = earlier.flow_run_id is not None and earlier.flow_run_id == flow_run_id  # this flow run, started again
    state = await state_of(earlier.flow_run_id) if earlier.flow_run_id and not own else None
    if not own and not is_gone(earlier, state):
        raise EnrichRunning(
            f"enrichment {spec} is already running as {earlier.describe()}; if that run is gone for good, mark its "
            f"flow run crashed in Prefect or delete {marker_uri(results)}"
        )
    if earlier.flow_run_id and not own and state not in ENDED_FLOW_RUN_STATES:
        await mark_crashed(earlier.flow_run_id, _crash_message(earlier))
    return earlier


def _crash_message(marker: OpenRun) -> str:
    return (
        f"its process (pid {marker.pid} on {marker.host}) is gone; run {marker.run_id} of enrichment {marker.spec} "
        "ended without finishing"
    )


@dataclass(slots=True)
class Takeover:
    """What became of a dead run's batch, and why (for the log)."""

    batch_id: str | None
    """The dead run's batch, run on by this run (its persisted lines kept); None when not reused."""
    reused: int = 0
    """Lines of that batch the dead run finished: this run does not ask them again."""
    ended: str | None = None
    """The dead run's batch, ended `failed` here because this run asks other lines (or none)."""
    why: str = ""


def lines_hash(lines: bytes) -> str:
    return hashlib.sha256(lines).hexdigest()


REUSABLE = frozenset({"validating", "in_progress", "finalizing", "completed"})
"""A dead run's batch in these states holds its lines' answers, or will once it runs on."""


def _load(batch_id: str, settings: Settings) -> Batch | None:
    try:
        return BatchStore(settings).load(batch_id)
    except FileNotFoundError:
        return None


def take_over(earlier: OpenRun, lines: bytes | None, job: JobConfig, settings: Settings) -> Takeover:
    """Reuse the dead run's batch when this run asks the same lines (`lines`: this run's lines file, None when it
    asks none) and the batch did not end failed, cancelled or expired; otherwise end it with what it persisted
    (`job`: the enrichment's job, the batch's)."""
    batch = _load(earlier.batch_id, settings)
    status = batch.status if batch is not None else "unknown"
    asked = lines.count(b"\n") if lines is not None else 0
    if lines is not None and lines_hash(lines) == earlier.lines_sha256 and (batch is None or status in REUSABLE):
        if batch is not None and status == "completed":
            reused = batch.request_counts.completed + batch.request_counts.failed
        else:
            reused = len(ResultParts(earlier.batch_id, settings).load())
        why = (
            f"the same {asked} rows as run {earlier.run_id}: its batch {earlier.batch_id} ({status}) runs on, "
            f"{reused} rows finished by it reused"
        )
        return Takeover(earlier.batch_id, reused, why=why)
    because = "it asked other rows" if lines is not None else "no row is asked now"
    if batch is None or status in TERMINAL_STATUSES:
        return Takeover(None, why=f"run {earlier.run_id}'s batch {earlier.batch_id} is {status}; {because}")
    end_batch(
        earlier.batch_id,
        job,
        "failed",
        f"its enrich run {earlier.run_id} ended without finishing ({earlier.describe()}); the next run did not "
        f"reuse it: {because}",
        settings,
        earlier.lines_uri,
    )
    why = f"run {earlier.run_id}'s batch {earlier.batch_id} ended failed with what it persisted: {because}"
    return Takeover(None, ended=earlier.batch_id, why=why)


def open_run(
    spec: str,
    results: str,
    run_id: str,
    lines: bytes,
    lines_uri: str,
    batch_id: str,
    flow_run_id: str | None,
    settings: Settings,
) -> OpenRun:
    """Write the lines file and this run's marker (it replaces a dead run's, whose batch was settled first)."""
    storage.write_bytes(lines_uri, lines, settings)
    process = HostProcess.this()
    marker = OpenRun(
        run_id=run_id,
        spec=spec,
        batch_id=batch_id,
        lines_uri=lines_uri,
        lines_sha256=lines_hash(lines),
        flow_run_id=flow_run_id,
        host=process.host,
        pid=process.pid,
        pid_started=process.started,
        started_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    storage.write_bytes(marker_uri(results), marker.model_dump_json().encode(), settings)
    return marker
