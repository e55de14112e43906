"""The API's reconcile check on a local store, with a double for Prefect's flow runs (no server)."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

from prefect.client.schemas.objects import StateType

from pronk import storage
from pronk.api.batches.reconcile import QUEUE_NOTE_AFTER_S, Reconciler
from pronk.batches.queue import BatchQueue
from pronk.batches.results import FinishedLine, ResultParts
from pronk.batches.schemas import Batch
from pronk.batches.store import BatchStore
from pronk.protocol.lines import OutputLine, ResponseEnvelope, error_line
from pronk.settings import Settings


class FakeRuns:
    def __init__(self, ended: list[SimpleNamespace], counts: dict[str, int], dead: list[SimpleNamespace] = []):  # noqa: B006
        self._ended = ended
        self.counts = counts
        self.dead = dead
        self.judged_remote: list[bool] = []
        self.resumed: list[tuple[str, dict, int]] = []

    async def end_dead(self, judge_remote: bool) -> list[SimpleNamespace]:
        """As Prefect does once pronk marks them: the dead runs are now among the ended runs, crashed."""
        self.judged_remote.append(judge_remote)
        marked, self.dead = self.dead, []
        self._ended += [SimpleNamespace(**{**vars(run), "state_type": StateType.CRASHED}) for run in marked]
        return marked

    async def drainers(self) -> list[SimpleNamespace]:
        return []

    async def ended(self) -> list[SimpleNamespace]:
        return self._ended

    async def count(self, batch_id: str) -> int:
        return self.counts.get(batch_id, 1)

    async def start(self, deployment: str, parameters: dict, run_name: str, tags: list[str]) -> str:
        self.resumed.append((parameters["batch_id"], deployment, run_name))
        return f"resumed-{run_name}"


def flow_run(run_id: str, batch_id: str, state: StateType, input_uri: str) -> SimpleNamespace:
    return SimpleNamespace(
        id=run_id,
        parameters={"batch_id": batch_id, "input_uri": input_uri, "job_id": "job-c0ffee01"},
        state_type=state,
        state=SimpleNamespace(message="Flow run process exited with non-zero status code -9."),
    )


def test_a_crashed_run_is_resumed_until_the_limit_then_its_batch_ends_failed(tmp_path):
    settings = Settings(data_dir=tmp_path, storage_uri=str(tmp_path / "store"), max_batch_runs=3)
    store = BatchStore(settings)
    path = tmp_path / "input.jsonl"
    body = {"model": "pronk-tiny", "messages": [{"role": "user", "content": "hi"}]}
    path.write_text(json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": body}))
    batches = {}
    for name, status, owner_run in [
        ("crashed", "in_progress", "run-crashed"),
        ("crashed_too_often", "in_progress", "run-3"),
        ("failed", "finalizing", "run-failed"),
        ("done", "completed", "run-done"),
        ("moved_on", "in_progress", "a-newer-run"),
        ("cancelled", "cancelling", "run-cancelled"),
    ]:
        batch = Batch(id=f"batch_{name}", input_file_id=str(path), job_id="job-c0ffee01", model="pronk-tiny")
        batch.mark(status)
        batch.flow_run_id = owner_run
        batch.output_uri = str(tmp_path / f"{batch.id}_output.jsonl")
        batch.error_uri = str(tmp_path / f"{batch.id}_error.jsonl")
        store.save(batch)
        batches[name] = batch
    runs = FakeRuns(
        [
            flow_run("run-crashed", "batch_crashed", StateType.CRASHED, str(path)),
            flow_run("run-3", "batch_crashed_too_often", StateType.CRASHED, str(path)),
            flow_run("run-failed", "batch_failed", StateType.FAILED, str(path)),
            flow_run("run-done", "batch_done", StateType.CRASHED, str(path)),
            flow_run("run-old", "batch_moved_on", StateType.CRASHED, str(path)),
            flow_run("run-cancelled", "batch_cancelled", StateType.CANCELLED, str(path)),
        ],
        {"batch_crashed_too_often": 3},
    )
    kept = FinishedLine(  # the failed run finished line 1 before it failed: it must reach the output file
        line=1,
        output=OutputLine(
            id="batch_req_kept",
            custom_id="a",
            response=ResponseEnvelope(status_code=200, request_id="kept", body={"usage": {"prompt_tokens": 5}}),
        ),
        ok=True,
        prompt_tokens=5,
        completion_tokens=2,
    )
    ResultParts("batch_failed", settings).write_part("run-failed", 1, [kept])
    reconciler = Reconciler(settings, runs, runs, store)

    acted = asyncio.run(reconciler.check())

    assert sorted(acted) == ["batch_cancelled", "batch_crashed", "batch_crashed_too_often", "batch_failed"]
    assert runs.resumed == [("batch_crashed", "run-batch/run-batch", "batch_crashed-run-2")]
    resumed = store.load("batch_crashed")
    assert resumed.status == "in_progress" and resumed.flow_run_id == "resumed-batch_crashed-run-2"
    for name in ("crashed_too_often", "failed"):
        ended = store.load(f"batch_{name}")
        assert ended.status == "failed" and ended.errors.data[0].code == "batch_run_failed"
    too_often = store.load("batch_crashed_too_often")
    errors = [json.loads(x)["error"]["code"] for x in Path(too_often.error_uri).read_text().splitlines()]
    assert errors == ["batch_run_failed"]
    failed = store.load("batch_failed")
    outputs = [json.loads(x)["id"] for x in Path(failed.output_uri).read_text().splitlines()]
    assert outputs == ["batch_req_kept"] and (failed.request_counts.completed, failed.request_counts.failed) == (1, 0)
    assert "3 runs ended without finishing a line; at most 3" in too_often.errors.data[0].message
    assert store.load("batch_moved_on").status == "in_progress"
    assert store.load("batch_cancelled").status == "cancelled"  # a cancel never leaves a batch `cancelling`
    assert asyncio.run(reconciler.check()) == []  # each ended flow run is acted on once


def test_a_run_whose_process_is_gone_is_marked_crashed_and_its_batch_resumed(tmp_path):
    """A killed drainer's process took its batch's subflow run along, still RUNNING: it is marked crashed and the
    batch resumed as a run of its own. Runs on other hosts are judged by heartbeats only once the loop has watched
    Prefect answer for longer than the heartbeats' window."""
    settings = Settings(data_dir=tmp_path, storage_uri=str(tmp_path / "store"), max_batch_runs=3)
    store = BatchStore(settings)
    batch = Batch(id="batch_orphan", input_file_id="in.jsonl", job_id="job-c0ffee01", model="pronk-tiny")
    batch.mark("in_progress")
    batch.flow_run_id = "subflow-run"
    store.save(batch)
    runs = FakeRuns([], {}, dead=[flow_run("subflow-run", "batch_orphan", StateType.RUNNING, "in.jsonl")])
    reconciler = Reconciler(settings, runs, runs, store)

    assert asyncio.run(reconciler.check()) == ["batch_orphan"]
    assert runs.dead == [] and runs.resumed == [("batch_orphan", "run-batch/run-batch", "batch_orphan-run-2")]
    assert store.load("batch_orphan").flow_run_id == "resumed-batch_orphan-run-2"
    assert runs.judged_remote == [False]  # its first check: it has not watched heartbeats long enough
    reconciler.watching_since = time.monotonic() - 3600
    asyncio.run(reconciler.check())
    assert runs.judged_remote == [False, True]


