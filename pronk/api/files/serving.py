"""What the Files routes do: upload a batch input file within its limits, find the caller's file, page the caller's
files, and name a download."""

from __future__ import annotations

import contextlib
from typing import Literal, cast
from urllib.parse import quote

from fastapi import Request
from fastapi.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from pronk.api.body_limits import MULTIPART_SLACK, BodyRefused
from pronk.api.error_responses import ApiError, not_found
from pronk.api.files.wire import MAX_FILENAME, UPLOADABLE, FileList
from pronk.batches.file_store import FileRecord, FileStore, UploadRejected
from pronk.batches.schemas import FileObject, FilePurpose
from pronk.settings import Settings


def owned_file(files: FileStore, owner: str, file_id: str) -> FileRecord:
    """The caller's file, or 404 (also for another owner's file: its existence is not revealed)."""
    record = files.get(file_id)
    if record is None or record.owner != owner:
        raise not_found("file", file_id, "file_id")
    return record


def _too_large(size: int, limit: int) -> ApiError:
    return ApiError(
        413,
        f"File is too large: {size} bytes; the limit is {limit} bytes ({limit / 2**20:.0f} MiB).",
        param="file",
        code="file_too_large",
    )


async def _drain(request: Request) -> None:
    """Read what the client sends before answering, up to the body limit (past it, the connection is dropped)."""
    with contextlib.suppress(BodyRefused):
        async for _ in request.stream():
            pass


async def upload(request: Request, owner: str, files: FileStore, settings: Settings) -> FileObject:
    """Store the multipart `file` of purpose `batch`; nothing is stored when a limit is hit or the file has no
    request line."""
    limit = settings.api_max_upload_bytes
    declared = int(request.headers.get("content-length") or 0)
    if declared > limit + MULTIPART_SLACK:
        await _drain(request)
        raise _too_large(declared, limit)
    async with request.form(max_files=1, max_fields=8) as form:
        upload, purpose = form.get("file"), form.get("purpose")
        if not isinstance(upload, UploadFile):
            raise ApiError(
                400, "Missing 'file': send the file as multipart form field 'file'.", param="file", code="missing_file"
            )
        if purpose not in UPLOADABLE:
            raise ApiError(
                400,
                f"Invalid 'purpose' {str(purpose)[:80]!r}: pronk accepts {list(UPLOADABLE)}.",
                param="purpose",
                code="invalid_purpose",
            )
        if upload.size is not None and upload.size > limit:
            raise _too_large(upload.size, limit)
        try:
            record = await run_in_threadpool(
                files.upload,
                owner,
                (upload.filename or "upload.jsonl")[:MAX_FILENAME],
                cast(FilePurpose, purpose),
                upload.file,
                settings.api_max_upload_lines,
            )
        except UploadRejected as exc:
            raise ApiError(400, str(exc), param="file", code=exc.code) from exc
    return record.public()


def file_page(
    files: FileStore, owner: str, after: str | None, limit: int, order: Literal["asc", "desc"], purpose: str | None
) -> FileList:
    """A page of the caller's files."""
    records, has_more = files.list(owner, after, limit, order, purpose)
    data = [r.public() for r in records]
    return FileList(
        data=data, first_id=data[0].id if data else None, last_id=data[-1].id if data else None, has_more=has_more
    )


def content_disposition(filename: str) -> str:
    """`attachment` with the name per RFC 6266: an ASCII fallback and the UTF-8 name percent-encoded (RFC 5987)."""
    fallback = "".join(c if 32 <= ord(c) < 127 and c not in '"\\' else "_" for c in filename) or "download"
    return (
        f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(filename.encode('utf-8', 'replace'), safe='')}"
    )
