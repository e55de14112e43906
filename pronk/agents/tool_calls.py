"""Tool calls as constrained JSON: the step schema built from the tools' schemas, the prompt listing them, the parser.

A step's output is `{"tool": NAME, "arguments": {...}}` or `{"final": TEXT}`. Every string and array
in the schema gets a bound so the whole object fits the step's `max_tokens` (xgrammar enforces
`maxLength`/`maxItems`), which is what makes even a random-weight model's calls parse. Each tool's schema goes in
as the grammar can hold it (`pronk.agents.grammar_schema`): a string with a `pattern` or `format` gets no length
bound, since xgrammar holds no such pair.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from jsonschema import Draft202012Validator

from pronk.agents.grammar_schema import has_local_refs, relaxed, rerooted, resolve

MAX_ARRAY_ITEMS = 4
FINAL_START = re.compile(r'\s*\{\s*"final"')
"""How a final answer begins: an output that does not parse but begins so was no tool call."""


def _cap_arrays(schema: Any) -> Any:
    if isinstance(schema, dict):
        schema = {k: _cap_arrays(v) for k, v in schema.items()}
        if schema.get("type") == "array":
            schema["maxItems"] = min(schema.get("maxItems", MAX_ARRAY_ITEMS), MAX_ARRAY_ITEMS)
        return schema
    if isinstance(schema, list):
        return [_cap_arrays(v) for v in schema]
    return schema


def _string_slots(schema: Any, root: Any, seen: frozenset[str] = frozenset()) -> int:
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            return 0 if ref in seen else _string_slots(resolve(root, ref), root, seen | {ref})
        if schema.get("type") == "string":
            return 1
        if schema.get("type") == "array":
            items = _string_slots(schema.get("items", {}), root, seen)
            return schema.get("maxItems", MAX_ARRAY_ITEMS) * max(items, 1)
        branches = [_string_slots(b, root, seen) for key in ("anyOf", "oneOf") for b in schema.get(key, [])]
        properties = schema.get("properties", {}).values()
        return max(branches, default=0) + sum(_string_slots(v, root, seen) for v in properties)
    return 0


def _cap_strings(schema: Any, chars: int) -> Any:
    if isinstance(schema, dict):
        schema = {k: _cap_strings(v, chars) for k, v in schema.items()}
        bounded = "enum" in schema or "const" in schema or "pattern" in schema or "format" in schema
        if schema.get("type") == "string" and not bounded:
            schema["maxLength"] = min(schema.get("maxLength", chars), chars)
        return schema
    if isinstance(schema, list):
        return [_cap_strings(v, chars) for v in schema]
    return schema


def step_schema(
    tools: list[Any], allow_final: bool, max_tokens: int, answer_schema: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The JSON schema of one step's output, bounded to fit `max_tokens`; `answer_schema` constrains the final
    answer (a line's `response_format`), which is otherwise a string. A schema with local `$ref`s is held in the
    root's `$defs` (as `tool:NAME`, or `final`) and the step refers to it there."""
    defs: dict[str, Any] = {}

    def for_grammar(key: str, schema: dict[str, Any]) -> dict[str, Any]:
        view = _cap_arrays(relaxed(schema))
        if not has_local_refs(view):
            return view
        defs[key] = rerooted(view, f"#/$defs/{key}")
        return {"$ref": f"#/$defs/{key}"}

    branches: list[dict[str, Any]] = [
        {
            "type": "object",
            "properties": {"tool": {"const": t.name}, "arguments": for_grammar(f"tool:{t.name}", t.parameters)},
            "required": ["tool", "arguments"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    if allow_final:
        branches.append(
            {
                "type": "object",
                "properties": {"final": for_grammar("final", answer_schema) if answer_schema else {"type": "string"}},
                "required": ["final"],
                "additionalProperties": False,
            }
        )
    schema = branches[0] if len(branches) == 1 else {"anyOf": branches}
    if defs:
        schema = {"$defs": defs, **schema}
    chars = max(8, (max_tokens - 24) // max(_string_slots(schema, schema), 1) - 8)
    return _cap_strings(schema, chars)


def system_prompt(tools: list[Any]) -> str:
    lines = [
        "You are an agent. Each turn, reply with one JSON object: either "
        '{"tool": NAME, "arguments": {...}} to call a tool, or {"final": ANSWER} when done.',
        "Tools:",
    ]
    for t in tools:
        lines.append(f"- {t.name}: {t.description} Arguments schema: {json.dumps(t.parameters, sort_keys=True)}")
    return "\n".join(lines)


def parse_call(text: str, tools: set[str], allow_final: bool, structured: bool = False) -> dict[str, Any] | str:
    """The step's call, or a message saying why it is unusable.

    With `structured` (the line has a `response_format`) the final answer may be any JSON value; it is
    returned as compact JSON text, for the caller to validate against its schema.
    """
    try:
        call = json.loads(text, strict=False)
    except json.JSONDecodeError as exc:
        return f"unparsable step output ({exc.msg} at {exc.pos}): {text[:120]!r}"
    except RecursionError:
        return f"unparsable step output (nested too deeply): {text[:120]!r}"
    if isinstance(call, dict) and allow_final and structured and call.get("final") is not None:
        return {"final": json.dumps(call["final"], separators=(",", ":"))}
    if isinstance(call, dict) and allow_final and isinstance(call.get("final"), str):
        return {"final": call["final"]}
    if isinstance(call, dict) and call.get("tool") in tools and isinstance(call.get("arguments"), dict):
        return {"tool": call["tool"], "arguments": copy.deepcopy(call["arguments"])}
    return f"step output is not a call of {sorted(tools)}: {text[:120]!r}"


def tool_call_validity(
    text: str, call: dict[str, Any] | str, schemas: dict[str, dict[str, Any]]
) -> tuple[bool | None, bool | None]:
    """Whether a step's output meant as a tool call parsed as one, and whether the call was valid.

    `call` is `parse_call`'s reading of `text`; `schemas` holds the arguments' schemas of the tools the step
    offered. A call parsed when it is `{"tool": NAME, "arguments": {...}}`, and is valid when NAME is one of those
    tools and the arguments are valid against its schema (constrained decoding should make every call valid, but
    a truncated output or a schema keyword the grammar does not enforce slips through; the harness runs such a
    call all the same). `(None, None)`: no tool call was meant, as the output is (or begins as) a final answer
    or the step offered no tool.
    """
    if isinstance(call, dict):
        if "final" in call:
            return None, None
        return True, Draft202012Validator(schemas[call["tool"]]).is_valid(call["arguments"])
    if not schemas:
        return None, None
    try:
        loaded = json.loads(text, strict=False)
    except (json.JSONDecodeError, RecursionError):
        return (None, None) if FINAL_START.match(text) else (False, False)
    if isinstance(loaded, dict) and "final" in loaded and "tool" not in loaded:
        return None, None
    parsed = (
        isinstance(loaded, dict) and isinstance(loaded.get("tool"), str) and isinstance(loaded.get("arguments"), dict)
    )
    return parsed, False
