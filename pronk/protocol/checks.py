"""How a line's answer is checked: the `check` object a batch line (or a labelled row of an enrichment) carries.

A check is data from an input line, so it is hostile until validated: patterns, schemas and predicates are
bounded in size and compiled here, so a line whose check cannot run is refused with the line's own error
rather than failing later. Running a check against an answer is `pronk.agents.checks`'s.

    {"type": "exact", "expected": "Paris"}                        normalised (case, punctuation, articles) match
    {"type": "exact", "expected": "Paris", "normalize": false}    the answer stripped, equal
    {"type": "number", "expected": 345000, "tolerance": 0.5}      the answer's last number within the tolerance
    {"type": "json", "schema": {...}, "fields": {"hq": "FR"}}     JSON valid against the schema, given fields equal
    {"type": "regex", "pattern": "^[A-Z]{2}$"}                     the pattern found in the answer
    {"type": "python", "predicate": "def check(answer): ..."}     `check(answer)` true, run in the python sandbox
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import regex
from pydantic import BaseModel, ConfigDict, Field, field_validator

from pronk.protocol.bodies import valid_json_schema

CheckStatus = Literal["passed", "failed", "unchecked"]
MAX_EXPECTED_CHARS = 10_000
MAX_PATTERN_CHARS = 1_000
MAX_PREDICATE_CHARS = 4_000


class _Check(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ExactCheck(_Check):
    type: Literal["exact"]
    expected: str = Field(max_length=MAX_EXPECTED_CHARS)
    normalize: bool = Field(
        default=True, description="Compare case-folded, without punctuation, articles or repeated spaces."
    )


class NumberCheck(_Check):
    type: Literal["number"]
    expected: float
    tolerance: float = Field(default=0.0, ge=0, description="Largest difference that still passes.")
    relative: bool = Field(default=False, description="The tolerance is a share of |expected|.")


class JsonCheck(_Check):
    type: Literal["json"]
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema", description="A JSON schema (2020-12).")
    fields: dict[str, Any] = Field(default_factory=dict, description="Top-level keys whose values must be equal.")

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @field_validator("json_schema")
    @classmethod
    def _schema_is_valid(cls, schema: dict[str, Any] | None) -> dict[str, Any] | None:
        return schema if schema is None else valid_json_schema(schema)


class RegexCheck(_Check):
    type: Literal["regex"]
    pattern: str = Field(max_length=MAX_PATTERN_CHARS)
    ignore_case: bool = False

    @field_validator("pattern")
    @classmethod
    def _pattern_compiles(cls, pattern: str) -> str:
        try:
            regex.compile(pattern)
        except regex.error as exc:
            raise ValueError(f"not a valid regular expression: {exc}") from exc
        return pattern


class PythonCheck(_Check):
    type: Literal["python"]
    predicate: str = Field(
        max_length=MAX_PREDICATE_CHARS,
        description="Python source defining `check(answer: str) -> bool`, run in the python tool's sandbox.",
    )

    @field_validator("predicate")
    @classmethod
    def _defines_check(cls, predicate: str) -> str:
        if "def check(" not in predicate:
            raise ValueError("the predicate must define `check(answer)`")
        try:
            compile(predicate, "<predicate>", "exec")
        except SyntaxError as exc:
            raise ValueError(f"the predicate does not compile: {exc.msg} (line {exc.lineno})") from exc
        return predicate


Check = Annotated[ExactCheck | NumberCheck | JsonCheck | RegexCheck | PythonCheck, Field(discriminator="type")]


class CheckResult(BaseModel):
    """What checking one answer gave: `unchecked` when the line had no check or the check could not run."""

    status: CheckStatus
    reason: str = ""
