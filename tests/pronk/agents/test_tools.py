"""The agent tools on their own: sandboxed python with limits, polars SQL, BM25 search, tools by import path."""

from __future__ import annotations

import asyncio

import pytest

from pronk.agents.tools import load_tools, run_tool
from pronk.agents.tools.base import ToolContext
from pronk.agents.tools.python_exec import PythonTool
from pronk.jobs.schema import PythonToolLimits, ToolsConfig
from pronk.settings import get_settings


def call(tool, arguments, tmp_path, timeout_s=20.0):
    return asyncio.run(run_tool(tool, arguments, ToolContext("t", tmp_path / "scratch"), timeout_s, 2000))


@pytest.fixture(scope="module")
def tools():
    return load_tools(
        ToolsConfig(
            enabled=["python", "sql", "search", "spawn_subagents", "tests.pronk.agents.tool_fixtures:ExplodingTool"]
        ),
        get_settings().sandbox_bwrap,
    )


def test_python_runs_code_and_returns_what_it_prints(tools, tmp_path):
    outcome = call(
        tools["python"], {"code": "import json, math\nprint(json.dumps({'pi': round(math.pi, 2)}))"}, tmp_path
    )
    assert outcome.ok and outcome.text.strip() == '{"pi": 3.14}'


@pytest.mark.parametrize(
    ("code", "shown"),
    [("12 * 34", "408"), ("x = 2\nx ** 10", "1024"), ("'a' + 'b'", "'ab'"), ("x = 1", ""), ("print('hi')", "hi")],
)
def test_python_shows_the_value_of_a_last_expression_as_a_notebook_does(tools, tmp_path, code, shown):
    outcome = call(tools["python"], {"code": code}, tmp_path)
    assert outcome.ok and outcome.text.strip() == (shown or "(no output)")


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("while True:\n    pass", "CPU time limit of 1s exceeded"),
        ("import time\ntime.sleep(60)", "wall time limit of 2s exceeded"),
        ("while True:\n    print('x' * 1000)", "output limit"),
        ("x = bytearray(1 << 31)", "MemoryError"),
        ("print(open('/etc/hostname').read())", "No such file or directory: '/etc/hostname'"),
        ("import socket\nsocket.create_connection(('127.0.0.1', 80))", "ConnectionRefusedError"),
        ("import subprocess\nsubprocess.run(['cat', '/etc/hostname'], check=True)", "CalledProcessError"),
        ("raise ValueError('boom')", "ValueError: boom"),
    ],
    ids=["cpu", "wall", "output", "memory", "file-outside", "network", "subprocess", "raises"],
)
def test_python_limits_and_confinement_become_tool_errors(tmp_path, code, expected):
    wall_s = 2 if "sleep" in code else 30
    tool = PythonTool(
        PythonToolLimits(cpu_s=1, wall_s=wall_s, memory_mb=256, output_bytes=1024), get_settings().sandbox_bwrap
    )
    outcome = call(tool, {"code": code}, tmp_path)
    assert not outcome.ok and expected in outcome.text
    assert outcome.seconds < 30


def test_python_may_write_inside_its_scratch_folder(tools, tmp_path):
    outcome = call(
        tools["python"], {"code": "open('notes.txt', 'w').write('kept')\nprint(open('notes.txt').read())"}, tmp_path
    )
    assert outcome.ok and outcome.text.strip() == "kept"
    assert (tmp_path / "scratch" / "notes.txt").read_text() == "kept"


def test_sql_queries_the_shipped_tables(tools, tmp_path):
    query = (
        "SELECT c.name, SUM(o.amount_usd) AS total FROM companies c JOIN orders o ON c.company_id = o.company_id "
        "GROUP BY c.name ORDER BY total DESC LIMIT 1"
    )
    outcome = call(tools["sql"], {"query": query}, tmp_path)
    assert outcome.ok and outcome.text.splitlines() == ["name,total", "Delta Freight,1150000"]
    bad = call(tools["sql"], {"query": "SELEC nonsense"}, tmp_path)
    assert not bad.ok and bad.text.startswith("sql:")


def test_search_ranks_the_corpus(tools, tmp_path):
    outcome = call(tools["search"], {"query": "tool call gap", "k": 2}, tmp_path)
    assert outcome.ok and outcome.text.startswith("1. Tool-call gaps [tool-call-gap]")
    assert not call(tools["search"], {"query": "x", "k": 99}, tmp_path).ok


def test_a_search_snippet_is_the_passage_that_matches_the_query(tools, tmp_path):
    """The prefix-caching note's eviction order comes after its first 200 characters."""
    outcome = call(tools["search"], {"query": "order cached prefix blocks evicted", "k": 1}, tmp_path)
    snippet = outcome.text.split(": ", 1)[1]
    assert outcome.ok and "least-recently-used" in snippet and snippet.startswith("… ")
    assert len(snippet.removeprefix("… ").removesuffix(" …")) <= 200


def test_a_raising_or_stuck_tool_is_contained(tools, tmp_path):
    outcome = call(tools["explode"], {"why": "test"}, tmp_path)
    assert not outcome.ok and "RuntimeError: kaboom" in outcome.text
    stuck = load_tools(ToolsConfig(enabled=["tests.pronk.agents.tool_fixtures:StuckTool"]), "bwrap")["stuck"]
    outcome = call(stuck, {}, tmp_path, timeout_s=0.5)
    assert not outcome.ok and "timed out after 0.5s" in outcome.text


def test_bad_tool_entries_are_refused_by_name():
    with pytest.raises(ValueError, match="nope"):
        load_tools(ToolsConfig(enabled=["nope"]), "bwrap")
    with pytest.raises(ValueError, match="given twice"):
        load_tools(ToolsConfig(enabled=["sql", "sql"]), "bwrap")
