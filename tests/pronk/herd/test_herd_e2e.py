"""Herd on the shared stack: a tuning within its budget on temporary workers, the quality guard refusing a
configuration made worse on purpose, and a rolling restart of the job's workers while a batch runs (every line
completes)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import mlflow
import pytest

from pronk.batches.labelled import labelled_lines
from pronk.batches.schemas import CheckCounts
from pronk.batches.store import BatchStore
from pronk.herd.guard import judge
from pronk.herd.profile import scan_steps
from pronk.herd.trial import restart_key, run_labelled_set
from pronk.jobs.catalog import resolve_job
from pronk.jobs.versions import with_changes
from pronk.settings import PROJECT_ROOT, get_settings
from pronk.stack.embedded import read_state
from pronk.stack.processes import alive
from pronk.stack.rolling import rolling_restart
from pronk.stack.state import SUPERVISOR
from pronk.worker_registry import worker_registry

pytestmark = pytest.mark.e2e
JOB = "job-c0ffee01"


def run_batch_file(path: Path, out: Path, batch_id: str | None = None) -> dict:
    from pronk.flows.batch import run_batch

    return asyncio.run(
        run_batch(input_uri=str(path), job_id=JOB, output_dir=str(out), batch_id=batch_id, trace_sample=0)
    )


def long_replay_lines(count: int, steps: int, gap_s: float) -> list[dict]:
    shape = {
        "system_prompt_tokens": 300,
        "steps": [{"new_prompt_tokens": 40, "output_tokens": 16, "tool_gap_s": gap_s} for _ in range(steps)],
    }
    return [
        {
            "custom_id": f"long-{i}",
            "method": "POST",
            "url": "/v1/pronk/replay",
            "body": {"model": "pronk-tiny", "shape": {**shape, "trace_id": f"long-{i}"}},
        }
        for i in range(count)
    ]


def test_herd_tunes_within_budget_on_temporary_workers_with_a_task_run_per_trial(stack, tmp_path):
    """One tuning, through the `herd` flow (the command line runs the same `Tuner`; its printing is a unit test)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from pronk.flows.herd import herd

    batch = run_batch_file(PROJECT_ROOT / "data" / "replay_batch.jsonl", tmp_path / "out")
    assert batch["status"] == "completed" and batch["steps_uri"]
    workers_before = {k: v for k, v in read_state(stack).items() if k.startswith(JOB)}

    state = herd(
        job_id=JOB,
        budget_minutes=1.5,
        sample=3,
        knobs=["routing", "kv_pin_ttl_s", "max_concurrency"],
        max_workers=1,
        time_scale=0.2,
        return_state=True,
    )
    summary = state.result()
    labels = [row["trial"] for row in summary["table"]]
    # How many trials fit the budget depends on the machine's speed; the first trial's fleet may take the
    # remaining budget to start (a loaded machine took 56 s), so the budget leaves room for that.
    assert labels[0] == "current #1"
    measured = [row for row in summary["table"] if row["error"] is None]
    assert measured and all(row["tasks_per_dollar"] > 0 for row in measured), summary
    assert summary["seconds"] <= 1.5 * 60 + 20  # the budget, plus stopping the last trial's fleet

    # the job's own workers were never touched, and no trial worker is left
    assert {k: v for k, v in read_state(stack).items() if k.startswith(JOB)} == workers_before
    registry = worker_registry(stack)
    trial_jobs = [p.name for p in stack.registry_dir.iterdir() if p.is_dir() and p.name != JOB]
    assert all(not registry.live(job_id) for job_id in trial_jobs)

    client = mlflow.MlflowClient(stack.tracking_uri)
    children = client.search_runs(
        [client.get_run(summary["mlflow_run_id"]).info.experiment_id],
        f"tags.mlflow.parentRunId = '{summary['mlflow_run_id']}'",
    )
    assert len(children) == len(summary["table"])
    assert all("tasks_per_dollar" in run.data.metrics for run in children if "pronk.herd.error" not in run.data.tags)

    async def task_run_names() -> list[str]:
        async with get_client() as client:
            runs = await client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id]))
            )
        return [t.name for t in runs]

    names = asyncio.run(task_run_names())
    assert set(labels) <= set(names)
    assert any(name.startswith("herd-profile") for name in names)


