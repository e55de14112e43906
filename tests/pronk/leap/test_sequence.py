"""`LeapRun`'s calls to a worker through the engine's `WorkerClient`, against the worker's real `/weights/*` routes:
each call's outcome lands in the worker's entry of the saved record, and a refused checkpoint stays typed for the
flow's retry condition."""

import asyncio

import pytest

from pronk.engine.client import WeightsRefused
from pronk.leap.records import LeapRecord, LeapStore, WorkerLeap
from pronk.leap.sequence import LeapRun
from pronk.settings import Settings
from tests.engine.test_weight_calls import URL, client_of, weights_worker


@pytest.fixture
def settings(tmp_path):
    return Settings(data_dir=tmp_path, storage_uri=str(tmp_path / "store"))


def leap_run(settings) -> LeapRun:
    _, app = weights_worker()
    record = LeapRecord(
        job_id="job-c0ffee01",
        model="m",
        from_version="m/1",
        to_version="m/2",
        workers={"w0": WorkerLeap(worker_id="w0", url=URL, version="m/1")},
    )
    return LeapRun(record, LeapStore(settings), client_of(app))


def test_a_staged_and_reloaded_worker_is_saved_serving_the_new_version(settings):
    run = leap_run(settings)

    async def leap():
        await run.stage("w0", "models:/m/2")
        await run.reload("w0", "m/2")
        await run.workers.aclose()

    asyncio.run(leap())
    worker = LeapStore(settings).latest("job-c0ffee01").workers["w0"]
    assert (worker.state, worker.version, worker.attempts, worker.error) == ("ready", "m/2", 2, None)
    assert worker.stage_seconds is not None and worker.paused_at <= worker.resumed_at


def test_a_refused_checkpoint_fails_the_worker_with_the_reason_and_stays_weights_refused(settings):
    run = leap_run(settings)
    with pytest.raises(WeightsRefused):
        asyncio.run(run.stage("w0", "models:/m/3"))
    worker = LeapStore(settings).latest("job-c0ffee01").workers["w0"]
    assert worker.state == "failed" and worker.attempts == 1 and "does not fit m/1" in worker.error
