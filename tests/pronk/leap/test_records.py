"""A Leap's record: its switch time and the rows the CLI and the artifact show."""

from __future__ import annotations

import pytest

from pronk.leap.records import LeapRecord, WorkerLeap


def test_leap_record_switch_time_spans_first_pause_to_last_resume():
    record = LeapRecord(job_id="job-c0ffee01", model="m", to_version="m/2")
    record.workers = {
        "w0": WorkerLeap(worker_id="w0", url="u", version="m/2", paused_at=10.0, resumed_at=10.2),
        "w1": WorkerLeap(worker_id="w1", url="u", version="m/2", paused_at=10.1, resumed_at=10.5),
    }
    record.finish("completed", "ok")
    assert record.switch_seconds == pytest.approx(0.5)
    assert [row["paused → resumed s"] for row in record.table()] == [0.2, 0.4]
