"""Batches: create one from an uploaded file (addressed to a job), list, read and cancel the caller's batches."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query

from pronk.api.batches import serving
from pronk.api.batches.drainers import DrainersDep
from pronk.api.batches.wire import BatchCreate, BatchId, BatchList
from pronk.api.deps import BatchesDep, FilesDep, IdempotencyDep, OwnerDep, SettingsDep
from pronk.api.idempotency import HEADER
from pronk.batches.schemas import BatchObject

router = APIRouter(prefix="/batches", tags=["batches"])


@router.post("")
async def create_batch(
    body: BatchCreate,
    owner: OwnerDep,
    files: FilesDep,
    batches: BatchesDep,
    drainers: DrainersDep,
    keys: IdempotencyDep,
    settings: SettingsDep,
    idempotency_key: Annotated[
        str | None, Header(alias=HEADER, description="Retries with the same key get the first try's batch.")
    ] = None,
) -> BatchObject:
    """Check the request and record the batch (`validating`); its run starts in the background."""
    batch = await serving.create_batch(body, owner, files, batches, drainers, keys, settings, idempotency_key)
    return batch.public()


@router.get("")
def list_batches(
    owner: OwnerDep,
    batches: BatchesDep,
    after: Annotated[str | None, Query(description="Cursor: the id of the last batch of the previous page.")] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> BatchList:
    """The caller's batches, newest first."""
    return serving.batch_page(batches, owner, after, limit)


@router.get("/{batch_id}")
def get_batch(batch_id: BatchId, owner: OwnerDep, batches: BatchesDep) -> BatchObject:
    return serving.owned_batch(batches, owner, batch_id).public()


@router.post("/{batch_id}/cancel")
def cancel_batch(batch_id: BatchId, owner: OwnerDep, batches: BatchesDep) -> BatchObject:
    """Ask the run to stop: the batch is `cancelling` at once and `cancelled` when the run has written what finished."""
    return serving.cancel(batches, owner, batch_id).public()
