"""Weights: register a checkpoint as a model version, Leap running fleets to new weights, and watch them switch.

`POST /v1/weights/reload` takes a body mapping a served model name to a checkpoint URI
(`{"pronk-tiny": "models:/pronk-tiny/2"}`, or a directory / `s3://` path, which is validated and
registered first). Each job serving that name gets a Leap, run by the `leap` Prefect deployment.
"""

from __future__ import annotations

from typing import Annotated, Literal, Protocol

from fastapi import APIRouter, Body, Depends, Query, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field

from engine.registry import Registry
from pronk.api.deps import AdminDep, OwnerDep, SettingsDep
from pronk.api.errors import ApiError
from pronk.api.weight_sources import allowed_source
from pronk.batches.schemas import new_id
from pronk.jobs import JobConfig, load_jobs
from pronk.models.checkpoints import CheckpointMismatch
from pronk.models.leap_records import LeapRecord, LeapStore
from pronk.models.registry import alias_version, parse_models_uri
from pronk.models.versions import UploadResult, check_version_fits, upload_checkpoint
from pronk.settings import Settings

router = APIRouter(prefix="/weights", tags=["weights"])
DEPLOYMENT = "leap/leap"


class LeapStarter(Protocol):
    async def start(self, job_id: str, version: int, leap_id: str) -> str | None: ...


class DeploymentLeaps:
    """Starts a Leap as a run of the `leap` deployment; the process work pool's worker picks it up."""

    def __init__(self, settings: Settings):
        from pronk.stack.prefect_env import configure_prefect

        configure_prefect(settings)

    async def start(self, job_id: str, version: int, leap_id: str) -> str | None:
        from prefect.deployments import arun_deployment

        flow_run = await arun_deployment(
            name=DEPLOYMENT,
            parameters={"job_id": job_id, "version": version, "leap_id": leap_id},
            timeout=0,
            as_subflow=False,
            flow_run_name=leap_id,
            idempotency_key=leap_id,
            tags=["pronk-api", job_id],
        )
        return str(flow_run.id)


def get_leaps(request: Request) -> LeapStarter:
    if getattr(request.app.state, "leaps", None) is None:
        request.app.state.leaps = DeploymentLeaps(request.app.state.settings)
    return request.app.state.leaps


LeapsDep = Annotated[LeapStarter, Depends(get_leaps)]


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


class JobWeights(BaseModel):
    job_id: str
    served_model_name: str
    model: str
    workers: list[WorkerWeights]
    latest_leap: LeapRecord | None = None


class WeightsStatus(BaseModel):
    object: Literal["list"] = "list"
    data: list[JobWeights]


def _mismatch(exc: CheckpointMismatch, param: str) -> ApiError:
    return ApiError(409, str(exc), param=param, code="checkpoint_mismatch")


@router.post("/upload")
async def upload(body: WeightsUpload, owner: AdminDep, settings: SettingsDep) -> UploadResult:
    """Validate a checkpoint against the model's current version and register it as the next version (admin keys)."""
    source = allowed_source(body.source, settings, "source")
    jobs = load_jobs(settings.jobs_dir)
    if body.job_id is not None and body.job_id not in jobs:
        raise ApiError(400, f"No job {body.job_id!r}; known jobs: {sorted(jobs)}.", param="job_id", code="unknown_job")
    job_model = jobs[body.job_id].model if body.job_id else None
    try:
        return await run_in_threadpool(upload_checkpoint, source, body.model, job_model, settings)
    except CheckpointMismatch as exc:
        raise _mismatch(exc, "source") from exc
    except FileNotFoundError as exc:
        raise ApiError(400, str(exc), param="source", code="invalid_checkpoint") from exc


def _target_version(job: JobConfig, uri: str, settings: Settings) -> int:
    """The version of the job's model that `uri` names, registering a checkpoint directory first."""
    name = parse_models_uri(job.model)[0]
    if not uri.startswith("models:/"):
        return upload_checkpoint(uri, name, job.model, settings).version
    target_name, alias, number = parse_models_uri(uri)
    if target_name != name:
        raise ApiError(
            400,
            f"Job {job.job_id} serves model {name!r}; {uri} is another model.",
            param=job.served_model_name,
            code="model_mismatch",
        )
    return alias_version(name, alias, settings) if alias else int(number)


