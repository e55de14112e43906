"""Where live workers announce themselves: one JSON file per worker, refreshed by a heartbeat.

A file per worker on the data directory needs no extra service, survives any single process,
and is atomic to update (write then rename). The router treats a file whose heartbeat is older
than the timeout as a dead worker.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from pydantic import BaseModel

from engine.protocol import WorkerStats


class WorkerEntry(BaseModel):
    worker_id: str
    job_id: str
    url: str
    pid: int
    started_at: float
    heartbeat_at: float
    stats: WorkerStats


class Registry:
    def __init__(self, root: Path, heartbeat_timeout_s: float = 5.0):
        self.root = root
        self.heartbeat_timeout_s = heartbeat_timeout_s

    @classmethod
    def from_settings(cls, settings) -> Registry:
        """The registry pronk's settings (`registry_dir`, `heartbeat_timeout_s`) describe."""
        return cls(settings.registry_dir, settings.heartbeat_timeout_s)

    def _path(self, job_id: str, worker_id: str) -> Path:
        return self.root / job_id / f"{worker_id}.json"

    def announce(self, entry: WorkerEntry) -> None:
        path = self._path(entry.job_id, entry.worker_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(entry.model_dump_json())
        tmp.replace(path)

    def withdraw(self, job_id: str, worker_id: str) -> None:
        self._path(job_id, worker_id).unlink(missing_ok=True)

    def entries(self, job_id: str) -> list[WorkerEntry]:
        entries = []
        for path in sorted((self.root / job_id).glob("*.json")):
            try:
                entries.append(WorkerEntry.model_validate(json.loads(path.read_text())))
            except (OSError, ValueError):
                continue
        return entries

    def live(self, job_id: str, now: float | None = None) -> list[WorkerEntry]:
        """Workers of the job whose heartbeat is fresh."""
        now = time.time() if now is None else now
        return [e for e in self.entries(job_id) if now - e.heartbeat_at <= self.heartbeat_timeout_s]