def test_a_crashed_run_that_finished_lines_does_not_count_against_the_batch_s_runs(tmp_path):
    """A restart that cuts a run short costs the batch nothing: only runs that persisted no line count."""
    settings = Settings(data_dir=tmp_path, storage_uri=str(tmp_path / "store"), max_batch_runs=2)
    store = BatchStore(settings)
    batch = Batch(id="batch_restarted", input_file_id="in.jsonl", job_id="job-c0ffee01", model="pronk-tiny")
    batch.mark("in_progress")
    batch.flow_run_id = "run-4"
    store.save(batch)
    kept = FinishedLine(line=1, output=error_line(1, "a", "x", "y"), ok=False)
    for run in ("1700000000000-aaaaaa", "1700000000001-bbbbbb", "1700000000002-cccccc"):
        ResultParts("batch_restarted", settings).write_part(run, 1, [kept])
    runs = FakeRuns([flow_run("run-4", "batch_restarted", StateType.CRASHED, "in.jsonl")], {"batch_restarted": 4})

    assert asyncio.run(Reconciler(settings, runs, runs, store).check()) == ["batch_restarted"]
    assert runs.resumed == [("batch_restarted", "run-batch/run-batch", "batch_restarted-run-5")]


def test_a_batch_queued_while_no_drainer_runs_says_why_and_the_note_goes_once_it_runs(tmp_path):
    settings = Settings(data_dir=tmp_path, storage_uri=str(tmp_path / "store"))
    store = BatchStore(settings)
    batch = Batch(id="batch_waiting", input_file_id="in.jsonl", job_id="job-c0ffee01", model="pronk-tiny")
    store.save(batch)
    queue = BatchQueue(settings)
    queue.put(batch, "in.jsonl")
    (entry,) = queue.waiting()
    queue.remove(entry)
    old = f"{time.time_ns() - int((QUEUE_NOTE_AFTER_S + 5) * 1e9):020d}-{batch.id}.json"
    storage.write_bytes(storage.join(queue.root, old), entry.run.model_dump_json().encode(), settings)
    waiting = SimpleNamespace(
        name="batch-queue-1",
        state_type=StateType.SCHEDULED,
        state=SimpleNamespace(name="AwaitingConcurrencySlot", timestamp=datetime.now(UTC)),
    )

    class Drainers(FakeRuns):
        async def drainers(self) -> list[SimpleNamespace]:
            return [waiting]

    runs = Drainers([], {})
    starts = SimpleNamespace(queue=queue, want_drainer=lambda: None)
    asyncio.run(Reconciler(settings, runs, runs, store, starts).check())  # type: ignore[arg-type]

    (note,) = store.load(batch.id).errors.data
    assert note.code == "batch_queue_waiting" and "batch-queue-1 has been AwaitingConcurrencySlot" in note.message
    noted = store.load(batch.id)
    noted.mark("in_progress")
    assert noted.errors is None
