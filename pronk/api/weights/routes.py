"""Weights: register a checkpoint as a model version, Leap running fleets to new weights, and watch them switch.

`POST /v1/weights/reload` takes a body mapping a served model name to a checkpoint URI
(`{"pronk-tiny": "models:/pronk-tiny/2"}`, or a directory / `s3://` path, which is validated and
registered first). Each job serving that name gets a Leap, run by the `leap` Prefect deployment. Every route needs
an admin key. Handlers that touch MLflow, the store or the worker registry are plain `def`s (FastAPI runs them in
its threadpool) or hand those calls to the threadpool (`serving`).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from pronk.api.deps import AdminDep, RunsDep, SettingsDep
from pronk.api.weights import serving
from pronk.api.weights.wire import LeapList, WeightsReload, WeightsStatus, WeightsUpload
from pronk.models.versions import UploadResult

router = APIRouter(prefix="/weights", tags=["weights"])


@router.post("/upload")
def upload(body: WeightsUpload, owner: AdminDep, settings: SettingsDep) -> UploadResult:
    """Validate a checkpoint against the model's current version and register it as the next version (admin keys)."""
    return serving.upload(body, settings)


@router.post("/reload", status_code=202)
async def reload(owner: AdminDep, settings: SettingsDep, leaps: RunsDep, body: WeightsReload) -> LeapList:
    """Leap every job with live workers serving each named model to the checkpoint given for it.

    All are validated before any starts.
    """
    return await serving.start_leaps(body, settings, leaps)


@router.get("/status")
def status(
    owner: AdminDep,
    settings: SettingsDep,
    job_id: Annotated[str | None, Query(description="Only this job.")] = None,
) -> WeightsStatus:
    """Each job's live workers (version, Leap state, staged version) and its latest Leap (admin keys: it names
    every job and the workers' internal addresses, which are the operator's, not the API's users')."""
    return serving.fleets(job_id, settings)
