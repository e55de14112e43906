"""The batch run's bookkeeping and its persisted parts, on a local store (no server)."""

from __future__ import annotations

import asyncio
import json

from pronk import storage
from pronk.agents.completions import failed_outcome
from pronk.agents.outcomes import Completion, RequestOutcome, Usage
from pronk.agents.step_records import StepRecord
from pronk.batches import run as batch_run
from pronk.batches.file_store import FileStore
from pronk.batches.input import validate_input
from pronk.batches.results import FinishedLine, ResultParts
from pronk.batches.run import BatchRun, end_batch, finish_run
from pronk.batches.schemas import Batch
from pronk.batches.store import BatchStore
from pronk.jobs.catalog import resolve_job
from pronk.protocol.lines import OutputLine
from pronk.settings import Settings, get_settings

JOB = "job-c0ffee01"


def read_lines(uri: str) -> list[str]:
    return storage.read_bytes(uri, get_settings()).decode().splitlines()


def input_file(tmp_path, lines: int) -> str:
    rows = [
        json.dumps(
            {
                "custom_id": f"r{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "pronk-tiny", "messages": [{"role": "user", "content": f"hi {i}"}]},
            }
        )
        for i in range(1, lines + 1)
    ]
    rows.insert(2, "not json")  # input line 3 is invalid: an error line, never run
    path = tmp_path / "input.jsonl"
    path.write_text("\n".join(rows) + "\n")
    return str(path)


def setup(tmp_path, lines: int = 5):
    settings = Settings(data_dir=tmp_path, storage_uri=str(tmp_path / "store"))
    store = BatchStore(settings)
    uri = input_file(tmp_path, lines)
    batch = Batch(input_file_id=uri, job_id=JOB, model="pronk-tiny", completion_window="unlimited")
    batch.output_uri = str(tmp_path / "out" / f"{batch.id}_output.jsonl")
    batch.error_uri = str(tmp_path / "out" / f"{batch.id}_error.jsonl")
    batch.mark("in_progress")
    store.save(batch)
    job = resolve_job(JOB, get_settings())
    validated = validate_input(storage.read_bytes(uri, get_settings()), job)
    return settings, store, batch, job, validated, uri


def done(request, tokens: int, worker: str = "w1") -> tuple[RequestOutcome, list[StepRecord]]:
    usage = Usage(prompt_tokens=tokens, cached_tokens=1, completion_tokens=2)
    completion = Completion(
        kind="chat",
        request_id=f"chatcmpl-{request.custom_id}",
        model="pronk-tiny",
        model_version="1",
        worker_id=worker,
        usage=usage,
        text="ok",
    )
    step = StepRecord(trace_id=request.custom_id, step=0, root_trace_id=request.custom_id, custom_id=request.custom_id)
    step.worker_id, step.prompt_tokens, step.output_tokens = worker, tokens, 2
    return RequestOutcome(request.line, request.custom_id, completion), [step]


def test_parts_keep_every_run_and_skip_rows_that_do_not_parse(tmp_path):
    settings = Settings(data_dir=tmp_path, storage_uri=str(tmp_path / "store"))
    parts = ResultParts("batch_x", settings)
    line = FinishedLine(line=2, output=OutputLine(custom_id="a"), ok=False)
    parts.write_part("run-a", 1, [line])
    parts.write_part("run-b", 1, [FinishedLine(line=5, output=OutputLine(custom_id="b"), ok=False)])
    storage.write_bytes(storage.join(parts.root, "run-b-000002.jsonl"), b'{"line": "x"}\n\n', get_settings())
    assert sorted(parts.load()) == [2, 5]
    parts.delete()
    assert parts.load() == {}


