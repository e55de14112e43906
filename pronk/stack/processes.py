"""Background processes of the embedded stack: start detached with a log file, stop by process group."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx


def spawn(argv: list[str], log_path: Path, env: dict[str, str] | None = None, cwd: Path | None = None) -> int:
    """Start `argv` in its own session (so its children stop with it); output goes to `log_path`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            cwd=cwd,
            start_new_session=True,
        )
    return process.pid


def alive(pid: int) -> bool:
    if pid <= 0:
        return False
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reap it if it is our own child that exited
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop(pid: int, timeout_s: float = 20.0) -> None:
    """SIGTERM the process group, then SIGKILL whatever is left after `timeout_s`."""
    for sig, wait in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not alive(pid):
                return
            time.sleep(0.2)


def wait_healthy(url: str, what: str, pid: int, log: Path, timeout_s: float = 120.0) -> None:
    """Wait until `url` answers 200; fail at once if process `pid` exits, or after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if not alive(pid):
            raise RuntimeError(f"{what} exited during start-up; see {log}")
        time.sleep(0.5)
    raise RuntimeError(f"{what} not answering at {url} after {timeout_s:.0f}s; see {log}")
