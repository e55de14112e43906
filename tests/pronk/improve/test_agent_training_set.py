"""The agent training set: what its script writes, valid for the job, shaped as the held-out set, disjoint from it."""

from __future__ import annotations

import ast
import asyncio
import json
import re
from collections import Counter

import pytest
from pydantic import TypeAdapter

from pronk.agents.checks import run_check
from pronk.agents.tools import job_tools
from pronk.batches.input import validate_input
from pronk.improve.agent_training_set import (
    HELD_OUT,
    PROFILED_COMPANIES,
    TRAINING_SET,
    evaluate,
    run_tool,
    task_family,
    training_lines,
)
from pronk.jobs.catalog import resolve_job
from pronk.protocol.checks import Check
from pronk.settings import get_settings


def read(path) -> list[dict]:
    return [json.loads(raw) for raw in path.read_text().splitlines() if raw.strip()]


@pytest.fixture(scope="module")
def held_out() -> list[dict]:
    return read(HELD_OUT)


@pytest.fixture(scope="module")
def training() -> list[dict]:
    return read(TRAINING_SET)


def question(line: dict) -> str:
    return line["body"]["messages"][-1]["content"]


def test_the_committed_set_is_what_the_script_writes(held_out, training):
    assert training_lines(job_tools(resolve_job("smollm2-cpu", get_settings()), "bwrap"), held_out, seed=0) == training


def test_it_is_large_every_line_valid_for_the_job_and_checked(training):
    assert len(training) >= 180
    assert set(Counter(task_family(line["custom_id"]) for line in training)) == {"arith", "lookup", "search"}
    validated = validate_input(TRAINING_SET.read_bytes(), resolve_job("smollm2-cpu", get_settings()))
    assert validated.errors == [] and len(validated.requests) == len(training)
    assert all(request.check is not None for request in validated.requests)
    assert len({line["custom_id"] for line in training}) == len(training)


def test_it_shares_nothing_with_the_held_out_set(held_out, training):
    held_out_questions = {question(line) for line in held_out}
    held_out_lines = {json.dumps(line, sort_keys=True) for line in held_out}
    assert not held_out_questions & {question(line) for line in training}
    assert not held_out_lines & {json.dumps(line, sort_keys=True) for line in training}
    assert not {line["custom_id"] for line in held_out} & {line["custom_id"] for line in training}


def test_no_profiled_company_is_one_a_held_out_line_asks_about(held_out):
    asked = " ".join(question(line) for line in held_out)
    assert PROFILED_COMPANIES and not [name for name in PROFILED_COMPANIES if name in asked]


def test_each_line_is_a_held_out_line_of_its_family_but_for_its_question_and_check(held_out, training):
    templates = {}
    for line in held_out:
        templates.setdefault(task_family(line["custom_id"]), []).append(line)
    for line in training:
        family = templates[task_family(line["custom_id"])]
        template = family[0]
        assert list(line) == [*template, "reference"]
        assert {k: v for k, v in line["body"].items() if k != "messages"} == {
            k: v for k, v in template["body"].items() if k != "messages"
        }
        assert line["body"]["messages"][:-1] == template["body"]["messages"][:-1]
        assert line["check"]["type"] in {other["check"]["type"] for other in family}


def test_arithmetic_answers_are_the_expressions_values(training):
    for line in training:
        if task_family(line["custom_id"]) == "arith":
            expression = question(line).removeprefix("Use python to compute ")
            expression = expression.removesuffix(". Then answer with the number.")
            assert evaluate(expression) == pytest.approx(line["check"]["expected"])
            assert evaluate(expression) == eval(compile(ast.parse(expression, mode="eval"), "<arith>", "eval"))


def test_each_reference_is_a_call_of_the_lines_own_tool_that_finds_its_answer_and_an_answer_that_passes(training):
    tools = job_tools(resolve_job("smollm2-cpu", get_settings()), "bwrap")

    def passes(line: dict, text: str) -> bool:
        check = TypeAdapter(Check).validate_python(line["check"])
        return asyncio.run(run_check(check, text)).status == "passed"

    for line in training:
        call = line["reference"]["call"]
        assert call["tool"] == line["body"]["tool_choice"]["function"]["name"]
        assert passes(line, line["reference"]["answer"])
        if call["tool"] == "python":
            expression = question(line).removeprefix("Use python to compute ")
            assert call["arguments"] == {"code": expression.removesuffix(". Then answer with the number.")}
            continue
        result = run_tool(tools[call["tool"]], call["arguments"])
        if line["check"]["type"] == "number" and call["tool"] == "search":
            # A company profile states two numbers; the check's is the one its question asks.
            assert re.search(rf"\b{line['check']['expected']}\b", result), (line["custom_id"], result)
        else:
            assert passes(line, result), (line["custom_id"], result)
