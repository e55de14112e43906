"""The agent training set: generated tasks of the held-out set's families, whose checks are computed or looked up.

`pronk improve training-set` writes `data/labelled/agent-train.jsonl` from a seed, deterministically.
Each line is a copy of the held-out set's (`data/labelled/agent.jsonl`) first line of its family (the part of its
custom id before the first `-`: arith, lookup, search) with only the custom id, the user's question and the check
changed, so system prompts, tools, tool_choice, harness options and sampling are the held-out lines' own.

- **arith**: expressions of the held-out shapes, their values computed here (Python's arithmetic, as the python
  tool's would be).
- **lookup**: one field of one company, or an aggregate, each answer read by running its SQL through the job's own
  `sql` tool over the same tables.
- **search**: facts of the corpus, each kept only if the job's own `search` tool, asked the question, returns
  text the check passes on.

No task repeats a held-out question or a held-out prompt's example, nor asks a company fact that any held-out
question asks (whatever its family), nor is passed by echoing its own question; every check is run on its expected
answer before the line is written.

Each line also carries, beside its check, a `reference`: `call`, the tool call its answer came from (the expression,
the SQL, the question as the search query) in the harness's `{"tool", "arguments"}` form, and `answer`, what a right
final answer says. Batches ignore it; the improve loop shows it as a hint to a task none of its rollouts solved
(`pronk.improve.hints`).
"""

from __future__ import annotations

import ast
import asyncio
import copy
import csv
import io
import json
import operator
import random
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from pronk.agents.checks import run_check
from pronk.agents.tools.base import Tool, ToolContext
from pronk.protocol.checks import Check
from pronk.settings import PROJECT_ROOT

HELD_OUT = PROJECT_ROOT / "data" / "labelled" / "agent.jsonl"
TRAINING_SET = PROJECT_ROOT / "data" / "labelled" / "agent-train.jsonl"
PER_FAMILY = {"arith": 70, "lookup": 80, "search": 96}
"""The most tasks of each family (search has fewer facts than that to ask)."""

COMPANY_FIELDS = {
    "founded": ("In which year was {name} founded?", "founded"),
    "employees": ("How many employees does {name} have?", "employ"),
    "country": ("What is the country code of {name}?", "country"),
    "industry": ("What is the industry of {name}?", "industry"),
    "domain": ("What is the domain of {name}?", "domain"),
}
"""A company field: its question (the held-out phrasing) and the word that marks a held-out line asking it."""

