"""Client-side tools with OpenAI's semantics, on a scripted router: one step, constrained to the offered tools,
answered as OpenAI's `tool_calls`; output lines that the official client's and vLLM's own models accept."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest
from openai.types.chat import ChatCompletion
from pydantic import BaseModel

from pronk.agents.harness import Harness
from pronk.agents.step_records import StepRecorder
from pronk.batches.input import validate_input
from pronk.batches.outputs import output_line
from pronk.engine.client import StepRejected
from pronk.engine.worker_protocol import StepRequest, StepResult
from pronk.jobs.catalog import resolve_job
from pronk.protocol.error_codes import ErrorCode
from pronk.settings import get_settings
from tests.fakes import answered
from tests.peers import how_lines_ended

BWRAP = get_settings().sandbox_bwrap
"""The bubblewrap binary a harness's python tool isolates code with."""

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_current_weather",
        "description": "Get the current weather in a given location",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["location"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}


class ScriptedRouter:
    """Answers each step with the next scripted output and keeps the steps it was sent; refuses a step whose JSON
    schema vLLM's xgrammar backend refuses, as a worker does."""

    def __init__(self, *outputs: str):
        self.outputs = list(outputs)
        self.steps: list[StepRequest] = []

    async def generate(self, request: StepRequest) -> StepResult:
        from vllm import SamplingParams
        from vllm.exceptions import VLLMClientError
        from vllm.sampling_params import StructuredOutputsParams
        from vllm.v1.structured_output.backend_xgrammar import validate_xgrammar_grammar

        self.steps.append(request)
        if request.sampling.json_schema is not None:
            structured = StructuredOutputsParams(json=request.sampling.json_schema)
            try:
                validate_xgrammar_grammar(SamplingParams(structured_outputs=structured))
            except (ValueError, VLLMClientError) as exc:
                raise StepRejected(str(exc)) from exc
        return answered(request, self.outputs.pop(0))

    async def finish(self, trace_id: str) -> None:
        pass


def run(body: dict, *outputs: str, tmp_path):
    job = resolve_job("tiny-cpu", get_settings())
    raw = {"custom_id": "c", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "pronk-tiny", **body}}
    validated = validate_input(json.dumps(raw).encode(), job)
    assert validated.errors == [], validated.errors
    router = ScriptedRouter(*outputs)
    outcome = asyncio.run(
        Harness(router, job, StepRecorder(), tmp_path, sandbox_bwrap=BWRAP).run_line(validated.requests[0])
    )  # type: ignore[arg-type]
    return outcome, router.steps


def weather_line(**extra) -> dict:
    return {"messages": [{"role": "user", "content": "Weather in Boston?"}], "tools": [WEATHER], **extra}


def test_a_required_call_comes_back_as_openai_tool_calls_valid_for_the_official_client(tmp_path):
    outcome, (step,) = run(
        weather_line(tool_choice="required"),
        '{"tool": "get_current_weather", "arguments": {"location": "Boston, MA"}}',
        tmp_path=tmp_path,
    )
    line = output_line(outcome).model_dump(mode="json")
    body = line["response"]["body"]
    completion = ChatCompletion.model_validate(body)
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name == "get_current_weather"
    assert json.loads(call.function.arguments) == {"location": "Boston, MA"}
    schema = json.dumps(step.sampling.json_schema)
    assert '"const": "get_current_weather"' in schema and '"final"' not in schema
    assert "get_current_weather" in step.messages[0].text()


def test_auto_may_answer_in_text_and_a_named_choice_offers_that_tool_alone(tmp_path):
    outcome, (step,) = run(weather_line(tools=[WEATHER, TIME]), '{"final": "It is sunny."}', tmp_path=tmp_path)
    message = output_line(outcome).model_dump(mode="json")["response"]["body"]["choices"][0]
    assert message["message"] == {"role": "assistant", "content": "It is sunny."}
    assert message["finish_reason"] == "stop" and '"final"' in json.dumps(step.sampling.json_schema)

    named = {"type": "function", "function": {"name": "get_time"}}
    outcome, (step,) = run(
        weather_line(tools=[WEATHER, TIME], tool_choice=named),
        '{"tool": "get_time", "arguments": {}}',
        tmp_path=tmp_path,
    )
    schema = json.dumps(step.sampling.json_schema)
    assert '"const": "get_time"' in schema and "get_current_weather" not in schema and '"final"' not in schema
    assert outcome.completion is not None and outcome.completion.tool_calls is not None
    assert outcome.completion.tool_calls[0]["function"] == {"name": "get_time", "arguments": "{}"}


def test_tool_choice_none_is_a_plain_chat(tmp_path):
    outcome, (step,) = run(weather_line(tool_choice="none"), "Probably sunny.", tmp_path=tmp_path)
    assert step.sampling.json_schema is None
    assert outcome.completion is not None and outcome.completion.text == "Probably sunny."


@pytest.mark.parametrize(
    "output",
    ['{"tool": "get_current_weather", "arguments": {"unit": "kelvin"}}', '{"tool": "get_current_weather", "argu'],
    ids=["against-schema", "cut"],
)
def test_a_call_that_does_not_match_its_tool_is_the_lines_error_not_a_half_made_call(tmp_path, output):
    outcome, _ = run(weather_line(tool_choice="required"), output, tmp_path=tmp_path)
    line = output_line(outcome).model_dump(mode="json")
    assert line["response"] is None and line["error"]["code"] == ErrorCode.INVALID_TOOL_CALL


class Place(BaseModel):
    city: str
    country: str


class BookFlight(BaseModel):
    origin: Place
    destination: Place


