"""After a crash: a dead run's marker is taken over (its flow run marked crashed, its batch run on when the rows are
the same), a live run's marker refuses the new run, and a run that ends removes its own marker."""

from __future__ import annotations

import asyncio
import os
import subprocess

import pytest

from pronk import storage
from pronk.batches.input import validate_input
from pronk.batches.results import FinishedLine, ResultParts
from pronk.batches.run import BatchRun, open_batch
from pronk.batches.store import BatchStore
from pronk.enrich import open_run
from pronk.enrich.open_run import EnrichRunning, OpenRun, check_earlier, close, read_open_run, take_over
from pronk.enrich.run import lines_file
from pronk.enrich.table import plan
from pronk.jobs.catalog import resolve_job
from pronk.protocol.lines import OutputLine
from pronk.settings import Settings, get_settings
from tests.pronk.enrich.test_table import SPEC, rows

FLOW_RUN = "6f1c2a9e-0000-4000-8000-000000000001"


@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings(data_dir=tmp_path, storage_uri=str(tmp_path / "store"))


def dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


class Prefect:
    """Stands in for `pronk.control.flow_runs`: a flow run's state, and the runs marked crashed."""

    def __init__(self, state: str | None):
        self.state = state
        self.crashed: list[tuple[str, str]] = []

    async def state_of(self, flow_run_id: str) -> str | None:
        return self.state

    async def mark_crashed(self, flow_run_id: str, message: str) -> bool:
        self.crashed.append((flow_run_id, message))
        return True

    def check(self, results: str, settings: Settings, flow_run_id: str | None = None) -> OpenRun | None:
        return asyncio.run(check_earlier("t", results, settings, flow_run_id, self.state_of, self.mark_crashed))


def the_lines(*names: str) -> bytes:
    table = rows(*names)
    return lines_file(SPEC, resolve_job("tiny-cpu", get_settings()), plan(SPEC, table, None))


def killed_run(settings: Settings, lines: bytes, finished: list[int]) -> OpenRun:
    """A run that wrote its marker, ran its batch's lines `finished` (persisted), then was SIGKILLed."""
    results = storage.join(settings.store_uri, "enrichments", "t")
    marker = open_run.open_run(
        "t", results, "run-1", lines, storage.join(results, "inputs", "run-1.jsonl"), "batch_dead", FLOW_RUN, settings
    )
    job, store = resolve_job("tiny-cpu", get_settings()), BatchStore(settings)
    batch = open_batch(store, settings, job, marker.lines_uri, "batch_dead", FLOW_RUN)
    run = BatchRun.resume(batch, job, validate_input(lines, job), ResultParts(batch.id, settings), FLOW_RUN)
    batch.mark("in_progress")
    store.save(batch)
    persisted = [FinishedLine(line=n, output=OutputLine(custom_id=f"row-{n - 1}"), ok=False) for n in finished]
    ResultParts(batch.id, settings).write_part(run.run_tag, 1, persisted)
    dead = marker.model_copy(update={"pid": dead_pid(), "pid_started": None})
    storage.write_bytes(open_run.marker_uri(results), dead.model_dump_json().encode(), settings)
    return dead


def test_a_run_after_a_crash_marks_the_dead_flow_run_crashed_and_runs_on_under_its_batch(settings):
    lines = the_lines("Acme", "Borealis", "Cobalt", "Dyna")
    dead = killed_run(settings, lines, finished=[1, 3])
    results = storage.join(settings.store_uri, "enrichments", "t")

    prefect = Prefect("RUNNING")  # as Prefect shows a flow run whose process was killed outright
    earlier = prefect.check(results, settings, flow_run_id="another-flow-run")
    assert earlier == dead
    assert [flow_run for flow_run, _ in prefect.crashed] == [FLOW_RUN]
    assert "is gone" in prefect.crashed[0][1] and "run-1" in prefect.crashed[0][1]

    takeover = take_over(
        earlier, lines, resolve_job("tiny-cpu", get_settings()), settings
    )  # the same rows make the same lines
    assert (takeover.batch_id, takeover.reused, takeover.ended) == ("batch_dead", 2, None)
    assert "2 rows finished by it reused" in takeover.why

    # The re-run runs under that batch: only the lines nobody persisted are asked.
    job, store = resolve_job("tiny-cpu", get_settings()), BatchStore(settings)
    batch = open_batch(store, settings, job, "new-lines.jsonl", takeover.batch_id, "another-flow-run")
    run = BatchRun.resume(batch, job, validate_input(lines, job), ResultParts(batch.id, settings), "another-flow-run")
    assert sorted(run.finished) == [1, 3] and [r.line for r in run.todo] == [2, 4]
    assert batch.flow_run_id == "another-flow-run"


