"""Client-side tools, with OpenAI's semantics: a line whose `tools` are the client's own functions (none of them a
tool of the job's harness) gets one generation that may call them, and the client runs the call.

The step is constrained as a server agent's step is (`pronk.agents.tool_calls.step_schema`: `{"tool", "arguments"}`
with the tool's own argument schema, or `{"final": ...}`), so even a small model's call parses. `tool_choice`
decides the branches: `auto` both, `required` the tools only, a named function that one alone (`none` never comes
here: such a line is a plain chat). The answer goes back in OpenAI's shape: an assistant message with `tool_calls`
(an id, `type: "function"`, the arguments as a JSON string) and `finish_reason: "tool_calls"`, or a plain message.
What the model wrote is checked against the chosen tool's schema (its `format`s too) before it is returned; a call
that is not one is the line's error, never a half-made call. The grammar holds a relaxed copy of each schema
(`pronk.agents.grammar_schema`), so this check is what enforces the rest. The conversation a client sends back
(assistant `tool_calls`, `tool` results) is shown to the model in the same JSON form its calls take.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator

from pronk.agents.tool_calls import parse_call, step_schema, system_prompt
from pronk.engine.worker_protocol import ChatMessage, StepRequest, StepResult
from pronk.protocol.bodies import ChatCompletionBody, NamedToolChoice, ToolSpec
from pronk.protocol.ids import new_id

EMPTY_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {}}


class NotACall(ValueError):
    """The model's output is neither a valid call of an offered tool nor an answer the line allows."""


@dataclass(frozen=True, slots=True)
class ClientTool:
    """A client's function as the step schema and the prompt see it."""

    name: str
    description: str
    parameters: dict[str, Any]


def is_client_line(body: ChatCompletionBody, server_tools: set[str]) -> bool:
    """Whether the line's tools are all the client's own (none is a tool of the job's harness)."""
    return bool(body.tools) and not any(t.function.name in server_tools for t in body.tools or [])


def mixed_tools(tools: list[ToolSpec], server_tools: set[str]) -> tuple[list[str], list[str]] | None:
    """(server tools, client tools) of a line that lists both kinds, which pronk refuses; None otherwise."""
    server = [t.function.name for t in tools if t.function.name in server_tools]
    client = [t.function.name for t in tools if t.function.name not in server_tools]
    return (server, client) if server and client else None


def offered(body: ChatCompletionBody) -> tuple[list[ClientTool], bool]:
    """The tools the step may call and whether it may answer instead, from `tool_choice`."""
    tools = [
        ClientTool(t.function.name, t.function.description or "", t.function.parameters or EMPTY_ARGUMENTS)
        for t in body.tools or []
    ]
    choice = body.tool_choice
    if isinstance(choice, NamedToolChoice):
        return [t for t in tools if t.name == choice.function.name], False
    return tools, choice != "required"


def _as_prompt(message: ChatMessage) -> dict[str, Any]:
    """A message of the client's conversation as the model reads it: an assistant's `tool_calls` in the JSON form
    its calls take, everything else as its text."""
    calls = (message.model_extra or {}).get("tool_calls")
    if message.role == "assistant" and isinstance(calls, list) and calls:
        shown = []
        for call in calls:
            function = call.get("function", {}) if isinstance(call, dict) else {}
            try:
                arguments = json.loads(function.get("arguments") or "{}")
            except (TypeError, json.JSONDecodeError):
                arguments = function.get("arguments")
            shown.append(json.dumps({"tool": function.get("name"), "arguments": arguments}))
        return {"role": "assistant", "content": "\n".join(shown)}
    return {"role": message.role, "content": message.text()}


def client_tool_step(body: ChatCompletionBody, chat_step: StepRequest) -> StepRequest:
    """The one step of a client-tool line, from the plain chat step of its body (`completions.to_step_request`: the
    same sampling): the tools listed in a system message, the output constrained to a call of an offered tool (or
    an answer, when `tool_choice` allows one)."""
    tools, allow_final = offered(body)
    prompt = system_prompt(tools)
    if not allow_final:
        prompt += "\nCall a tool now: an answer is not allowed."
    messages = [ChatMessage(role="system", content=prompt)]
    messages += [ChatMessage.model_validate(_as_prompt(m)) for m in body.messages]
    schema = step_schema(tools, allow_final, chat_step.sampling.max_tokens, body.answer_schema)
    sampling = chat_step.sampling.model_copy(update={"json_schema": schema})
    return chat_step.model_copy(update={"messages": messages, "sampling": sampling})


def read_step(body: ChatCompletionBody, result: StepResult) -> tuple[str | None, list[dict[str, Any]] | None]:
    """(answer text, None) or (None, OpenAI `tool_calls`) from the step's output; `NotACall` when it is neither a
    call valid against its tool's schema nor an allowed answer."""
    tools, allow_final = offered(body)
    schemas = {t.name: t.parameters for t in tools}
    call = parse_call(result.text, set(schemas), allow_final, structured=body.answer_schema is not None)
    if isinstance(call, str):
        cut = " (cut at max_tokens)" if result.finish_reason == "length" else ""
        raise NotACall(f"{call}{cut}")
    if "final" in call:
        return call["final"], None
    validator = Draft202012Validator(schemas[call["tool"]], format_checker=Draft202012Validator.FORMAT_CHECKER)
    errors = sorted(validator.iter_errors(call["arguments"]), key=str)
    if errors:
        raise NotACall(f"the call of {call['tool']!r} does not match its parameters: {errors[0].message}")
    tool_call = {
        "id": new_id("call"),
        "type": "function",
        "function": {"name": call["tool"], "arguments": json.dumps(call["arguments"], separators=(",", ":"))},
    }
    return None, [tool_call]
