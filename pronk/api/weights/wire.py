"""The weights resource on the wire (`/v1/weights`): an upload's body, a reload's body, what a Leap started, what
the fleets serve and each job's latest Leap.

An upload's answer is the domain's `UploadResult` (`pronk.models.versions`), which `pronk weights upload` prints too,
and a Leap's record is `LeapRecord` (`pronk.leap.records`), which the Leap flow keeps.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import Body
from pydantic import BaseModel, ConfigDict, Field

from pronk.engine.worker_protocol import WorkerStats
from pronk.leap.records import LeapRecord


class WeightsUpload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    source: str = Field(
        min_length=1, description="Checkpoint directory (Hugging Face format): a path on the server or s3://…."
    )
    model: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$", description="Registered model name, e.g. `pronk-tiny`."
    )
    job_id: str | None = Field(
        default=None,
        pattern=r"^job-[0-9a-f]{8}$",
        description="Validate against this job's current model; default: the newest version.",
    )


WeightsReload = Annotated[
    dict[str, str],
    Body(description="Served model name → checkpoint URI (`models:/NAME/N`, `models:/NAME@ALIAS`, a dir or s3://)."),
]


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
