"""A tool's JSON schema as the engine's grammar can hold it.

Workers constrain a step with xgrammar (`pronk.engine.worker.COMPACT_JSON_OUTPUTS`), and vLLM refuses the whole request
when its schema has a keyword xgrammar cannot enforce (`multipleOf`, `uniqueItems`, a `format` it does not know, a
string's `pattern` or `format` beside a length bound, a multi-branch `allOf`, some `propertyNames` and
`patternProperties` pairings) or a `$ref` it cannot resolve. OpenAI takes all of these in a tool's `parameters`, and
pydantic (so `openai.pydantic_function_tool` too) writes nested models as `$defs` with `$ref`s to them.

So the grammar gets a relaxed copy of each schema (`relaxed`): those keywords dropped, nothing else changed. A
schema with local `$ref`s sits under the step schema's root `$defs`, its refs re-rooted there (`rerooted`), since a
ref is read from the root of the schema it is in. What the grammar no longer enforces is checked after the step:
a call is validated against its tool's own schema before anything uses it.
"""

from __future__ import annotations

from typing import Any

XGRAMMAR_STRING_FORMATS = frozenset(
    {
        "email",
        "date",
        "time",
        "date-time",
        "duration",
        "ipv4",
        "ipv6",
        "hostname",
        "uuid",
        "uri",
        "uri-reference",
        "uri-template",
        "json-pointer",
        "relative-json-pointer",
    }
)
"""The string formats xgrammar enforces (vLLM's `STRING_SUPPORTED_FORMATS`); any other `format` is dropped."""

SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
"""Keywords whose value maps names to subschemas."""
SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
"""Keywords whose value is a list of subschemas."""
SCHEMA_VALUES = (
    "items",
    "additionalProperties",
    "unevaluatedProperties",
    "propertyNames",
    "contains",
    "not",
    "if",
    "then",
    "else",
)
"""Keywords whose value is one subschema."""


def _types(schema: dict[str, Any]) -> set[str]:
    declared = schema.get("type")
    if isinstance(declared, str):
        return {declared}
    if isinstance(declared, list):
        return {t for t in declared if isinstance(t, str)}
    return set()


def _pattern_and_length(schema: Any) -> bool:
    return (
        isinstance(schema, dict)
        and ("pattern" in schema or "format" in schema)
        and ("minLength" in schema or "maxLength" in schema)
    )


def _subschemas(schema: dict[str, Any], change: Any) -> dict[str, Any]:
    """`schema` with `change` applied to each of its direct subschemas (never to property names or other values)."""
    out = dict(schema)
    for key in SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: change(sub) for name, sub in out[key].items()}
    for key in SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [change(sub) for sub in out[key]]
    for key in SCHEMA_VALUES:
        if isinstance(out.get(key), dict):
            out[key] = change(out[key])
    return out


def _unenforceable(schema: dict[str, Any]) -> set[str]:
    """The keywords of `schema` itself (not of its subschemas) that make vLLM refuse it under xgrammar."""
    types = _types(schema)
    drop: set[str] = set()
    if types & {"integer", "number"}:
        drop.add("multipleOf")
    if "array" in types:
        drop |= {"uniqueItems", "contains", "minContains", "maxContains"}
    if "string" in types:
        if schema.get("format") not in XGRAMMAR_STRING_FORMATS:
            drop.add("format")
        if "pattern" in schema or schema.get("format") in XGRAMMAR_STRING_FORMATS:
            drop |= {"minLength", "maxLength"}
    if "object" in types:
        if (
            "properties" in schema
            or "patternProperties" in schema
            or schema.get("unevaluatedProperties", True) is not True
            or _pattern_and_length(schema.get("propertyNames"))
        ):
            drop.add("propertyNames")
        patterns = schema.get("patternProperties")
        if isinstance(patterns, dict) and ("properties" in schema or len(patterns) > 1):
            drop.add("patternProperties")
    if isinstance(schema.get("allOf"), list) and len(schema["allOf"]) >= 2:
        drop.add("allOf")
    return drop & schema.keys()


def relaxed(schema: Any) -> Any:
    """A copy of `schema` without the keywords xgrammar cannot enforce; it accepts everything `schema` accepts."""
    if not isinstance(schema, dict):
        return schema
    drop = _unenforceable(schema)
    return _subschemas({k: v for k, v in schema.items() if k not in drop}, relaxed)


def _children(schema: dict[str, Any]) -> list[Any]:
    """The direct subschemas of `schema`."""
    children: list[Any] = []
    for key in SCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            children += schema[key].values()
    for key in SCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            children += schema[key]
    children += [schema[key] for key in SCHEMA_VALUES if isinstance(schema.get(key), dict)]
    return children


def has_local_refs(schema: Any) -> bool:
    """Whether `schema` refers into itself (`"$ref": "#..."`)."""
    if not isinstance(schema, dict):
        return False
    return str(schema.get("$ref", "")).startswith("#") or any(has_local_refs(c) for c in _children(schema))


def rerooted(schema: Any, pointer: str) -> Any:
    """A copy of `schema` whose local refs point into it where it sits at `pointer` (`#/$defs/NAME`) of another
    schema's root: `#` becomes `pointer`, `#/$defs/X` becomes `pointer/$defs/X`."""
    if not isinstance(schema, dict):
        return schema
    out = _subschemas(schema, lambda sub: rerooted(sub, pointer))
    ref = out.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        out["$ref"] = pointer + ref[1:]
    return out


def resolve(root: Any, ref: str) -> Any:
    """What the local ref `ref` (`#/a/b`) points to in `root`; None when it points nowhere."""
    node = root
    for part in ref.removeprefix("#").split("/")[1:]:
        key = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node
