"""Which unended flow runs are dead: this host's by their process, others by Prefect's heartbeats (no server)."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from prefect.client.schemas.objects import StateType

from pronk.control.dead_runs import HOST, PENDING_AFTER_S, PID, PID_STARTED, process_of, verdict
from pronk.host_process import HostProcess

NOW = datetime(2026, 12, 7, 22, 0, tzinfo=UTC)
DEAD_AFTER_S = 90.0


def run(labels: dict[str, str], state: StateType = StateType.RUNNING, since_s: float = 3600) -> SimpleNamespace:
    return SimpleNamespace(
        labels=labels,
        state_type=state,
        state=SimpleNamespace(timestamp=NOW - timedelta(seconds=since_s)),
        created=NOW - timedelta(seconds=since_s),
    )


def labels_of(process: HostProcess) -> dict[str, str]:
    return {HOST: process.host, PID: str(process.pid), PID_STARTED: str(process.started or "")}


def judged(flow_run: SimpleNamespace, heartbeat_s: float | None = None, remote: bool = True) -> str | None:
    beat = NOW - timedelta(seconds=heartbeat_s) if heartbeat_s is not None else None
    return verdict(flow_run, beat, NOW, remote, DEAD_AFTER_S)  # type: ignore[arg-type]


def a_dead_process() -> HostProcess:
    gone = subprocess.Popen(["true"])
    gone.wait()
    return HostProcess(HostProcess.this().host, gone.pid, None)


def test_a_run_of_this_host_is_judged_by_its_process_at_once_whatever_its_heartbeats():
    alive = labels_of(HostProcess.this())
    assert judged(run(alive), heartbeat_s=None) is None  # alive, though Prefect never heard a heartbeat
    dead = labels_of(a_dead_process())
    assert "its process (pid" in (judged(run(dead, since_s=1), heartbeat_s=1, remote=False) or "")
    reused = labels_of(HostProcess(HostProcess.this().host, HostProcess.this().pid, 1))  # same pid, started earlier
    assert judged(run(reused), heartbeat_s=1, remote=False) is not None


def test_a_run_on_another_host_is_dead_only_after_its_heartbeats_stop_and_only_when_judged_remote():
    elsewhere = labels_of(HostProcess("another-host", 4242, 7))
    assert judged(run(elsewhere), heartbeat_s=DEAD_AFTER_S + 30, remote=False) is None
    assert judged(run(elsewhere), heartbeat_s=DEAD_AFTER_S - 30) is None
    assert judged(run(elsewhere), heartbeat_s=DEAD_AFTER_S + 30) == "no heartbeat for 120s (on another-host)"
    assert judged(run(elsewhere, since_s=10), heartbeat_s=None) is None  # it changed state just now
    assert judged(run({}), heartbeat_s=None) == "no heartbeat for 3600s (with no process recorded)"


def test_a_submitted_run_whose_process_never_started_is_dead_after_the_pending_bound():
    assert judged(run({}, StateType.PENDING, since_s=PENDING_AFTER_S - 10)) is None
    assert "its process never started" in (judged(run({}, StateType.PENDING, since_s=PENDING_AFTER_S + 10)) or "")


def test_labels_that_do_not_name_a_process_name_none():
    assert process_of({HOST: "h", PID: "not a pid"}) is None
    assert process_of({HOST: "h"}) is None
    assert process_of({HOST: "h", PID: "12", PID_STARTED: ""}) == HostProcess("h", 12, None)
