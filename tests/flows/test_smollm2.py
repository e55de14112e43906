"""The suite's one test on the real model: SmolLM2-135M-Instruct imported from its pinned PyPI package, served by a
worker of the `smollm2-cpu` job, running the demo's checked batch. It asserts what pronk counts, never what the
model writes (how many checks pass is the model's business, and is reported, not tested)."""

from __future__ import annotations

import asyncio

import pytest

from pronk.jobs.catalog import resolve_job
from pronk.models.imports import import_model
from pronk.settings import PROJECT_ROOT, get_settings
from pronk.stack.fleet import start_workers, wait_for_workers
from pronk.stack.processes import stop_groups

pytestmark = pytest.mark.e2e


def test_smollm2_is_imported_once_and_its_checked_lines_count_passed_tasks(stack, tmp_path):
    from pronk.flows.batch import run_batch

    job = resolve_job("smollm2-cpu", get_settings())
    assert job.model_source is not None
    first = import_model(job.model_source, "smollm2-135m-instruct", settings=stack)  # converts the GGUF once
    workers = start_workers(job, stack, indices=[0])
    try:
        again = import_model(job.model_source, "smollm2-135m-instruct", settings=stack)
        assert first.registered and not again.registered and again.version == first.version
        wait_for_workers(job, stack, workers)
        batch = asyncio.run(
            run_batch(
                input_uri=str(PROJECT_ROOT / "data" / "sample_batch.jsonl"),
                job_id=job.job_id,
                output_dir=str(tmp_path),
            )
        )
    finally:
        stop_groups(workers.values())
    assert batch["status"] == "completed" and batch["request_counts"]["total"] == 8
    assert batch["model"] == "smollm2-135m-instruct"
    checks = batch["checks"]
    assert checks["passed"] + checks["failed"] == 6 and checks["unchecked"] == 2
    assert batch["tasks_counted"] == "passed"
    assert batch["processing_cost"] > 0
    assert batch["tasks_per_dollar"] == pytest.approx(checks["passed"] / batch["processing_cost"])
