"""Files of the Files API under the store (a local folder or S3): uploaded batch inputs and batch results.

Layout under `<store>/files/`: `records/<id>.json` (the File object plus who owns it and where its
bytes are), `content/<id>.jsonl` (uploaded bytes; a batch's results stay where the flow wrote them)
and `owners/<owner>/…` (the owner's listing, see `OwnerIndex`).
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from typing import BinaryIO, Literal

import fsspec
from pydantic import Field

from pronk import storage
from pronk.batches.input import parse_line
from pronk.batches.owner_index import OwnerIndex, Page
from pronk.batches.schemas import Batch, FileObject, FilePurpose
from pronk.pronk_error import PronkError
from pronk.settings import Settings


class UploadRejected(PronkError, ValueError):
    """An upload over a limit, or with no request line; nothing of it was stored. `code` names which, for the API."""

    def __init__(self, message: str, code: str):
        super().__init__(message)
        self.code = code


class FileRecord(FileObject):
    """The stored form of a File: the public object plus its owner, its bytes' URI and a summary of its lines."""

    owner: str | None = Field(
        default=None, description="Owner of the API key that uploaded it (None: made outside the API)."
    )
    uri: str = Field(description="Where the content lives (local path or s3://).")
    lines: int = Field(default=0, ge=0, description="Non-blank lines of a batch input file.")
    urls: list[str] = Field(default_factory=list, description="Distinct `url` values of its lines.")
    models: list[str] = Field(default_factory=list, description="Distinct `body.model` values of its lines.")

    def public(self) -> FileObject:
        return FileObject.model_validate(self.model_dump(include=set(FileObject.model_fields)))


@dataclass(slots=True)
class InputSummary:
    lines: int = 0
    urls: set[str] = field(default_factory=set)
    models: set[str] = field(default_factory=set)


def summarize_input(source: BinaryIO, max_lines: int) -> InputSummary:
    """Count the request lines and collect their urls and models; unparsable lines are left to the batch flow. A file
    over `max_lines`, or without a line that is not blank, raises UploadRejected."""
    summary = InputSummary()
    for raw in source:
        if not raw.strip():
            continue
        summary.lines += 1
        if summary.lines > max_lines:
            raise UploadRejected(
                f"a batch input file may hold at most {max_lines} request lines; this one has more", "too_many_lines"
            )
        line, _ = parse_line(raw)
        if isinstance(line, dict):
            if isinstance(line.get("url"), str):
                summary.urls.add(line["url"])
            body = line.get("body")
            if isinstance(body, dict) and isinstance(body.get("model"), str):
                summary.models.add(body["model"])
    if not summary.lines:
        raise UploadRejected(
            "the file has no request lines (it is empty or blank): a batch input file holds one JSON request a line",
            "empty_file",
        )
    source.seek(0)
    return summary


class FileStore:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.root = storage.join(self.settings.store_uri, "files")
        self.owners = OwnerIndex(storage.join(self.root, "owners"), self.settings)

    def _record_uri(self, file_id: str) -> str:
        return storage.join(self.root, "records", f"{file_id}.json")

    def _save(self, record: FileRecord) -> None:
        storage.write_bytes(self._record_uri(record.id), record.model_dump_json().encode(), self.settings)

    def _index(self, record: FileRecord) -> None:
        if record.owner is not None:
            self.owners.add(record.owner, record.id)

    def upload(self, owner: str, filename: str, purpose: FilePurpose, source: BinaryIO, max_lines: int) -> FileRecord:
        """Store an uploaded batch input file: check its lines first, then copy its bytes; raises UploadRejected."""
        summary = summarize_input(source, max_lines)
        record = FileRecord(
            owner=owner,
            filename=filename,
            purpose=purpose,
            bytes=0,
            uri="",
            lines=summary.lines,
            urls=sorted(summary.urls),
            models=sorted(summary.models),
        )
        record.uri = storage.join(self.root, "content", f"{record.id}.jsonl")
        if "://" not in record.uri:
            storage.filesystem(record.uri, self.settings).makedirs(record.uri.rsplit("/", 1)[0], exist_ok=True)
        with fsspec.open(record.uri, "wb", **storage.storage_options(record.uri, self.settings)) as target:
            shutil.copyfileobj(source, target, 1 << 20)
        record.bytes = storage.size(record.uri, self.settings)
        self._save(record)
        self._index(record)
        return record

    def register(self, owner: str | None, uri: str, purpose: FilePurpose, filename: str | None = None) -> FileRecord:
        """Make an existing object (a batch's output or error file) a File."""
        record = FileRecord(
            owner=owner,
            uri=uri,
            purpose=purpose,
            bytes=storage.size(uri, self.settings),
            filename=filename or uri.rsplit("/", 1)[-1],
            created_at=int(time.time()),
        )
        self._save(record)
        self._index(record)
        return record

    def attach_results(self, batch: Batch) -> None:
        """Make the batch's non-empty output and error files Files and set `output_file_id` / `error_file_id`."""
        for uri, attr in ((batch.output_uri, "output_file_id"), (batch.error_uri, "error_file_id")):
            if uri and getattr(batch, attr) is None and storage.size(uri, self.settings) > 0:
                setattr(batch, attr, self.register(batch.owner, uri, "batch_output").id)

    def get(self, file_id: str) -> FileRecord | None:
        try:
            return FileRecord.model_validate_json(storage.read_bytes(self._record_uri(file_id), self.settings))
        except FileNotFoundError:
            return None

    def delete(self, record: FileRecord) -> None:
        storage.delete(record.uri, self.settings)
        storage.delete(self._record_uri(record.id), self.settings)
        if record.owner is not None:
            self.owners.remove(record.owner, record.id)

    def list(
        self, owner: str, after: str | None, limit: int, order: Literal["asc", "desc"], purpose: str | None = None
    ) -> tuple[list[FileRecord], bool]:
        """A page of the owner's files (optionally of one purpose) and whether more follow."""
        found: list[FileRecord] = []
        cursor = after
        while True:
            page: Page = self.owners.page(owner, cursor, limit + 1, order)
            uris = [self._record_uri(file_id) for file_id in page.ids]
            for data in storage.read_many(uris, self.settings):
                if data is None:
                    continue
                record = FileRecord.model_validate_json(data)
                if purpose is None or record.purpose == purpose:
                    found.append(record)
            if len(found) > limit or not page.has_more or not page.ids:
                return found[:limit], len(found) > limit
            cursor = page.ids[-1]
