"""A row's answer made into typed column values, or the reason it cannot be: every answer is hostile until validated.

The answer was constrained to the output schema while it was generated (structured outputs), but a
step cut at its token budget, a model that ignores the constraint, or an engine without it can still
hand back anything; what does not parse and validate here becomes the row's `_error`, never a column value.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import polars as pl
from jsonschema import Draft202012Validator

from pronk.enrich.spec import EnrichSpec
from pronk.protocol.checks import CheckStatus

MAX_ANSWER_CHARS = 200_000
INT64 = (-(2**63), 2**63 - 1)
DTYPES: dict[str, pl.DataType] = {
    "string": pl.String(),
    "integer": pl.Int64(),
    "number": pl.Float64(),
    "boolean": pl.Boolean(),
}


def dtype_of(type_name: str) -> pl.DataType:
    if type_name.startswith("list["):
        return pl.List(DTYPES[type_name[5:-1]])
    return DTYPES[type_name]


def output_schema(spec: EnrichSpec) -> dict[str, pl.DataType]:
    """The polars dtypes of the output columns."""
    return {name: dtype_of(column.type) for name, column in spec.outputs.items()}


@dataclass(slots=True)
class Answer:
    values: dict[str, Any]
    error: str | None = None
    check: CheckStatus = "unchecked"
    """How the answer checked against the row's labels (`unchecked`: the row has none)."""


class AnswerParser:
    """Parses and validates answers against one spec's output schema."""

    def __init__(self, spec: EnrichSpec):
        self.spec = spec
        self.validator = Draft202012Validator(spec.output_schema())

    def failed(self, error: str) -> Answer:
        return Answer({name: None for name in self.spec.outputs}, error)

    def parse(self, text: str | None) -> Answer:
        if not isinstance(text, str):
            return self.failed("no answer")
        if len(text) > MAX_ANSWER_CHARS:
            return self.failed(f"answer of {len(text)} characters is longer than {MAX_ANSWER_CHARS}")
        try:
            value = json.loads(text, parse_constant=_refuse_constant)
        except (ValueError, RecursionError) as exc:
            return self.failed(f"unparseable answer ({exc}): {text[:120]!r}")
        problems = sorted(self.validator.iter_errors(value), key=lambda e: list(e.absolute_path))
        if problems:
            where = ".".join(str(p) for p in problems[0].absolute_path) or "answer"
            return self.failed(f"answer does not match the output schema at {where}: {problems[0].message[:200]}")
        for name, column in self.spec.outputs.items():
            problem = _out_of_range(value[name], column.type)
            if problem:
                return self.failed(f"answer column {name}: {problem}")
        return Answer({name: value[name] for name in self.spec.outputs})


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


def _out_of_range(value: Any, type_name: str) -> str | None:
    items = value if type_name.startswith("list[") else [value]
    for item in items:
        if isinstance(item, int) and not isinstance(item, bool) and not INT64[0] <= item <= INT64[1]:
            return f"integer {item} does not fit 64 bits"
        if isinstance(item, float) and not math.isfinite(item):
            return f"number {item} is not finite"
    return None
