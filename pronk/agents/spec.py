"""Agent lines: the `tools`, `tool_choice` and `harness` fields of a chat body, and replay lines.

A chat completion body with `tools` is an agent task whose loop the job's harness runs on the
server. A body on `REPLAY_URL` carries a trace shape to replay with fixed lengths. Checking a
line against the job (known tools, valid schemas, limits within the job's caps) happens here,
once, at validation; the harness trusts what passes.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from jsonschema import Draft202012Validator, SchemaError
from pydantic import BaseModel, ConfigDict, Field

from pronk.agents.trace_shape import TraceShape
from pronk.jobs import HarnessConfig, JobConfig

REPLAY_URL = "/v1/pronk/replay"


class ToolFunction(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str = Field(
        min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$", description="A tool of the job's harness."
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


def check_tools(
    tools: list[ToolSpec], tool_choice: ToolChoice, request: HarnessRequest | None, job: JobConfig, known: set[str]
) -> tuple[str, str] | None:
    """`(error code, message)` for the first problem of an agent line, or None."""
    names = [t.function.name for t in tools]
    unknown = [n for n in names if n not in known]
    if unknown:
        return "unknown_tool", f"tools {unknown} are not tools of job {job.job_id} (it has {sorted(known)})"
    if len(set(names)) != len(names):
        return "invalid_tool_schema", f"a tool is listed twice: {names}"
    for tool in tools:
        schema = tool.function.parameters
        if schema is None:
            continue
        try:
            Draft202012Validator.check_schema(schema)
        except SchemaError as exc:
            return (
                "invalid_tool_schema",
                f"tool {tool.function.name!r}: parameters is not a valid JSON schema: {exc.message}",
            )
        if schema.get("type") != "object":
            return (
                "invalid_tool_schema",
                f"tool {tool.function.name!r}: parameters must have type 'object', "
                f"got {json.dumps(schema.get('type'))}",
            )
    if isinstance(tool_choice, NamedToolChoice) and tool_choice.function.name not in names:
        return (
            "unknown_tool",
            f"tool_choice names {tool_choice.function.name!r}, which is not in this line's tools {names}",
        )
    if request is not None:
        problems = request.over_caps(job.harness)
        if problems:
            return "harness_limit_exceeded", "; ".join(problems)
    return None
