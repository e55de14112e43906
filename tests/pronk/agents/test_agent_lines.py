"""Agent and replay batch lines: validation against the job's harness, and the bounded step schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from pronk.agents.harness import tool_views
from pronk.agents.tool_calls import parse_call as _parse
from pronk.agents.tool_calls import step_schema
from pronk.agents.tools import job_tools
from pronk.batches.input import validate_input
from pronk.jobs.catalog import resolve_job
from pronk.protocol.error_codes import ErrorCode
from pronk.settings import PROJECT_ROOT, get_settings
from tests.conftest import DATA


@pytest.fixture
def job():
    return resolve_job("tiny-cpu", get_settings())


def line(custom_id: str, **body) -> str:
    full = {"model": "pronk-tiny", "messages": [{"role": "user", "content": "go"}], **body}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": full})


def tool(name: str, parameters=None) -> dict:
    function = {"name": name} if parameters is None else {"name": name, "parameters": parameters}
    return {"type": "function", "function": function}


@pytest.mark.parametrize(
    ("path", "job_name"),
    [
        (PROJECT_ROOT / "data" / "sample_batch.jsonl", "smollm2-cpu"),
        (PROJECT_ROOT / "data" / "agent_batch.jsonl", "smollm2-cpu"),
        (PROJECT_ROOT / "data" / "labelled" / "agent.jsonl", "smollm2-cpu"),
        (PROJECT_ROOT / "data" / "replay_batch.jsonl", "tiny-cpu"),
        (DATA / "agent_batch.jsonl", "tiny-cpu"),
        (DATA / "sample_batch.jsonl", "tiny-cpu"),
    ],
    ids=lambda value: value.name if isinstance(value, Path) else value,
)
def test_shipped_batches_validate_for_their_job(path, job_name):
    validated = validate_input(path.read_bytes(), resolve_job(job_name, get_settings()))
    assert validated.errors == [] and len(validated.requests) == validated.total


@pytest.mark.parametrize(
    ("body", "code", "fragment"),
    [
        ({"tools": [tool("sql"), tool("shell")]}, ErrorCode.MIXED_TOOLS, "['sql'] are tools of job"),
        (
            {"tools": [tool("sql")], "tool_choice": {"type": "function", "function": {"name": "python"}}},
            ErrorCode.UNKNOWN_TOOL,
            "tool_choice",
        ),
        (
            {"tools": [tool("sql", {"type": "object", "properties": {"query": {"type": "strin"}}})]},
            ErrorCode.INVALID_TOOL_SCHEMA,
            "not a valid JSON schema",
        ),
        ({"tools": [tool("sql", {"type": "array"})]}, ErrorCode.INVALID_TOOL_SCHEMA, "type 'object'"),
        (
            {"tools": [tool("sql")], "harness": {"max_steps": 99}},
            ErrorCode.HARNESS_LIMIT_EXCEEDED,
            "max_steps=99 is beyond the job's cap 8",
        ),
        (
            {"tools": [tool("sql")], "harness": {"max_fan_out": 5, "max_depth": 3}},
            ErrorCode.HARNESS_LIMIT_EXCEEDED,
            "max_fan_out=5",
        ),
        ({"tools": [tool("sql")], "harness": {"max_stepz": 2}}, ErrorCode.INVALID_BODY, "max_stepz"),
    ],
    ids=[
        "mixed-tools",
        "unknown-choice",
        "bad-schema",
        "not-object",
        "steps-over-cap",
        "fan-out-over-cap",
        "unknown-limit",
    ],
)
def test_bad_agent_lines_become_error_lines(job, body, code, fragment):
    validated = validate_input(line("bad", **body).encode(), job)
    assert validated.requests == []
    (error,) = validated.errors
    assert error.error.code == code and fragment in error.error.message, error.error.message


def test_bad_replay_line_is_an_invalid_body(job):
    raw = {
        "custom_id": "r",
        "method": "POST",
        "url": "/v1/pronk/replay",
        "body": {"model": "pronk-tiny", "shape": {"trace_id": "x", "steps": []}},
    }
    (error,) = validate_input(json.dumps(raw).encode(), job).errors
    assert error.error.code == ErrorCode.INVALID_BODY and "system_prompt_tokens" in error.error.message


def test_step_schema_is_valid_bounded_and_parses_calls(job):
    validated = validate_input(
        line("ok", tools=[tool("python"), tool("sql"), tool("search"), tool("spawn_subagents")]).encode(), job
    )
    views = list(tool_views(validated.requests[0].body, job_tools(job, get_settings().sandbox_bwrap)).values())
    schema = step_schema(views, allow_final=True, max_tokens=96)
    Draft202012Validator.check_schema(schema)
    lengths = [v for k, v in _walk(schema) if k == "maxLength"]
    assert lengths and max(lengths) <= 96
    assert all(v <= 4 for k, v in _walk(schema) if k == "maxItems")
    assert _parse('{"tool":"sql","arguments":{"query":"SELECT 1\x01"}}', {"sql"}, True) == {
        "tool": "sql",
        "arguments": {"query": "SELECT 1\x01"},
    }
    assert _parse('{"final":"done"}', {"sql"}, True) == {"final": "done"}
    assert "not a call" in _parse('{"final":"done"}', {"sql"}, False)
    assert "unparsable" in _parse('{"tool":', {"sql"}, True)


ANSWER = {
    "type": "object",
    "properties": {"sector": {"type": "string"}, "score": {"type": "number", "minimum": 0, "maximum": 1}},
    "required": ["sector", "score"],
    "additionalProperties": False,
}


def test_response_format_constrains_the_final_answer(job):
    fmt = {"type": "json_schema", "json_schema": {"name": "row", "schema": ANSWER, "strict": True}}
    validated = validate_input(line("ok", tools=[tool("search")], response_format=fmt).encode(), job)
    body = validated.requests[0].body
    assert body.answer_schema == ANSWER
    views = list(tool_views(body, job_tools(job, get_settings().sandbox_bwrap)).values())
    schema = step_schema(views, allow_final=True, max_tokens=96, answer_schema=body.answer_schema)
    Draft202012Validator.check_schema(schema)
    final = schema["anyOf"][-1]["properties"]["final"]
    assert final["properties"]["score"] == {"type": "number", "minimum": 0, "maximum": 1}
    assert final["properties"]["sector"]["maxLength"] <= 96
    only_answer = step_schema([], allow_final=True, max_tokens=96, answer_schema=ANSWER)
    assert list(only_answer["properties"]) == ["final"]
    assert _parse('{"final":{"sector":"a","score":1}}', {"search"}, True, structured=True) == {
        "final": '{"sector":"a","score":1}'
    }
    assert "not a call" in _parse('{"final":null}', {"search"}, True, structured=True)
    plain = validate_input(line("p", response_format={"type": "json_object"}).encode(), job).requests[0].body
    assert plain.answer_schema == {"type": "object"}
    assert (
        validate_input(line("t", response_format={"type": "text"}).encode(), job).requests[0].body.answer_schema is None
    )


@pytest.mark.parametrize(
    ("fmt", "fragment"),
    [
        ({"type": "json_schema"}, "needs a json_schema"),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}, "not a valid JSON schema"),
        ({"type": "xml"}, "response_format.type"),
    ],
)
def test_a_bad_response_format_is_an_invalid_body(job, fmt, fragment):
    (error,) = validate_input(line("bad", response_format=fmt).encode(), job).errors
    assert error.error.code == ErrorCode.INVALID_BODY and fragment in error.error.message, error.error.message


def _walk(node):
    if isinstance(node, dict):
        for key, value in node.items():
            yield key, value
            yield from _walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from _walk(item)
