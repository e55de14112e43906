"""`pronk runs` and `pronk herd profile` over a local store holding hand-made batch records and step records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from pronk.agents.step_records import steps_ndjson
from pronk.batches.report import RunFigures, batch_markdown, completion_times, recent_runs, runs_table, text_histogram
from pronk.batches.schemas import Batch, BatchUsage, InputTokensDetails, RequestCounts
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
    figures = RunFigures(
        "batch_x",
        JOB,
        "completed",
        2,
        2,
        0,
        870,
        224,
        53,
        25.7,
        0.0001,
        20000.0,
        "passed",
        2,
        1,
        0.5,
        4.0,
        "m/1|<x>",
        0,
    )
    text = batch_markdown(figures, times, "http://127.0.0.1:5000/#/x")
    assert (
        "| tasks per dollar (counts passed lines) | 20,000.00 |" in text
        and "| checks passed / checked | 1 / 2 (50%) |" in text
    )
    assert "m/1_x" not in text and "m/1__x_" in text
    assert "p50 3.1 s" in text or "p50 0.6 s" in text
    assert "[MLflow](http://127.0.0.1:5000/#/x)" in text


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
