"""What the weights routes do: register a checkpoint as a model version, start a Leap for each job serving a model,
and read what the fleets serve.

Checkpoint sources are `models:/`, `s3://`, or a folder under the weights root: a server path in a request body
would let any caller register (and Leap a shared fleet to) whatever the API process can read, so local paths are
refused unless `PRONK_WEIGHTS_ROOT` names a folder, and then only paths inside it (after resolving `..` and
symlinks) are accepted. Checks of a version live in `pronk.models.versions`; the Leap itself is the `leap` Prefect
deployment's. What touches MLflow, the store or the worker registry runs in FastAPI's threadpool.
"""

from __future__ import annotations

from pathlib import Path

from fastapi.concurrency import run_in_threadpool

from pronk.api.error_responses import ApiError
from pronk.api.weights.wire import JobWeights, LeapList, LeapStarted, WeightsStatus, WeightsUpload, WorkerWeights
from pronk.jobs.catalog import load_jobs
from pronk.jobs.schema import JobConfig
from pronk.leap.records import LeapRecord, LeapStore
from pronk.models.checkpoints import CheckpointMismatch
from pronk.models.registry import MODELS_SCHEME
from pronk.models.versions import (
    ModelMismatch,
    NotLeapable,
    UploadResult,
    leap_model,
    leap_target,
    upload_checkpoint,
)
from pronk.protocol.ids import new_id
from pronk.settings import Settings
from pronk.stack.deployments import API_TAG, DeploymentStarter
from pronk.worker_registry import worker_registry

LEAP = "leap/leap"
"""The Leap flow's deployment."""
REMOTE_SCHEMES = (MODELS_SCHEME, "s3://")
MAX_SOURCE = 1024


def allowed_source(uri: str, settings: Settings, param: str) -> str:
    """`uri` when the API may use it as a checkpoint source; otherwise a 400 that says what is accepted."""
    if len(uri) > MAX_SOURCE or "\x00" in uri:
        raise _refused(f"The source {uri[:80]!r}… is not a usable URI.", param)
    if uri.startswith(REMOTE_SCHEMES):
        return uri
    root = settings.weights_root
    if root is None:
        raise _refused(
            f"The source {uri!r} is a server path; over HTTP only models:/ and s3:// sources are accepted"
            " (set PRONK_WEIGHTS_ROOT to allow a folder on the server).",
            param,
        )
    if "://" in uri and not uri.startswith("file://"):
        raise _refused(f"The source {uri!r} has an unsupported scheme; use models:/, s3:// or a path.", param)
    try:
        path = Path(uri.removeprefix("file://")).resolve()
        inside = path.is_relative_to(root.resolve())
    except (OSError, ValueError, RuntimeError):
        inside = False
    if not inside:
        raise _refused(f"The source {uri!r} is not under the weights root of this server.", param)
    return str(path)


def _refused(message: str, param: str) -> ApiError:
    return ApiError(400, message, param=param, code="source_not_allowed")


def _mismatch(exc: CheckpointMismatch, param: str) -> ApiError:
    return ApiError(409, str(exc), param=param, code="checkpoint_mismatch")


def upload(body: WeightsUpload, settings: Settings) -> UploadResult:
    """Validate a checkpoint against the model's current version and register it as the next version."""
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


async def start_leaps(body: dict[str, str], settings: Settings, runs: DeploymentStarter) -> LeapList:
    """A Leap of every job with live workers serving each named model to the checkpoint given for it, each recorded
    `queued` and run by the `leap` deployment; all are validated before any starts."""
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
        # The flow keeps the Leap's record under its id, where it was saved `queued` here.
        parameters = {"job_id": job.job_id, "version": version, "leap_id": record.id}
        flow_run_id = await runs.start(LEAP, parameters, record.id, [API_TAG, job.job_id])
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


def fleets(job_id: str | None, settings: Settings) -> WeightsStatus:
    """Each job's live workers (version, Leap state, staged version) and its latest Leap (only `job_id`'s, if given)."""
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