def _validated_target(job: JobConfig, uri: str, settings: Settings) -> int | None:
    """The target version, checked against what the job's live workers serve; None when the job has no live worker."""
    serving = {w.stats.model_version for w in Registry.from_settings(settings).live(job.job_id)}
    if not serving:
        return None
    if not job.model.startswith("models:/"):
        raise ApiError(
            400,
            f"Job {job.job_id} serves {job.model!r}, not an MLflow model.",
            param=job.served_model_name,
            code="not_leapable",
        )
    version = _target_version(job, uri, settings)
    name = parse_models_uri(job.model)[0]
    for current in sorted(serving):
        check_version_fits(f"models:/{name}/{version}", current, settings)
    return version


@router.post("/reload", status_code=202)
async def reload(
    owner: AdminDep,
    settings: SettingsDep,
    leaps: LeapsDep,
    body: Annotated[
        dict[str, str],
        Body(
            description="Served model name → checkpoint URI (`models:/NAME/N`, `models:/NAME@ALIAS`, a dir or s3://)."
        ),
    ],
) -> LeapList:
    """Leap every job with live workers serving each named model to the checkpoint given for it; all are validated before any starts."""
    if not body:
        raise ApiError(400, "Give at least one served model name and checkpoint URI.", code="invalid_value")
    jobs = load_jobs(settings.jobs_dir)
    planned: list[tuple[JobConfig, int]] = []
    for served, given in body.items():
        uri = allowed_source(given, settings, served)
        serving = [j for j in jobs.values() if j.served_model_name == served]
        if not serving:
            raise ApiError(400, f"No job serves model {served!r}.", param=served, code="unknown_model")
        for job in serving:
            try:
                version = await run_in_threadpool(_validated_target, job, uri, settings)
            except ApiError:
                raise
            except CheckpointMismatch as exc:
                raise _mismatch(exc, served) from exc
            except Exception as exc:
                raise ApiError(
                    400, f"Cannot use {uri!r} for {served!r}: {exc}", param=served, code="invalid_checkpoint"
                ) from exc
            if version is not None:
                planned.append((job, version))
    if not planned:
        raise ApiError(409, f"No job serving {sorted(body)} has live workers to Leap.", code="no_live_workers")
    store = LeapStore(settings)
    started = []
    for job, version in planned:
        name = parse_models_uri(job.model)[0]
        record = LeapRecord(job_id=job.job_id, model=name, to_version=f"{name}/{version}", id=new_id("leap"))
        await run_in_threadpool(store.save, record)
        flow_run_id = await leaps.start(job.job_id, version, record.id)
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
async def status(
    owner: OwnerDep,
    settings: SettingsDep,
    job_id: Annotated[str | None, Query(description="Only this job.")] = None,
) -> WeightsStatus:
    """Each job's live workers (version, Leap state, staged version) and its latest Leap."""
    jobs = load_jobs(settings.jobs_dir)
    if job_id is not None and job_id not in jobs:
        raise ApiError(404, f"No job {job_id!r}.", param="job_id", code="not_found")
    registry = Registry.from_settings(settings)
    store = LeapStore(settings)
    data = []
    for job in jobs.values():
        if job_id is not None and job.job_id != job_id:
            continue
        workers = [
            WorkerWeights(
                worker_id=w.worker_id,
                model_version=w.stats.model_version,
                leap_state=w.stats.leap_state,
                staged_version=w.stats.staged_version,
            )
            for w in registry.live(job.job_id)
        ]
        latest = await run_in_threadpool(store.latest, job.job_id)
        data.append(
            JobWeights(
                job_id=job.job_id,
                served_model_name=job.served_model_name,
                model=job.model,
                workers=workers,
                latest_leap=latest,
            )
        )
    return WeightsStatus(data=data)