def test_a_configuration_whose_lines_cannot_complete_is_refused_on_the_labelled_set(stack, tmp_path):
    """Made worse on purpose, on real workers. The set's check passes any answer (the tiny model's are random); the
    worse configuration asks for a default answer longer than any worker's KV budget holds and admits by KV budget,
    so every line is refused as too long. Neither setting needs new workers, so both run on the job's own (the
    tuner runs the same `run_labelled_set` on its trial fleet; starting one here took 2-3 minutes on a loaded
    machine, and the tuning test above starts one already)."""
    path = tmp_path / "labelled.jsonl"
    path.write_text(
        "".join(
            json.dumps(
                {
                    "custom_id": f"any-{i}",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": {"model": "any", "messages": [{"role": "user", "content": f"Say something {i}."}]},
                    "check": {"type": "regex", "pattern": ""},
                }
            )
            + "\n"
            for i in range(3)
        )
    )
    job = with_changes(resolve_job(JOB, get_settings()), {"quality": {"labelled_set": str(path)}})
    worse = with_changes(job, {"default_max_tokens": 10_000_000, "scheduling": {"admission": "kv_budget"}})
    assert restart_key(worse) == restart_key(job)
    lines = labelled_lines(job, stack)
    current = asyncio.run(run_labelled_set(job, lines, stack))
    answered_worse = asyncio.run(run_labelled_set(worse, lines, stack))
    assert (current, answered_worse) == (CheckCounts(passed=3), CheckCounts(failed=3))
    verdict = judge([100.0, 100.0], [200.0, 200.0], success=(current, answered_worse))
    assert not verdict.accept
    assert verdict.reason.endswith("success rate fell beyond noise: 0/3 passed (0%) against 3/3 passed (100%)")


def test_rolling_restart_with_a_batch_running(stack, tmp_path):
    path = tmp_path / "long.jsonl"
    # >= 10 x 10 s of tool gaps per line whatever the model's speed: the batch outlasts restarting both workers
    # (~60 s on 2 quiet cores: each worker serves again ~30 s after its stop)
    path.write_text("".join(json.dumps(line) + "\n" for line in long_replay_lines(16, 10, 10.0)))
    batch_id = "batch_" + "5" * 24
    result: dict = {}
    runner = threading.Thread(target=lambda: result.update(run_batch_file(path, tmp_path / "out", batch_id)))
    runner.start()
    store = BatchStore(stack)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if store.exists(batch_id) and store.load(batch_id).status == "in_progress":
            break
        time.sleep(0.5)
    before = read_state(stack)
    time.sleep(3)  # steps in flight on both workers
    restarted = rolling_restart(resolve_job(JOB, get_settings()), stack)
    running_after = runner.is_alive()
    runner.join(timeout=600)

    assert running_after, "the batch ended before the second worker was restarted: the test proved nothing"
    assert set(restarted) == {f"{JOB}-w0", f"{JOB}-w1"}
    assert all(restarted[name] != before[name] and not alive(before[name]) for name in restarted)
    assert result["status"] == "completed", result
    assert result["request_counts"] == {"total": 16, "completed": 16, "failed": 0, "cancelled": 0}
    steps = scan_steps([result["steps_uri"]], stack).collect()
    assert steps.height >= 16 * 10 and steps["error"].null_count() == steps.height  # no step failed, none retried
    state = read_state(stack)
    assert alive(state[SUPERVISOR]) and {n: state[n] for n in restarted} == restarted
    assert len(worker_registry(stack).live(JOB)) == 2
