"""Leap's canary sequence with stand-in workers: stage and reload only change the record, as a worker that did them
would, and the labelled set's tally on a set of workers depends on the version they serve."""

import asyncio
import json

import pytest

from pronk.batches.labelled import labelled_lines
from pronk.batches.schemas import CheckCounts, LinesChecked
from pronk.engine.client import WorkerClient
from pronk.jobs.catalog import resolve_job
from pronk.leap import canary
from pronk.leap.records import LeapRecord, LeapStore, WorkerLeap
from pronk.leap.sequence import LeapFailed, LeapRefused, LeapRun, conclude, switch
from pronk.settings import Settings, get_settings

OLD, NEW = "pronk-tiny/1", "pronk-tiny/2"
TIMEOUT_S = 60.0


@pytest.fixture
def settings(tmp_path):
    return Settings(data_dir=tmp_path, storage_uri=str(tmp_path / "store"))


def job_with_set(tmp_path, canary_on: bool = True):
    path = tmp_path / "labelled.jsonl"
    lines = [
        {
            "custom_id": f"q{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "any", "messages": [{"role": "user", "content": f"say {i}"}]},
            "check": {"type": "regex", "pattern": "."},
        }
        for i in range(4)
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    job = resolve_job("tiny-cpu", get_settings())
    quality = job.quality.model_copy(update={"labelled_set": str(path), "canary": canary_on})
    return job.model_copy(update={"quality": quality})


def leap_run(settings, workers: list[str]) -> LeapRun:
    record = LeapRecord(
        job_id="job-c0ffee01",
        model="pronk-tiny",
        from_version=OLD,
        to_version=NEW,
        workers={w: WorkerLeap(worker_id=w, url=f"http://{w}", version=OLD) for w in workers},
    )
    return LeapRun(record, LeapStore(settings), WorkerClient("t"))


class Fleet:
    """Stage and reload that succeed unless told otherwise, and a labelled set that passes `rates[version]` of 20."""

    def __init__(self, rates: dict[str, int], stuck: set[str] = frozenset(), unstageable: set[str] = frozenset()):
        self.rates = rates
        self.stuck = stuck
        self.unstageable = unstageable
        self.calls: list[tuple] = []

    async def stage(self, run: LeapRun, worker_id: str, uri: str) -> None:
        self.calls.append(("stage", worker_id))
        if worker_id in self.unstageable:
            run.record.workers[worker_id].error = "disk full"
            raise RuntimeError("disk full")

    async def reload(self, run: LeapRun, worker_id: str, version: str) -> None:
        self.calls.append(("reload", worker_id, version))
        worker = run.record.workers[worker_id]
        if worker_id in self.stuck and version == OLD:
            worker.state, worker.error = "failed", "reload failed"
            raise RuntimeError("reload failed")
        worker.version, worker.paused_at, worker.resumed_at = version, 1.0, 1.5

    def measure_on(self, run: LeapRun):
        async def measure(lines, worker_ids: list[str], progress: LinesChecked) -> CheckCounts:
            (version,) = {run.record.workers[w].version for w in worker_ids}
            self.calls.append(("measure", tuple(worker_ids), version))
            progress.total += len(lines)
            await asyncio.sleep(0)
            progress.done += len(lines)
            passed = self.rates[version]
            return CheckCounts(passed=passed, failed=20 - passed)

        return measure


def trial(run: LeapRun, job, fleet: Fleet, measure=None, timeout_s: float = TIMEOUT_S):
    """`canary.trial` of the job's labelled set with the fleet's stage, reload and (unless given) measure."""
    lines = labelled_lines(job, get_settings())
    return canary.trial(run, job, lines, fleet.stage, fleet.reload, measure or fleet.measure_on(run), timeout_s)


def test_a_canary_that_holds_lets_the_rest_of_the_fleet_switch(settings, tmp_path):
    job = job_with_set(tmp_path)
    run = leap_run(settings, ["w0", "w1", "w2"])
    fleet = Fleet({OLD: 16, NEW: 15})

    async def leap():
        failed = await trial(run, job, fleet)
        assert failed == []
        await conclude(run, await switch(run, fleet.stage, fleet.reload), fleet.reload, settings)

    asyncio.run(leap())
    record = run.record
    assert record.status == "completed" and {w.version for w in record.workers.values()} == {NEW}
    assert fleet.calls[:2] == [("stage", "w0"), ("reload", "w0", NEW)]
    assert set(fleet.calls[2:4]) == {("measure", ("w1", "w2"), OLD), ("measure", ("w0",), NEW)}
    assert sorted(fleet.calls[4:]) == [("reload", "w1", NEW), ("reload", "w2", NEW), ("stage", "w1"), ("stage", "w2")]
    assert record.canary.worse is False and record.canary.candidate == CheckCounts(passed=15, failed=5)
    assert record.canary.baseline_workers == ["w1", "w2"] and record.canary.lines == 4
    assert "canary w0 on pronk-tiny/2: 15/20 passed (75%)" in record.canary_summary()
    saved = LeapStore(settings).latest("job-c0ffee01")
    assert saved.canary.baseline == CheckCounts(passed=16, failed=4)


def test_a_worse_canary_goes_back_and_the_leap_is_refused_naming_both_rates(settings, tmp_path):
    job = job_with_set(tmp_path)
    run = leap_run(settings, ["w0", "w1"])
    fleet = Fleet({OLD: 16, NEW: 3})
    with pytest.raises(LeapRefused) as refused:
        asyncio.run(trial(run, job, fleet))
    message = str(refused.value)
    assert message.startswith("canary refused: pronk-tiny/2 on w0: 3/20 passed (15%), against pronk-tiny/1: 16/20")
    assert "the fleet stays on pronk-tiny/1" in message and "--no-canary" in message
    assert fleet.calls[-1] == ("reload", "w0", OLD)
    assert ("stage", "w1") not in fleet.calls
    record = LeapStore(settings).latest("job-c0ffee01")
    assert record.status == "refused" and record.message == message and not record.alias_moved
    assert record.canary.worse is True and record.canary.candidate == CheckCounts(passed=3, failed=17)
    assert {w.worker_id: (w.version, w.state) for w in record.workers.values()} == {
        "w0": (OLD, "rolled_back"),
        "w1": (OLD, "ready"),
    }


def test_a_one_worker_job_measures_the_baseline_on_it_before_it_switches(settings, tmp_path):
    job = job_with_set(tmp_path)
    run = leap_run(settings, ["w0"])
    fleet = Fleet({OLD: 16, NEW: 0})
    with pytest.raises(LeapRefused, match="canary refused"):
        asyncio.run(trial(run, job, fleet))
    assert fleet.calls == [
        ("measure", ("w0",), OLD),
        ("stage", "w0"),
        ("reload", "w0", NEW),
        ("measure", ("w0",), NEW),
        ("reload", "w0", OLD),
    ]
    assert run.record.canary.baseline_workers == ["w0"]


def test_a_worse_canary_that_cannot_go_back_fails_the_leap_saying_so(settings, tmp_path):
    job = job_with_set(tmp_path)
    run = leap_run(settings, ["w0", "w1"])
    fleet = Fleet({OLD: 20, NEW: 0}, stuck={"w0"})
    with pytest.raises(LeapFailed, match="w0 could not go back to pronk-tiny/1: reload failed"):
        asyncio.run(trial(run, job, fleet))
    assert run.record.status == "failed"


def test_a_canary_that_cannot_stage_fails_the_leap_with_no_worker_switched(settings, tmp_path):
    job = job_with_set(tmp_path)
    run = leap_run(settings, ["w0", "w1"])
    fleet = Fleet({OLD: 20, NEW: 20}, unstageable={"w0"})

    async def leap():
        failed = await trial(run, job, fleet)
        assert failed == ["w0"]
        await conclude(run, failed, fleet.reload, settings)

    with pytest.raises(LeapFailed, match="no worker switched, the fleet still serves pronk-tiny/1"):
        asyncio.run(leap())
    assert [c for c in fleet.calls if c[0] == "measure"] == []


def test_a_canary_that_outlasts_its_bound_goes_back_and_the_leap_is_refused_saying_so(settings, tmp_path):
    job = job_with_set(tmp_path)
    run = leap_run(settings, ["w0", "w1"])
    fleet = Fleet({OLD: 16, NEW: 16})
    measure = fleet.measure_on(run)

    async def slow_measure(lines, worker_ids, progress):
        await asyncio.sleep(5)
        return await measure(lines, worker_ids, progress)

    with pytest.raises(LeapRefused, match=r"did not finish within leap_canary_timeout_s \(0.2s\) on w0"):
        asyncio.run(trial(run, job, fleet, slow_measure, 0.2))
    record = LeapStore(settings).latest("job-c0ffee01")
    assert record.status == "refused" and 0.2 <= record.canary.seconds < 5
    assert {w.version for w in record.workers.values()} == {OLD} and fleet.calls[-1] == ("reload", "w0", OLD)
    assert "did not finish in 0." in record.canary_summary()


def test_a_held_canary_reports_how_long_it_measured(settings, tmp_path):
    job = job_with_set(tmp_path)
    run = leap_run(settings, ["w0", "w1"])
    fleet = Fleet({OLD: 16, NEW: 16})
    asyncio.run(trial(run, job, fleet))
    assert 0 <= run.record.canary.seconds < TIMEOUT_S
    assert run.record.canary_summary().endswith(f"held in {run.record.canary.seconds:.1f}s")


def test_a_leap_to_the_version_served_runs_no_canary_and_switches_nothing(settings, tmp_path):
    run = leap_run(settings, ["w0", "w1"])
    for worker in run.record.workers.values():
        worker.version = NEW
    run.original = {w: NEW for w in run.original}
    assert canary.labelled_set(job_with_set(tmp_path), run.record, True, settings) is None
    fleet = Fleet({})

    async def leap():
        await conclude(run, await switch(run, fleet.stage, fleet.reload), fleet.reload, settings)

    asyncio.run(leap())
    assert fleet.calls == []
    assert run.record.status == "completed"
    assert run.record.message.startswith("the fleet already served pronk-tiny/2: nothing switched")


def test_without_a_canary_every_worker_switches_at_once(settings):
    run = leap_run(settings, ["w0", "w1"])
    fleet = Fleet({})

    async def leap():
        await conclude(run, await switch(run, fleet.stage, fleet.reload), fleet.reload, settings)

    asyncio.run(leap())
    assert run.record.status == "completed" and run.record.canary is None and run.record.switch_seconds == 0.5
    assert sorted(fleet.calls) == [("reload", "w0", NEW), ("reload", "w1", NEW), ("stage", "w0"), ("stage", "w1")]


def test_the_canary_runs_only_with_a_labelled_set_its_flag_and_the_callers(settings, tmp_path):
    record = leap_run(settings, ["w0"]).record
    assert canary.labelled_set(resolve_job("tiny-cpu", get_settings()), record, True, settings) is None
    assert canary.labelled_set(job_with_set(tmp_path, canary_on=False), record, True, settings) is None
    assert canary.labelled_set(job_with_set(tmp_path), record, False, settings) is None
    lines = canary.labelled_set(job_with_set(tmp_path), record, True, settings)
    assert [line.custom_id for line in lines] == ["q0", "q1", "q2", "q3"]


def test_an_unreadable_labelled_set_refuses_the_leap_before_any_worker_is_touched(settings, tmp_path):
    job = job_with_set(tmp_path)
    (tmp_path / "labelled.jsonl").unlink()
    record = leap_run(settings, ["w0"]).record
    with pytest.raises(LeapRefused, match=r"cannot read the labelled set .*--no-canary"):
        canary.labelled_set(job, record, True, settings)
    assert LeapStore(settings).latest("job-c0ffee01").status == "refused"


def test_the_canary_record_shows_the_lines_checked_on_both_versions_while_they_run(settings, tmp_path):
    job = job_with_set(tmp_path)
    run = leap_run(settings, ["w0", "w1"])
    fleet = Fleet({OLD: 16, NEW: 16})
    seen: list[LinesChecked] = []

    async def slow_measure(lines, worker_ids, progress):
        progress.total += len(lines)
        await asyncio.sleep(1.5)  # the record is saved about once a second meanwhile
        seen.append(LeapStore(settings).latest("job-c0ffee01").canary.checked)
        progress.done += len(lines)
        return CheckCounts(passed=16, failed=4)

    lines = len(labelled_lines(job, get_settings()))
    asyncio.run(trial(run, job, fleet, slow_measure))
    assert LinesChecked(total=2 * lines, done=0) in seen  # both versions' lines asked, none checked yet
    assert run.record.canary.checked == LinesChecked(total=2 * lines, done=2 * lines)
    assert LeapStore(settings).latest("job-c0ffee01").canary.checked == run.record.canary.checked