SEARCH_FACTS: list[tuple[list[str], str]] = [
    (["In which country was Acme Robotics founded?", "Where was Acme Robotics founded?"], r"united states"),
    (["What does Acme Robotics build?", "Which products does Acme Robotics make?"], r"welding|vision kit"),
    (["To which plants does Acme Robotics mostly sell?", "Who are Acme Robotics' main customers?"], r"automotive"),
    (["What nationality is Delta Freight?", "In which country is Delta Freight based?"], r"dutch|netherlands"),
    (["Where does Delta Freight run its contracts?", "In which region does Delta Freight operate?"], r"europe"),
    (
        ["What does each input line of a batch yield?", "How many output lines does one batch input line give?"],
        r"output line|error line|exactly one",
    ),
    (["What does the batch object report?", "Which counts does a batch object report?"], r"request counts|usage"),
    (["Within what is a batch processed?", "How is an OpenAI-style batch processed?"], r"completion window|async"),
    (["How do sub-agents run?", "Do sub-agents run one after another?"], r"concurrently"),
    (["What does each sub-agent start from?", "Where does a sub-agent's conversation start?"], r"parent"),
    (["What does the key-value cache grow with?", "What makes the KV cache grow?"], r"tokens in flight"),
    (["What does the scheduler do when the KV cache is full?", "What happens when the KV cache is full?"], r"preempt"),
    (["What are MLflow traces made of?", "What do MLflow traces consist of?"], r"spans"),
    (["What does MLflow track?", "What does MLflow keep a record of?"], r"experiments"),
    (["What execution modes does Polars have?", "Is Polars lazy or eager?"], r"lazy|eager"),
    (["What does Polars' SQL context run?", "Which statements run in Polars' SQL context?"], r"select"),
    (["What does Prefect orchestrate?", "What does Prefect coordinate?"], r"flows|tasks"),
    (["Where does Prefect record states?", "What keeps the states of Prefect's flows?"], r"server"),
    (["What do agent traces re-read at every step?", "What does an agent trace read again each step?"], r"prefix"),
    (
        ["Which routing policy sends each request to the next worker in turn?", "Which policy takes workers in turn?"],
        r"round[- ]robin",
    ),
    (
        ["Which routing policy picks the worker with the fewest requests?", "Which policy favours an idle worker?"],
        r"least[- ]loaded",
    ),
    (["What is the idle time between a tool call and its result?", "What is a tool-call gap?"], r"gap|idle time"),
    (["What kind of attention does vLLM use?", "Which attention does vLLM serve models with?"], r"paged"),
    (["What kind of batching does vLLM do?", "How does vLLM batch requests?"], r"continuous"),
    (["What does a small KV cache create?", "What does a small key-value cache lead to?"], r"memory pressure"),
    (
        ["What do a trace's key-value blocks become during a tool-call gap?", "What happens to KV blocks in a gap?"],
        r"eviction candidate",
    ),
    (["What keeps a trace's prefix warm until its next step?", "How is a prefix kept warm through a gap?"], r"pin"),
    (["What lets a Prefect flow run on a work pool?", "How does a flow run on a Prefect work pool?"], r"deployment"),
    (
        ["How many task runs a second does a Prefect server record?", "How fast does Prefect record task runs?"],
        r"dozen",
    ),
]
"""Facts of `data/corpus`: questions asking one (without " Search the corpus.") and a pattern of the answer."""

PROFILED_COMPANIES = (
    "Borealis Foods",
    "Cobalt Analytics",
    "Granite Health",
    "Ion Mobility",
    "Kestrel Drones",
    "Lumen Lighting",
    "Nimbus Cloud",
    "Vela Shipping",
)
"""The companies `data/corpus` has a profile of (none that a held-out line asks about), each stating the founding year
and head count the companies table has. Asking one makes the model pick the asked number out of a text holding two."""

COMPANY_NUMBER_QUESTIONS = {
    "founded": ("In which year was {name} founded?", "When was {name} founded?"),
    "employees": ("About how many people does {name} employ?", "How many employees does {name} have?"),
}
"""Two phrasings of each number a profile states, by its column in the companies table."""

_OPERATORS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
}


def task_family(custom_id: str) -> str:
    """A labelled task's family: its custom id up to the first `-` (`arith-07` and `arith-train-007` are arith)."""
    return custom_id.split("-", 1)[0]


def evaluate(expression: str) -> float:
    """The value of an arithmetic expression of integers and + - * / **."""

    def value(node: ast.AST) -> Any:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        raise ValueError(f"not plain arithmetic: {ast.dump(node)}")

    return value(ast.parse(expression, mode="eval").body)


def arithmetic_expressions(rng: random.Random) -> list[str]:
    """Expressions of the held-out shapes, in the order drawn, without repeats."""
    shapes: list[Callable[[], str]] = [
        lambda: f"{rng.randint(11, 99)} * {rng.randint(11, 99)}",
        lambda: f"{rng.randint(1000, 9999)} + {rng.randint(1000, 9999)}",
        lambda: f"{rng.randint(500, 5000)} - {rng.randint(10, 499)}",
        lambda: f"{rng.randint(2, 9)} ** {rng.randint(2, 6)}",
        lambda: f"{(a := rng.randint(11, 30))} * {a} + {rng.randint(1, 99)}",
        lambda: f"{rng.randint(2, 12)} * {rng.randint(2, 12)} * {rng.randint(2, 12)}",
        lambda: f"{(d := rng.randint(2, 25)) * rng.randint(2, 40)} / {d}",
        lambda: " + ".join(str(rng.randint(10, 300) * 1000) for _ in range(3)),
    ]
    expressions: list[str] = []
    while len(expressions) < 4 * PER_FAMILY["arith"]:
        expression = rng.choice(shapes)()
        if expression not in expressions:
            expressions.append(expression)
    return expressions


