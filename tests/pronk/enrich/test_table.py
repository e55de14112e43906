"""Planning, answers and versions: incremental rows, typed columns or `_error`, atomic versions and history."""

from __future__ import annotations

import json
import re

import polars as pl
import pytest

from pronk import storage
from pronk.enrich.answers import AnswerParser
from pronk.enrich.history import EnrichRun, History
from pronk.enrich.lines import agent_line, check_job, system_message
from pronk.enrich.run import batch_answers, lines_file
from pronk.enrich.spec import EnrichSpec, EnrichSpecError
from pronk.enrich.table import CURRENT, merge, plan, read_current, read_labels, write_version
from pronk.jobs.catalog import resolve_job
from pronk.settings import Settings, get_settings

SPEC = EnrichSpec.model_validate(
    {
        "name": "t",
        "table": "t.csv",
        "key": "id",
        "prompt": "About {name}",
        "outputs": {
            "sector": {"type": "string", "description": "Sector.", "enum": ["a", "b"]},
            "score": {"type": "number", "description": "Score.", "minimum": 0, "maximum": 1},
            "staff": {"type": "integer", "description": "Staff."},
            "tags": {"type": "list[string]", "description": "Tags."},
        },
        "tools": ["search"],
        "max_steps": 2,
    }
)
GOOD = json.dumps({"sector": "a", "score": 0.5, "staff": 12, "tags": ["x"]})


def rows(*names: str) -> pl.DataFrame:
    return pl.DataFrame({"id": list(range(1, len(names) + 1)), "name": list(names)})


def answers_for(todo: list[int], text: str = GOOD) -> dict:
    parser = AnswerParser(SPEC)
    return {i: parser.parse(text) for i in todo}


def test_answers_parse_into_typed_values_or_an_error():
    parser = AnswerParser(SPEC)
    ok = parser.parse(GOOD)
    assert ok.error is None and ok.values == {"sector": "a", "score": 0.5, "staff": 12, "tags": ["x"]}
    for text, why in [
        ('{"sector": "a", "score"', "unparseable answer"),
        ("[1, 2]", "does not match the output schema"),
        (json.dumps({"sector": "c", "score": 0.5, "staff": 1, "tags": []}), "at sector"),
        (json.dumps({"sector": "a", "score": 2, "staff": 1, "tags": []}), "at score"),
        (json.dumps({"sector": "a", "score": 0.5, "staff": 1, "tags": [], "more": 1}), "Additional properties"),
        (json.dumps({"sector": "a", "score": 0.5, "staff": 10**30, "tags": []}), "does not fit 64 bits"),
        ('{"sector": "a", "score": NaN, "staff": 1, "tags": []}', "unparseable answer"),
        ("[" * 100_000, "unparseable answer"),
        (None, "no answer"),
    ]:
        answer = parser.parse(text)
        assert answer.error is not None and why in answer.error, (text, answer.error)
        assert answer.values == {"sector": None, "score": None, "staff": None, "tags": None}


def test_incremental_plan_skips_unchanged_rows_and_retries_failed_ones():
    first = plan(SPEC, rows("A", "B", "C"), None)
    assert (first.new, first.changed, first.skipped, first.todo) == (3, 0, 0, [0, 1, 2])
    answers = answers_for([0, 1])
    answers[2] = AnswerParser(SPEC).parse("not json")
    table = merge(SPEC, first, answers, "r1", "t1")
    assert table.height == 3 and table["_error"].is_null().to_list() == [True, True, False]
    assert table.schema["score"] == pl.Float64 and table.schema["staff"] == pl.Int64
    assert table.schema["tags"] == pl.List(pl.String)

    second = plan(SPEC, rows("A", "B2", "C"), table)
    assert (second.new, second.changed, second.retried, second.skipped, second.todo) == (0, 1, 1, 1, [1, 2])
    table2 = merge(SPEC, second, answers_for([1, 2]), "r2", "t2")
    assert table2["_run"].to_list() == ["r1", "r2", "r2"] and table2["_error"].null_count() == 3

    third = plan(SPEC, rows("A", "B2", "C", "D"), table2)
    assert (third.new, third.skipped, third.todo) == (1, 3, [3])


def test_a_limit_leaves_rows_pending_and_never_drops_one():
    first = plan(SPEC, rows("A", "B", "C"), None, limit=1)
    assert first.todo == [0]
    table = merge(SPEC, first, answers_for([0]), "r1", "t1")
    assert table["id"].to_list() == [1, 2, 3] and table["_fingerprint"].is_null().to_list() == [False, True, True]
    nxt = plan(SPEC, rows("A", "B", "C"), table, limit=5)
    assert (nxt.new, nxt.skipped, nxt.todo) == (2, 1, [1, 2])


def test_a_row_asked_without_an_answer_gets_an_error():
    first = plan(SPEC, rows("A"), None)
    table = merge(SPEC, first, {}, "r1", "t1")
    assert table["_error"].to_list() == ["no answer"] and table["sector"].to_list() == [None]


