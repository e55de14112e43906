"""The trace-sample drawers' lock: one drawer at a time per data dir, and how to find the one that runs.

The drawer (`drawer`) holds `logs/trace_samples.lock` with `flock` while it draws. Whoever starts
a drawer takes the lock first, passes it to the drawer, and writes the drawer's pid into the file. `pronk stack down`
reads that pid to stop a drawer that would otherwise outlive the server it draws for. The pid alone proves nothing
(the drawer may have ended and its pid gone to another process), so it counts only while the lock is held, the
process has this lock file open, and it runs the drawer's module. It lives with the rest of the trace sample and
imports neither Prefect nor MLflow: the stack, which stops the drawer (`pronk stack down`), loads neither through it.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from pronk.settings import Settings

DRAWER_MODULE = "pronk.control.trace_sample.drawer"
_PROC = Path("/proc")


def lock_path(settings: Settings) -> Path:
    return settings.logs_dir / "trace_samples.lock"


def take_lock(settings: Settings, create: bool = True) -> int | None:
    """The lock file's descriptor, holding the lock; None when another holds it (or, without `create`, no file)."""
    if create:
        settings.logs_dir.mkdir(parents=True, exist_ok=True)
    try:
        lock = os.open(lock_path(settings), os.O_RDWR | (os.O_CREAT if create else 0), 0o600)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock)
        return None
    return lock


def record_holder(lock: int, pid: int) -> None:
    """Write the drawer's pid into the lock file, held through `lock`."""
    os.ftruncate(lock, 0)
    os.pwrite(lock, f"{pid}\n".encode(), 0)


def _runs_the_drawer(pid: int, lock_file: Path) -> bool:
    """Whether process `pid` runs the drawer's module with `lock_file` open (False when it is gone or unreadable)."""
    try:
        argv = (_PROC / str(pid) / "cmdline").read_bytes().split(b"\0")
        fds = list((_PROC / str(pid) / "fd").iterdir())
    except OSError:
        return False
    if DRAWER_MODULE.encode() not in argv:
        return False
    for fd in fds:
        try:
            if Path(os.readlink(fd)) == lock_file:
                return True
        except OSError:
            continue  # closed meanwhile
    return False


def running_drawer(settings: Settings) -> int | None:
    """The pid of this data dir's running drawer, or None when none runs."""
    lock = take_lock(settings, create=False)
    if lock is not None:  # nobody holds it: no drawer runs
        os.close(lock)
        return None
    try:
        pid = int(lock_path(settings).read_text().strip())
    except (OSError, ValueError):
        return None  # no lock file, or its holder not written yet (it is being started)
    return pid if _runs_the_drawer(pid, lock_path(settings).resolve()) else None
