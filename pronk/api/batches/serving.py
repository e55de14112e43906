"""What the Batches routes do: choose the job a batch goes to, record and queue it (once per idempotency key), find
the caller's batch, page the caller's batches, and ask a run to stop.

The API resolves jobs here, at its entry, from the catalog; the batch's run resolves its job again at the top of its
own flow run, from the job id recorded here.
"""

from __future__ import annotations

from fastapi.concurrency import run_in_threadpool

from pronk.api.batches.drainers import Drainers
from pronk.api.batches.wire import BatchCreate, BatchList
from pronk.api.error_responses import ApiError, not_found
from pronk.api.files.serving import owned_file
from pronk.api.idempotency import HEADER, IdempotencyKeys, Remembered, check_key, request_hash
from pronk.batches.file_store import FileRecord, FileStore
from pronk.batches.schemas import TERMINAL_STATUSES, Batch
from pronk.batches.store import BatchStore
from pronk.jobs.catalog import AmbiguousModel, job_for_model, load_jobs
from pronk.jobs.schema import JobConfig
from pronk.protocol.bodies import SERVED_URLS
from pronk.settings import Settings
from pronk.worker_registry import worker_registry


def choose_job(job_id: str | None, file: FileRecord, jobs: dict[str, JobConfig], settings: Settings) -> JobConfig:
    """The job named by `job_id`, else the job serving the file's model (`pronk.jobs.catalog.job_for_model`: of
    several, the one with live workers, else the default job); anything unclear is a 400. Reads the worker
    registry when several jobs serve the model: call it from the threadpool."""
    if job_id is not None:
        job = jobs.get(job_id)
        if job is None:
            raise ApiError(400, f"No job {job_id!r}; known jobs: {sorted(jobs)}.", param="job_id", code="unknown_job")
        if file.models and job.served_model_name not in file.models:
            raise ApiError(
                400,
                f"Job {job_id} serves model {job.served_model_name!r} but the file's lines ask for {file.models}.",
                param="job_id",
                code="model_mismatch",
            )
        return job
    if len(file.models) != 1:
        raise ApiError(
            400,
            f"Cannot choose a job: the file's lines name {len(file.models)} models {file.models}; pass job_id.",
            param="job_id",
            code="ambiguous_job",
        )
    (model,) = file.models
    try:
        return job_for_model(
            model, jobs, lambda job_id: bool(worker_registry(settings).live(job_id)), settings.default_job
        )
    except AmbiguousModel as exc:
        raise ApiError(400, f"Cannot choose a job: {exc}.", param="job_id", code="ambiguous_job") from exc


def owned_batch(batches: BatchStore, owner: str, batch_id: str) -> Batch:
    """The caller's batch, or 404 (also for another owner's batch: its existence is not revealed)."""
    try:
        batch = batches.load(batch_id)
    except FileNotFoundError:
        batch = None
    if batch is None or batch.owner != owner:
        raise not_found("batch", batch_id, "batch_id")
    return batch


async def create_batch(
    body: BatchCreate,
    owner: str,
    files: FileStore,
    batches: BatchStore,
    drainers: Drainers,
    keys: IdempotencyKeys,
    settings: Settings,
    idempotency_key: str | None,
) -> Batch:
    """Check the request and record the batch (`validating`) and queue it; a retry with the same idempotency key gets
    the first try's batch."""
    if idempotency_key is None:
        return await _create_batch(body, owner, files, batches, drainers, settings)
    key = check_key(idempotency_key)
    async with keys.held(owner, key):
        remembered = await run_in_threadpool(keys.find, owner, key)
        if remembered is not None and await run_in_threadpool(batches.exists, remembered.batch_id):
            if remembered.request_sha256 != request_hash(body):
                raise ApiError(
                    409,
                    f"This {HEADER} was used with a different request; use a new key for a new batch.",
                    param=HEADER,
                    code="idempotency_key_reused",
                )
            return await run_in_threadpool(owned_batch, batches, owner, remembered.batch_id)
        batch = await _create_batch(body, owner, files, batches, drainers, settings)
        await run_in_threadpool(
            keys.remember, owner, key, Remembered(batch_id=batch.id, request_sha256=request_hash(body))
        )
        return batch


async def _create_batch(
    body: BatchCreate, owner: str, files: FileStore, batches: BatchStore, drainers: Drainers, settings: Settings
) -> Batch:
    file = await run_in_threadpool(owned_file, files, owner, body.input_file_id)
    if file.purpose != "batch":
        raise ApiError(
            400, f"File {file.id} has purpose {file.purpose!r}; a batch needs purpose 'batch'.", param="input_file_id"
        )
    if not file.lines:
        raise ApiError(
            400,
            f"File {file.id} has no request lines: a batch needs at least one; upload a file with one JSON request a "
            "line.",
            param="input_file_id",
            code="empty_file",
        )
    if body.endpoint not in SERVED_URLS:
        raise ApiError(
            400, f"Endpoint {body.endpoint[:80]!r} is not served; use one of {list(SERVED_URLS)}.", param="endpoint"
        )
    other_urls = [url for url in file.urls if url != body.endpoint]
    if other_urls:
        raise ApiError(
            400,
            f"Every line's url must equal the endpoint {body.endpoint!r}; the file also has {other_urls}.",
            param="endpoint",
            code="endpoint_mismatch",
        )
    job = await run_in_threadpool(choose_job, body.job_id, file, await run_in_threadpool(load_jobs, settings), settings)
    batch = Batch(
        input_file_id=file.id,
        endpoint=body.endpoint,
        completion_window=body.completion_window,
        metadata=body.metadata,
        job_id=job.job_id,
        model=job.served_model_name,
        price_per_worker_hour=job.worker_hour_price,
        owner=owner,
    )
    batch.request_counts.total = file.lines
    await run_in_threadpool(batches.create, batch)
    await drainers.queue_batch(batch, file.uri)
    return batch


def batch_page(batches: BatchStore, owner: str, after: str | None, limit: int) -> BatchList:
    """A page of the caller's batches, newest first."""
    stored, has_more = batches.list(owner, after, limit)
    data = [batch.public() for batch in stored]
    return BatchList(
        data=data, first_id=data[0].id if data else None, last_id=data[-1].id if data else None, has_more=has_more
    )


def cancel(batches: BatchStore, owner: str, batch_id: str) -> Batch:
    """Ask the run to stop: the batch is `cancelling` at once and `cancelled` when the run has written what finished."""
    batch = owned_batch(batches, owner, batch_id)
    if batch.status in TERMINAL_STATUSES:
        raise ApiError(
            409,
            f"Cannot cancel batch {batch_id}: it is already {batch.status}.",
            param="batch_id",
            code="batch_not_cancellable",
        )
    batches.request_cancel(batch_id)
    return batches.load(batch_id)
