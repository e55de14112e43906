"""The queue of API batches waiting for a run: one object per batch under the store, named so they sort in order.

A burst of API batches used to become a burst of flow-run processes, one per batch (issue 40: 50 at once, load 16,
Prefect's SQLite locked, runs crashed at submission, a one-line batch done after 20 minutes). Now the API puts each
batch here once its record is saved, and one drainer flow run (`flows/batch_queue.py`) takes them in order and runs
each as a subflow of its own. An entry stays until its batch has been run, so a drainer killed mid-way leaves the
batches it had not finished for the next one; `runnable` says which batches no run owns yet.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from pydantic import BaseModel

from pronk import storage
from pronk.batches.schemas import TERMINAL_STATUSES, Batch
from pronk.settings import Settings


class QueuedRun(BaseModel):
    """What a drainer needs to run a waiting batch, so it reads nothing else to start it."""

    batch_id: str
    input_uri: str
    job_id: str


@dataclass(frozen=True, slots=True)
class Entry:
    name: str
    """`<enqueued ns>-<batch id>.json`: the listing's order is the queue's."""
    run: QueuedRun


class BatchQueue:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.root = storage.join(settings.store_uri, "batch_queue")

    def put(self, batch: Batch, input_uri: str) -> None:
        """Queue the batch behind every batch queued before it."""
        run = QueuedRun(batch_id=batch.id, input_uri=input_uri, job_id=batch.job_id)
        name = f"{time.time_ns():020d}-{batch.id}.json"
        storage.write_bytes(storage.join(self.root, name), run.model_dump_json().encode(), self.settings)

    def names(self) -> list[str]:
        """The queue's entries by name, first queued first: a listing, without reading them."""
        return [n for n in storage.list_names(self.root, self.settings) if n.endswith(".json")]

    def waiting(self) -> list[Entry]:
        """Every queued batch, first queued first."""
        return self.first(None)

    def first(self, count: int | None, skip: frozenset[str] = frozenset()) -> list[Entry]:
        """The first `count` queued batches (all: None) whose ids are not in `skip`; only those are read, so a queue
        of thousands costs a drainer a listing per look, not a read of every entry. One removed meanwhile is left
        out."""
        names = [n for n in self.names() if batch_id_of(n) not in skip][:count]
        contents = storage.read_many([storage.join(self.root, n) for n in names], self.settings)
        return [Entry(n, QueuedRun.model_validate_json(c)) for n, c in zip(names, contents, strict=True) if c]

    def remove(self, entry: Entry) -> None:
        storage.delete(storage.join(self.root, entry.name), self.settings)


def enqueued_at(name: str) -> float:
    """When the entry was queued (seconds since the epoch), from its name."""
    return int(name.split("-", 1)[0]) / 1e9


def batch_id_of(name: str) -> str:
    """The batch id in an entry's name."""
    return name.split("-", 1)[-1].removesuffix(".json")


def runnable(batch: Batch) -> bool:
    """No run owns the batch yet and it has not ended: a queued batch a drainer should run.

    A batch that an earlier run opened (its `flow_run_id` is set) is that run's, or the reconcile loop's to resume,
    never a second drainer's. A batch cancelled while it waited is run too: its run ends it `cancelled` at once.
    """
    return batch.flow_run_id is None and batch.status not in TERMINAL_STATUSES