def test_a_run_asking_other_rows_ends_the_dead_runs_batch_with_what_it_persisted(settings):
    dead = killed_run(settings, the_lines("Acme", "Borealis"), finished=[2])
    takeover = take_over(
        dead, the_lines("Acme", "Borealis", "Cobalt"), resolve_job("tiny-cpu", get_settings()), settings
    )
    assert (takeover.batch_id, takeover.ended) == (None, "batch_dead")
    batch = BatchStore(settings).load("batch_dead")
    assert batch.status == "failed" and "run-1 ended without finishing" in batch.errors.data[0].message  # type: ignore[union-attr]
    assert (batch.request_counts.total, batch.request_counts.failed) == (2, 2)  # line 2 persisted, line 1 never ran
    assert ResultParts("batch_dead", settings).load() == {}
    assert take_over(dead, None, resolve_job("tiny-cpu", get_settings()), settings).why.endswith(
        "is failed; no row is asked now"
    )


def test_a_live_run_refuses_the_new_run_and_is_left_alone(settings):
    results = storage.join(settings.store_uri, "enrichments", "t")
    lines = the_lines("Acme")
    live = open_run.open_run("t", results, "run-1", lines, str(settings.data_dir / "l.jsonl"), "b", FLOW_RUN, settings)
    assert live.pid == os.getpid()
    prefect = Prefect("RUNNING")
    with pytest.raises(EnrichRunning, match=f"enrichment t is already running as flow run {FLOW_RUN}"):
        prefect.check(results, settings, flow_run_id="another-flow-run")
    assert prefect.crashed == [] and read_open_run(results, settings) == live

    # Prefect has the last word on an ended flow run (its pid may be taken by another process by now)...
    assert Prefect("CRASHED").check(results, settings, "another-flow-run") == live
    # ...a pid now held by a process that started later is not the run's...
    reused = live.model_copy(update={"pid_started": (live.pid_started or 0) + 1})
    storage.write_bytes(open_run.marker_uri(results), reused.model_dump_json().encode(), settings)
    assert Prefect("RUNNING").check(results, settings, "another-flow-run") == reused
    # ...and a run on another host, whose flow run Prefect does not show ended, may still run.
    elsewhere = live.model_copy(update={"host": "another-host", "pid": dead_pid()})
    storage.write_bytes(open_run.marker_uri(results), elsewhere.model_dump_json().encode(), settings)
    for state in ("RUNNING", None):
        with pytest.raises(EnrichRunning, match=r"pid \d+ on another-host"):
            Prefect(state).check(results, settings, "another-flow-run")
    # The same flow run started again (a retry) takes over its own marker without marking itself crashed.
    own = Prefect("RUNNING")
    assert own.check(results, settings, FLOW_RUN) == elsewhere and own.crashed == []


def test_a_run_that_ends_removes_its_marker_and_never_another_runs(settings):
    results = storage.join(settings.store_uri, "enrichments", "t")
    assert Prefect("RUNNING").check(results, settings) is None  # no marker: nothing to take over
    lines = the_lines("Acme")
    marker = open_run.open_run("t", results, "run-2", lines, str(settings.data_dir / "l.jsonl"), "b", None, settings)
    assert storage.read_bytes(marker.lines_uri, settings) == lines and marker.lines_sha256 == open_run.lines_hash(lines)
    close(results, "run-1", settings)
    assert read_open_run(results, settings) == marker
    close(results, "run-2", settings)
    assert read_open_run(results, settings) is None
    storage.write_bytes(open_run.marker_uri(results), b"{not json", settings)
    assert read_open_run(results, settings) is None  # an unreadable marker is ignored, not fatal


def test_the_same_rows_make_the_same_lines_file(settings):
    assert the_lines("Acme", "Borealis") == the_lines("Acme", "Borealis")
    assert the_lines("Acme", "Borealis") != the_lines("Acme", "Borealis!")
