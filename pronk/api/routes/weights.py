"""Weights: register a checkpoint as a model version, Leap running fleets to new weights, and watch them switch.

`POST /v1/weights/reload` takes a body mapping a served model name to a checkpoint URI
(`{"pronk-tiny": "models:/pronk-tiny/2"}`, or a directory / `s3://` path, which is validated and
registered first). Each job serving that name gets a Leap, run by the `leap` Prefect deployment.
Checks live in `pronk.models.versions`, Leap's bodies in `pronk.leap.schemas`; handlers that touch MLflow,
the store or the worker registry are plain `def`s (FastAPI runs them in its threadpool) or hand those
calls to the threadpool.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Query
from fastapi.concurrency import run_in_threadpool

from pronk.api.deps import AdminDep, RunsDep, SettingsDep
from pronk.api.error_responses import ApiError
from pronk.api.runs import start_leap
from pronk.api.weight_sources import allowed_source
from pronk.jobs.catalog import load_jobs
from pronk.jobs.schema import JobConfig
from pronk.leap.records import LeapRecord, LeapStore
from pronk.leap.schemas import JobWeights, LeapList, LeapStarted, WeightsStatus, WorkerWeights
from pronk.models.checkpoints import CheckpointMismatch
from pronk.models.versions import (
    ModelMismatch,
    NotLeapable,
    UploadResult,
    WeightsUpload,
    leap_model,
    leap_target,
    upload_checkpoint,
)
from pronk.protocol.ids import new_id
from pronk.settings import Settings
from pronk.worker_registry import worker_registry

router = APIRouter(prefix="/weights", tags=["weights"])


def _mismatch(exc: CheckpointMismatch, param: str) -> ApiError:
    return ApiError(409, str(exc), param=param, code="checkpoint_mismatch")


@router.post("/upload")
def upload(body: WeightsUpload, owner: AdminDep, settings: SettingsDep) -> UploadResult:
    """Validate a checkpoint against the model's current version and register it as the next version (admin keys)."""
    source = allowed_source(body.source, settings, "source")
    jobs = load_jobs(settings)
    if body.job_id is not None and body.job_id not in jobs:
        raise ApiError(400, f"No job {body.job_id!r}; known jobs: {sorted(jobs)}.", param="job_id", code="unknown_job")
    job_model = jobs[body.job_id].model if body.job_id else None
    try:
        return upload_checkpoint(source, body.model, settings, job_model)
    except CheckpointMismatch as exc:
        raise _mismatch(exc, "source") from exc
    except FileNotFoundError as exc:
        raise ApiError(400, str(exc), param="source", code="invalid_checkpoint") from exc


def _validated_target(job: JobConfig, served: str, uri: str, settings: Settings) -> int | None:
    """The version `uri` names for `job`, checked against what its live workers serve; None when it has none."""
    try:
        serving = {w.stats.model_version for w in worker_registry(settings).live(job.job_id)}
        return leap_target(job, uri, serving, settings) if serving else None
    except NotLeapable as exc:
        raise ApiError(400, str(exc), param=served, code="not_leapable") from exc
    except ModelMismatch as exc:
        raise ApiError(400, str(exc), param=served, code="model_mismatch") from exc
    except CheckpointMismatch as exc:
        raise _mismatch(exc, served) from exc
    except Exception as exc:
        raise ApiError(
            400, f"Cannot use {uri!r} for {served!r}: {exc}", param=served, code="invalid_checkpoint"
        ) from exc


@router.post("/reload", status_code=202)
async def reload(
    owner: AdminDep,
    settings: SettingsDep,
    leaps: RunsDep,
    body: Annotated[
        dict[str, str],
        Body(
            description="Served model name → checkpoint URI (`models:/NAME/N`, `models:/NAME@ALIAS`, a dir or s3://)."
        ),
    ],
) -> LeapList:
    """Leap every job with live workers serving each named model to the checkpoint given for it.

    All are validated before any starts.
    """
    if not body:
        raise ApiError(400, "Give at least one served model name and checkpoint URI.", code="invalid_value")
    jobs = await run_in_threadpool(load_jobs, settings)
    planned: list[tuple[JobConfig, int]] = []
    for served, given in body.items():
        uri = allowed_source(given, settings, served)
        serving = [j for j in jobs.values() if j.served_model_name == served]
        if not serving:
            raise ApiError(400, f"No job serves model {served!r}.", param=served, code="unknown_model")
        for job in serving:
            version = await run_in_threadpool(_validated_target, job, served, uri, settings)
            if version is not None:
                planned.append((job, version))
    if not planned:
        raise ApiError(409, f"No job serving {sorted(body)} has live workers to Leap.", code="no_live_workers")
    store = LeapStore(settings)
    started = []
    for job, version in planned:
        name = leap_model(job)
        record = LeapRecord(job_id=job.job_id, model=name, to_version=f"{name}/{version}", id=new_id("leap"))
        await run_in_threadpool(store.save, record)
        flow_run_id = await start_leap(leaps, job.job_id, version, record.id)
        started.append(
            LeapStarted(
                leap_id=record.id,
                job_id=job.job_id,
                served_model_name=job.served_model_name,
                to_version=record.to_version,
                flow_run_id=flow_run_id,
            )
        )
    return LeapList(data=started)


@router.get("/status")
def status(
    owner: AdminDep,
    settings: SettingsDep,
    job_id: Annotated[str | None, Query(description="Only this job.")] = None,
) -> WeightsStatus:
    """Each job's live workers (version, Leap state, staged version) and its latest Leap (admin keys: it names
    every job and the workers' internal addresses, which are the operator's, not the API's users')."""
    jobs = load_jobs(settings)
    if job_id is not None and job_id not in jobs:
        raise ApiError(404, f"No job {job_id!r}.", param="job_id", code="not_found")
    registry = worker_registry(settings)
    store = LeapStore(settings)
    data = []
    for job in jobs.values():
        if job_id is not None and job.job_id != job_id:
            continue
        workers = [WorkerWeights.of(w.worker_id, w.stats) for w in registry.live(job.job_id)]
        data.append(
            JobWeights(
                job_id=job.job_id,
                served_model_name=job.served_model_name,
                model=job.model,
                workers=workers,
                latest_leap=store.latest(job.job_id),
            )
        )
    return WeightsStatus(data=data)
