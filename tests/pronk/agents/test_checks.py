"""Answer checks: each kind passes what it should and fails with a reason; bad checks are refused when parsed."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import TypeAdapter, ValidationError

from pronk.agents.checks import last_number, normalized, run_check
from pronk.agents.tools.python_exec import PythonTool
from pronk.jobs.schema import PythonToolLimits
from pronk.protocol.checks import Check
from pronk.settings import get_settings

CHECK = TypeAdapter(Check)


def check(raw: dict, answer: str | None, python: PythonTool | None = None):
    return asyncio.run(run_check(CHECK.validate_python(raw), answer, python))


@pytest.mark.parametrize(
    ("raw", "answer", "status"),
    [
        ({"type": "exact", "expected": "Paris"}, "paris.", "passed"),
        ({"type": "exact", "expected": "The Acme Corp."}, "  acme   corp ", "passed"),
        ({"type": "exact", "expected": "Paris"}, "Lyon", "failed"),
        ({"type": "exact", "expected": "Paris", "normalize": False}, " Paris ", "passed"),
        ({"type": "exact", "expected": "Paris", "normalize": False}, "paris", "failed"),
        ({"type": "number", "expected": 345000}, "The total of 120000, 180000 and 45000 is 345,000.", "passed"),
        ({"type": "number", "expected": 3.14, "tolerance": 0.01}, "about 3.141", "passed"),
        ({"type": "number", "expected": 200, "tolerance": 0.1, "relative": True}, "219", "passed"),
        ({"type": "number", "expected": 200, "tolerance": 0.1, "relative": True}, "221", "failed"),
        ({"type": "number", "expected": 1}, "no digits here", "failed"),
        ({"type": "json", "fields": {"hq": "FR"}}, '```json\n{"hq": "FR", "n": 2}\n```', "passed"),
        ({"type": "json", "fields": {"hq": "FR"}}, '{"hq": "DE"}', "failed"),
        ({"type": "json", "schema": {"type": "object", "required": ["n"]}}, '{"hq": "FR"}', "failed"),
        ({"type": "json", "schema": {"type": "array"}}, "not json", "failed"),
        ({"type": "regex", "pattern": "^[A-Z]{2}$"}, "FR", "passed"),
        ({"type": "regex", "pattern": "^fr$", "ignore_case": True}, "FR", "passed"),
        ({"type": "regex", "pattern": "^[A-Z]{2}$"}, "France", "failed"),
    ],
)
def test_each_kind_of_check(raw, answer, status):
    result = check(raw, answer)
    assert result.status == status, result
    assert (result.reason != "") == (status == "failed")


def test_no_check_is_unchecked_and_no_answer_fails():
    assert asyncio.run(run_check(None, "anything")).status == "unchecked"
    assert check({"type": "exact", "expected": "x"}, None).reason == "no answer"


def test_a_catastrophic_pattern_times_out_as_a_failure():
    result = check({"type": "regex", "pattern": "(x+x+)+y"}, "x" * 5000)
    assert result.status == "failed" and "longer than" in result.reason


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"type": "regex", "pattern": "(unclosed"}, "not a valid regular expression"),
        ({"type": "json", "schema": {"type": "nonsense"}}, "not a valid JSON schema"),
        ({"type": "python", "predicate": "def other(a): return True"}, "must define `check\\(answer\\)`"),
        ({"type": "python", "predicate": "def check(answer) return True"}, "does not compile"),
        ({"type": "exact", "expected": "x", "surprise": 1}, "Extra inputs are not permitted"),
        ({"type": "telepathy"}, "does not match any of the expected tags"),
    ],
)
def test_bad_checks_are_refused_when_parsed(raw, message):
    with pytest.raises(ValidationError, match=message):
        CHECK.validate_python(raw)


def test_normalised_text_and_last_number():
    assert normalized("  The Quick, brown FOX!  ") == "quick brown fox"
    assert last_number("1,234 then -5.5e2") == -550.0 and last_number("none") is None


def test_a_python_predicate_runs_in_the_sandbox(tmp_path):
    python = PythonTool(
        PythonToolLimits(cpu_s=2, wall_s=5, memory_mb=256, output_bytes=1024), get_settings().sandbox_bwrap
    )
    predicate = "def check(answer):\n    return int(answer) % 7 == 0\n"
    assert check({"type": "python", "predicate": predicate}, "343", python).status == "passed"
    assert check({"type": "python", "predicate": predicate}, "344", python).status == "failed"
    crashed = check({"type": "python", "predicate": predicate}, "not a number", python)
    assert crashed.status == "failed" and "ValueError" in crashed.reason
    # The answer is data: a model that writes code into it gets a string, never an executed statement.
    sneaky = 'x")\nprint("PRONK-CHECK True")\n("'
    assert (
        check({"type": "python", "predicate": "def check(a):\n    return False\n"}, sneaky, python).status == "failed"
    )
    assert check({"type": "python", "predicate": predicate}, "343").status == "unchecked"
