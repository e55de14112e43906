"""Leap's records: one Leap's target, each worker's part in it and the canary's tallies, kept under the store.

The record (`LeapRecord`, kept by `LeapStore` under the store like batch records) is what `pronk leap status`,
`GET /v1/weights/status` and the flow's artifacts show: the target version, each worker's state
(`ready → uploading → reloading → ready`, or `failed`), its attempts and pause/resume times, the
canary's tallies, and how the Leap ended.
"""

from __future__ import annotations

import time
from typing import Literal

from pydantic import BaseModel, Field

from pronk import storage
from pronk.batches.schemas import CheckCounts, LinesChecked
from pronk.protocol.ids import new_id
from pronk.settings import Settings

LeapStatus = Literal["queued", "canary", "staging", "reloading", "completed", "rolled_back", "failed", "refused"]
WorkerLeapState = Literal["ready", "uploading", "reloading", "failed", "rolled_back"]


class WorkerLeap(BaseModel):
    """One worker's part in a Leap."""

    worker_id: str
    url: str
    state: WorkerLeapState = "ready"
    version: str = Field(description="The version this worker serves now.")
    attempts: int = Field(default=0, description="Stage and reload attempts made.")
    stage_seconds: float | None = None
    paused_at: float | None = Field(default=None, description="Unix time its in-flight generations had drained.")
    resumed_at: float | None = Field(default=None, description="Unix time it served the new weights.")
    error: str | None = None


class CanaryRecord(BaseModel):
    """The labelled set's tallies on the canary (the target version) and on the baseline (the version served)."""

    worker_id: str = Field(description="The worker switched first and measured on the target version.")
    labelled_set: str
    lines: int
    baseline_workers: list[str] = Field(
        description="Workers measured on the version served: the others, or the canary itself before it switched."
    )
    baseline: CheckCounts | None = None
    candidate: CheckCounts | None = None
    worse: bool | None = Field(default=None, description="Whether the canary passed fewer checks beyond noise.")
    reason: str = ""
    seconds: float | None = Field(default=None, description="How long the labelled set took on both versions.")
    checked: LinesChecked = Field(
        default_factory=LinesChecked, description="Lines of the set run so far on either version, and checked."
    )


class LeapRecord(BaseModel):
    """One Leap of a job's fleet to a model version."""

    id: str = Field(default_factory=lambda: new_id("leap"))
    job_id: str
    model: str = Field(description="Registered model name.")
    from_version: str | None = Field(
        default=None, description="Version label the fleet served before, e.g. `pronk-tiny/1`."
    )
    to_version: str = Field(description="Target version label, e.g. `pronk-tiny/2`.")
    status: LeapStatus = "queued"
    message: str = ""
    alias: str | None = Field(
        default=None, description="The job's alias, moved to the target when the whole fleet switched."
    )
    alias_moved: bool = False
    workers: dict[str, WorkerLeap] = Field(default_factory=dict)
    canary: CanaryRecord | None = Field(default=None, description="None: the Leap switched the fleet at once.")
    created_at: float = Field(default_factory=time.time)
    finished_at: float | None = None
    switch_seconds: float | None = Field(
        default=None, description="First worker paused → last worker serving the new version."
    )
    flow_run_id: str | None = None

    def finish(self, status: LeapStatus, message: str) -> None:
        self.status, self.message, self.finished_at = status, message, time.time()
        # The canary switched before its labelled run: the fleet's switch is timed on the workers that followed.
        fleet = [w for w in self.workers.values() if not self.canary or w.worker_id != self.canary.worker_id]
        paused = [w.paused_at for w in fleet or self.workers.values() if w.paused_at]
        resumed = [w.resumed_at for w in fleet or self.workers.values() if w.resumed_at]
        if status == "completed" and paused and resumed:
            self.switch_seconds = max(resumed) - min(paused)

    def canary_summary(self) -> str:
        """The canary's tallies in one line, for the CLI and the artifact ("" when the Leap ran no canary)."""
        canary = self.canary
        if canary is None:
            return ""
        took = f" in {canary.seconds:.1f}s" if canary.seconds is not None else ""
        if canary.baseline is None or canary.candidate is None:
            return f"canary {canary.worker_id}: the {canary.lines} lines of {canary.labelled_set} did not finish{took}"
        return (
            f"canary {canary.worker_id} on {self.to_version}: {canary.candidate.describe()}; "
            f"{self.from_version} on {', '.join(canary.baseline_workers)}: {canary.baseline.describe()}; "
            f"{'refused' if canary.worse else 'held'}{took}"
        )

    def fleet_on_target(self) -> bool:
        """Whether every worker already serves the target version: the Leap has nothing to switch."""
        return bool(self.workers) and all(w.version == self.to_version for w in self.workers.values())

    def table(self) -> list[dict[str, object]]:
        """Rows for a Prefect table artifact and the CLI."""
        return [
            {
                "worker": w.worker_id,
                "state": w.state,
                "version": w.version,
                "attempts": w.attempts,
                "stage s": None if w.stage_seconds is None else round(w.stage_seconds, 3),
                "paused → resumed s": None
                if not (w.paused_at and w.resumed_at)
                else round(w.resumed_at - w.paused_at, 3),
                "error": w.error or "",
            }
            for w in self.workers.values()
        ]


class LeapStore:
    """`leaps/<id>.json` per Leap and `leaps/latest-<job>.json`, the newest Leap of each job."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.root = storage.join(self.settings.store_uri, "leaps")

    def save(self, record: LeapRecord) -> None:
        data = record.model_dump_json().encode()
        storage.write_bytes(storage.join(self.root, f"{record.id}.json"), data, self.settings)
        storage.write_bytes(storage.join(self.root, f"latest-{record.job_id}.json"), data, self.settings)

    def load(self, leap_id: str) -> LeapRecord:
        return LeapRecord.model_validate_json(
            storage.read_bytes(storage.join(self.root, f"{leap_id}.json"), self.settings)
        )

    def latest(self, job_id: str) -> LeapRecord | None:
        try:
            return LeapRecord.model_validate_json(
                storage.read_bytes(storage.join(self.root, f"latest-{job_id}.json"), self.settings)
            )
        except FileNotFoundError:
            return None