def test_a_resumed_run_runs_only_the_rest_and_counts_each_line_and_worker_second_once(tmp_path):
    settings, store, batch, job, validated, _ = setup(tmp_path)
    parts = ResultParts(batch.id, settings)
    first = BatchRun.resume(batch, job, validated, parts, "flow-1")
    assert [r.line for r in first.todo] == [1, 2, 4, 5, 6]
    for request in first.todo[:2]:
        first.record(*done(request, tokens=10))
    first.record(failed_outcome(first.todo[2], "step_failed", "boom"), [])
    first.flush()  # then the process dies: nothing more is written

    batch = store.load(batch.id)
    second = BatchRun.resume(batch, job, validated, parts, "flow-2")
    assert [r.line for r in second.todo] == [5, 6]
    counts = batch.request_counts
    assert (counts.total, counts.completed, counts.failed) == (6, 2, 2)  # line 3 invalid, line 4 failed
    assert batch.usage.input_tokens == 20 and batch.usage.output_tokens == 4
    for request in second.todo:
        second.record(*done(request, tokens=100, worker="w2"))
    finish_run(second, store, FileStore(settings))

    final = store.load(batch.id)
    assert final.status == "completed"
    assert (final.request_counts.completed, final.request_counts.failed) == (4, 2)
    assert final.usage.input_tokens == 220 and final.usage.total_tokens == 220 + 8
    assert final.worker_seconds >= sum(r.worker_seconds for r in parts.runs() if r.run == first.run_tag)
    outputs = [json.loads(x) for x in read_lines(final.output_uri)]
    errors = [json.loads(x) for x in read_lines(final.error_uri)]
    assert [o["custom_id"] for o in outputs] == ["r1", "r2", "r4", "r5"]  # input lines 1, 2, 5, 6
    assert [(e["error"]["line"], e["error"]["code"]) for e in errors] == [(3, "invalid_json"), (4, "step_failed")]
    steps = [json.loads(x) for x in read_lines(final.steps_uri)]
    assert sorted(s["custom_id"] for s in steps) == ["r1", "r2", "r4", "r5"]
    assert not storage.exists(parts.root, get_settings())


def test_a_batch_whose_run_is_gone_ends_failed_with_its_finished_lines(tmp_path):
    settings, _, batch, job, validated, uri = setup(tmp_path, lines=3)
    parts = ResultParts(batch.id, settings)
    run = BatchRun.resume(batch, job, validated, parts, "flow-1")
    run.record(*done(run.todo[0], tokens=7))
    run.flush()
    ended = end_batch(batch.id, job, "failed", "the flow run crashed 3 times", settings, uri)
    assert ended is not None and ended.status == "failed" and ended.failed_at
    assert ended.errors.data[0].code == "batch_run_failed" and "crashed" in ended.errors.data[0].message
    counts = ended.request_counts
    assert (counts.completed, counts.failed, counts.cancelled) == (1, 3, 0)  # a failed run's unstarted lines failed
    assert [json.loads(x)["custom_id"] for x in read_lines(ended.output_uri)] == ["r1"]
    errors = [json.loads(x)["error"] for x in read_lines(ended.error_uri)]
    assert [(e["line"], e["code"]) for e in errors] == [
        (2, "batch_run_failed"),
        (3, "invalid_json"),
        (4, "batch_run_failed"),
    ]
    assert end_batch(batch.id, job, "cancelled", "late", settings, uri).status == "failed"  # terminal stays terminal


def calls(request, *validity: tuple[bool, bool]) -> list[StepRecord]:
    """A line's step attempts whose outputs were meant as tool calls, each (parsed, valid)."""
    return [
        StepRecord(
            trace_id=request.custom_id,
            step=0,
            attempt=attempt,
            root_trace_id=request.custom_id,
            custom_id=request.custom_id,
            tool_call_parsed=parsed,
            tool_call_valid=valid,
        )
        for attempt, (parsed, valid) in enumerate(validity)
    ]