def run_tool(tool: Tool, arguments: dict[str, Any]) -> str:
    with tempfile.TemporaryDirectory(prefix="pronk-training-tasks-") as scratch:
        return asyncio.run(tool.run(arguments, ToolContext(trace_id="training-tasks", scratch_dir=Path(scratch))))


def sql_value(sql: Tool, query: str) -> str:
    """The single value `query` selects, as the sql tool returns it."""
    rows = list(csv.reader(io.StringIO(run_tool(sql, {"query": query}))))
    if len(rows) != 2 or len(rows[1]) != 1:
        raise ValueError(f"{query!r} returned {rows!r}, not one value")
    return rows[1][0]


def _column(sql: Tool, query: str) -> list[str]:
    """The one column `query` selects, as the sql tool returns it."""
    return [row[0] for row in csv.reader(io.StringIO(run_tool(sql, {"query": query})))][1:]


Task = tuple[str, dict[str, Any], dict[str, Any]]
"""A generated task: its question, its check, and the reference tool call its answer came from."""


def reference_call(tool: str, **arguments: str) -> dict[str, Any]:
    """A tool call in the harness's form, as a model's turn writes it."""
    return {"tool": tool, "arguments": arguments}


def sql_tasks(sql: Tool, held_out: list[str]) -> list[Task]:
    """(question, check, reference) of every company field no held-out question asks, then aggregates, each answer
    from `sql`."""
    tasks = []
    for name in _column(sql, "SELECT name FROM companies ORDER BY company_id"):
        for field, (question, marker) in COMPANY_FIELDS.items():
            if any(name in text and marker in text for text in held_out):
                continue
            query = f"SELECT {field} FROM companies WHERE name = '{name}'"
            tasks.append(
                (
                    f"{question.format(name=name)} Query the companies table with sql.",
                    _check_of(sql_value(sql, query)),
                    reference_call("sql", query=query),
                )
            )
    aggregates = [("How many rows does the orders table have? Use sql with COUNT(*).", "SELECT COUNT(*) FROM orders")]
    for word, function in [("smallest", "MIN"), ("total", "SUM")]:
        aggregates.append(
            (
                f"What is the {word} amount_usd in the orders table? Use sql with {function}.",
                f"SELECT {function}(amount_usd) FROM orders",
            )
        )
    for word, function, column in [
        ("largest number of employees", "MAX", "employees"),
        ("smallest number of employees", "MIN", "employees"),
        ("earliest founded year", "MIN", "founded"),
        ("latest founded year", "MAX", "founded"),
    ]:
        aggregates.append(
            (
                f"What is the {word} in the companies table? Use sql with {function}.",
                f"SELECT {function}({column}) FROM companies",
            )
        )
    for year in (2023, 2024, 2025):
        aggregates.append(
            (
                f"How many orders in the orders table are from the year {year}? Use sql with COUNT(*).",
                f"SELECT COUNT(*) FROM orders WHERE year = {year}",
            )
        )
    for industry in _column(sql, "SELECT DISTINCT industry FROM companies ORDER BY industry"):
        aggregates.append(
            (
                f"How many companies in the companies table are in the {industry} industry? Use sql with COUNT(*).",
                f"SELECT COUNT(*) FROM companies WHERE industry = '{industry}'",
            )
        )
    return tasks + [
        (question, _check_of(sql_value(sql, query)), reference_call("sql", query=query))
        for question, query in aggregates
    ]


def _check_of(answer: str) -> dict[str, Any]:
    """A held-out lookup's check of `answer`: a number, a country code as a word, or the text itself."""
    if re.fullmatch(r"-?\d+", answer):
        return {"type": "number", "expected": int(answer)}
    if re.fullmatch(r"[A-Z]{2}", answer):
        return {"type": "regex", "pattern": rf"\b{answer}\b", "ignore_case": True}
    return {"type": "regex", "pattern": re.escape(answer), "ignore_case": True}


