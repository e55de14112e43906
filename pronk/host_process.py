"""A process named across hosts: its host, its pid and when it started, so a reused pid is never taken for it.

Runs that die without a hook (SIGKILL, OOM, a stack stopped under them) leave records behind that say who owned
them: an enrichment's open-run marker, a flow run's labels (`pronk.control.dead_runs`). Whoever finds such a record
asks `alive()`: on the same host the answer is exact; from another host the process table cannot say (None), and
the caller judges by the run's heartbeats instead.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path


def process_started(pid: int) -> int | None:
    """When the process started (clock ticks since boot), or None where /proc cannot say."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # Field 22 (starttime); the command name (field 2) may hold spaces and parentheses, so count from its end.
    fields = stat[stat.rfind(b")") + 2 :].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def process_alive(pid: int, started: int | None) -> bool:
    """Whether process `pid` of this host still runs, and is the one that started at `started` (when known)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, under another user
    now = process_started(pid)
    return started is None or now is None or now == started


@dataclass(frozen=True, slots=True)
class HostProcess:
    host: str
    pid: int
    started: int | None = None
    """`process_started` of the pid when it was recorded (None: unknown, the pid alone is trusted)."""

    @classmethod
    def this(cls) -> HostProcess:
        pid = os.getpid()
        return cls(socket.gethostname(), pid, process_started(pid))

    def alive(self) -> bool | None:
        """Whether it still runs: exact on its own host, None from another (this host's processes cannot say)."""
        if self.host != socket.gethostname():
            return None
        return process_alive(self.pid, self.started)

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}"
