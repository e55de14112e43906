"""Leap on the wire (`/v1/weights`): what a Leap started, what the fleets serve and each job's latest Leap.

As `pronk.batches.schemas` holds the batches', these are the API's response bodies; the routes only handle them.
An upload's body and answer (`WeightsUpload`, `UploadResult`) live with the upload in `pronk.models.versions`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from engine.worker_protocol import WorkerStats
from pronk.leap.records import LeapRecord


class LeapStarted(BaseModel):
    leap_id: str
    job_id: str
    served_model_name: str
    to_version: str = Field(description="Version label the job's workers will serve, e.g. `pronk-tiny/2`.")
    flow_run_id: str | None = None
    status: Literal["queued"] = "queued"


class LeapList(BaseModel):
    object: Literal["list"] = "list"
    data: list[LeapStarted]


class WorkerWeights(BaseModel):
    worker_id: str
    model_version: str
    leap_state: str
    staged_version: str | None = None

    @classmethod
    def of(cls, worker_id: str, stats: WorkerStats) -> WorkerWeights:
        return cls(
            worker_id=worker_id,
            model_version=stats.model_version,
            leap_state=stats.leap_state,
            staged_version=stats.staged_version,
        )


class JobWeights(BaseModel):
    job_id: str
    served_model_name: str
    model: str
    workers: list[WorkerWeights]
    latest_leap: LeapRecord | None = None


class WeightsStatus(BaseModel):
    object: Literal["list"] = "list"
    data: list[JobWeights]
