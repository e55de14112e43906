"""Background processes of the embedded stack: start detached with a log file, stop by process group.

Each process starts in its own session, so it leads a process group that holds everything it spawns
(vLLM's EngineCore under an engine worker, flow runs under the Prefect worker). Stopping a process
means emptying its group: a leader killed alone would leave its children orphaned, outside `stack down`.
"""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

import httpx

from pronk.engine.tls import verify_context

_PROC = Path("/proc")


def spawn(
    argv: list[str],
    log_path: Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    user: str | None = None,
) -> int:
    """Start `argv` in its own session (so its children stop with it); output goes to `log_path`.

    `user` runs it as that system user, with that user's group and no supplementary groups (root only).
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    entry = pwd.getpwnam(user) if user is not None else None
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            cwd=cwd,
            start_new_session=True,
            user=entry.pw_uid if entry else None,
            group=entry.pw_gid if entry else None,
            extra_groups=[] if entry else None,
        )
    return process.pid


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, process group) of `pid` from /proc, or None when it is gone or /proc is unreadable."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()  # the command name may hold spaces and parentheses
    return fields[0], int(fields[2])


def reap(pid: int) -> int | None:
    """Collect `pid`'s exit status if it is our own child that exited: its exit code, -signal, or None."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    return os.waitstatus_to_exitcode(status) if done == pid else None


def alive(pid: int) -> bool:
    """Whether `pid` runs; a zombie (dead, waiting for a parent that may never reap it) counts as dead."""
    if pid <= 0:
        return False
    reap(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = _stat(pid)
    return stat is None or stat[0] not in "ZX"


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group `pgid`, found in /proc."""
    if pgid <= 0 or not _PROC.is_dir():
        return []
    members = []
    for entry in _PROC.iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None and stat[1] == pgid and stat[0] not in "ZX":
                members.append(int(entry.name))
    return members


def _group_alive(pgid: int) -> bool:
    return alive(pgid) or bool(group_members(pgid))


def kill_group(pgid: int, timeout_s: float = 5.0) -> bool:
    """SIGKILL process group `pgid` (its leader may be dead already) and wait until it is empty."""
    return stop(pgid, timeout_s=0.0, kill_timeout_s=timeout_s)


def stop(pid: int, timeout_s: float = 20.0, kill_timeout_s: float = 5.0) -> bool:
    """SIGTERM the process group `pid` leads, then SIGKILL whatever is left after `timeout_s`.

    Returns whether the group is empty at the end. Waits on the whole group, not only its leader, so
    children that outlive their parent are caught too.
    """
    return stop_groups([pid], timeout_s, kill_timeout_s)[pid]


def stop_groups(pids: Iterable[int], timeout_s: float = 20.0, kill_timeout_s: float = 5.0) -> dict[int, bool]:
    """`stop` for several process groups at once: each is signalled together and waited on together, so they
    stop in the time the slowest takes, not in the sum of their times. Returns pid -> whether its group is empty."""
    results: dict[int, bool] = {}
    left = set(pids)
    for sig, wait in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, kill_timeout_s)):
        if wait <= 0 or not left:
            continue
        for pid in sorted(left):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                results[pid] = True
            except PermissionError:
                results[pid] = not _group_alive(pid)
        left -= results.keys()
        deadline = time.monotonic() + wait
        while left and time.monotonic() < deadline:
            results.update({pid: True for pid in left if not _group_alive(pid)})
            left -= results.keys()
            if left:
                time.sleep(0.2)
    results.update({pid: not _group_alive(pid) for pid in left})
    return results


def wait_healthy(
    url: str, what: str, pid: int, log: Path, timeout_s: float = 120.0, ca_file: Path | None = None
) -> None:
    """Wait until `url` answers 200; fail at once if process `pid` exits, or after `timeout_s`.

    An `https://` URL is verified against the CA bundle `ca_file` (an HTTPS worker's), else the system's trust store.
    """
    verify = verify_context(ca_file)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2.0, verify=verify).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if not alive(pid):
            raise RuntimeError(f"{what} exited during start-up; see {log}")
        time.sleep(0.5)
    raise RuntimeError(f"{what} not answering at {url} after {timeout_s:.0f}s; see {log}")
