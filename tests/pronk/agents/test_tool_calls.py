"""Tool-call validity: which step outputs were meant as tool calls, which parsed, which were valid; the harness
records it on every step attempt, on a stand-in router that replays scripted outputs."""

from __future__ import annotations

import asyncio
import json

import pytest

from pronk.agents.harness import Harness
from pronk.agents.step_records import StepRecorder, ToolCallCounts, summarise
from pronk.agents.tool_calls import parse_call, tool_call_validity
from pronk.batches.input import validate_input
from pronk.engine.worker_protocol import StepRequest, StepResult
from pronk.jobs.catalog import resolve_job
from pronk.settings import get_settings
from tests.fakes import answered

BWRAP = get_settings().sandbox_bwrap
"""The bubblewrap binary a harness's python tool isolates code with."""

SQL = {
    "type": "object",
    "properties": {"query": {"type": "string", "maxLength": 300}},
    "required": ["query"],
    "additionalProperties": False,
}


def validity(text: str, tools: dict, allow_final: bool = True) -> tuple[bool | None, bool | None]:
    return tool_call_validity(text, parse_call(text, set(tools), allow_final), tools)


def test_a_call_is_valid_when_it_names_an_offered_tool_with_arguments_its_schema_accepts():
    assert validity('{"tool": "sql", "arguments": {"query": "SELECT 1"}}', {"sql": SQL}) == (True, True)
    assert validity('{"tool": "sql", "arguments": {"query": 5}}', {"sql": SQL}) == (True, False)
    assert validity('{"tool": "sql", "arguments": {"sql": "SELECT 1"}}', {"sql": SQL}) == (True, False)
    assert validity('{"tool": "nope", "arguments": {}}', {"sql": SQL}) == (True, False)  # not a tool of the step
    assert validity('{"tool": "sql", "arguments": "SELECT 1"}', {"sql": SQL}) == (False, False)
    assert validity('{"tool": "sql", "argu', {"sql": SQL}) == (False, False)  # cut off by max_tokens
    assert validity("SELECT 1", {"sql": SQL}) == (False, False)


def test_a_final_answer_or_a_step_without_tools_is_no_tool_call():
    assert validity('{"final": "done"}', {"sql": SQL}) == (None, None)
    assert validity('{"final": "done"}', {"sql": SQL}, allow_final=False) == (None, None)  # refused, still no call
    assert validity(' { "final": "cut o', {"sql": SQL}) == (None, None)
    assert validity('{"tool": "sql", "arguments": {}}', {}) == (None, None)


class ScriptedRouter:
    """Answers each agent step with the next scripted output."""

    def __init__(self, outputs: list[str]):
        self.outputs = outputs

    async def generate(self, request: StepRequest) -> StepResult:
        return answered(request, self.outputs.pop(0))

    async def finish(self, trace_id: str) -> None:
        pass


def test_the_harness_records_each_attempt_and_the_trace_sums_them(tmp_path):
    job = resolve_job("tiny-cpu", get_settings())
    tools = [{"type": "function", "function": {"name": "sql", "parameters": SQL}}]
    raw = {
        "custom_id": "a",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "pronk-tiny", "messages": [{"role": "user", "content": "go"}], "tools": tools},
    }
    (request,) = validate_input(json.dumps(raw).encode(), job).requests
    outputs = [
        '{"tool": "sql", "argu',  # step 0, attempt 0: does not parse, retried
        '{"tool": "nope", "arguments": {}}',  # attempt 1: no such tool, retried
        '{"tool": "sql", "arguments": {"query": 5}}',  # attempt 2: the schema rejects it; it runs all the same
        '{"tool": "sql", "arguments": {"query": "SELECT 1"}}',  # step 1: valid
        '{"final": "done"}',  # step 2: no tool call
    ]
    recorder = StepRecorder()
    harness = Harness(ScriptedRouter(outputs), job, recorder, tmp_path, sandbox_bwrap=BWRAP)  # type: ignore[arg-type]
    outcome = asyncio.run(harness.run_line(request))

    records = recorder.take_line("a")
    assert [(r.step, r.attempt, r.tool_call_parsed, r.tool_call_valid) for r in records] == [
        (0, 0, False, False),
        (0, 1, True, False),
        (0, 2, True, False),
        (1, 0, True, True),
        (2, 0, None, None),
    ]
    assert records[2].tool_name == "sql" and records[3].tool_name == "sql"
    counts = ToolCallCounts.of(records)
    assert (counts.total, counts.parsed, counts.valid, counts.validity) == (4, 3, 1, 0.25)
    assert outcome.completion is not None and outcome.completion.summary == summarise(records)
    assert outcome.completion.summary.tool_call_counts == counts


@pytest.mark.parametrize(("choice", "last_may_call"), [("auto", False), ("required", True)])
def test_the_last_step_must_answer_unless_every_step_must_call_a_tool(tmp_path, choice, last_may_call):
    job = resolve_job("tiny-cpu", get_settings())
    tools = [{"type": "function", "function": {"name": "sql", "parameters": SQL}}]
    body = {"model": "pronk-tiny", "messages": [{"role": "user", "content": "go"}], "tools": tools}
    raw = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": body}
    raw["body"] |= {"tool_choice": choice, "harness": {"max_steps": 2}}
    (request,) = validate_input(json.dumps(raw).encode(), job).requests
    call = '{"tool": "sql", "arguments": {"query": "SELECT 1"}}'
    router = ScriptedRouter([call, call if last_may_call else '{"final": "done"}'])
    schemas: list[dict] = []
    generate = router.generate

    async def recording(step: StepRequest) -> StepResult:
        schemas.append(step.sampling.json_schema or {})
        return await generate(step)

    router.generate = recording  # type: ignore[method-assign]
    outcome = asyncio.run(Harness(router, job, StepRecorder(), tmp_path, sandbox_bwrap=BWRAP).run_line(request))  # type: ignore[arg-type]
    assert ("tool" in json.dumps(schemas[1])) is last_may_call
    assert outcome.completion is not None
    assert outcome.completion.finish_reason == ("max_steps" if last_may_call else "stop")
