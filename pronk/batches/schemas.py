"""OpenAI-shaped batch schemas: input lines, request bodies, output and error lines, the Batch object."""

from __future__ import annotations

import secrets
import time
from typing import Any, Literal

from jsonschema import Draft202012Validator, SchemaError
from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator

from engine.protocol import ChatMessage
from pronk.agents.spec import REPLAY_URL, HarnessRequest, ToolChoice, ToolSpec

CHAT_COMPLETIONS_URL = "/v1/chat/completions"
SERVED_URLS = (CHAT_COMPLETIONS_URL, REPLAY_URL)

BatchStatus = Literal[
    "validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled"
]
TERMINAL_STATUSES = frozenset({"failed", "completed", "expired", "cancelled"})


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


class ErrorCode:
    """Stable codes of error lines; clients match on these, so never rename one."""

    INVALID_JSON = "invalid_json"
    INVALID_LINE = "invalid_line"
    MISSING_CUSTOM_ID = "missing_custom_id"
    DUPLICATE_CUSTOM_ID = "duplicate_custom_id"
    INVALID_METHOD = "invalid_method"
    UNSUPPORTED_URL = "unsupported_url"
    INVALID_BODY = "invalid_body"
    MODEL_MISMATCH = "model_mismatch"
    LINE_TOO_LARGE = "line_too_large"
    REQUEST_REJECTED = "request_rejected"
    ENGINE_UNAVAILABLE = "engine_unavailable"
    CONTEXT_LENGTH = "context_length"
    UNKNOWN_TOOL = "unknown_tool"
    INVALID_TOOL_SCHEMA = "invalid_tool_schema"
    HARNESS_LIMIT_EXCEEDED = "harness_limit_exceeded"
    STEP_FAILED = "step_failed"
    CANCELLED = "batch_cancelled"
    EXPIRED = "batch_expired"
    RUN_FAILED = "batch_run_failed"


class JsonSchemaFormat(BaseModel):
    """OpenAI's `response_format.json_schema`: the schema every answer of the line must match."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    name: str = Field(default="answer", min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema", description="A JSON schema (draft 2020-12).")
    strict: bool | None = None

    @field_validator("schema_")
    @classmethod
    def _valid_schema(cls, value: dict[str, Any]) -> dict[str, Any]:
        try:
            Draft202012Validator.check_schema(value)
        except SchemaError as exc:
            raise ValueError(f"not a valid JSON schema: {exc.message}") from exc
        return value


class ResponseFormat(BaseModel):
    """OpenAI's `response_format`: `text` (no constraint), `json_object`, or `json_schema` with a schema."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    def answer_schema(self) -> dict[str, Any] | None:
        """The schema the answer is constrained to (vLLM structured outputs), or None for `text`."""
        if self.type == "json_schema":
            if self.json_schema is None:
                raise ValueError("response_format of type json_schema needs a json_schema")
            return self.json_schema.schema_
        return {"type": "object"} if self.type == "json_object" else None


class ChatCompletionBody(BaseModel):
    """The subset of OpenAI's chat completion request pronk serves; other known-harmless keys are ignored."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1)
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: StrictInt | None = Field(
        default=None, ge=1, description="A JSON integer (never a string, bool or float), up to the job's cap."
    )
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1, description="Wins over `max_tokens`.")
    temperature: float = Field(default=1.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    seed: StrictInt | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    stop: str | list[str] | None = None
    n: Literal[1] = 1
    tools: list[ToolSpec] | None = Field(
        default=None, description="Tools the job's harness may call: makes the line an agent task."
    )
    tool_choice: ToolChoice = Field(
        default="auto", description="auto, required, none, or a named function (forced on the first step)."
    )
    harness: HarnessRequest | None = Field(default=None, description="Per-line harness limits, within the job's caps.")
    response_format: ResponseFormat | None = Field(
        default=None,
        description="Constrain the answer (an agent's final answer, or a plain chat's reply) to a JSON schema.",
    )

    @field_validator("response_format")
    @classmethod
    def _schema_given(cls, value: ResponseFormat | None) -> ResponseFormat | None:
        if value is not None:
            value.answer_schema()
        return value

    @property
    def answer_schema(self) -> dict[str, Any] | None:
        return self.response_format.answer_schema() if self.response_format is not None else None

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, value: str | list[str] | None) -> list[str] | None:
        return [value] if isinstance(value, str) else value

    def output_limit(self, default: int) -> int:
        return self.max_completion_tokens or self.max_tokens or default


class LineError(BaseModel):
    code: str
    message: str
    line: int | None = Field(default=None, description="1-based line number in the input file.")


class ResponseEnvelope(BaseModel):
    status_code: int
    request_id: str
    body: dict[str, Any]


class OutputLine(BaseModel):
    """One line of an output or error file, in OpenAI's batch format."""

    id: str = Field(default_factory=lambda: new_id("batch_req"))
    custom_id: str | None
    response: ResponseEnvelope | None = None
    error: LineError | None = None


class RequestCounts(BaseModel):
    total: int = 0
    completed: int = 0
    failed: int = 0


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


class Batch(BaseModel):
    """OpenAI's Batch object plus pronk's job addressing and cost."""

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
    price_per_worker_hour: float = 0.0
    worker_seconds: float = Field(default=0.0, description="Worker-seconds the job's fleet was held for this run.")
    processing_cost: float = Field(default=0.0, description="USD: worker_seconds / 3600 × price_per_worker_hour.")
    tasks_per_dollar: float | None = None
    output_uri: str | None = None
    error_uri: str | None = None
    steps_uri: str | None = Field(
        default=None, description="NDJSON step records of the run's traces, beside the output file."
    )
    flow_run_id: str | None = None
    owner: str | None = Field(
        default=None, description="Who made it through the API (an API key's owner); never shown by the API."
    )

    def model_post_init(self, context: Any) -> None:
        if self.expires_at is None and self.completion_window == "24h":
            self.expires_at = self.created_at + 24 * 3600

    def mark(self, status: BatchStatus) -> None:
        """Move to `status` and stamp its `<status>_at` time."""
        self.status = status
        stamp = f"{status}_at"
        if stamp in type(self).model_fields and getattr(self, stamp) is None:
            setattr(self, stamp, int(time.time()))
