"""The batch queue on a local store: first queued first, only the entries asked for are read, and which batches a
drainer may run."""

from __future__ import annotations

from pronk.batches.queue import BatchQueue, runnable
from pronk.batches.schemas import Batch
from pronk.settings import Settings


def batch(n: int) -> Batch:
    return Batch(id=f"batch_{n:024d}", input_file_id="file-x", job_id="job-c0ffee01", model="pronk-tiny")


def test_batches_come_out_in_the_order_they_were_queued_and_running_ones_are_skipped(tmp_path):
    queue = BatchQueue(Settings(data_dir=tmp_path, storage_uri=str(tmp_path / "store")))
    for n in (3, 1, 2):
        queue.put(batch(n), f"file:///in-{n}.jsonl")
    assert [e.run.batch_id for e in queue.waiting()] == [batch(n).id for n in (3, 1, 2)]
    first, second = queue.first(2)
    assert (first.run.input_uri, second.run.batch_id) == ("file:///in-3.jsonl", batch(1).id)
    assert [e.run.batch_id for e in queue.first(1, frozenset({batch(3).id}))] == [batch(1).id]
    queue.remove(first)
    assert [e.run.batch_id for e in queue.waiting()] == [batch(1).id, batch(2).id]


def test_a_drainer_runs_only_batches_no_run_owns_that_have_not_ended():
    waiting, cancelled, owned, ended = batch(1), batch(2), batch(3), batch(4)
    cancelled.status = "cancelling"
    owned.flow_run_id = "an-earlier-run"
    ended.mark("completed")
    assert [runnable(b) for b in (waiting, cancelled, owned, ended)] == [True, True, False, False]
