"""OpenAI's Batch and File objects, with pronk's job addressing and cost (the lines themselves: `pronk.protocol`)."""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, Field

from pronk.agents.step_records import ToolCallCounts
from pronk.protocol.bodies import CHAT_COMPLETIONS_URL
from pronk.protocol.error_codes import ErrorCode
from pronk.protocol.ids import new_id

BatchStatus = Literal[
    "validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled"
]
TERMINAL_STATUSES = frozenset({"failed", "completed", "expired", "cancelled"})


class RequestCounts(BaseModel):
    """OpenAI's request counts, and pronk's `cancelled` beside them (the `openai` client keeps it, in
    `request_counts.model_extra`). A batch that ended has `completed + failed + cancelled == total`."""

    total: int = Field(default=0, description="Requests (non-blank lines) in the input file.")
    completed: int = Field(default=0, description="Requests answered.")
    failed: int = Field(
        default=0, description="Requests that were invalid, or ran and failed, or that a failed run never finished."
    )
    cancelled: int = Field(
        default=0,
        description="Requests never started because the batch was cancelled or its completion window ended: OpenAI "
        "cancels an expired batch's unfinished requests too, and counts neither as failed. The batch's status says "
        "which (`cancelled` or `expired`); their error lines say `batch_cancelled` or `batch_expired`.",
    )


class CheckCounts(BaseModel):
    """Lines by how their answer's check ended; `unchecked` lines carried no check (or one that could not run)."""

    passed: int = 0
    failed: int = 0
    unchecked: int = 0

    @property
    def checked(self) -> int:
        return self.passed + self.failed

    @property
    def success_rate(self) -> float | None:
        """Passed over checked lines; None when no line was checked."""
        return self.passed / self.checked if self.checked else None

    def describe(self) -> str:
        rate = self.success_rate
        return f"{self.passed}/{self.checked} passed" + (f" ({rate:.0%})" if rate is not None else "")


class LinesChecked(BaseModel):
    """How far a long run of checked lines has got, for a command to show while it runs: the lines given so far
    (`pronk.batches.labelled.check_lines` adds each call's) and those checked. An improve round's rollouts and a
    Leap's canary keep one in their record."""

    total: int = 0
    done: int = 0


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class BatchUsage(BaseModel):
    """OpenAI's batch usage: input (prompt), cached input and output (completion) tokens."""

    input_tokens: int = 0
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int = 0
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int = 0

    def add(self, prompt: int, cached: int, completion: int) -> None:
        self.input_tokens += prompt
        self.input_tokens_details.cached_tokens += cached
        self.output_tokens += completion
        self.total_tokens += prompt + completion


class InFlightPoint(BaseModel):
    """The lines in flight a run chose from some time on (`pronk.batches.in_flight`)."""

    at_s: float = Field(description="Seconds since the run began.")
    target: int = Field(description="Lines (root traces) the run keeps in flight from then on.")
    source: Literal["fixed", "start", "profile", "run"] = Field(
        description="`fixed`: the job's `max_concurrency`; `start`: adaptive's first value, `max_concurrency`; "
        "`profile`: chosen from the Herd's profile of the job's earlier runs; `run`: from this run's finished lines."
    )
    lines: int = Field(default=0, description="Finished lines the target was measured on.")


class BatchErrorData(BaseModel):
    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchErrors(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchErrorData] = Field(default_factory=list)


FilePurpose = Literal["batch", "batch_output"]


class FileObject(BaseModel):
    """OpenAI's File object: an uploaded batch input file, or a batch's output or error file."""

    id: str = Field(default_factory=lambda: new_id("file"))
    object: Literal["file"] = "file"
    bytes: int = Field(ge=0, description="Size of the content in bytes.")
    created_at: int = Field(default_factory=lambda: int(time.time()))
    expires_at: int | None = None
    filename: str
    purpose: FilePurpose
    status: Literal["uploaded", "processed", "error"] = "processed"
    status_details: str | None = None


class BatchObject(BaseModel):
    """OpenAI's Batch object plus pronk's job addressing and cost: what the API shows (its files by id only)."""

    id: str = Field(default_factory=lambda: new_id("batch"))
    object: Literal["batch"] = "batch"
    endpoint: str = CHAT_COMPLETIONS_URL
    errors: BatchErrors | None = None
    input_file_id: str
    completion_window: Literal["24h", "unlimited"] = "24h"
    status: BatchStatus = "validating"
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int = Field(default_factory=lambda: int(time.time()))
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts = Field(default_factory=RequestCounts)
    metadata: dict[str, str] | None = None
    usage: BatchUsage = Field(default_factory=BatchUsage)
    job_id: str
    model: str
    price_per_worker_hour: float = Field(
        default=0.0, description="USD per worker-hour with its KV host tier (JobConfig.worker_hour_price)."
    )
    worker_seconds: float = Field(default=0.0, description="Worker-seconds the job's fleet was held for this run.")
    processing_cost: float = Field(default=0.0, description="USD: worker_seconds / 3600 × price_per_worker_hour.")
    tasks_per_dollar: float | None = None
    checks: CheckCounts = Field(default_factory=CheckCounts)
    success_rate: float | None = Field(default=None, description="Passed over checked lines (None: none checked).")
    tool_calls: ToolCallCounts = Field(
        default_factory=ToolCallCounts,
        description="Agent steps whose output was meant as a tool call, every attempt: `total`, `parsed`, `valid` "
        "(a tool the step offered, arguments valid against its schema) and `validity`, valid over total "
        "(None: no call).",
    )
    in_flight: list[InFlightPoint] = Field(
        default_factory=list,
        description="The lines in flight the latest run of the batch chose, from its start on: one point with the "
        "job's fixed `max_concurrency`, or every change of the adaptive target (`scheduling.concurrency`).",
    )
    tasks_counted: Literal["completed", "passed"] = Field(
        default="completed",
        description="What tasks per dollar counts: the lines whose check passed when any line was checked, "
        "else the completed lines.",
    )
    flow_run_id: str | None = None

    def model_post_init(self, context: Any) -> None:
        if self.expires_at is None and self.completion_window == "24h":
            self.expires_at = self.created_at + 24 * 3600


class Batch(BatchObject):
    """The stored form of a batch: the public object plus its owner and where its files lie on the server, which
    the API never shows (a client reads the files by `output_file_id` and `error_file_id`)."""

    output_uri: str | None = None
    error_uri: str | None = None
    steps_uri: str | None = Field(
        default=None, description="NDJSON step records of the run's traces, beside the output file."
    )
    owner: str | None = Field(default=None, description="Who made it through the API (an API key's owner).")

    def public(self) -> BatchObject:
        return BatchObject.model_validate(self.model_dump(include=set(BatchObject.model_fields)))

    def mark(self, status: BatchStatus) -> None:
        """Move to `status` and stamp its `<status>_at` time; a note on why it waited in the queue goes."""
        self.status = status
        if self.errors is not None and status != "validating":
            kept = [e for e in self.errors.data if e.code != ErrorCode.QUEUE_WAITING]
            self.errors = BatchErrors(data=kept) if kept else None
        stamp = f"{status}_at"
        if stamp in type(self).model_fields and getattr(self, stamp) is None:
            setattr(self, stamp, int(time.time()))
