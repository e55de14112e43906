"""The bookkeeping of one run of a batch: counts, usage, cost, stop checks, persisted results and the final files.

Prefect-free, so the flow stays a recipe and all of this is unit-tested without a server. A run
starts from what earlier runs of the same batch persisted (`ResultParts`): those lines never run
again, and `request_counts` and `usage` are recomputed from the persisted lines, never added twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Literal

from pronk import storage
from pronk.agents.checks import run_check
from pronk.agents.harness import Harness
from pronk.agents.outcomes import Completion, LineFailure, RequestOutcome
from pronk.agents.step_records import StepRecord, ToolCallCounts, record_order, steps_ndjson
from pronk.agents.tools.python_exec import PythonTool
from pronk.batches.file_store import FileStore
from pronk.batches.in_flight import InFlight, LineLoad
from pronk.batches.input import BatchInputError, InputLimits, ValidatedInput, validate_input
from pronk.batches.outputs import output_line, trace_row
from pronk.batches.results import FinishedLine, ResultParts, RunRecord, jsonl, new_run_tag
from pronk.batches.schemas import TERMINAL_STATUSES, Batch, BatchErrorData, BatchErrors, BatchUsage, CheckCounts
from pronk.batches.store import BatchStore
from pronk.engine.registry import WorkerEntry
from pronk.jobs.schema import JobConfig
from pronk.pronk_error import PronkError
from pronk.protocol.checks import CheckResult
from pronk.protocol.error_codes import ErrorCode
from pronk.protocol.ids import new_id
from pronk.protocol.lines import OutputLine, ValidRequest, error_line
from pronk.settings import Settings

logger = logging.getLogger(__name__)

StopReason = Literal["cancelled", "expired", "failed"]


class BatchFailed(PronkError, RuntimeError):
    """The batch ended `failed` (its input could not be used); its record says why."""


# Cancellation and expiry are cooperative: the run stops starting requests, lets those in flight
# finish, and writes one error line per request it never started. `failed`: the run ended without
# finishing them (its process died too often, or it raised), so its partial results are written.
STOP_ERRORS: dict[StopReason, tuple[str, str]] = {
    "cancelled": (ErrorCode.CANCELLED, "the batch was cancelled before this request started"),
    "expired": (ErrorCode.EXPIRED, "the batch's completion window ended before this request started"),
    "failed": (ErrorCode.RUN_FAILED, "the batch's run ended before this request finished"),
}


OUTAGE_RERUNS = 5
"""How many times a line that found no worker to run it (`engine_unavailable`) runs again once one is back. A fleet
that restarts (an operator's `pronk stack down`/`up`, a host rebooting) costs a line nothing within its batch's
window; a line whose steps take down every worker they reach fails after this many tries."""
OUTAGE_FIRST_WAIT_S, OUTAGE_MAX_WAIT_S = 1.0, 15.0
"""The first wait for a worker to come back, and the most between two looks (the wait doubles)."""


def fleet_outage(outcome: RequestOutcome) -> bool:
    """The line failed because no worker could run its steps: the fleet's fault, not the line's."""
    failure = outcome.result
    return isinstance(failure, LineFailure) and failure.code == ErrorCode.ENGINE_UNAVAILABLE


def finished_line(
    outcome: RequestOutcome, steps: list[StepRecord], row: dict | None = None, checked: CheckResult | None = None
) -> FinishedLine:
    """The one place that reads a `RequestOutcome`: what of it is persisted and counted.

    An output line carries its check's result as `response.body.pronk.check` (`{"status", "reason"}`).
    """
    rows = [asdict(s) for s in steps]
    checked = checked or CheckResult(status="unchecked")
    row = {**(row or {}), "check": checked.status}
    completion = outcome.completion
    output = output_line(outcome)
    calls = ToolCallCounts.of(steps)
    if completion is None:
        return FinishedLine(
            line=outcome.line, output=output, ok=False, check=checked.status, tool_calls=calls, steps=rows, row=row
        )
    assert output.response is not None
    output.response.body.setdefault("pronk", {})["check"] = checked.model_dump()
    usage = completion.usage
    return FinishedLine(
        line=outcome.line,
        output=output,
        ok=True,
        prompt_tokens=usage.prompt_tokens,
        cached_tokens=usage.cached_tokens,
        completion_tokens=usage.completion_tokens,
        worker_id=completion.worker_id or None,
        check=checked.status,
        tool_calls=calls,
        steps=rows,
        row=row,
    )


def _input_line(line: OutputLine) -> int:
    return (line.error.line or 0) if line.error is not None else 0


def steps_uri(batch: Batch) -> str:
    return (batch.output_uri or "").removesuffix("_output.jsonl") + "_steps.jsonl"


class BatchRun:
    """Live state of one run: shared by its chunk tasks, saved to the store about once a second."""

    def __init__(
        self,
        batch: Batch,
        job: JobConfig,
        requests: list[ValidRequest],
        invalid: list[OutputLine] | None = None,
        parts: ResultParts | None = None,
        finished: dict[int, FinishedLine] | None = None,
        prior_worker_seconds: float = 0.0,
        in_flight_start: LineLoad | None = None,
    ):
        self.batch = batch
        self.job = job
        self.requests = requests
        self.invalid = invalid or []
        self.parts = parts
        self.finished: dict[int, FinishedLine] = dict(finished or {})
        self.todo = [r for r in requests if r.line not in self.finished]
        """The requests no earlier run finished: the only ones this run starts."""
        self.run_tag = new_run_tag()
        self.in_flight = InFlight(job, in_flight_start)
        """How many lines run at once: the job's `max_concurrency`, or the adaptive target (`in_flight_start`: the
        Herd's measure of the job's earlier runs, for it to start from)."""
        self.pending: list[FinishedLine] = []
        self.parts_written = 0
        self.workers_seen: set[str] = set()
        self.stop_reason: StopReason | None = None
        self.unstarted: list[ValidRequest] = []
        self.prior_worker_seconds = prior_worker_seconds
        self.started = time.monotonic()
        self.predicates = any(r.check is not None and r.check.type == "python" for r in requests)
        """Whether any line's check is a Python predicate, run in the python tool's sandbox with the job's limits."""
        self.recount()

    @classmethod
    def resume(
        cls,
        batch: Batch,
        job: JobConfig,
        validated: ValidatedInput,
        parts: ResultParts,
        flow_run_id: str | None,
        in_flight_start: LineLoad | None = None,
    ) -> BatchRun:
        """A run that starts from everything earlier runs of this batch persisted, and registers itself."""
        prior = sum(r.worker_seconds for r in parts.runs())
        run = cls(batch, job, validated.requests, validated.errors, parts, parts.load(), prior, in_flight_start)
        batch.request_counts.total = validated.total
        parts.save_run(RunRecord(run=run.run_tag, flow_run_id=flow_run_id))
        return run

    def recount(self) -> None:
        """`request_counts` and `usage` from the finished lines: exact however many runs the batch took."""
        counts = self.batch.request_counts
        done = list(self.finished.values())
        counts.completed = sum(1 for f in done if f.ok)
        unstarted = len(self.unstarted) if self.stop_reason is not None else 0
        counts.cancelled = unstarted if self.stop_reason in ("cancelled", "expired") else 0
        counts.failed = len(self.invalid) + len(done) - counts.completed + unstarted - counts.cancelled
        usage = BatchUsage()
        for f in done:
            if f.ok:
                usage.add(f.prompt_tokens, f.cached_tokens, f.completion_tokens)
        self.batch.usage = usage
        calls = ToolCallCounts()
        for f in done:
            calls.add(f.tool_calls)
        self.batch.tool_calls = calls
        self.batch.checks = CheckCounts(
            passed=sum(1 for f in done if f.check == "passed"),
            failed=sum(1 for f in done if f.check == "failed"),
            unchecked=sum(1 for f in done if f.check == "unchecked") + len(self.invalid) + unstarted,
        )

    def chunks(self, size: int) -> list[tuple[int, int]]:
        """`[start, stop)` ranges of `todo` of at most `size` requests: one Prefect task run each."""
        return [(start, min(start + size, len(self.todo))) for start in range(0, len(self.todo), size)]

    async def run_lines(self, harness: Harness, start: int, stop: int) -> None:
        """Run `todo[start:stop]` concurrently within the run's lines in flight (`in_flight`), recording each line as
        it ends; once the run is told to stop, the lines not yet started are left unstarted."""

        def live_workers() -> list[WorkerEntry]:
            return harness.router.workers()

        python = PythonTool(self.job.tools.python, harness.sandbox_bwrap) if self.predicates else None

        async def one(request: ValidRequest) -> None:
            async with self.in_flight.slots:
                if self.stop_reason is not None:
                    self.unstarted.append(request)
                    return
                outcome = await harness.run_line(request)
                steps = harness.recorder.take_line(request.custom_id)
                for _ in range(OUTAGE_RERUNS):
                    if not fleet_outage(outcome) or not await self.fleet_back(live_workers):
                        break
                    outcome = await harness.run_line(request)
                    steps = harness.recorder.take_line(request.custom_id)
                self.in_flight.observe(steps, live_workers)
                self.batch.in_flight = list(self.in_flight.points)
                answer = outcome.result.text if isinstance(outcome.result, Completion) else None
                checked = await run_check(request.check, answer, python)
                self.record(outcome, steps, checked)

        self.in_flight.retarget(live_workers)
        self.batch.in_flight = list(self.in_flight.points)
        await asyncio.gather(*(one(r) for r in self.todo[start:stop]))

    async def fleet_back(self, live_workers: Callable[[], list[WorkerEntry]]) -> bool:
        """Wait, backing off, until a worker of the job is live again; False when the run is told to stop or the
        batch's window ends first."""
        delay = OUTAGE_FIRST_WAIT_S
        while self.stop_reason is None and (self.batch.expires_at is None or time.time() < self.batch.expires_at):
            if live_workers():
                return True
            await asyncio.sleep(delay)
            delay = min(delay * 2, OUTAGE_MAX_WAIT_S)
        return False

    def record(self, outcome: RequestOutcome, steps: list[StepRecord], checked: CheckResult | None = None) -> None:
        """A line finished: counted now, persisted with its step records and table row at the next flush."""
        line = finished_line(outcome, steps, trace_row(outcome), checked)
        self.finished[line.line] = line
        self.pending.append(line)
        checks = self.batch.checks
        setattr(checks, line.check, getattr(checks, line.check) + 1)
        self.batch.tool_calls.add(line.tool_calls)
        counts = self.batch.request_counts
        if not line.ok:
            counts.failed += 1
            return
        counts.completed += 1
        if line.worker_id:
            self.workers_seen.add(line.worker_id)
        self.batch.usage.add(line.prompt_tokens, line.cached_tokens, line.completion_tokens)

    @property
    def done(self) -> int:
        return self.batch.request_counts.completed + self.batch.request_counts.failed

    def take_pending(self) -> tuple[int, list[FinishedLine]]:
        """Hand over the lines finished since the last call, with their part number (call on the event loop)."""
        lines, self.pending = self.pending, []
        if lines:
            self.parts_written += 1
        return self.parts_written, lines

    def persist(self, seq: int, lines: list[FinishedLine]) -> None:
        """Write one part (when there are lines) and this run's worker time so far."""
        if self.parts is None:
            return
        if lines:
            self.parts.write_part(self.run_tag, seq, lines)
        self.parts.save_run(RunRecord(run=self.run_tag, worker_seconds=self.run_worker_seconds()))

    def flush(self) -> None:
        self.persist(*self.take_pending())

    def run_worker_seconds(self) -> float:
        return max(len(self.workers_seen), 1) * (time.monotonic() - self.started)

    def check_stop(self, store: BatchStore) -> None:
        """Stop when the API asked to cancel (the batch shows `cancelling`) or the completion window is over."""
        batch = self.batch
        if self.stop_reason is not None:
            return
        if store.cancel_requested(batch.id):
            self.stop_reason = "cancelled"
            batch.mark("cancelling")
        elif batch.expires_at is not None and time.time() >= batch.expires_at:
            self.stop_reason = "expired"

    def unstarted_lines(self) -> list[OutputLine]:
        """One error line per request the stopped run never started; they count as cancelled when the batch was
        cancelled or expired, as failed when its run failed."""
        if self.stop_reason is None:
            return []
        code, reason = STOP_ERRORS[self.stop_reason]
        self.recount()
        return [error_line(r.line, r.custom_id, code, reason) for r in self.unstarted]

    def final_status(self) -> Literal["completed", "cancelled", "expired", "failed"]:
        """`expired` only when the window cut requests off; a cancel request always ends `cancelled`."""
        if self.stop_reason == "expired" and not self.unstarted:
            return "completed"
        return self.stop_reason or "completed"

    def account(self, ran: bool = True) -> None:
        """Worker time of every run of the batch, each counted once; cost and tasks per dollar from it."""
        batch = self.batch
        batch.worker_seconds = self.prior_worker_seconds + (self.run_worker_seconds() if ran else 0.0)
        batch.processing_cost = batch.worker_seconds / 3600.0 * self.job.worker_hour_price
        checks = batch.checks
        batch.success_rate = checks.success_rate
        batch.tasks_counted = "passed" if checks.checked else "completed"
        tasks = checks.passed if checks.checked else batch.request_counts.completed
        batch.tasks_per_dollar = tasks / batch.processing_cost if batch.processing_cost > 0 else None

    def result_lines(self) -> tuple[list[OutputLine], list[OutputLine]]:
        """Output and error lines sorted by input line: exactly one per input line of a finished batch."""
        finished = sorted(self.finished.values(), key=lambda f: f.line)
        outputs = [f.output for f in finished if f.ok]
        failures = [f.output for f in finished if not f.ok]
        errors = sorted(self.invalid + failures + self.unstarted_lines(), key=_input_line)
        return outputs, errors

    def step_records(self) -> list[StepRecord]:
        rows = [StepRecord(**row) for f in self.finished.values() for row in f.steps]
        return sorted(rows, key=record_order)

    def write_results(self, files: FileStore) -> None:
        """The output, error and step files, assembled from every run's finished lines; Files for the API."""
        batch = self.batch
        assert batch.output_uri is not None and batch.error_uri is not None
        outputs, errors = self.result_lines()
        settings = files.settings
        storage.write_bytes(batch.output_uri, jsonl(outputs), settings)
        storage.write_bytes(batch.error_uri, jsonl(errors), settings)
        batch.steps_uri = steps_uri(batch)
        storage.write_bytes(batch.steps_uri, steps_ndjson(self.step_records()), settings)
        files.attach_results(batch)

    def summary_table(self) -> list[dict[str, object]]:
        batch = self.batch
        usage = batch.usage
        rows = {
            "status": batch.status,
            "requests total": batch.request_counts.total,
            "requests completed": batch.request_counts.completed,
            "requests failed": batch.request_counts.failed,
            "requests cancelled": batch.request_counts.cancelled,
            "prompt tokens": usage.input_tokens,
            "cached prompt tokens": usage.input_tokens_details.cached_tokens,
            "completion tokens": usage.output_tokens,
            "worker seconds": round(batch.worker_seconds, 3),
            "processing cost (USD)": round(batch.processing_cost, 8),
            "tasks per dollar": batch.tasks_per_dollar,
            "tasks counted": batch.tasks_counted,
            "checks passed": batch.checks.passed,
            "checks failed": batch.checks.failed,
            "lines unchecked": batch.checks.unchecked,
            "success rate": batch.success_rate,
            "tool calls": batch.tool_calls.total,
            "tool calls parsed": batch.tool_calls.parsed,
            "tool calls valid": batch.tool_calls.valid,
            "tool call validity": batch.tool_calls.validity,
            "concurrency": self.job.scheduling.concurrency,
            "lines in flight (last target)": self.in_flight.target,
            "lines in flight (most)": max(p.target for p in self.in_flight.points),
        }
        return [{"figure": k, "value": v} for k, v in rows.items()]


