"""The stack's state file, `stack.json` under the data dir: what `pronk stack up` started, name -> pid.

Written by `stack up` and by the supervisor (a restarted worker has a new pid), read by `stack status`
and `stack down`; every write replaces the file whole (write, then rename) so no reader sees half of it.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from pronk.settings import Settings

SUPERVISOR = "supervisor"
_WORKER_NAME = re.compile(r"^(?P<job_id>job-[0-9a-f]{8})-w(?P<index>\d+)$")


def state_path(settings: Settings) -> Path:
    return settings.data_dir / "stack.json"


def read_state(settings: Settings) -> dict[str, int]:
    path = state_path(settings)
    if not path.exists():
        return {}
    raw = json.loads(path.read_text())
    return {str(name): int(pid) for name, pid in raw.items()}


def write_state(settings: Settings, state: dict[str, int]) -> None:
    write_json(state_path(settings), state)


def write_json(path: Path, value: object) -> None:
    """Replace `path` with `value` as JSON in one rename."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value, indent=2))
    tmp.replace(path)


def worker_name(job_id: str, index: int) -> str:
    """An engine worker's id, its entry here and its log's name: `job-c0ffee01-w0`."""
    return f"{job_id}-w{index}"


def worker_of(name: str) -> tuple[str, int] | None:
    """(job id, index) when `name` is an engine worker's entry (`job-c0ffee01-w0`), else None."""
    match = _WORKER_NAME.match(name)
    return (match["job_id"], int(match["index"])) if match else None
