"""Checking an agent line against its job, once, at validation: known tools, valid schemas, limits within the job's
caps. The harness trusts what passes."""

from __future__ import annotations

import json

from jsonschema import Draft202012Validator, SchemaError

from pronk.agents.client_tools import mixed_tools
from pronk.jobs.schema import JobConfig
from pronk.protocol.bodies import HarnessRequest, NamedToolChoice, ToolChoice, ToolSpec
from pronk.protocol.error_codes import ErrorCode


def check_tools(
    tools: list[ToolSpec], tool_choice: ToolChoice, request: HarnessRequest | None, job: JobConfig, known: set[str]
) -> tuple[str, str] | None:
    """`(error code, message)` for the first problem of a line with tools, or None. Its tools are all the job's
    (`known`: a server-side agent) or all the client's own (`pronk.agents.client_tools`); never both."""
    names = [t.function.name for t in tools]
    mixed = mixed_tools(tools, known)
    if mixed:
        server, client = mixed
        return (
            ErrorCode.MIXED_TOOLS,
            f"tools {server} are tools of job {job.job_id}, run by its harness, and {client} are the client's own, "
            "returned as tool_calls: a line lists one kind or the other",
        )
    if len(set(names)) != len(names):
        return ErrorCode.INVALID_TOOL_SCHEMA, f"a tool is listed twice: {names}"
    for tool in tools:
        schema = tool.function.parameters
        if schema is None:
            continue
        try:
            Draft202012Validator.check_schema(schema)
        except SchemaError as exc:
            return (
                ErrorCode.INVALID_TOOL_SCHEMA,
                f"tool {tool.function.name!r}: parameters is not a valid JSON schema: {exc.message}",
            )
        if schema.get("type") != "object":
            return (
                ErrorCode.INVALID_TOOL_SCHEMA,
                f"tool {tool.function.name!r}: parameters must have type 'object', "
                f"got {json.dumps(schema.get('type'))}",
            )
    if isinstance(tool_choice, NamedToolChoice) and tool_choice.function.name not in names:
        return (
            ErrorCode.UNKNOWN_TOOL,
            f"tool_choice names {tool_choice.function.name!r}, which is not in this line's tools {names}",
        )
    if request is not None:
        problems = request.over_caps(job.harness)
        if problems:
            return ErrorCode.HARNESS_LIMIT_EXCEEDED, "; ".join(problems)
    return None