def default_result_uris(batch: Batch, settings: Settings, output_dir: str | None = None) -> None:
    """Where the output and error files go (kept when an earlier run already chose)."""
    base = output_dir or storage.join(settings.store_uri, "outputs", batch.id)
    batch.output_uri = batch.output_uri or storage.join(base, f"{batch.id}_output.jsonl")
    batch.error_uri = batch.error_uri or storage.join(base, f"{batch.id}_error.jsonl")


def input_uri_of(batch: Batch, files: FileStore) -> str:
    """An API batch names an uploaded File; a command-line batch names its input's URI."""
    record = files.get(batch.input_file_id) if batch.input_file_id.startswith("file_") else None
    return record.uri if record is not None else batch.input_file_id


def end_batch(
    batch_id: str,
    job: JobConfig,
    status: Literal["failed", "cancelled"],
    message: str,
    settings: Settings,
    input_uri: str | None = None,
    limits: InputLimits | None = None,
) -> Batch | None:
    """End a batch whose run is gone: its persisted lines in the output/error files, the rest as error lines.
    `job` is the batch's job, resolved by the caller.

    Called by the flow's failure and cancellation hooks (with the run's own `limits`) and by the
    API's reconcile loop, which validates without the job's tokenizer: there, a line whose prompt
    only the tokenizer would find too long ends `batch_run_failed` instead. A batch already
    terminal (or unknown) is left alone.
    """
    store = BatchStore(settings)
    try:
        batch = store.load(batch_id)
    except FileNotFoundError:
        return None
    if batch.status in TERMINAL_STATUSES:
        return batch
    files = FileStore(settings)
    try:
        data = storage.read_bytes(input_uri or input_uri_of(batch, files), settings)
        validated = validate_input(data, job, limits or InputLimits(max_line_bytes=settings.max_line_bytes))
    except (OSError, ValueError, BatchInputError) as exc:
        logger.warning("batch %s: cannot read its input again (%s); ending it with what was persisted", batch_id, exc)
        validated = ValidatedInput([], [], batch.request_counts.total)
    parts = ResultParts(batch.id, settings)
    run = BatchRun(
        batch,
        job,
        validated.requests,
        validated.errors,
        parts,
        parts.load(),
        sum(r.worker_seconds for r in parts.runs()),
    )
    run.stop_reason = "cancelled" if status == "cancelled" else "failed"
    run.unstarted = list(run.todo)
    run.recount()
    run.account(ran=False)
    default_result_uris(batch, settings)
    if status == "failed":
        batch.errors = BatchErrors(data=[BatchErrorData(code=ErrorCode.RUN_FAILED, message=message)])
    run.write_results(files)
    batch.mark(status)
    store.save(batch)
    parts.delete()
    logger.warning("batch %s ended %s: %s", batch_id, status, message)
    return batch


