"""The Files resource on the wire: the file id, the upload form, the list and the deletion answers.

A File itself is OpenAI's `FileObject` (`pronk.batches.schemas`): the stored record (`FileRecord`) is that object
plus its owner, URI and line summary, which the batch flow writes too when it registers its output files.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import Path
from pydantic import BaseModel

from pronk.batches.schemas import FileObject
from pronk.protocol.ids import id_pattern

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