def test_the_batch_counts_tool_calls_of_every_line_and_a_resumed_run_counts_them_once(tmp_path):
    settings, store, batch, job, validated, _ = setup(tmp_path)
    parts = ResultParts(batch.id, settings)
    first = BatchRun.resume(batch, job, validated, parts, "flow-1")
    outcome, steps = done(first.todo[0], tokens=10)
    first.record(outcome, steps + calls(first.todo[0], (True, True), (True, False)))
    failed = first.todo[1]  # its call never parsed: the line failed, its attempts still count
    first.record(failed_outcome(failed, "step_failed", "boom"), calls(failed, (False, False), (False, False)))
    assert batch.model_dump()["tool_calls"] == {"total": 4, "parsed": 2, "valid": 1, "validity": 0.25}
    summary = {row["figure"]: row["value"] for row in first.summary_table()}
    assert (summary["tool calls"], summary["tool calls parsed"], summary["tool calls valid"]) == (4, 2, 1)
    assert summary["tool call validity"] == 0.25
    first.flush()

    second = BatchRun.resume(store.load(batch.id), job, validated, parts, "flow-2")
    assert second.batch.tool_calls == batch.tool_calls
    for request in second.todo:
        second.record(*done(request, tokens=1))
    finish_run(second, store, FileStore(settings))
    final = store.load(batch.id)
    assert (final.tool_calls.total, final.tool_calls.valid, final.tool_calls.validity) == (4, 1, 0.25)
    steps = [json.loads(x) for x in read_lines(final.steps_uri)]
    assert sum(1 for s in steps if s["tool_call_valid"]) == 1


def test_a_batch_without_tool_calls_has_no_validity():
    batch = Batch(input_file_id="file-x", job_id=JOB, model="pronk-tiny")
    assert batch.tool_calls.validity is None
    assert Batch.model_validate_json(batch.model_dump_json()).tool_calls == batch.tool_calls


class FleetThatRestarts:
    """A harness whose fleet is down until the router has looked for a live worker `down` times: until then each
    line finds no worker (`engine_unavailable`)."""

    def __init__(self, down: int):
        self.down = down
        self.looks = 0
        self.tries: dict[str, int] = {}
        self.recorder = self
        self.router = self

    def workers(self) -> list[str]:
        self.looks += 1
        return ["w1"] if self.looks > self.down else []

    def take_line(self, custom_id: str) -> list:
        return []

    async def run_line(self, request) -> RequestOutcome:
        self.tries[request.custom_id] = self.tries.get(request.custom_id, 0) + 1
        if self.looks <= self.down:
            return failed_outcome(request, "engine_unavailable", "no live worker for job job-c0ffee01")
        return done(request, 10)[0]


def test_a_line_that_found_no_worker_runs_again_once_the_fleet_is_back(tmp_path, monkeypatch):
    """A fleet restart costs a line nothing: it runs again once a worker is live, up to `OUTAGE_RERUNS` times; a line
    that takes the fleet down more often than that fails as before."""
    monkeypatch.setattr(batch_run, "OUTAGE_FIRST_WAIT_S", 0.01)
    _, _, batch, job, validated, _ = setup(tmp_path, lines=3)
    run = BatchRun(batch, job, validated.requests, validated.errors)
    harness = FleetThatRestarts(down=5)
    asyncio.run(run.run_lines(harness, 0, len(run.todo)))  # type: ignore[arg-type]
    assert [f.ok for f in run.finished.values()] == [True] * 3
    assert min(harness.tries.values()) >= 2  # each ran again once the fleet was back

    (tmp_path / "again").mkdir()
    _, _, batch, job, validated, _ = setup(tmp_path / "again", lines=1)
    run = BatchRun(batch, job, validated.requests, validated.errors)
    always_down = FleetThatRestarts(down=10**9)
    always_down.workers = lambda: ["w1"]  # type: ignore[method-assign]  # workers announce, yet every step fails
    asyncio.run(run.run_lines(always_down, 0, len(run.todo)))  # type: ignore[arg-type]
    (failed,) = run.finished.values()
    assert not failed.ok and always_down.tries == {"r1": 1 + batch_run.OUTAGE_RERUNS}


def test_a_line_waiting_for_the_fleet_stops_when_the_batch_is_cancelled(tmp_path, monkeypatch):
    monkeypatch.setattr(batch_run, "OUTAGE_FIRST_WAIT_S", 0.01)
    _, _, batch, job, validated, _ = setup(tmp_path, lines=1)
    run = BatchRun(batch, job, validated.requests, validated.errors)
    harness = FleetThatRestarts(down=10**9)

    async def cancel_soon() -> None:
        await asyncio.sleep(0.1)
        run.stop_reason = "cancelled"

    async def both() -> None:
        await asyncio.gather(run.run_lines(harness, 0, 1), cancel_soon())  # type: ignore[arg-type]

    asyncio.run(both())
    (failed,) = run.finished.values()
    assert not failed.ok and harness.tries == {"r1": 1}
