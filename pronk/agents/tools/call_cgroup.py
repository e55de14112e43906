"""A cgroup per `python` call: memory and processes bounded for the call as a whole, every child included.

rlimits bound each process alone (eight forked children of 450 MB each pass a 512 MB RLIMIT_AS), so the call
runs inside a cgroup of its own whose memory (swap refused, the sandbox's tmpfs scratch counted) and process
count are the job's limits. The command joins the group before it execs bwrap, so nothing inside starts
outside it; `close` kills whatever is left and removes the group.

cgroup v2 is used where the root of the unified hierarchy offers the memory and pids controllers, else the v1
memory and pids hierarchies (as on a Firecracker VM). Where neither can be written (not root, no delegation),
`CallCgroup.create` returns None and the call keeps only its rlimits; `layout` logs why, once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
import uuid
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

logger = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
GROUP = "pronk-calls"
KILL_ROUNDS = 50
KILL_WAIT_S = 0.02


@dataclass(frozen=True, slots=True)
class Layout:
    """Where call groups are made: one parent folder per hierarchy (one for v2, memory and pids for v1)."""

    version: int
    memory: Path
    pids: Path


def _v1_parent(controller: str) -> Path:
    """Our own group in a v1 hierarchy (from /proc/self/cgroup), so call groups sit inside whatever bounds us."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return CGROUP_ROOT / controller / path.lstrip("/") / GROUP
    raise OSError(f"no cgroup v1 {controller} hierarchy")


@lru_cache
def layout() -> Layout | None:
    """Where this host lets pronk make call groups, None where it does not (logged once)."""
    v2 = CGROUP_ROOT / "cgroup.controllers"
    try:
        if v2.exists() and {"memory", "pids"} <= set(v2.read_text().split()):
            parent = CGROUP_ROOT / GROUP
            parent.mkdir(exist_ok=True)
            (CGROUP_ROOT / "cgroup.subtree_control").write_text("+memory +pids")
            (parent / "cgroup.subtree_control").write_text("+memory +pids")
            return Layout(2, parent, parent)
        memory, pids = _v1_parent("memory"), _v1_parent("pids")
        memory.mkdir(exist_ok=True)
        pids.mkdir(exist_ok=True)
        return Layout(1, memory, pids)
    except OSError as exc:
        logger.warning("python tool calls keep per-process limits only: no call cgroup (%s)", exc)
        return None


@dataclass(frozen=True, slots=True)
class CallCgroup:
    """One call's group (two folders under cgroup v1, one under v2)."""

    version: int
    memory: Path
    pids: Path

    @classmethod
    def create(cls, memory_bytes: int, processes: int) -> CallCgroup | None:
        where = layout()
        if where is None:
            return None
        name = uuid.uuid4().hex
        group = cls(where.version, where.memory / name, where.pids / name)
        try:
            for folder in {group.memory, group.pids}:
                folder.mkdir()
            if group.version == 2:
                (group.memory / "memory.max").write_text(str(memory_bytes))
                (group.memory / "memory.swap.max").write_text("0")
            else:
                (group.memory / "memory.limit_in_bytes").write_text(str(memory_bytes))
                swap = group.memory / "memory.memsw.limit_in_bytes"
                if swap.exists():
                    swap.write_text(str(memory_bytes))
            (group.pids / "pids.max").write_text(str(processes))
        except OSError:
            group.close()
            raise
        return group

    def wrap(self, command: list[str]) -> list[str]:
        """`command`, started by a shell that first moves itself into the group."""
        joins = " && ".join(f"echo $$ > {folder / 'cgroup.procs'}" for folder in sorted({self.memory, self.pids}))
        return ["/bin/sh", "-c", f'{joins} && exec "$@"', "sh", *command]

    def ran_out_of_memory(self) -> bool:
        """True when the kernel killed a process of the call for the group's memory limit."""
        events = self.memory / ("memory.events" if self.version == 2 else "memory.oom_control")
        try:
            fields = dict(line.split() for line in events.read_text().splitlines() if len(line.split()) == 2)
        except OSError:
            return False
        return int(fields.get("oom_kill", "0")) > 0

    def close(self) -> None:
        """Kill what is left in the group, then remove it."""
        for folder in {self.memory, self.pids}:
            for _ in range(KILL_ROUNDS):
                try:
                    pids = [int(p) for p in (folder / "cgroup.procs").read_text().split()]
                except OSError:
                    break
                if not pids:
                    break
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(KILL_WAIT_S)
            try:
                folder.rmdir()
            except OSError as exc:
                logger.warning("call cgroup %s not removed: %s", folder, exc)
