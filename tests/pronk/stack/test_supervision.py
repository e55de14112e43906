"""Supervision on the session's real stack: a SIGKILLed worker leaves nothing behind and comes back.

The test leaves the stack as it found it: both workers serving (the killed one restarted by the supervisor).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pronk.stack.processes import alive, group_members
from pronk.stack.state import read_state
from pronk.stack.supervisor import WorkerState, read_report
from pronk.worker_registry import worker_registry

pytestmark = pytest.mark.e2e
JOB = "job-c0ffee01"
WORKER = f"{JOB}-w0"
PRONK = str(Path(sys.executable).parent / "pronk")


def wait_for(condition, timeout_s: float, what: str) -> float:
    """Poll `condition` until true; returns the seconds it took."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout_s, f"{what} not within {timeout_s:.0f}s"
        time.sleep(0.2)
    return time.monotonic() - start


def batch_file(path: Path, lines: int) -> Path:
    rows = [
        {
            "custom_id": f"s{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "pronk-tiny", "max_tokens": 16, "messages": [{"role": "user", "content": f"s {i}"}]},
        }
        for i in range(lines)
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def test_a_sigkilled_worker_leaves_no_children_and_is_restarted_while_a_batch_completes(stack, tmp_path):
    from pronk.flows.batch import run_batch

    state = read_state(stack)
    assert alive(state["supervisor"])
    registry = worker_registry(stack)
    wait_for(lambda: {e.worker_id for e in registry.live(JOB)} >= {WORKER, f"{JOB}-w1"}, 120, "both workers live")
    pid = state[WORKER]
    children = set(group_members(pid)) - {pid}
    assert children, "vLLM's engine processes should run in the worker's process group"

    os.kill(pid, signal.SIGKILL)  # the worker alone, as a crash or the OOM killer would
    children_gone_s = wait_for(lambda: not any(alive(c) for c in children), 15, "the dead worker's children gone")

    batch = asyncio.run(
        run_batch(input_uri=str(batch_file(tmp_path / "in.jsonl", 8)), job_id=JOB, output_dir=str(tmp_path))
    )
    assert batch["request_counts"] == {"total": 8, "completed": 8, "failed": 0, "cancelled": 0}

    def restarted() -> bool:
        entry = next((e for e in registry.live(JOB) if e.worker_id == WORKER), None)
        return entry is not None and entry.pid != pid and alive(entry.pid)

    back_s = children_gone_s + wait_for(restarted, 180 - children_gone_s, "the worker heartbeating again")
    new_pid = read_state(stack)[WORKER]
    assert new_pid != pid and any(e.pid == new_pid for e in registry.live(JOB))
    wait_for(lambda: len(group_members(new_pid)) > 1, 30, "the new worker's engine processes")

    def row():
        report = read_report(stack)
        return next((w for w in report.workers if w.worker_id == WORKER), None) if report else None

    wait_for(lambda: (r := row()) is not None and r.state == WorkerState.SERVING, 30, "the report saying serving")
    row_now = row()
    assert row_now is not None
    assert row_now.restarts == 1 and row_now.pid == new_pid and (row_now.last_failure or "").startswith("exited")
    status = subprocess.run(
        [PRONK, "stack", "status"], env={**os.environ}, capture_output=True, text=True, timeout=60
    ).stdout
    assert any(WORKER in line and "serving" in line and "restarts 1" in line for line in status.splitlines()), status
    print(f"children gone after {children_gone_s:.1f}s, worker back after {back_s:.1f}s")
