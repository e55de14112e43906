"""Request bodies of a batch line: OpenAI's chat completion body (with pronk's agent fields) and the replay body.

A chat completion body with `tools` of the job's harness is an agent task whose loop the harness runs on the server;
one whose tools are all the client's own gets one step that may answer with OpenAI's `tool_calls`
(`pronk.agents.client_tools`). A body on
`REPLAY_URL` carries a trace shape to replay with fixed lengths. Checking an agent line against its job (known tools,
limits within the job's caps) is `pronk.agents.validation`'s.
"""

from __future__ import annotations

from typing import Any, Literal

from jsonschema import Draft202012Validator, SchemaError
from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator

from pronk.engine.worker_protocol import ChatMessage
from pronk.jobs.schema import HarnessConfig
from pronk.protocol.shapes import TraceShape

CHAT_COMPLETIONS_URL = "/v1/chat/completions"
REPLAY_URL = "/v1/pronk/replay"
SERVED_URLS = (CHAT_COMPLETIONS_URL, REPLAY_URL)


def valid_json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` itself when it is a valid JSON schema (2020-12); else ValueError, for a pydantic validator."""
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise ValueError(f"not a valid JSON schema: {exc.message}") from exc
    return schema


class ToolFunction(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str = Field(
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9_-]+$",
        description="A tool of the job's harness, or a function of the client's own.",
    )
    description: str | None = Field(default=None, description="Overrides the tool's own description in the prompt.")
    parameters: dict[str, Any] | None = Field(
        default=None,
        description="JSON schema of the arguments; narrows the tool's own schema for this line (omit: the tool's).",
    )


class ToolSpec(BaseModel):
    """OpenAI's tool entry: `{"type": "function", "function": {"name", "description", "parameters"}}`."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["function"] = "function"
    function: ToolFunction


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["function"] = "function"
    function: ToolFunction


ToolChoice = Literal["auto", "required", "none"] | NamedToolChoice


class HarnessRequest(BaseModel):
    """Limits a line may ask for; each must stay within the job's `harness` caps."""

    model_config = ConfigDict(extra="forbid")

    max_steps: int | None = Field(default=None, ge=1, description="Most model steps of this trace.")
    max_fan_out: int | None = Field(default=None, ge=0, description="Most children per spawn_subagents call.")
    max_depth: int | None = Field(default=None, ge=0, description="Nesting levels of subagents.")
    tool_timeout_s: float | None = Field(default=None, gt=0, description="Seconds per tool call.")
    trace_timeout_s: float | None = Field(default=None, gt=0, description="Seconds for the whole trace.")

    def over_caps(self, caps: HarnessConfig) -> list[str]:
        return [
            f"harness.{name}={value} is beyond the job's cap {getattr(caps, name)}"
            for name, value in self.model_dump(exclude_none=True).items()
            if value > getattr(caps, name)
        ]

    def applied_to(self, caps: HarnessConfig) -> HarnessConfig:
        return caps.model_copy(update=self.model_dump(exclude_none=True))


class ReplayBody(BaseModel):
    """A replay line's body: a trace shape run with fixed lengths on the job's model."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    shape: TraceShape
    kv_pin_ttl_s: float | None = Field(
        default=None, ge=0, description="Pin TTL across tool gaps; the job's when omitted."
    )


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
        return valid_json_schema(value)


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
        default=None,
        description="Tools of the job's harness (the line is an agent task run on the server), or the client's own "
        "functions (one step, answered with tool_calls); never both.",
    )
    tool_choice: ToolChoice = Field(
        default="auto", description="auto, required, none, or a named function (forced on the first step)."
    )
    harness: HarnessRequest | None = Field(default=None, description="Per-line harness limits, within the job's caps.")
    response_format: ResponseFormat | None = Field(
        default=None,
        description="Constrain the answer (an agent's final answer, or a plain chat's reply) to a JSON schema.",
    )

    stream: bool = Field(
        default=False,
        description="Refused when true: a batch line's answer is one object, never a stream (OpenAI's and vLLM's "
        "batch runners refuse it too).",
    )

    @field_validator("stream")
    @classmethod
    def _no_stream(cls, value: bool) -> bool:
        if value:
            raise ValueError("stream is not supported in a batch: each line's answer is written whole")
        return value

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