def search_tasks(search: Tool, sql: Tool) -> list[Task]:
    """(question, check, reference) of each corpus fact (`SEARCH_FACTS`, and the numbers of `PROFILED_COMPANIES`,
    read from the companies table with `sql`) whose answer the search tool returns for the question itself."""
    facts: list[tuple[list[str], dict[str, Any], dict[str, Any]]] = []
    for questions, pattern in SEARCH_FACTS:
        check = {"type": "regex", "pattern": pattern, "ignore_case": True}
        facts.append((questions, check, check))
    for name in PROFILED_COMPANIES:
        for column, phrasings in COMPANY_NUMBER_QUESTIONS.items():
            number = sql_value(sql, f"SELECT {column} FROM companies WHERE name = '{name}'")
            returned = {"type": "regex", "pattern": rf"\b{number}\b"}
            facts.append(([q.format(name=name) for q in phrasings], _check_of(number), returned))
    tasks = []
    for questions, check, returned in facts:
        for question in questions:
            if _passes(returned, run_tool(search, {"query": question})):
                tasks.append((f"{question} Search the corpus.", check, reference_call("search", query=question)))
    return tasks


def _passes(check: dict[str, Any], answer: str) -> bool:
    result = asyncio.run(run_check(TypeAdapter(Check).validate_python(check), answer))
    return result.status == "passed"


def _question(line: dict[str, Any]) -> str:
    return line["body"]["messages"][-1]["content"]


def training_lines(tools: dict[str, Tool], held_out: list[dict[str, Any]], seed: int = 0) -> list[dict[str, Any]]:
    """The training set's lines, in family order, from the held-out lines (templates, and questions to avoid)."""
    rng = random.Random(seed)
    templates: dict[str, dict[str, Any]] = {}
    for line in held_out:
        templates.setdefault(task_family(line["custom_id"]), line)
    texts = [m["content"] for line in held_out for m in line["body"]["messages"]]
    arithmetic: list[Task] = []
    for expression in arithmetic_expressions(rng):
        expected = evaluate(expression)
        number = int(expected) if float(expected).is_integer() else expected
        question = f"Use python to compute {expression}. Then answer with the number."
        check = {"type": "number", "expected": number, "tolerance": 0.001}
        arithmetic.append((question, check, reference_call("python", code=expression)))
    generated = {
        "arith": arithmetic,
        "lookup": sql_tasks(tools["sql"], [_question(line) for line in held_out]),
        "search": search_tasks(tools["search"], tools["sql"]),
    }
    lines = []
    for family, candidates in generated.items():
        # Nothing a held-out line (or its prompt's example) asks, and nothing its question alone would pass.
        tasks = [
            (question, check, reference)
            for question, check, reference in candidates
            if not any(question in text for text in texts) and not _passes(check, question)
        ]
        chosen = sorted(rng.sample(range(len(tasks)), min(PER_FAMILY[family], len(tasks))))
        for number, index in enumerate(chosen, start=1):
            question, check, reference = tasks[index]
            answer = _canonical_answer(check)
            if not _passes(check, answer):
                raise ValueError(f"{family} task {question!r}: its check fails its own answer: {check}")
            line = copy.deepcopy(templates[family])
            line["custom_id"] = f"{family}-train-{number:03d}"
            line["body"]["messages"][-1]["content"] = question
            line["check"] = check
            line["reference"] = {"call": reference, "answer": answer}
            lines.append(line)
    return lines


def _canonical_answer(check: dict[str, Any]) -> str:
    """What a right final answer to a generated check says (a regex's answer is the pattern's first alternative)."""
    if check["type"] == "number":
        return f"{check['expected']}"
    return re.sub(r"\\b|\\", "", check["pattern"].split("|")[0]).replace("[- ]", " ")


def write_training_set(tools: dict[str, Tool], seed: int, out: Path) -> int:
    """Write the training set generated with a job's own tools (its `sql` and `search` look answers up) from `seed`
    to `out`; how many lines it has."""
    held_out = [json.loads(raw) for raw in HELD_OUT.read_text().splitlines() if raw.strip()]
    lines = training_lines(tools, held_out, seed)
    out.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return len(lines)
