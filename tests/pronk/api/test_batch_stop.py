"""The batch run's cancellation and expiry decisions, on a local store (no server)."""

from __future__ import annotations

import time

from pronk.batches.run import BatchRun
from pronk.batches.schemas import Batch
from pronk.batches.store import BatchStore
from pronk.jobs.catalog import resolve_job
from pronk.protocol.bodies import ChatCompletionBody
from pronk.protocol.lines import ValidRequest
from pronk.settings import Settings, get_settings


def make_run(tmp_path, expires_at: int | None = None) -> tuple[BatchRun, BatchStore]:
    store = BatchStore(Settings(data_dir=tmp_path, storage_uri=str(tmp_path / "store")))
    batch = Batch(input_file_id="file-x", job_id="job-c0ffee01", model="pronk-tiny", completion_window="unlimited")
    batch.expires_at = expires_at
    batch.mark("in_progress")
    store.save(batch)
    body = ChatCompletionBody(model="pronk-tiny", messages=[{"role": "user", "content": "hi"}])
    requests = [ValidRequest(line=i + 1, custom_id=f"r{i}", body=body) for i in range(3)]
    batch.request_counts.total = len(requests)
    return BatchRun(batch, resolve_job("job-c0ffee01", get_settings()), requests=requests), store


def test_a_cancel_request_stops_the_run_and_the_record_cannot_lose_it(tmp_path):
    run, store = make_run(tmp_path)
    run.check_stop(store)
    assert run.stop_reason is None
    store.request_cancel(run.batch.id)
    store.save(run.batch)  # the flow saving progress after the API's request keeps showing it
    assert store.load(run.batch.id).status == "cancelling"
    run.check_stop(store)
    assert run.stop_reason == "cancelled" and run.batch.status == "cancelling" and run.batch.cancelling_at
    run.unstarted = run.requests[1:]
    lines = run.unstarted_lines()
    assert [(line.custom_id, line.error.code, line.error.line) for line in lines] == [
        ("r1", "batch_cancelled", 2),
        ("r2", "batch_cancelled", 3),
    ]
    counts = run.batch.request_counts
    assert (counts.total, counts.completed, counts.failed, counts.cancelled) == (3, 0, 0, 2)
    assert run.final_status() == "cancelled"


def test_the_window_ending_stops_the_run_but_a_run_with_nothing_cut_off_completes(tmp_path):
    run, store = make_run(tmp_path, expires_at=int(time.time()) - 1)
    run.check_stop(store)
    assert run.stop_reason == "expired" and run.final_status() == "completed"
    run.unstarted = run.requests[2:]
    assert [line.error.code for line in run.unstarted_lines()] == ["batch_expired"] and run.final_status() == "expired"
    assert (run.batch.request_counts.failed, run.batch.request_counts.cancelled) == (0, 1)


def test_a_cancelled_batch_counts_its_unstarted_lines_apart_from_its_failures_and_the_openai_client_reads_both(
    tmp_path,
):
    """OpenAI's request_counts keep `failed` for requests that failed; the ones a cancel kept from starting are
    pronk's `cancelled`, which the official client still parses (as an extra field)."""
    import openai.types

    from pronk.agents.outcomes import LineFailure, RequestOutcome

    run, store = make_run(tmp_path)
    first = run.requests[0]
    run.record(RequestOutcome(first.line, first.custom_id, LineFailure("step_failed", "the worker answered 500")), [])
    store.request_cancel(run.batch.id)
    run.check_stop(store)
    run.unstarted = run.requests[1:]
    errors = run.result_lines()[1]
    assert [line.error.code for line in errors] == ["step_failed", "batch_cancelled", "batch_cancelled"]
    run.batch.mark(run.final_status())
    public = run.batch.public().model_dump(mode="json")
    assert public["request_counts"] == {"total": 3, "completed": 0, "failed": 1, "cancelled": 2}
    parsed = openai.types.Batch.model_validate(public).request_counts
    assert (parsed.total, parsed.completed, parsed.failed, parsed.model_extra) == (3, 0, 1, {"cancelled": 2})


def test_a_finished_batch_ignores_a_late_cancel_request(tmp_path):
    run, store = make_run(tmp_path)
    run.batch.mark("completed")
    store.save(run.batch)
    store.request_cancel(run.batch.id)
    assert store.load(run.batch.id).status == "completed"
