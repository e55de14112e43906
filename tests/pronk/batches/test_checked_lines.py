"""Lines whose answer is checked: the check is validated with the line, its result lands on the output line, the
batch counts passed / failed / unchecked, and tasks per dollar counts passed lines once any line was checked."""

from __future__ import annotations

import asyncio
import json

from pronk.agents.outcomes import Completion, LineFailure, RequestOutcome, Usage
from pronk.batches.input import validate_input
from pronk.batches.results import FinishedLine
from pronk.batches.run import BatchRun
from pronk.batches.schemas import Batch
from pronk.jobs.catalog import resolve_job
from pronk.protocol.error_codes import ErrorCode
from pronk.settings import get_settings

JOB = "job-c0ffee01"


def line(custom_id: str, check: object = None, url: str = "/v1/chat/completions") -> str:
    body: dict = {"model": "pronk-tiny", "messages": [{"role": "user", "content": "2+2?"}]}
    if url != "/v1/chat/completions":
        shape = {
            "trace_id": custom_id,
            "system_prompt_tokens": 8,
            "steps": [{"new_prompt_tokens": 4, "output_tokens": 2}],
        }
        body = {"model": "pronk-tiny", "shape": shape}
    raw: dict = {"custom_id": custom_id, "method": "POST", "url": url, "body": body}
    if check is not None:
        raw["check"] = check
    return json.dumps(raw)


def test_a_check_is_validated_with_its_line():
    data = "\n".join(
        [
            line("exact", {"type": "exact", "expected": "4"}),
            line("plain"),
            line("bad-regex", {"type": "regex", "pattern": "(unclosed"}),
            line("unknown", {"type": "telepathy"}),
            line("replay", {"type": "exact", "expected": "4"}, url="/v1/pronk/replay"),
        ]
    ).encode()
    validated = validate_input(data, resolve_job(JOB, get_settings()))
    assert [(r.custom_id, r.check is not None) for r in validated.requests] == [("exact", True), ("plain", False)]
    errors = {e.custom_id: e.error for e in validated.errors}
    assert {e.code for e in errors.values()} == {ErrorCode.INVALID_CHECK}
    assert "not a valid regular expression" in errors["bad-regex"].message
    assert "no answer to check" in errors["replay"].message


class AnsweringHarness:
    """Answers each line with a fixed text (or fails it), as the real harness's outcome would carry it."""

    def __init__(self, answers: dict[str, str | None]):
        self.answers = answers
        self.recorder = self

    def take_line(self, custom_id: str) -> list:
        return []

    async def run_line(self, request) -> RequestOutcome:
        text = self.answers[request.custom_id]
        if text is None:
            return RequestOutcome(request.line, request.custom_id, LineFailure(ErrorCode.STEP_FAILED, "boom"))
        usage = Usage(prompt_tokens=10, cached_tokens=0, completion_tokens=2)
        completion = Completion("chat", "req-1", "pronk-tiny", "pronk-tiny/1", "w0", usage, text=text)
        return RequestOutcome(request.line, request.custom_id, completion)


def test_the_batch_counts_checks_and_tasks_per_dollar_counts_passed_lines():
    data = "\n".join(
        [
            line("right", {"type": "number", "expected": 4}),
            line("wrong", {"type": "exact", "expected": "four"}),
            line("no-answer", {"type": "regex", "pattern": "4"}),
            line("plain"),
            "not json",
        ]
    ).encode()
    job = resolve_job(JOB, get_settings())
    validated = validate_input(data, job)
    batch = Batch(input_file_id="file-x", job_id=job.job_id, model="pronk-tiny", price_per_worker_hour=1.0)
    run = BatchRun(batch, job, validated.requests, validated.errors)
    harness = AnsweringHarness({"right": "It is 4.", "wrong": "4", "no-answer": None, "plain": "4"})
    asyncio.run(run.run_lines(harness, 0, len(run.todo)))  # type: ignore[arg-type]
    run.account()

    assert batch.checks.model_dump() == {"passed": 1, "failed": 2, "unchecked": 2}
    assert batch.success_rate == 1 / 3 and batch.tasks_counted == "passed"
    assert batch.tasks_per_dollar == 1 / batch.processing_cost
    outputs, _ = run.result_lines()
    checks = {o.custom_id: o.response.body["pronk"]["check"] for o in outputs if o.response}
    assert checks["right"] == {"status": "passed", "reason": ""}
    assert checks["wrong"]["status"] == "failed" and "expected 'four'" in checks["wrong"]["reason"]
    assert checks["plain"] == {"status": "unchecked", "reason": ""}
    rows = {f.output.custom_id: f.row["check"] for f in run.finished.values()}  # the per-trace table's column
    assert rows == {"right": "passed", "wrong": "failed", "no-answer": "failed", "plain": "unchecked"}

    # A resumed run counts the same from what was persisted.
    persisted = {f.line: FinishedLine.model_validate_json(f.model_dump_json()) for f in run.finished.values()}
    again = BatchRun(batch.model_copy(deep=True), job, validated.requests, validated.errors, finished=persisted)
    assert again.batch.checks == batch.checks


def test_a_batch_with_no_checks_counts_completed_lines():
    job = resolve_job(JOB, get_settings())
    validated = validate_input(line("plain").encode(), job)
    batch = Batch(input_file_id="file-x", job_id=job.job_id, model="pronk-tiny", price_per_worker_hour=1.0)
    run = BatchRun(batch, job, validated.requests)
    asyncio.run(run.run_lines(AnsweringHarness({"plain": "4"}), 0, 1))  # type: ignore[arg-type]
    run.account()
    assert batch.tasks_counted == "completed" and batch.success_rate is None
    assert batch.tasks_per_dollar == 1 / batch.processing_cost