DATED = {
    "type": "function",
    "function": {
        "name": "get_forecast",
        "parameters": {
            "type": "object",
            "properties": {
                "day": {"type": "string", "format": "date"},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                "days": {"type": "integer", "minimum": 1, "multipleOf": 1},
            },
            "required": ["day", "zip"],
        },
    },
}


def test_tools_written_by_pydantic_or_with_formats_and_patterns_reach_the_engine_and_come_back_as_calls(tmp_path):
    """OpenAI takes these schemas; a worker's vLLM refused the steps built from them (a `$ref` into the tool's
    `$defs` the grammar could not resolve, a length bound beside a `format` or `pattern`, `multipleOf`)."""
    book = openai.pydantic_function_tool(BookFlight)
    arguments = {"origin": {"city": "Oslo", "country": "NO"}, "destination": {"city": "Rome", "country": "IT"}}
    outcome, _ = run(
        weather_line(tools=[book], tool_choice="required"),
        json.dumps({"tool": "BookFlight", "arguments": arguments}),
        tmp_path=tmp_path,
    )
    assert outcome.completion is not None and outcome.completion.tool_calls is not None
    assert json.loads(outcome.completion.tool_calls[0]["function"]["arguments"]) == arguments

    outcome, _ = run(
        weather_line(tools=[DATED], tool_choice="required"),
        '{"tool": "get_forecast", "arguments": {"day": "2026-12-06", "zip": "02134"}}',
        tmp_path=tmp_path,
    )
    assert outcome.completion is not None and outcome.completion.finish_reason == "tool_calls"


def test_a_call_whose_argument_breaks_its_format_is_the_lines_error(tmp_path):
    outcome, _ = run(
        weather_line(tools=[DATED], tool_choice="required"),
        '{"tool": "get_forecast", "arguments": {"day": "tomorrow", "zip": "02134"}}',
        tmp_path=tmp_path,
    )
    line = output_line(outcome).model_dump(mode="json")
    assert line["error"]["code"] == ErrorCode.INVALID_TOOL_CALL and "date" in line["error"]["message"]


def test_the_clients_tool_results_come_back_to_the_model_in_the_form_of_its_calls(tmp_path):
    arguments = json.dumps({"location": "Boston, MA"})
    messages = [
        {"role": "user", "content": "Weather in Boston?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_current_weather", "arguments": arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "22 C, clear"},
    ]
    outcome, (step,) = run(weather_line(messages=messages), '{"final": "22 C and clear."}', tmp_path=tmp_path)
    assert [m.role for m in step.messages] == ["system", "user", "assistant", "tool"]
    assert json.loads(step.messages[2].text()) == {
        "tool": "get_current_weather",
        "arguments": {"location": "Boston, MA"},
    }
    assert step.messages[3].text() == "22 C, clear"
    assert outcome.completion is not None and outcome.completion.text == "22 C and clear."


def test_every_kind_of_output_and_error_line_validates_against_vllms_batch_output_model(tmp_path):
    call, _ = run(
        weather_line(), '{"tool": "get_current_weather", "arguments": {"location": "Boston"}}', tmp_path=tmp_path
    )
    text, _ = run(weather_line(), '{"final": "sunny"}', tmp_path=tmp_path)
    failed, _ = run(weather_line(tool_choice="required"), "not json", tmp_path=tmp_path)
    written = [output_line(o).model_dump(mode="json") for o in (call, text, failed)]
    assert [how_lines_ended([w])["c"] for w in written] == ["ok", "ok", ErrorCode.INVALID_TOOL_CALL]


def test_the_lines_of_vllms_run_batch_tests_end_as_openai_ends_them_each_valid_for_vllm_and_openai(tmp_path):
    """vLLM's tests/entrypoints/openai/test_run_batch.py sends these: two good lines (max_completion_tokens, and
    max_tokens), a model nobody serves, a url nobody serves and a streaming line. One output or error line each."""

    def line(custom_id: str, url: str = "/v1/chat/completions", model: str = "pronk-tiny", **body) -> str:
        messages = [{"role": "user", "content": "Hello world!"}]
        return json.dumps(
            {
                "custom_id": custom_id,
                "method": "POST",
                "url": url,
                "body": {"model": model, "messages": messages, **body},
            }
        )

    lines = [
        line("request-1", max_completion_tokens=16),
        line("request-2", max_tokens=16),
        line("request-3", model="NonExistModel", max_completion_tokens=16),
        line("request-4", url="/bad_url", max_completion_tokens=16),
        line("request-5", stream="True", max_completion_tokens=16),
    ]
    job = resolve_job("tiny-cpu", get_settings())
    validated = validate_input("\n".join(lines).encode(), job)
    router = ScriptedRouter("Hello!", "Hello!")
    harness = Harness(router, job, StepRecorder(), tmp_path, sandbox_bwrap=BWRAP)  # type: ignore[arg-type]
    outcomes = [asyncio.run(harness.run_line(request)) for request in validated.requests]
    written = [output_line(o).model_dump(mode="json") for o in outcomes]
    written += [e.model_dump(mode="json") for e in validated.errors]
    assert sorted(w["custom_id"] for w in written) == [f"request-{i}" for i in range(1, 6)]
    assert how_lines_ended(written) == {
        "request-1": "ok",
        "request-2": "ok",
        "request-3": ErrorCode.MODEL_MISMATCH,
        "request-4": ErrorCode.UNSUPPORTED_URL,
        "request-5": ErrorCode.INVALID_BODY,
    }
    assert [s.sampling.max_tokens for s in router.steps] == [16, 16]