def open_batch(
    store: BatchStore,
    settings: Settings,
    job: JobConfig,
    input_uri: str,
    batch_id: str | None,
    flow_run_id: str | None,
    output_dir: str | None = None,
    completion_window: Literal["24h", "unlimited"] = "24h",
    metadata: dict[str, str] | None = None,
) -> Batch:
    """The batch's record: the one the API (or an earlier run) saved, else a new one; now owned by this flow run."""
    if batch_id and store.exists(batch_id):
        batch = store.load(batch_id)
    else:
        batch = Batch(
            id=batch_id or new_id("batch"),
            input_file_id=input_uri,
            job_id=job.job_id,
            model=job.served_model_name,
            completion_window=completion_window,
            metadata=metadata,
        )
    if batch.status in TERMINAL_STATUSES:
        return batch
    batch.price_per_worker_hour = job.worker_hour_price
    batch.flow_run_id = flow_run_id
    default_result_uris(batch, settings, output_dir)
    store.save(batch)
    return batch


def reject_input(batch: Batch, store: BatchStore, exc: Exception) -> None:
    """The input file as a whole is unusable (or reading it broke): the batch fails with the reason."""
    message = str(exc) if isinstance(exc, BatchInputError) else f"cannot validate the input: {type(exc).__name__}"
    batch.errors = BatchErrors(data=[BatchErrorData(code="invalid_input_file", message=message, param="input_file_id")])
    batch.mark("failed")
    store.save(batch)


def finish_run(run: BatchRun, store: BatchStore, files: FileStore) -> None:
    """After the last chunk: account, write the final files from every run's lines, end the record, drop the parts."""
    batch = run.batch
    run.check_stop(store)
    run.flush()
    run.account()
    if run.stop_reason != "cancelled":
        batch.mark("finalizing")
    store.save(batch)
    run.write_results(files)
    batch.mark(run.final_status())
    store.save(batch)
    if run.parts is not None:
        run.parts.delete()