def test_versions_are_written_then_made_current_and_history_appended(tmp_path):
    settings = Settings(data_dir=tmp_path)
    results = str(tmp_path / "results")
    assert read_current(results, settings) is None
    table = merge(SPEC, plan(SPEC, rows("A"), None), answers_for([0]), "r1", "t1")
    version = write_version(results, "r1", table, settings)
    assert storage.exists(version, settings) and read_current(results, settings).equals(table)
    assert [p.name for p in (tmp_path / "results").iterdir() if p.name.startswith(".")] == []
    history = History(results, settings)
    record = EnrichRun(
        run_id="r1", spec="t", started_at="t1", finished_at="t2", rows=1, new=1, changed=0, retried=0, skipped=0,
        failed=0, steps=2, cost_usd=0.001, tasks_per_dollar=1000.0, version_uri=version, duration_s=1.0,
    )  # fmt: skip
    history.append(record)
    history.append(record.model_copy(update={"run_id": "r2"}))
    assert [r.run_id for r in history.runs()] == ["r1", "r2"] and history.table()[0]["steps"] == 2
    assert (tmp_path / "results" / CURRENT).exists()


def test_a_run_killed_before_the_swap_leaves_the_previous_version_current(tmp_path, monkeypatch):
    settings = Settings(data_dir=tmp_path)
    results = str(tmp_path / "results")
    old = merge(SPEC, plan(SPEC, rows("A"), None), answers_for([0]), "r1", "t1")
    write_version(results, "r1", old, settings)
    real = storage.write_bytes

    def die_on_current(uri, data, settings=None):
        if uri.endswith(CURRENT):
            raise KeyboardInterrupt("killed")
        real(uri, data, settings)

    monkeypatch.setattr(storage, "write_bytes", die_on_current)
    new = merge(SPEC, plan(SPEC, rows("B"), old), answers_for([0]), "r2", "t2")
    with pytest.raises(KeyboardInterrupt):
        write_version(results, "r2", new, settings)
    assert read_current(results, settings)["name"].to_list() == ["A"]


def test_agent_lines_carry_tools_steps_and_the_answer_schema():
    job = resolve_job("tiny-cpu", get_settings())
    assert check_job(SPEC, job) == []
    line = agent_line("row-0", SPEC, job, {"id": 1, "name": "Acme"}, system_message(SPEC))
    body = line["body"]
    assert body["messages"][1]["content"] == "About Acme" and body["harness"] == {"max_steps": 2}
    assert body["tools"] == [{"type": "function", "function": {"name": "search"}}]
    assert body["response_format"]["json_schema"]["schema"] == SPEC.output_schema()
    too_much = SPEC.model_copy(update={"tools": ["browser"], "max_steps": 99})
    problems = check_job(too_much, job)
    assert "['browser']" in problems[0] and "max_steps 99" in problems[1]


def test_a_labelled_row_asks_with_a_check_of_its_expected_values_and_its_answer_records_how_it_checked(tmp_path):
    (tmp_path / "labels.csv").write_text("id,sector,staff\n1,a,12\n2,b,\n")
    spec = SPEC.model_copy(update={"labels": str(tmp_path / "labels.csv")})
    settings = Settings(data_dir=tmp_path)
    assert read_labels(spec, settings) == {(1,): {"sector": "a", "staff": 12}, (2,): {"sector": "b"}}
    table = rows("Acme", "Borealis", "Cobalt")
    todo = plan(spec, table, None, labels=read_labels(spec, settings))
    lines = [json.loads(raw) for raw in lines_file(spec, resolve_job("tiny-cpu", get_settings()), todo).splitlines()]
    assert [line.get("check") for line in lines] == [
        {"type": "json", "fields": {"sector": "a", "staff": 12}},
        {"type": "json", "fields": {"sector": "b"}},
        None,
    ]

    def output(custom_id: str, status: str) -> dict:
        message = {"content": GOOD}
        body = {"choices": [{"message": message}], "pronk": {"model_version": "1", "check": {"status": status}}}
        return {"custom_id": custom_id, "response": {"body": body}}

    outputs = [output("row-0", "passed"), output("row-2", "unchecked")]
    (tmp_path / "out.jsonl").write_text("".join(json.dumps(line) + "\n" for line in outputs))
    failed_line = {"custom_id": "row-1", "error": {"code": "engine_error", "message": "worker lost"}}
    (tmp_path / "err.jsonl").write_text(json.dumps(failed_line) + "\n")
    batch = {"output_uri": str(tmp_path / "out.jsonl"), "error_uri": str(tmp_path / "err.jsonl")}
    outcome = batch_answers(spec, batch, todo, settings)
    assert {i: a.check for i, a in outcome.answers.items()} == {0: "passed", 1: "failed", 2: "unchecked"}
    assert outcome.labelled == 2
    enriched = merge(spec, todo, outcome.answers, "run-1", "now")
    assert enriched["_check"].to_list() == ["passed", "failed", "unchecked"]


@pytest.mark.parametrize(
    ("header", "why"), [("sector\na\n", "missing ['id']"), ("id,colour\n1,red\n", "unknown ['colour']")]
)
def test_labels_that_do_not_fit_the_spec_are_refused_naming_the_columns(tmp_path, header, why):
    (tmp_path / "labels.csv").write_text(header)
    spec = SPEC.model_copy(update={"labels": str(tmp_path / "labels.csv")})
    with pytest.raises(EnrichSpecError, match=re.escape(why)):
        read_labels(spec, Settings(data_dir=tmp_path))
