"""`pronk runs` and `pronk herd profile` over a local store holding hand-made batch records and step records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from pronk.agents.step_records import ToolCallCounts, steps_ndjson
from pronk.batches.report import (
    RunFigures,
    batch_markdown,
    completion_times,
    log_batch_run,
    recent_runs,
    runs_table,
    text_histogram,
)
from pronk.batches.schemas import Batch, BatchUsage, CheckCounts, InputTokensDetails, RequestCounts
from pronk.batches.store import BatchStore
from pronk.settings import Settings
from tests.pronk.herd.test_profile import records

PRONK = str(Path(sys.executable).parent / "pronk")
JOB = "job-c0ffee01"


def make_store(tmp_path: Path) -> Settings:
    settings = Settings(data_dir=tmp_path, storage_uri=str(tmp_path / "store"))
    store = BatchStore(settings)
    for i, (status, created) in enumerate([("completed", 1000), ("failed", 2000)]):
        steps = tmp_path / "out" / f"b{i}_steps.jsonl"
        steps.parent.mkdir(parents=True, exist_ok=True)
        steps.write_bytes(steps_ndjson(records()))
        batch = Batch(
            id=f"batch_{i:024d}",
            input_file_id="file_x",
            job_id=JOB,
            model="pronk-tiny",
            status=status,
            created_at=created,
            in_progress_at=created + 2,
            completed_at=created + 32 if status == "completed" else None,
            failed_at=created + 12 if status == "failed" else None,
            request_counts=RequestCounts(total=4, completed=3, failed=1),
            usage=BatchUsage(
                input_tokens=1000, input_tokens_details=InputTokensDetails(cached_tokens=250), output_tokens=90
            ),
            processing_cost=0.001,
            tasks_per_dollar=3000.0,
            steps_uri=str(steps),
        )
        store.save(batch)
    return settings


def test_recent_runs_newest_first(tmp_path):
    settings = make_store(tmp_path)
    rows = recent_runs(settings, [JOB, "job-00000000"])
    assert [r.status for r in rows] == ["failed", "completed"]
    done = rows[1]
    assert (done.lines, done.completed, done.failed, done.cached_pct) == (4, 3, 1, 25.0)
    assert (done.duration_s, done.tasks_per_dollar, done.model_version) == (30.0, 3000.0, "m/1")
    table = runs_table(rows)
    assert "batch_000000000000000000000000" in table and "25.0%" in table and "3,000 " in table  # counts completed
    assert (done.tasks_counted, done.checked, done.success_rate) == ("completed", 0, None)


def test_completion_times_and_markdown():
    times = completion_times(records())
    assert times == [0.6, 3.1]  # b ends 0.5 + 0.1; a's last step ends at 3.0 + 0.1
    assert len(text_histogram(times, bins=8)) == 8
    figures = figures_of_a_checked_agent_batch()
    text = batch_markdown(figures, times, "http://127.0.0.1:5000/#/x")
    assert (
        "| tasks per dollar (counts passed lines) | 20,000.00 |" in text
        and "| checks passed / checked | 1 / 2 (50%) |" in text
    )
    assert "m/1_x" not in text and "m/1__x_" in text
    assert "p50 3.1 s" in text or "p50 0.6 s" in text
    assert "[MLflow](http://127.0.0.1:5000/#/x)" in text
    assert "| checks failed / lines unchecked | 1 / 3 |" in text and "| tool calls valid / made | 3 / 4 (75%) |" in text
    idle = RunFigures.of(Batch(input_file_id="file_x", job_id=JOB, model="pronk-tiny"))
    assert "| tool calls valid / made | no tool call |" in batch_markdown(idle, [], None)


def figures_of_a_checked_agent_batch() -> RunFigures:
    return RunFigures(
        batch_id="batch_x",
        job_id=JOB,
        status="completed",
        lines=5,
        completed=5,
        failed=0,
        cancelled=0,
        input_tokens=870,
        cached_tokens=224,
        output_tokens=53,
        cached_pct=25.7,
        cost_usd=0.0001,
        tasks_per_dollar=20000.0,
        tasks_counted="passed",
        checked=2,
        passed=1,
        checks_failed=1,
        unchecked=3,
        success_rate=0.5,
        tool_calls=4,
        tool_calls_valid=3,
        tool_call_validity=0.75,
        duration_s=4.0,
        model_version="m/1|<x>",
        created_at=0,
    )


def test_the_figures_carry_checks_and_tool_call_validity_to_the_runs_table_and_mlflow(tmp_path):
    batch = Batch(
        input_file_id="file_x",
        job_id=JOB,
        model="pronk-tiny",
        checks=CheckCounts(passed=1, failed=1, unchecked=3),
        success_rate=0.5,
        tool_calls=ToolCallCounts(total=4, parsed=4, valid=3),
    )
    figures = RunFigures.of(batch)
    assert (figures.passed, figures.checks_failed, figures.unchecked, figures.success_rate) == (1, 1, 3, 0.5)
    assert (figures.tool_calls, figures.tool_calls_valid, figures.tool_call_validity) == (4, 3, 0.75)
    metrics = figures.metrics()
    assert {"passed", "checks_failed", "unchecked", "success_rate", "tool_calls", "tool_calls_valid"} <= set(metrics)
    assert metrics["tool_call_validity"] == 0.75
    assert "calls ok" in runs_table([figures]) and " 75.0% " in runs_table([figures])

    import mlflow

    settings = Settings(data_dir=tmp_path, storage_uri=str(tmp_path / "store"))
    rows = [
        {"custom_id": "a", "state": "completed", "tool_calls_valid": "3/4", "check": "passed"},
        {"custom_id": "b", "state": "error", "check": "failed"},
    ]
    run_id, _ = log_batch_run(figures, [], rows, settings)
    run = mlflow.get_run(run_id)
    assert run.data.metrics["tool_call_validity"] == 0.75 and run.data.metrics["checks_failed"] == 1
    table = mlflow.load_table("lines.json", run_ids=[run_id])
    assert table["check"].tolist() == ["passed", "failed"] and table["custom_id"].tolist() == ["a", "b"]


def test_runs_and_profile_commands(tmp_path):
    make_store(tmp_path)
    env = {**os.environ, "PRONK_DATA_DIR": str(tmp_path), "PRONK_STORAGE_URI": str(tmp_path / "store")}
    shown = subprocess.run([PRONK, "runs", "--json"], env=env, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert [json.loads(line)["status"] for line in shown.stdout.splitlines()] == ["failed", "completed"]
    profiled = subprocess.run(
        [PRONK, "herd", "profile", "--job", JOB, "--no-mlflow"], env=env, capture_output=True, text=True, timeout=60
    )
    assert profiled.returncode == 0, profiled.stderr
    assert "2 runs, 4 root traces" in profiled.stdout and "tool_gap_s[sql]" in profiled.stdout
