"""Files: upload a batch input file, list, read, download and delete the caller's files."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from pronk import storage
from pronk.api.deps import FilesDep, OwnerDep, SettingsDep
from pronk.api.files import serving
from pronk.api.files.wire import UPLOAD_FORM, FileDeleted, FileId, FileList
from pronk.batches.schemas import FileObject

router = APIRouter(prefix="/files", tags=["files"])


@router.post("", response_model=FileObject, openapi_extra=UPLOAD_FORM)
async def upload_file(request: Request, owner: OwnerDep, files: FilesDep, settings: SettingsDep) -> FileObject:
    """Upload a batch input file (multipart `file` and `purpose=batch`); nothing is stored when a limit is hit or
    the file has no request line."""
    return await serving.upload(request, owner, files, settings)


@router.get("", response_model=FileList)
def list_files(
    owner: OwnerDep,
    files: FilesDep,
    after: Annotated[str | None, Query(description="Cursor: the id of the last file of the previous page.")] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
    order: Annotated[Literal["asc", "desc"], Query(description="By creation time.")] = "desc",
    purpose: Annotated[str | None, Query(description="Only files of this purpose.")] = None,
) -> FileList:
    return serving.file_page(files, owner, after, limit, order, purpose)


@router.get("/{file_id}", response_model=FileObject)
def get_file(file_id: FileId, owner: OwnerDep, files: FilesDep) -> FileObject:
    return serving.owned_file(files, owner, file_id).public()


@router.delete("/{file_id}", response_model=FileDeleted)
def delete_file(file_id: FileId, owner: OwnerDep, files: FilesDep) -> FileDeleted:
    files.delete(serving.owned_file(files, owner, file_id))
    return FileDeleted(id=file_id)


@router.get("/{file_id}/content", response_class=StreamingResponse)
def file_content(file_id: FileId, owner: OwnerDep, files: FilesDep) -> StreamingResponse:
    """The file's bytes, streamed from the store."""
    record = serving.owned_file(files, owner, file_id)
    return StreamingResponse(
        storage.iter_chunks(record.uri, files.settings),
        media_type="application/octet-stream",
        headers={"Content-Disposition": serving.content_disposition(record.filename)},
    )
