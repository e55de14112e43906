"""Stand-ins shared by unit tests that drive the harness without an engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pronk.agents.harness import Harness
from pronk.agents.step_records import StepRecorder
from pronk.agents.transcripts import TranscriptRecorder
from pronk.engine.worker_protocol import StepRequest, StepResult
from pronk.jobs.catalog import resolve_job
from pronk.settings import get_settings


def answered(request: StepRequest, text: str) -> StepResult:
    """What a worker returns when a step's whole output is `text` (one token, finished)."""
    return StepResult(
        request_id=request.request_id,
        text=text,
        token_ids=[9],
        prompt_tokens=7,
        cached_tokens=0,
        completion_tokens=1,
        finish_reason="stop",
        model_version="m/1",
        worker_id="w0",
        queue_time_s=0.0,
        engine_time_s=0.001,
    )


def announce_worker(settings, job_id: str, model_version: str) -> None:
    """A live worker of `job_id` serving `model_version` in the settings' file registry (no process behind it)."""
    import time

    from pronk.engine.registry import FileRegistry, WorkerEntry
    from pronk.engine.worker_protocol import WorkerStats

    FileRegistry(settings.registry_dir).announce(
        WorkerEntry(
            worker_id=f"{job_id}-w0",
            job_id=job_id,
            url="http://127.0.0.1:9",
            pid=1,
            started_at=0.0,
            heartbeat_at=time.time(),
            stats=WorkerStats(worker_id=f"{job_id}-w0", job_id=job_id, model_version=model_version),
        )
    )


def tiny_harness(router: Any, scratch: Path, transcripts: TranscriptRecorder | None = None) -> Harness:
    """A harness of the tiny-cpu job over a stand-in router, its python tool on the session's bubblewrap."""
    settings = get_settings()
    job = resolve_job("tiny-cpu", settings)
    return Harness(router, job, StepRecorder(), scratch, transcripts, sandbox_bwrap=settings.sandbox_bwrap)
