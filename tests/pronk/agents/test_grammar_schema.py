"""A tool's schema as the engine's grammar can hold it: what vLLM refuses under xgrammar is dropped, refs re-rooted,
and every step schema built from such tools passes vLLM's own check of a request's JSON schema."""

from __future__ import annotations

import openai
import pytest
from jsonschema import Draft202012Validator
from pydantic import BaseModel

from pronk.agents.client_tools import ClientTool
from pronk.agents.grammar_schema import XGRAMMAR_STRING_FORMATS, relaxed, rerooted, resolve
from pronk.agents.tool_calls import step_schema


def vllm_accepts(schema: dict) -> None:
    """vLLM's own check of a request's JSON schema under the xgrammar backend (what a worker runs on a step)."""
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams
    from vllm.v1.structured_output.backend_xgrammar import validate_xgrammar_grammar

    validate_xgrammar_grammar(SamplingParams(structured_outputs=StructuredOutputsParams(json=schema)))


class Place(BaseModel):
    city: str
    country: str


class Forecast(BaseModel):
    place: Place
    compare_with: list[Place]


def obj(**properties) -> dict:
    return {"type": "object", "properties": properties}


PARAMETERS = {
    "pydantic-defs": openai.pydantic_function_tool(Forecast)["function"]["parameters"],
    "date": obj(day={"type": "string", "format": "date"}),
    "pattern-with-length": obj(zip={"type": "string", "pattern": "^[0-9]{5}$", "maxLength": 5}),
    "unknown-format": obj(colour={"type": "string", "format": "color"}),
    "multipleOf": obj(count={"type": "integer", "multipleOf": 5}),
    "uniqueItems": obj(tags={"type": "array", "items": {"type": "string"}, "uniqueItems": True}),
    "allOf": obj(n={"allOf": [{"type": "integer"}, {"minimum": 1}]}),
    "propertyNames": {**obj(a={"type": "string"}), "propertyNames": {"pattern": "^[a-z]+$"}},
    "recursive": {**obj(name={"type": "string"}, children={"type": "array", "items": {"$ref": "#"}})},
}


@pytest.mark.parametrize("parameters", PARAMETERS.values(), ids=PARAMETERS.keys())
@pytest.mark.parametrize("allow_final", [False, True], ids=["call-only", "call-or-answer"])
def test_a_step_offering_any_of_these_tools_is_one_vllm_accepts(parameters, allow_final):
    vllm_accepts(step_schema([ClientTool("f", "", parameters)], allow_final, max_tokens=128))


def test_a_relaxed_schema_drops_only_what_xgrammar_cannot_enforce():
    date = {"type": "string", "format": "date", "maxLength": 10, "description": "d"}
    assert relaxed(date) == {"type": "string", "format": "date", "description": "d"}
    assert relaxed({"type": "string", "format": "color"}) == {"type": "string"}
    assert relaxed(PARAMETERS["allOf"]) == obj(n={})
    assert relaxed(PARAMETERS["pydantic-defs"]) == PARAMETERS["pydantic-defs"]
    # property names are names, not keywords: a property called "format" or "multipleOf" stays
    named = obj(format={"type": "string"}, multipleOf={"type": "integer", "multipleOf": 2})
    assert relaxed(named) == obj(format={"type": "string"}, multipleOf={"type": "integer"})


def test_refs_are_rerooted_where_the_schema_sits_and_resolve_there():
    parameters = openai.pydantic_function_tool(Forecast)["function"]["parameters"]
    moved = rerooted(parameters, "#/$defs/tool:forecast")
    assert moved["properties"]["place"] == {"$ref": "#/$defs/tool:forecast/$defs/Place"}
    assert moved["properties"]["compare_with"]["items"] == {"$ref": "#/$defs/tool:forecast/$defs/Place"}
    assert rerooted({"$ref": "#"}, "#/$defs/tool:t") == {"$ref": "#/$defs/tool:t"}
    root = {"$defs": {"tool:forecast": moved}}
    assert resolve(root, "#/$defs/tool:forecast/$defs/Place") == parameters["$defs"]["Place"]
    assert resolve(root, "#/$defs/nothing") is None


def test_a_step_schema_holds_a_tool_with_refs_under_its_root_defs_and_bounds_its_strings():
    parameters = openai.pydantic_function_tool(Forecast)["function"]["parameters"]
    schema = step_schema([ClientTool("forecast", "", parameters)], allow_final=False, max_tokens=96)
    assert schema["properties"]["arguments"] == {"$ref": "#/$defs/tool:forecast"}
    city = schema["$defs"]["tool:forecast"]["$defs"]["Place"]["properties"]["city"]
    assert 8 <= city["maxLength"] < 96  # strings reached through refs count toward the step's budget
    call = {"tool": "forecast", "arguments": {"place": {"city": "Oslo", "country": "NO"}, "compare_with": []}}
    assert Draft202012Validator(schema).is_valid(call)
    assert not Draft202012Validator(schema).is_valid({**call, "arguments": {"place": {"city": "Oslo"}}})


def test_a_recursive_tool_schema_recurses_into_itself_not_into_the_step():
    schema = step_schema([ClientTool("tree", "", PARAMETERS["recursive"])], allow_final=True, max_tokens=96)
    assert schema["$defs"]["tool:tree"]["properties"]["children"]["items"] == {"$ref": "#/$defs/tool:tree"}
    call = {"tool": "tree", "arguments": {"name": "a", "children": [{"name": "b"}]}}
    assert Draft202012Validator(schema).is_valid(call)


def test_the_formats_kept_are_the_ones_vllm_lets_xgrammar_enforce():
    from vllm.v1.structured_output.backend_xgrammar import STRING_SUPPORTED_FORMATS

    assert set(STRING_SUPPORTED_FORMATS) == XGRAMMAR_STRING_FORMATS
