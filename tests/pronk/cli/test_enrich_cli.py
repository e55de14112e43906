"""`pronk enrich show` and a refused `pronk enrich run`, as a user runs them (subprocesses, no server)."""

from __future__ import annotations

import json

import polars as pl
import yaml

from pronk.enrich.answers import AnswerParser
from pronk.enrich.history import EnrichRun, History
from pronk.enrich.spec import load_spec
from pronk.enrich.table import merge, plan, read_rows, write_version
from pronk.settings import Settings
from tests.pronk.cli.test_cli import local_env, pronk

SPEC = {
    "table": "t.csv",
    "key": "id",
    "prompt": "About {name}",
    "outputs": {"sector": {"type": "string", "description": "Sector."}},
}


def test_show_prints_the_head_and_the_history(tmp_path):
    pl.DataFrame({"id": [1, 2], "name": ["Acme", "Borealis"]}).write_csv(tmp_path / "t.csv")
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump({**SPEC, "table": str(tmp_path / "t.csv"), "results": str(tmp_path / "out")}))
    spec, settings = load_spec(path), Settings(data_dir=tmp_path)
    first = plan(spec, read_rows(spec, settings), None)
    answers = {i: AnswerParser(spec).parse(json.dumps({"sector": "robots"})) for i in first.todo}
    version = write_version(str(tmp_path / "out"), "r1", merge(spec, first, answers, "r1", "t1"), settings)
    History(str(tmp_path / "out"), settings).append(
        EnrichRun(
            run_id="run-one",
            spec="small",
            started_at="t0",
            finished_at="t1",
            rows=2,
            new=2,
            changed=0,
            retried=0,
            skipped=0,
            failed=0,
            steps=3,
            cost_usd=0.0,
            tasks_per_dollar=None,
            version_uri=version,
            duration_s=1.0,
        )
    )
    shown = pronk(local_env(tmp_path), "enrich", "show", str(path))
    assert shown.returncode == 0, shown.stderr
    assert "run-one" in shown.stdout and "steps=3" in shown.stdout
    assert "Borealis" not in shown.stderr and "robots" in shown.stderr and "current.parquet" in shown.stderr


def test_run_refuses_a_bad_spec_naming_key_and_value_and_writes_nothing(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**SPEC, "outputs": {"when": {"type": "datetime", "description": "d"}}}))
    refused = pronk(local_env(tmp_path), "enrich", "run", str(path))
    assert refused.returncode == 1
    assert "outputs.when.type" in refused.stderr and "'datetime'" in refused.stderr
    assert not (tmp_path / "store").exists()
