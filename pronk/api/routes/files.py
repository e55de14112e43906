"""Files: upload a batch input file, list, read, download and delete the caller's files."""

from __future__ import annotations

import contextlib
from typing import Annotated, Literal, cast
from urllib.parse import quote

from fastapi import APIRouter, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from pydantic import BaseModel
from starlette.datastructures import UploadFile

from pronk import storage
from pronk.api.body_limits import MULTIPART_SLACK, BodyRefused
from pronk.api.deps import FilesDep, OwnerDep, SettingsDep
from pronk.api.error_responses import ApiError, not_found
from pronk.batches.file_store import FileRecord, FileStore, UploadRejected
from pronk.batches.schemas import FileObject, FilePurpose
from pronk.protocol.ids import id_pattern

router = APIRouter(prefix="/files", tags=["files"])

FILE_ID_PATTERN = id_pattern("file")
FileId = Annotated[str, Path(pattern=FILE_ID_PATTERN, description="The file's id (`file_` and 24 hex digits).")]
UPLOADABLE = ("batch",)
MAX_FILENAME = 255
"""Characters of an uploaded file's name that are kept."""


class FileList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FileObject]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool = True


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


UPLOAD_FORM = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file", "purpose"],
                    "properties": {
                        "file": {"type": "string", "format": "binary", "description": "The JSONL batch input file."},
                        "purpose": {"type": "string", "enum": list(UPLOADABLE)},
                    },
                }
            }
        },
    }
}
"""The form the upload route reads by hand (to bound it before parsing), described for the OpenAPI schema."""


@router.post("", response_model=FileObject, openapi_extra=UPLOAD_FORM)
async def upload_file(request: Request, owner: OwnerDep, files: FilesDep, settings: SettingsDep) -> FileObject:
    """Upload a batch input file (multipart `file` and `purpose=batch`); nothing is stored when a limit is hit or
    the file has no request line."""
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


@router.get("", response_model=FileList)
def list_files(
    owner: OwnerDep,
    files: FilesDep,
    after: Annotated[str | None, Query(description="Cursor: the id of the last file of the previous page.")] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
    order: Annotated[Literal["asc", "desc"], Query(description="By creation time.")] = "desc",
    purpose: Annotated[str | None, Query(description="Only files of this purpose.")] = None,
) -> FileList:
    records, has_more = files.list(owner, after, limit, order, purpose)
    data = [r.public() for r in records]
    return FileList(
        data=data, first_id=data[0].id if data else None, last_id=data[-1].id if data else None, has_more=has_more
    )


@router.get("/{file_id}", response_model=FileObject)
def get_file(file_id: FileId, owner: OwnerDep, files: FilesDep) -> FileObject:
    return owned_file(files, owner, file_id).public()


@router.delete("/{file_id}", response_model=FileDeleted)
def delete_file(file_id: FileId, owner: OwnerDep, files: FilesDep) -> FileDeleted:
    files.delete(owned_file(files, owner, file_id))
    return FileDeleted(id=file_id)


@router.get("/{file_id}/content", response_class=StreamingResponse)
def file_content(file_id: FileId, owner: OwnerDep, files: FilesDep) -> StreamingResponse:
    """The file's bytes, streamed from the store."""
    record = owned_file(files, owner, file_id)
    return StreamingResponse(
        storage.iter_chunks(record.uri, files.settings),
        media_type="application/octet-stream",
        headers={"Content-Disposition": content_disposition(record.filename)},
    )


def content_disposition(filename: str) -> str:
    """`attachment` with the name per RFC 6266: an ASCII fallback and the UTF-8 name percent-encoded (RFC 5987)."""
    fallback = "".join(c if 32 <= ord(c) < 127 and c not in '"\\' else "_" for c in filename) or "download"
    return (
        f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(filename.encode('utf-8', 'replace'), safe='')}"
    )
