"""Process groups as the stack uses them, on plain `python` processes: nothing a stopped process spawned survives it,
nor the trace-sample drawer that flow runs start outside the stack."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from pronk.control.trace_sample import drawer
from pronk.control.trace_sample.lock import running_drawer
from pronk.settings import Settings
from pronk.stack import embedded
from pronk.stack.processes import alive, group_members, kill_group, spawn, stop_groups
from pronk.stack.state import read_state, write_state

# A stand-in for an engine worker: a leader that starts a child in its own group, as vLLM starts EngineCore.
PARENT_WITH_CHILD = (
    "import subprocess, sys, time; "
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); "
    "time.sleep(300)"
)


def start_family(tmp_path, name: str) -> int:
    pid = spawn([sys.executable, "-c", PARENT_WITH_CHILD], tmp_path / f"{name}.log")
    deadline = time.monotonic() + 10
    while len(group_members(pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(group_members(pid)) == 2
    return pid


def test_a_sigkilled_leader_leaves_its_child_and_kill_group_ends_it(tmp_path):
    pid = start_family(tmp_path, "worker")
    (child,) = set(group_members(pid)) - {pid}
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid) and alive(child)  # the orphan the tester found
    assert kill_group(pid)
    assert not alive(child) and group_members(pid) == []


def test_down_stops_the_supervisor_first_then_what_makes_work_and_empties_every_recorded_group(tmp_path):
    """The API (and the Prefect worker with its flow runs) stop before the engine workers, so no step in flight is cut
    off by a worker stopping under it."""
    settings = Settings(data_dir=tmp_path)
    state = {
        "supervisor": spawn([sys.executable, "-c", "import time; time.sleep(300)"], tmp_path / "supervisor.log"),
        "job-c0ffee01-w0": start_family(tmp_path, "w0"),
        "job-c0ffee01-w1": start_family(tmp_path, "w1"),
        "api": start_family(tmp_path, "api"),
    }
    os.kill(state["job-c0ffee01-w1"], signal.SIGKILL)  # a dead worker whose child lives on
    write_state(settings, state)
    stopped = embedded.down(settings)
    assert stopped == ["supervisor", "api", "job-c0ffee01-w0", "job-c0ffee01-w1"]
    assert all(group_members(pid) == [] for pid in state.values())
    assert read_state(settings) == {}


def test_stop_groups_empties_every_group_and_kills_one_that_ignores_sigterm(tmp_path):
    deaf = spawn(
        [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"],
        tmp_path / "deaf.log",
    )
    families = [start_family(tmp_path, f"f{i}") for i in range(2)]
    gone = spawn([sys.executable, "-c", "pass"], tmp_path / "gone.log")
    while alive(gone):
        time.sleep(0.05)
    time.sleep(0.5)  # the deaf process has set its handler
    assert stop_groups([deaf, *families, gone], timeout_s=1.0) == {pid: True for pid in (deaf, *families, gone)}
    assert all(group_members(pid) == [] for pid in (deaf, *families))


def start_stand_in_drawer(settings: Settings, monkeypatch, code: str) -> subprocess.Popen:
    """Start a drawer as a flow run does (`start_drawer`: the lock passed to it, its pid in the lock file), running
    `code` in place of the drawer's own; it prints `ready` to the drawer's log once it has begun."""
    started = []
    popen = subprocess.Popen

    def stand_in(args, **kw):
        started.append(popen([sys.executable, "-c", code, *args[1:]], **kw))
        return started[0]

    with monkeypatch.context() as patch:
        patch.setattr(drawer.subprocess, "Popen", stand_in)
        assert drawer.start_drawer(settings, "batch_1")
    log = settings.logs_dir / "trace_samples.log"
    deadline = time.monotonic() + 10
    while "ready" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    return started[0]


def test_down_stops_the_trace_sample_drawer_a_flow_run_started(tmp_path, monkeypatch):
    settings = Settings(data_dir=tmp_path)
    drawer = start_stand_in_drawer(settings, monkeypatch, "import time; print('ready', flush=True); time.sleep(300)")
    assert running_drawer(settings) == drawer.pid
    assert embedded.down(settings) == [embedded.TRACE_SAMPLE_DRAWER]
    assert drawer.wait(timeout=5) == -signal.SIGTERM
    assert running_drawer(settings) is None and embedded.down(settings) == []


def test_a_drawer_deaf_to_sigterm_is_killed(tmp_path, monkeypatch):
    deaf = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
        "time.sleep(300)"
    )
    settings = Settings(data_dir=tmp_path)
    drawer = start_stand_in_drawer(settings, monkeypatch, deaf)
    assert embedded.stop_trace_sample_drawer(settings, timeout_s=0.5)
    assert drawer.wait(timeout=5) == -signal.SIGKILL
