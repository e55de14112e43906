"""Finding the running drawer by its lock: the pid in the lock file counts only while the lock is held by a process
that runs the drawer's module with the lock file open, so no other process is ever taken for the drawer."""

from __future__ import annotations

import os
import sys
import time

import pytest

from pronk.control.trace_sample.lock import DRAWER_MODULE, lock_path, record_holder, running_drawer, take_lock
from pronk.settings import Settings
from pronk.stack.processes import alive, spawn, stop

HOLDER = (
    "import fcntl, os, sys, time; lock = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
    "fcntl.flock(lock, fcntl.LOCK_EX); os.ftruncate(lock, 0); os.write(lock, str(os.getpid()).encode()); "
    "time.sleep(300)"
)
"""Takes the lock the way a drawer holds it and writes its own pid; the arguments after the lock file are its
command line's tail (the drawer's module, or not)."""


@pytest.fixture
def settings(tmp_path) -> Settings:
    settings = Settings(data_dir=tmp_path)
    settings.logs_dir.mkdir(parents=True)
    return settings


def start_holder(settings: Settings, *tail: str) -> int:
    pid = spawn([sys.executable, "-c", HOLDER, str(lock_path(settings)), *tail], settings.logs_dir / "holder.log")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if lock_path(settings).exists() and lock_path(settings).read_text() == str(pid):
            return pid
        time.sleep(0.05)
    raise AssertionError("the holder never took the lock")


def test_the_process_that_holds_the_lock_and_runs_the_drawer_is_found(settings):
    pid = start_holder(settings, "-m", DRAWER_MODULE)
    try:
        assert running_drawer(settings) == pid
    finally:
        stop(pid, timeout_s=5.0)
    assert running_drawer(settings) is None  # the lock went with it; the pid stays in the file


def test_a_lock_holder_of_another_command_line_is_not_the_drawer(settings):
    pid = start_holder(settings, "-m", "some.other_module")
    try:
        assert running_drawer(settings) is None and alive(pid)
    finally:
        stop(pid, timeout_s=5.0)


def test_a_drawer_that_no_longer_holds_the_lock_is_not_taken_for_the_running_one(settings):
    """A stale pid in the lock file, now a process running the drawer's module without the lock (another data dir's,
    or one taking its first orders without the lock): not this data dir's drawer."""
    pid = spawn([sys.executable, "-c", "import time; time.sleep(300)", DRAWER_MODULE], settings.logs_dir / "d.log")
    try:
        lock = take_lock(settings)
        assert lock is not None
        record_holder(lock, pid)
        os.close(lock)  # nobody holds the lock now
        assert running_drawer(settings) is None
        lock = take_lock(settings)  # held, but by a process that is not the one in the file
        assert lock is not None
        try:
            assert running_drawer(settings) is None
        finally:
            os.close(lock)
        assert alive(pid)
    finally:
        stop(pid, timeout_s=5.0)


def test_no_lock_file_means_no_drawer_and_none_is_made(settings):
    assert running_drawer(settings) is None and not lock_path(settings).exists()
