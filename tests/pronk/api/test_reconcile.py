"""The API's reconcile check on a local store, with a double for Prefect's flow runs (no server)."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
from pathlib import Path
from types import SimpleNamespace

from prefect.client.schemas.objects import StateType

from pronk import storage
from pronk.api.reconcile import Reconciler
from pronk.batches.results import FinishedLine, ResultParts
from pronk.batches.schemas import Batch
from pronk.batches.store import BatchStore
from pronk.control import flow_runs
from pronk.enrich import open_run
from pronk.enrich.open_run import OpenRun
from pronk.protocol.lines import OutputLine, ResponseEnvelope
from pronk.settings import Settings


class FakeRuns:
    def __init__(self, ended: list[SimpleNamespace], counts: dict[str, int], orphans: list[SimpleNamespace] = []):  # noqa: B006
        self._ended = ended
        self.counts = counts
        self.orphans = orphans
        self.resumed: list[tuple[str, dict, int]] = []

    async def orphaned(self) -> list[SimpleNamespace]:
        return self.orphans

    async def crash(self, flow_run_id: str, message: str) -> bool:
        """As Prefect does: the marked subflow run is now among the ended runs, crashed."""
        (orphan,) = [o for o in self.orphans if o.id == flow_run_id]
        self.orphans.remove(orphan)
        self._ended.append(SimpleNamespace(**{**vars(orphan), "state_type": StateType.CRASHED}))
        return True

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
    assert "run 3 of at most 3" in store.load("batch_crashed_too_often").errors.data[0].message
    assert store.load("batch_moved_on").status == "in_progress"
    assert store.load("batch_cancelled").status == "cancelled"  # a cancel never leaves a batch `cancelling`
    assert asyncio.run(reconciler.check()) == []  # each ended flow run is acted on once


def test_the_subflow_runs_of_a_crashed_drainer_are_marked_crashed_and_resumed(tmp_path):
    """A killed drainer's process took its batch's subflow run along, still RUNNING: it is marked crashed and the
    batch resumed as a run of its own."""
    settings = Settings(data_dir=tmp_path, storage_uri=str(tmp_path / "store"), max_batch_runs=3)
    store = BatchStore(settings)
    batch = Batch(id="batch_orphan", input_file_id="in.jsonl", job_id="job-c0ffee01", model="pronk-tiny")
    batch.mark("in_progress")
    batch.flow_run_id = "subflow-run"
    store.save(batch)
    runs = FakeRuns([], {}, orphans=[flow_run("subflow-run", "batch_orphan", StateType.RUNNING, "in.jsonl")])
    reconciler = Reconciler(settings, runs, runs, store)

    assert asyncio.run(reconciler.check()) == ["batch_orphan"]
    assert runs.orphans == [] and runs.resumed == [("batch_orphan", "run-batch/run-batch", "batch_orphan-run-2")]
    assert store.load("batch_orphan").flow_run_id == "resumed-batch_orphan-run-2"


def test_a_dead_enrichment_run_is_marked_crashed_while_the_batch_check_keeps_failing(tmp_path, monkeypatch):
    """The loop's two checks stand apart: a batch check that fails every time (a record that does not load, say) must
    not leave a SIGKILLed enrichment's flow run Running for good."""
    settings = Settings(data_dir=tmp_path, storage_uri=str(tmp_path / "store"), reconcile_interval_s=0.01)
    dead = subprocess.Popen(["true"])
    dead.wait()
    results = storage.join(settings.store_uri, "enrichments", "killed")
    marker = OpenRun(
        run_id="run-1",
        spec="killed",
        batch_id="batch_dead",
        lines_uri=storage.join(results, "inputs", "run-1.jsonl"),
        lines_sha256="0" * 64,
        flow_run_id="flow-run-of-the-killed-run",
        host=socket.gethostname(),
        pid=dead.pid,
        started_at="2026-01-01T00:00:00+00:00",
    )
    storage.write_bytes(open_run.marker_uri(results), marker.model_dump_json().encode(), settings)
    crashed: list[str] = []
    marked = asyncio.Event()

    async def state_of(flow_run_id: str) -> str:
        return "CRASHED" if flow_run_id in crashed else "RUNNING"

    async def mark_crashed(flow_run_id: str, message: str) -> bool:
        crashed.append(flow_run_id)
        marked.set()
        return True

    monkeypatch.setattr(flow_runs, "flow_run_state", state_of)
    monkeypatch.setattr(flow_runs, "mark_crashed", mark_crashed)

    class FailingRuns(FakeRuns):
        async def ended(self) -> list[SimpleNamespace]:
            raise ValueError("a batch record that does not load")

    async def until_marked() -> None:
        runs = FailingRuns([], {})
        loop = asyncio.create_task(Reconciler(settings, runs, runs, BatchStore(settings)).loop())
        await marked.wait()
        loop.cancel()

    asyncio.run(asyncio.wait_for(until_marked(), 10))
    assert crashed == ["flow-run-of-the-killed-run"]
